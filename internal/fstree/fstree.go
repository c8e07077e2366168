// Package fstree describes directory trees as data, for tests: Snapshot
// records everything a checkpoint must preserve about a tree (type, mode,
// owner, size and content digest, symlink target, xattrs, modification
// time) and Diff says how two snapshots differ.
package fstree

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Entry is one path of a tree.
type Entry struct {
	Type   string // "dir", "file", "symlink", "other"
	Mode   uint32 // permission bits, setuid/setgid/sticky
	UID    uint32
	GID    uint32
	Size   int64
	Digest string // sha256 of a file's content
	Target string // a symlink's target
	Xattrs string // sorted "name=value" lines, trusted.overlay.* excluded
	Mtime  int64  // nanoseconds; directories' mtimes are not compared
}

// Tree maps slash-separated paths relative to the root ("." is the root).
type Tree map[string]Entry

// Snapshot walks dir without following symlinks.
func Snapshot(dir string) (Tree, error) {
	t := Tree{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: p, Err: err}
		}
		e := Entry{Mode: st.Mode & 07777, UID: st.Uid, GID: st.Gid}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			e.Type = "dir"
		case unix.S_IFREG:
			e.Type, e.Size, e.Mtime = "file", st.Size, st.Mtim.Nano()
			if e.Digest, err = digest(p); err != nil {
				return err
			}
		case unix.S_IFLNK:
			e.Type = "symlink"
			if e.Target, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			e.Type = fmt.Sprintf("other(%o)", st.Mode&unix.S_IFMT)
		}
		if e.Type != "symlink" {
			if e.Xattrs, err = xattrs(p); err != nil {
				return err
			}
		}
		t[filepath.ToSlash(rel)] = e
		return nil
	})
	return t, err
}

// MustSnapshot is Snapshot for tests.
func MustSnapshot(t interface {
	Helper()
	Fatalf(string, ...any)
}, dir string) Tree {
	t.Helper()
	s, err := Snapshot(dir)
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return s
}

func digest(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func xattrs(p string) (string, error) {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		if err == unix.ENOTSUP {
			return "", nil
		}
		return "", err
	}
	var lines []string
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		if len(name) == 0 || strings.HasPrefix(string(name), "trusted.overlay.") || strings.HasPrefix(string(name), "security.") {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, string(name), v)
		if err != nil {
			return "", err
		}
		lines = append(lines, string(name)+"="+string(v[:m]))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n"), nil
}

// Diff lists the differences between want and got, one line each; empty
// when they are equal. The root directory's own entry is compared too.
func Diff(want, got Tree) []string {
	var out []string
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			out = append(out, "missing: "+p)
			continue
		}
		if w != g {
			if w.Type == "dir" && g.Type == "dir" {
				w.Mtime, g.Mtime = 0, 0
				if w == g {
					continue
				}
			}
			out = append(out, fmt.Sprintf("differs: %s: want %+v, got %+v", p, w, g))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			out = append(out, "unexpected: "+p)
		}
	}
	slices.Sort(out)
	return out
}
