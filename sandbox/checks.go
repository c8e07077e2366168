package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// checkTraversable fails when an unprivileged uid could not reach dir:
// QEMU runs as one and opens its run directory below it.
func checkTraversable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("sandbox: %s is not traversable by others (mode %v): the sandboxes' QEMU runs unprivileged below it; chmod o+x %s", d, fi.Mode().Perm(), d)
		}
		if d == "/" {
			return nil
		}
	}
}

// dirInfo is what checkOwnership weighs of one directory.
type dirInfo struct {
	Path string
	Uid  uint32
	Mode os.FileMode
}

// checkRootOwned fails when another uid than root or hostproxy's own could
// swap an entry on the way to dir or in it: hostproxy trusts
// <dir>/<id>/ctl to be its own. Links on the way are resolved first, so
// the directories checked are the ones really walked.
func checkRootOwned(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	real, err = filepath.Abs(real)
	if err != nil {
		return err
	}
	var chain []dirInfo
	for d := real; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("sandbox: no owner for %s", d)
		}
		chain = append(chain, dirInfo{Path: d, Uid: st.Uid, Mode: fi.Mode()})
		if d == "/" {
			break
		}
	}
	return checkOwnership(chain, uint32(os.Geteuid()))
}

// checkOwnership is the rule checkRootOwned applies to the directories
// from dir (chain[0]) up to /, for a hostproxy running as uid self (root
// in production): every one is owned by root or self and writable by
// neither its group nor others, except that a parent (never dir itself)
// may be writable by all when it is sticky (as /tmp is: only an entry's
// owner, and the directory's, may rename or remove it; the entry below
// is root's or self's by the same rule, and so is the sticky directory).
func checkOwnership(chain []dirInfo, self uint32) error {
	for i, d := range chain {
		if d.Uid != 0 && d.Uid != self {
			return fmt.Errorf("sandbox: %s is owned by uid %d, neither root nor hostproxy's: whoever owns it could swap a sandbox's directories below it; chown root %s", d.Path, d.Uid, d.Path)
		}
		if d.Mode.Perm()&0o022 == 0 {
			continue
		}
		if i > 0 && d.Mode&os.ModeSticky != 0 {
			continue
		}
		return fmt.Errorf("sandbox: %s is writable by its group or others (mode %v): they could swap a sandbox's directories below it; chmod go-w %s", d.Path, d.Mode, d.Path)
	}
	return nil
}
