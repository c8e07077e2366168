package layers

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// merge writes into dst (an empty directory) one layer equivalent to the
// layers srcs stacked, oldest first: what an overlay mount of them would
// show, in the upper-layer format (whiteouts, opaque directories) so that
// layers below still show through where they should. Regular files are
// hard links to the sources (sealed layers never change, so sharing
// inodes is safe and costs no data); directories, symlinks and whiteouts
// are made anew. The cost is one syscall or so per entry, never per byte.
//
// below are the layers the result will sit on, topmost first. A whiteout
// is kept only where one of them shows the path it hides: overlayfs lists
// a directory that exists in one layer only straight from that layer, so
// a whiteout with nothing under it would show up in readdir as a name
// that cannot be looked up.
func merge(ctx context.Context, dst string, srcs, below []string) error {
	m := merger{below: below}
	for _, src := range srcs {
		if err := replaceDirAttrs(src, dst); err != nil {
			return err
		}
		if err := m.applyDir(ctx, src, dst, ".", false); err != nil {
			return err
		}
		// Entries made inside changed the root's times; put them back (a
		// squashed layer's root gives a restore its attributes).
		if err := copyTimes(src, dst); err != nil {
			return err
		}
	}
	return nil
}

// copyTimes gives dst the atime and mtime of src.
func copyTimes(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: dst, Err: err}
	}
	return nil
}

type merger struct{ below []string }

// shownBelow reports whether the layers below show an entry at rel: a
// lookup as overlayfs does it, component by component, where a whiteout
// or a non-directory ends the descent and an opaque directory hides the
// layers under it.
func (m merger) shownBelow(rel string) bool {
	layers := m.below
	parts := strings.Split(rel, "/")
	for i := range parts {
		prefix := filepath.Join(parts[:i+1]...)
		last := i == len(parts)-1
		var next []string
		for _, b := range layers {
			p := filepath.Join(b, prefix)
			var st unix.Stat_t
			if unix.Lstat(p, &st) != nil {
				continue
			}
			if isWhiteout(&st) {
				break
			}
			if last {
				return true
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				break
			}
			next = append(next, b)
			if isOpaque(p) {
				break
			}
		}
		if len(next) == 0 {
			return false
		}
		layers = next
	}
	return false
}

const (
	xattrOpaque = "trusted.overlay.opaque"
)

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func isOpaque(dir string) bool {
	v, err := getXattr(dir, xattrOpaque)
	return err == nil && string(v) == "y"
}

func setOpaque(dir string) error {
	if err := unix.Lsetxattr(dir, xattrOpaque, []byte("y"), 0); err != nil {
		return &os.PathError{Op: "setxattr opaque", Path: dir, Err: err}
	}
	return nil
}

// applyDir applies the entries of the layer directory src onto dst, as
// overlayfs would show src above dst; rel is their path in the layer.
// hidden says that dst or one of its ancestors in the merged layer is
// opaque: nothing below shows inside dst, so no whiteout is needed there
// (and one would be listed: dst then lives in one layer only).
func (m merger) applyDir(ctx context.Context, src, dst, rel string, hidden bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		s, d, r := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), filepath.Join(rel, e.Name())
		var st, dt unix.Stat_t
		if err := unix.Lstat(s, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: s, Err: err}
		}
		dstErr := unix.Lstat(d, &dt)
		dstExists := dstErr == nil
		if dstErr != nil && !errors.Is(dstErr, unix.ENOENT) {
			return &os.PathError{Op: "lstat", Path: d, Err: dstErr}
		}
		dstIsDir := dstExists && dt.Mode&unix.S_IFMT == unix.S_IFDIR
		switch {
		case isWhiteout(&st):
			if dstExists {
				if err := os.RemoveAll(d); err != nil {
					return err
				}
			}
			if hidden || isOpaque(dst) || !m.shownBelow(r) {
				continue
			}
			if err := unix.Mknod(d, unix.S_IFCHR, 0); err != nil {
				return &os.PathError{Op: "mknod whiteout", Path: d, Err: err}
			}
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			if dstIsDir && !isOpaque(s) {
				// Merge into the directory below, which keeps its
				// opaqueness; the upper directory's attributes win.
				if err := replaceDirAttrs(s, d); err != nil {
					return err
				}
			} else {
				// Replaces whatever was below: an opaque directory, or a
				// directory over a file or a whiteout, hides the layers
				// under it, so the merged one must be opaque too.
				if dstExists {
					if err := os.RemoveAll(d); err != nil {
						return err
					}
				}
				if err := os.Mkdir(d, 0o700); err != nil {
					return err
				}
				if err := copyDirAttrs(s, d); err != nil {
					return err
				}
				if isOpaque(s) || (dstExists && !hidden && m.shownBelow(r)) {
					if err := setOpaque(d); err != nil {
						return err
					}
				}
			}
			if err := m.applyDir(ctx, s, d, r, hidden || isOpaque(d)); err != nil {
				return err
			}
			// Entries made inside changed the times; put them back.
			ts := []unix.Timespec{st.Atim, st.Mtim}
			if err := unix.UtimesNanoAt(unix.AT_FDCWD, d, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return &os.PathError{Op: "utimensat", Path: d, Err: err}
			}
		default:
			if dstExists {
				if err := os.RemoveAll(d); err != nil {
					return err
				}
			}
			if err := copyEntry(s, d, &st); err != nil {
				return err
			}
		}
	}
	return nil
}

// replaceDirAttrs makes dst's attributes src's, keeping dst's opaque mark.
func replaceDirAttrs(src, dst string) error {
	opaque := isOpaque(dst)
	names, err := listXattrs(dst)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := unix.Lremovexattr(dst, n); err != nil && !errors.Is(err, unix.ENODATA) {
			return &os.PathError{Op: "removexattr " + n, Path: dst, Err: err}
		}
	}
	if err := copyDirAttrs(src, dst); err != nil {
		return err
	}
	if opaque {
		return setOpaque(dst)
	}
	return nil
}

// copyEntry makes dst the non-directory src: a hard link for a regular
// file, a new symlink with the same owner and times for a symlink.
func copyEntry(src, dst string, st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := unix.Link(src, dst); err != nil {
			return &os.LinkError{Op: "link", Old: src, New: dst, Err: err}
		}
		return nil
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
		if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return &os.PathError{Op: "lchown", Path: dst, Err: err}
		}
		ts := []unix.Timespec{st.Atim, st.Mtim}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "utimensat", Path: dst, Err: err}
		}
		return nil
	default:
		// Layers hold no special files but whiteouts (the capture rules
		// refuse them); keep whatever is there rather than lose it.
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return &os.PathError{Op: "mknod", Path: dst, Err: err}
		}
		if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return &os.PathError{Op: "lchown", Path: dst, Err: err}
		}
		return copyXattrs(src, dst)
	}
}
