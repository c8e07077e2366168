package guestimage

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// RootEdit is one change to the userland tree after mmdebstrap, as a
// value: a directory (made if missing) or a file (replaced), with its mode.
type RootEdit struct {
	Path    string // relative to the root
	Dir     bool
	Mode    uint32
	Content string
}

// RootEdits are the changes strata makes to the Debian userland: the
// directories strata uses, a hostname and hosts file (strata-init sets
// the real hostname from the kernel command line), an empty fstab (init
// mounts everything) and an empty machine-id (every sandbox is its own
// machine; nothing in the image boots systemd).
func RootEdits() []RootEdit {
	return []RootEdit{
		{Path: "workspace", Dir: true, Mode: 0o755},
		{Path: "var/lib/strata", Dir: true, Mode: 0o700},
		{Path: "run/strata", Dir: true, Mode: 0o755},
		{Path: "etc/hostname", Mode: 0o644, Content: "sandbox\n"},
		{Path: "etc/hosts", Mode: 0o644, Content: "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		{Path: "etc/fstab", Mode: 0o644, Content: ""},
		{Path: "etc/machine-id", Mode: 0o444, Content: ""},
	}
}

// applyRootEdits applies edits under root. Each parent is resolved inside
// root (openat2 RESOLVE_IN_ROOT) and the last component is never
// followed: a symlink in the tree (an absolute one especially) cannot send
// a write onto the host.
func applyRootEdits(root string, edits []RootEdit) error {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rfd)
	for _, e := range edits {
		if err := applyRootEdit(rfd, e); err != nil {
			return fmt.Errorf("%s: %w", e.Path, err)
		}
	}
	return nil
}

func applyRootEdit(rfd int, e RootEdit) error {
	clean := path.Clean(e.Path)
	dir, base := path.Split(clean)
	if base == "" || base == "." || base == ".." || path.IsAbs(clean) || strings.HasPrefix(clean, "../") {
		return fmt.Errorf("not a relative path below the root")
	}
	if dir == "" {
		dir = "."
	}
	pfd, err := unix.Openat2(rfd, dir, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("resolve %s: %w", dir, err)
	}
	defer unix.Close(pfd)
	var fd int
	if e.Dir {
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		fd, err = unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
	} else {
		if err := unix.Unlinkat(pfd, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
		fd, err = unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		for b := []byte(e.Content); len(b) > 0; {
			n, err := unix.Write(fd, b)
			if err != nil {
				unix.Close(fd)
				return err
			}
			b = b[n:]
		}
	}
	err = unix.Fchmod(fd, e.Mode)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	return err
}
