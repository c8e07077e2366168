// Package treetar writes a directory tree as a tar stream and unpacks one
// into a directory, for the files routes (guestd) and createos cp: what
// both sides of a copy do with a tree, in one place.
//
// Write carries directories, regular files, symlinks (as links, never
// followed) and their modes and times; devices, fifos and sockets are
// left out. Extract unpacks through an os.Root of the target directory:
// no entry, and no symlink an earlier entry made, takes a write outside
// it; an entry named outside it (with "..", or a hard link out) is an
// *OutsideError before anything of it is written, and an absolute name is
// taken as relative to the directory, as tar does. The caller says which
// mode bits are kept (KeepAll in the guest, LocalModes with the user's
// umask on the user's machine); owners are never set. Directories get
// their times last, deepest first. Bytes are copied through one buffer:
// neither side holds a file whole.
//
// Written by hand over archive/tar because no library does the confined
// extraction with os.Root.
package treetar

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

const bufSize = 32 << 10

// Write writes the tree under dir (not dir itself) to tw, names relative
// to dir. It does not close tw.
func Write(tw *tar.Writer, dir string) error {
	buf := make([]byte, bufSize)
	// The root itself may be a symlink to the directory: its tree is
	// walked, not the link.
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil // gone meanwhile
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.Uname, h.Gname = filepath.ToSlash(rel), "", ""
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyBuffer(tw, io.LimitReader(f, h.Size), buf)
		return err
	})
}

// OutsideError is an entry that would land outside the directory.
type OutsideError struct{ Name string }

func (e *OutsideError) Error() string {
	return fmt.Sprintf("tar entry %q would land outside the directory", e.Name)
}

// EntryError is a filesystem error at one entry.
type EntryError struct {
	Name string
	Err  error
}

func (e *EntryError) Error() string { return fmt.Sprintf("tar entry %q: %v", e.Name, e.Err) }
func (e *EntryError) Unwrap() error { return e.Err }

// ErrNotTar is a body that is not a tar stream.
var ErrNotTar = errors.New("not a tar stream")

// KeepAll keeps every mode bit of a tar's entries: the permissions and
// the setuid, setgid and sticky bits (guestd: the guest is the sandbox's
// own, and a tar into it keeps what it says).
const KeepAll = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// LocalModes keeps what unpacking on a user's machine keeps, as tar does
// for a user who is not root: the permissions less umask, never setuid,
// setgid or sticky (a tar from a sandbox must not plant a setuid file,
// or a file its owner's umask would not have made, on the host).
func LocalModes(umask fs.FileMode) fs.FileMode { return fs.ModePerm &^ umask }

// Extract unpacks the tar r into root's directory and returns the bytes
// of the regular files written. Of each entry's mode only the bits of
// keep are set (KeepAll, LocalModes); owners are never set.
func Extract(r io.Reader, root *os.Root, keep fs.FileMode) (int64, error) {
	tr := tar.NewReader(r)
	buf := make([]byte, bufSize)
	var total int64
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirs []dirTime
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return total, fmt.Errorf("%w: %v", ErrNotTar, err)
		}
		name, ok := local(h.Name)
		if !ok {
			return total, &OutsideError{h.Name}
		}
		if name == "." {
			continue
		}
		fail := func(err error) (int64, error) { return total, &EntryError{h.Name, err} }
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return fail(err)
			}
		}
		perm := tarMode(h.Mode) & keep
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return fail(err)
			}
			if err := root.Chmod(name, perm); err != nil {
				return fail(err)
			}
			dirs = append(dirs, dirTime{name, h.ModTime})
		case tar.TypeReg:
			if fi, err := root.Lstat(name); err == nil && !fi.Mode().IsRegular() {
				if err := root.RemoveAll(name); err != nil {
					return fail(err)
				}
			}
			f, err := root.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
			if err != nil {
				return fail(err)
			}
			n, err := io.CopyBuffer(f, tr, buf)
			total += n
			if err == nil {
				err = f.Chmod(perm)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = root.Chtimes(name, h.ModTime, h.ModTime)
			}
			if err != nil {
				return fail(err)
			}
		case tar.TypeSymlink:
			root.RemoveAll(name)
			if err := root.Symlink(h.Linkname, name); err != nil {
				return fail(err)
			}
		case tar.TypeLink:
			target, ok := local(h.Linkname)
			if !ok || target == "." {
				return total, &OutsideError{h.Name}
			}
			root.RemoveAll(name)
			if err := root.Link(target, name); err != nil {
				return fail(err)
			}
		}
	}
	for _, d := range slices.Backward(dirs) {
		root.Chtimes(d.name, d.t, d.t)
	}
	return total, nil
}

// tarMode is a tar header's mode bits as an fs.FileMode: the permissions
// and the setuid, setgid and sticky bits (the type is the header's flag).
func tarMode(mode int64) fs.FileMode {
	m := fs.FileMode(mode & 0o777)
	for bit, fm := range map[int64]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
		if mode&bit != 0 {
			m |= fm
		}
	}
	return m
}

// local is name relative to the directory, and whether it stays in it.
func local(name string) (string, bool) {
	n := path.Clean(strings.TrimPrefix(name, "/"))
	return n, n == "." || filepath.IsLocal(n)
}
