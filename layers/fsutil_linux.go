package layers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"strata/internal/fault"
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

// exchangeAt swaps the entry name of the directory open at dir with the
// store path b atomically (renameat2 RENAME_EXCHANGE).
func exchangeAt(dir int, name, b string) error {
	if err := unix.Renameat2(dir, name, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
		return &os.LinkError{Op: "rename exchange", Old: name, New: b, Err: err}
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

// syncLayerLimit is the size above which syncLayer syncs a layer's whole
// filesystem (one syncfs) rather than entry by entry, inside a window
// (a restore's seal of its safety checkpoint): there, what syncfs would
// write back of other files must not lengthen it.
const syncLayerLimit = 1024

// sealLimit is syncLayer's limit for a capture's seal, which runs after
// the swap, outside the window. Each fsync costs a flush of the device
// even for an entry already clean (ext4 and XFS send one per call; in a
// microVM, QEMU turns each into an fdatasync of the image on the host:
// 0.8 ms each under TCG), while one syncfs right after prepare's writes
// back only what was dirtied since (the layer's last writes, the first
// writes on the new upper) and flushes once. Past a few entries, syncfs
// is the cheaper.
const sealLimit = 8

// syncLayer makes the layer directory dir, and the directories also,
// durable: dir's regular files and directories fsynced one by one,
// deepest first, then also, so that the cost follows the layer's size,
// never the dirty data of unrelated files on the filesystem (which
// syncfs would write back too). A file already clean costs a call and a
// flush. A layer of more than limit such entries, or one holding a
// symlink (a symlink cannot be opened to be fsynced, and on XFS nothing
// else forces its own changes to the log), is synced with syncfs
// instead: one call, whatever else it writes; also must be on dir's
// filesystem.
func syncLayer(ctx context.Context, dir string, limit int, also ...string) error {
	var paths []string
	whole := errors.New("sync the filesystem")
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			return whole
		case !d.Type().IsRegular() && !d.IsDir():
			return nil // whiteouts: entries of their directory
		case len(paths)+len(also) >= limit:
			return whole
		}
		paths = append(paths, p)
		return nil
	})
	if errors.Is(err, whole) {
		return syncFS(dir)
	}
	if err != nil {
		return err
	}
	slices.Reverse(paths)
	paths = append(paths, also...)
	for i := range paths {
		fd, err := unix.Open(paths[i], unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: paths[i], Err: err}
		}
		err = unix.Fsync(fd)
		unix.Close(fd)
		if err != nil {
			return &os.PathError{Op: "fsync", Path: paths[i], Err: err}
		}
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
	fd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: src, Err: err}
	}
	defer unix.Close(fd)
	return copyDirAttrsFD(fd, dst)
}

// replaceDirAttrs is copyDirAttrs onto a directory that already has
// attributes: dst's xattrs that src does not have go first (overlayfs's
// own excepted), so that dst ends up with exactly src's.
func replaceDirAttrs(src, dst string) error {
	names, err := listXattrs(dst)
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, overlayXattrPrefix) && !strings.HasPrefix(n, overlayXattrPrefix+"overlay.") {
			continue
		}
		if _, err := getXattr(src, n); errors.Is(err, unix.ENODATA) {
			if err := unix.Lremovexattr(dst, n); err != nil && !errors.Is(err, unix.ENODATA) {
				return &os.PathError{Op: "removexattr " + n, Path: dst, Err: err}
			}
		}
	}
	return copyDirAttrs(src, dst)
}

// copyDirAttrsFD is copyDirAttrs from the directory open at src; dst is a
// directory of the store's own.
func copyDirAttrsFD(src int, dst string) error {
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: dst, Err: err}
	}
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return &os.PathError{Op: "chown", Path: dst, Err: err}
	}
	if err := unix.Chmod(dst, st.Mode&07777); err != nil {
		return &os.PathError{Op: "chmod", Path: dst, Err: err}
	}
	if err := copyXattrsFD(src, dst); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: dst, Err: err}
	}
	return nil
}

// copyXattrs copies every xattr of src to dst (paths in the store, not
// followed) except overlayfs's own (user xattrs that overlayfs escaped as
// trusted.overlay.overlay.* stay).
func copyXattrs(src, dst string) error {
	return copyXattrsWith(dst, func() ([]string, error) { return listXattrs(src) }, func(n string) ([]byte, error) { return getXattr(src, n) })
}

// copyXattrsFD is copyXattrs from the file open at src.
func copyXattrsFD(src int, dst string) error {
	return copyXattrsWith(dst, func() ([]string, error) { return listXattrsFD(src) }, func(n string) ([]byte, error) { return getXattrFD(src, n) })
}

