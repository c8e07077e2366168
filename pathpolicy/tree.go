package pathpolicy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// direntBufSize is the getdents buffer of one directory level: a few
// hundred entries per system call.
const direntBufSize = 32 << 10

// ctxCheckEvery is how many entries the walk reads between two looks at
// ctx, on top of one look per directory.
const ctxCheckEvery = 4096

// CheckTree walks the directory dir and fails with path_hardlink when it
// holds a regular file with more than one link, or path_special_file when it
// holds a socket, a device or a FIFO. It refuses to cross into another
// filesystem (path_mount). Symlinks are neither followed nor refused.
//
// When whiteouts is true (dir is an overlay upper layer), character devices
// 0/0 are overlay whiteouts, not violations, whatever their link count: the
// kernel links all whiteouts of a filesystem to one shared inode.
//
// display maps a path relative to dir ("a/b") to the path the user should
// see ("/workspace/project/a/b"); the error's "offending" field is
// display(rel) and its "path" field is filepath.Clean(display("")). nil
// means filepath.Join(dir, rel).
//
// The walk reads directories with getdents and uses the entry type to stat
// only regular files, character devices and entries of unknown type; it
// allocates nothing per entry in the common case. It watches ctx and
// returns ctx.Err() when cancelled. Any other failure to read the tree is an
// unclassified (internal) error.
func CheckTree(ctx context.Context, dir string, whiteouts bool, display func(rel string) string) error {
	_, err := CheckTreeBytes(ctx, dir, whiteouts, display)
	return err
}

// CheckTreeBytes is CheckTree that also returns the space the tree holds:
// the allocated blocks (st_blocks) of its directories, the root included,
// and of its regular files, which the walk stats anyway. Symlinks and
// whiteouts are not counted.
func CheckTreeBytes(ctx context.Context, dir string, whiteouts bool, display func(rel string) string) (int64, error) {
	if display == nil {
		display = func(rel string) string { return filepath.Join(dir, rel) }
	}
	fd, err := openDir(unix.AT_FDCWD, dir)
	if err != nil {
		return 0, fmt.Errorf("pathpolicy: open %s: %w", dir, err)
	}
	return checkTreeFD(ctx, fd, dir, whiteouts, display)
}

// CheckTreeFD is CheckTree on the directory open at fd (which stays open):
// the walk starts at that inode, whatever its path now leads to. path is
// the directory's path for messages; display maps relative paths to what
// the user sees, as in CheckTree.
func CheckTreeFD(ctx context.Context, fd int, path string, whiteouts bool, display func(rel string) string) error {
	_, err := CheckTreeFDBytes(ctx, fd, path, whiteouts, display)
	return err
}

// CheckTreeFDBytes is CheckTreeFD that also returns the space the tree
// holds, as CheckTreeBytes counts it.
func CheckTreeFDBytes(ctx context.Context, fd int, path string, whiteouts bool, display func(rel string) string) (int64, error) {
	if display == nil {
		display = displayUnder(path)
	}
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("pathpolicy: open %s: %w", path, err)
	}
	return checkTreeFD(ctx, dup, path, whiteouts, display)
}

// checkTreeFD walks the directory open at fd, which it closes, and
// returns the space the tree holds.
func checkTreeFD(ctx context.Context, fd int, dir string, whiteouts bool, display func(rel string) string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return 0, fmt.Errorf("pathpolicy: stat %s: %w", dir, err)
	}
	w := &walker{
		ctx:       ctx,
		dir:       dir,
		whiteouts: whiteouts,
		display:   display,
		dev:       uint64(st.Dev),
		rel:       make([]byte, 0, 256),
		bytes:     st.Blocks * 512,
	}
	err := w.walk(fd, 0)
	return w.bytes, err
}

// walker holds the state of one CheckTree walk.
type walker struct {
	ctx       context.Context
	dir       string
	whiteouts bool
	display   func(string) string
	dev       uint64
	rel       []byte   // path of the current directory relative to dir
	bufs      [][]byte // one getdents buffer per depth, reused across directories
	seen      int      // entries since ctx was last checked
	st        unix.Stat_t
	bytes     int64 // allocated bytes of the directories and regular files so far
}

