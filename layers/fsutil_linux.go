package layers

import (
	"bytes"
	"errors"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// overlayXattrPrefix names the xattrs overlayfs keeps for itself in a
// layer. Opaque markers matter to a layer; origin and impure describe the
// mount a file was copied up in and must not follow it elsewhere.
const overlayXattrPrefix = "trusted.overlay."

func lstatIno(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	return st.Ino, nil
}

func statDev(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return st.Dev, nil
}

// exchange swaps two paths atomically (renameat2 RENAME_EXCHANGE).
func exchange(a, b string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
		return &os.LinkError{Op: "rename exchange", Old: a, New: b, Err: err}
	}
	return nil
}

// syncFS flushes the whole filesystem holding path to stable storage.
func syncFS(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return &os.PathError{Op: "syncfs", Path: path, Err: err}
	}
	return nil
}

// syncDir makes a directory's entries (renames into it) durable.
func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// copyDirAttrs gives dst the mode, owner, xattrs and times of src, both
// directories. overlayfs takes the merged root's attributes from the upper
// layer's root, so each new upper must start as a copy of the old one.
func copyDirAttrs(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return &os.PathError{Op: "chown", Path: dst, Err: err}
	}
	if err := unix.Chmod(dst, st.Mode&07777); err != nil {
		return &os.PathError{Op: "chmod", Path: dst, Err: err}
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: dst, Err: err}
	}
	return nil
}

// copyXattrs copies every xattr of src to dst except overlayfs's own
// (user xattrs that overlayfs escaped as trusted.overlay.overlay.* stay).
func copyXattrs(src, dst string) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, overlayXattrPrefix) && !strings.HasPrefix(n, overlayXattrPrefix+"overlay.") {
			continue
		}
		v, err := getXattr(src, n)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, n, v, 0); err != nil {
			return &os.PathError{Op: "setxattr " + n, Path: dst, Err: err}
		}
	}
	return nil
}

func listXattrs(path string) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, &os.PathError{Op: "listxattr", Path: path, Err: err}
		}
		var out []string
		for _, b := range bytes.Split(buf[:n], []byte{0}) {
			if len(b) > 0 {
				out = append(out, string(b))
			}
		}
		return out, nil
	}
}

func getXattr(path, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "getxattr " + name, Path: path, Err: err}
		}
		return buf[:n], nil
	}
}

// freeBytes returns the space available to root on path's filesystem.
func freeBytes(path string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	return st.Bfree * uint64(st.Bsize), nil
}

// bootID identifies this boot of the kernel: mounts never outlive it.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