func copyXattrsWith(dst string, list func() ([]string, error), get func(string) ([]byte, error)) error {
	names, err := list()
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, overlayXattrPrefix) && !strings.HasPrefix(n, overlayXattrPrefix+"overlay.") {
			continue
		}
		v, err := get(n)
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
	return listXattrsWith(func(b []byte) (int, error) { return unix.Llistxattr(path, b) })
}

func listXattrsFD(fd int) ([]string, error) {
	return listXattrsWith(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
}

func listXattrsWith(list func([]byte) (int, error)) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := list(buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, &os.PathError{Op: "listxattr", Path: "", Err: err}
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
	return getXattrWith(name, func(b []byte) (int, error) { return unix.Lgetxattr(path, name, b) })
}

func getXattrFD(fd int, name string) ([]byte, error) {
	return getXattrWith(name, func(b []byte) (int, error) { return unix.Fgetxattr(fd, name, b) })
}

func getXattrWith(name string, get func([]byte) (int, error)) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := get(buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "getxattr " + name, Path: "", Err: err}
		}
		return buf[:n], nil
	}
}

// bootID identifies this boot of the kernel: mounts never outlive it.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// space is what statfs says of a filesystem, for root.
type space struct {
	totalBytes, freeBytes   uint64
	totalInodes, freeInodes uint64
}

func statSpace(path string) (space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return space{}, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	bs := uint64(st.Bsize)
	return space{totalBytes: st.Blocks * bs, freeBytes: st.Bfree * bs, totalInodes: st.Files, freeInodes: st.Ffree}, nil
}

// isNoSpace reports whether err is the filesystem running out of blocks,
// inodes or quota.
func isNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// classifyNoSpace turns an out-of-space failure of any step into 507
// insufficient_storage; every step undoes what it did on failure, so the
// client can free space and retry.
func classifyNoSpace(err error) error {
	if err == nil || !isNoSpace(err) || fault.As(err) != nil {
		return err
	}
	return ErrNoSpace.Wrap(err)
}

// lockStore takes the store's lock file (flock, exclusive, not waiting)
// and writes this process's pid into it. A store already held fails with
// a message that names the store and the holder.
func lockStore(dir string) (*os.File, error) {
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, classifyNoSpace(fmt.Errorf("open store lock: %w", err))
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := strings.TrimSpace(string(pid))
			if holder == "" {
				holder = "unknown"
			}
			return nil, fmt.Errorf("store %s is in use by another guestd (pid %s): stop it first", dir, holder)
		}
		return nil, fmt.Errorf("lock store %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// detachUnder lazily unmounts every mount at or below dir (a probe mount
// left by a crash).
func detachUnder(dir string) {
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return
	}
	// Deepest first.
	for i := len(ms) - 1; i >= 0; i-- {
		unix.Unmount(ms[i].Mountpoint, unix.MNT_DETACH)
	}
}

// cloneFile makes dst a new regular file with src's content, shared block
// for block (FICLONE: no data is copied), and src's mode, owner, xattrs
// and times: a copy as far as anyone can tell, with a link count of its
// own. It fails (EOPNOTSUPP, EXDEV, EINVAL) where the filesystem cannot
// clone; dst is then removed.
func cloneFile(src, dst string, st *unix.Stat_t) (err error) {
	in, err := unix.Open(src, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: src, Err: err}
	}
	defer unix.Close(in)
	out, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: dst, Err: err}
	}
	defer func() {
		if cerr := unix.Close(out); err == nil && cerr != nil {
			err = &os.PathError{Op: "close", Path: dst, Err: cerr}
		}
		if err != nil {
			unix.Unlink(dst)
		}
	}()
	if err := unix.IoctlFileClone(out, in); err != nil {
		return &os.PathError{Op: "FICLONE", Path: dst, Err: err}
	}
	if err := unix.Fchown(out, int(st.Uid), int(st.Gid)); err != nil {
		return &os.PathError{Op: "fchown", Path: dst, Err: err}
	}
	// After the chown, which clears set-user-ID and set-group-ID bits.
	if err := unix.Fchmod(out, st.Mode&07777); err != nil {
		return &os.PathError{Op: "fchmod", Path: dst, Err: err}
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

// canClone reports whether the filesystem of dir (a scratch directory of
// the store's) clones files: FICLONE of a small file made there.
func canClone(dir string) bool {
	src, dst := filepath.Join(dir, "clone-probe"), filepath.Join(dir, "clone-probe.copy")
	defer os.Remove(src)
	defer os.Remove(dst)
	if err := os.WriteFile(src, []byte("probe"), 0o600); err != nil {
		return false
	}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return false
	}
	return cloneFile(src, dst, &st) == nil
}