// walk checks the directory open at fd, which it closes.
func (w *walker) walk(fd, depth int) error {
	defer unix.Close(fd)
	if err := w.ctx.Err(); err != nil {
		return err
	}
	if depth == len(w.bufs) {
		w.bufs = append(w.bufs, make([]byte, direntBufSize))
	}
	buf := w.bufs[depth]
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return w.ioError("read directory", "", err)
		}
		if n <= 0 {
			return nil
		}
		// struct linux_dirent64: d_ino u64, d_off s64, d_reclen u16,
		// d_type u8, then the NUL-terminated name.
		for off := 0; off < n; {
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			typ := buf[off+18]
			name := buf[off+19 : off+reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			off += reclen
			if len(name) == 0 || (name[0] == '.' && (len(name) == 1 || (len(name) == 2 && name[1] == '.'))) {
				continue
			}
			if w.seen++; w.seen >= ctxCheckEvery {
				w.seen = 0
				if err := w.ctx.Err(); err != nil {
					return err
				}
			}
			// The name points into buf, which stays untouched until this
			// entry is done (a subdirectory uses the next level's buffer).
			if err := w.entry(fd, unsafe.String(&name[0], len(name)), typ, depth); err != nil {
				return err
			}
		}
	}
}

// entry checks one directory entry of the directory open at fd.
func (w *walker) entry(fd int, name string, typ uint8, depth int) error {
	switch typ {
	case unix.DT_DIR:
		return w.descend(fd, name, depth)
	case unix.DT_LNK:
		return nil
	case unix.DT_BLK, unix.DT_FIFO, unix.DT_SOCK:
		return w.special(name)
	case unix.DT_CHR:
		if !w.whiteouts {
			return w.special(name)
		}
	}
	// DT_REG needs the link count, DT_CHR the device number, DT_UNKNOWN
	// (filesystems without d_type) everything.
	if err := unix.Fstatat(fd, name, &w.st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil // removed while we walk: not ours to judge
		}
		return w.ioError("stat", name, err)
	}
	switch w.st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if w.st.Nlink > 1 {
			return w.violation(CodePathHardlink, name,
				"The directory contains a hardlinked file; hardlinks are not supported.")
		}
		w.bytes += w.st.Blocks * 512
		return nil
	case unix.S_IFDIR:
		return w.descend(fd, name, depth)
	case unix.S_IFLNK:
		return nil
	case unix.S_IFCHR:
		if w.whiteouts && w.st.Rdev == 0 {
			return nil
		}
	}
	return w.special(name)
}

// descend walks the subdirectory name of the directory open at fd.
func (w *walker) descend(fd int, name string, depth int) error {
	mark := w.push(name)
	defer w.pop(mark)
	cfd, err := openDir(fd, name)
	if err != nil {
		if err == unix.ENOENT || err == unix.ELOOP || err == unix.ENOTDIR {
			return nil // removed, or replaced by a symlink or a file, while we walk
		}
		return w.ioError("open", "", err)
	}
	if err := unix.Fstat(cfd, &w.st); err != nil {
		unix.Close(cfd)
		return w.ioError("stat", "", err)
	}
	if uint64(w.st.Dev) != w.dev {
		unix.Close(cfd)
		return w.violation(CodePathMount, "", "The directory contains a mount point.")
	}
	w.bytes += w.st.Blocks * 512
	return w.walk(cfd, depth+1)
}

// push appends name to the relative path and returns the length to restore.
func (w *walker) push(name string) int {
	mark := len(w.rel)
	if mark > 0 {
		w.rel = append(w.rel, '/')
	}
	w.rel = append(w.rel, name...)
	return mark
}

func (w *walker) pop(mark int) { w.rel = w.rel[:mark] }

// relOf returns the path of name (or of the current directory when name is
// "") relative to the walk's root, as a new string.
func (w *walker) relOf(name string) string {
	switch {
	case name == "":
		return string(w.rel)
	case len(w.rel) == 0:
		return string([]byte(name)) // copy: name may alias a dirent buffer
	default:
		return string(w.rel) + "/" + name
	}
}

func (w *walker) special(name string) error {
	return w.violation(CodePathSpecialFile, name,
		"The directory contains a socket, device or named pipe; special files are not supported.")
}

func (w *walker) violation(code, name, message string) error {
	return violation(code, filepath.Clean(w.display("")), w.display(w.relOf(name)), message)
}

func (w *walker) ioError(op, name string, err error) error {
	return fmt.Errorf("pathpolicy: %s %s: %w", op, filepath.Join(w.dir, w.relOf(name)), err)
}

// openDir opens the directory name relative to dirfd without following a
// final symlink, retrying on EINTR.
func openDir(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}
