package layers

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"strconv"

	"golang.org/x/sys/unix"
)

// materialize copies the entry rel of src ("" is its root) to the new
// entry name of the directory open at dst: a regular file, a symlink, or
// a directory with everything under it. It is how restore-paths copies
// from a checkpoint into the live mount, release from the live mount into
// a plain directory, and export from a store into a plain directory.
//
// Each entry keeps its mode, owner (as root; a copy made by another user
// is owned by that user), times, and its user.* and security.* xattrs;
// overlayfs's trusted.overlay.* markers never follow it. Regular files
// are clones of the source (FICLONE: blocks shared, nothing copied) when
// both sides are on one filesystem that clones, copies otherwise
// (copy_file_range, then read and write). Hard links are not kept: each
// name gets a file of its own. Special files are made anew (mknod).
//
// Everything is made relative to dst with *at calls that follow no
// symlink: a symlink written into the destination meanwhile cannot lead
// the copy elsewhere. name must not exist (EEXIST). On an error, what was
// made so far stays: callers build under a temporary name and rename
// into place.
func materialize(ctx context.Context, src tree, rel string, dst int, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	st, err := src.Lstat(rel)
	if err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return materializeFile(ctx, src, rel, &st, dst, name)
	case unix.S_IFDIR:
		return materializeDir(ctx, src, rel, &st, dst, name)
	case unix.S_IFLNK:
		target, err := src.Readlink(rel)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(target, dst, name); err != nil {
			return &os.PathError{Op: "symlinkat", Path: name, Err: err}
		}
	default:
		if err := unix.Mknodat(dst, name, st.Mode, int(st.Rdev)); err != nil {
			return &os.PathError{Op: "mknodat", Path: name, Err: err}
		}
	}
	// A symlink or a special file: owner and times by name, not followed.
	if err := chownAt(dst, name, &st); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(dst, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: name, Err: err}
	}
	return nil
}

// chownAt gives dst/name st's owner; only root may, so another user's
// copy keeps its own.
func chownAt(dst int, name string, st *unix.Stat_t) error {
	err := unix.Fchownat(dst, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
	if err != nil && !(errors.Is(err, unix.EPERM) && os.Geteuid() != 0) {
		return &os.PathError{Op: "fchownat", Path: name, Err: err}
	}
	return nil
}

// materializeDir makes the directory name and fills it, then gives it its
// attributes (times last: the entries made inside change them).
func materializeDir(ctx context.Context, src tree, rel string, st *unix.Stat_t, dst int, name string) error {
	if err := unix.Mkdirat(dst, name, 0o700); err != nil {
		return &os.PathError{Op: "mkdirat", Path: name, Err: err}
	}
	fd, err := openBeneath(dst, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	names, err := src.ReadDir(rel)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := materialize(ctx, src, path.Join(rel, n), fd, n); err != nil {
			return err
		}
	}
	return setAttrsFD(fd, name, src, rel, st)
}

// materializeFile makes name a clone or a copy of the regular file rel.
func materializeFile(ctx context.Context, src tree, rel string, st *unix.Stat_t, dst int, name string) (err error) {
	in, err := src.Open(rel)
	if err != nil {
		return err
	}
	defer in.Close()
	ofd, err := unix.Openat(dst, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: name, Err: err}
	}
	out := os.NewFile(uintptr(ofd), name)
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			unix.Unlinkat(dst, name, 0)
		}
	}()
	if err := cloneOrCopy(ctx, out, in); err != nil {
		return err
	}
	return setAttrsFD(ofd, name, src, rel, st)
}

// cloneOrCopy gives out (empty) the content of in: FICLONE where the
// filesystem can, else a copy (io.Copy between files uses
// copy_file_range, which shares blocks itself on filesystems that can),
// in chunks so that a cancelled ctx stops a large one.
func cloneOrCopy(ctx context.Context, out, in *os.File) error {
	err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EINVAL) &&
		!errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
		return &os.PathError{Op: "FICLONE", Path: out.Name(), Err: err}
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := io.CopyN(out, in, copyChunk)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if n < copyChunk {
			return nil
		}
	}
}

// copyChunk is how much a copy writes between two looks at its ctx.
const copyChunk = 64 << 20

// setAttrsFD gives the file or directory open at fd (named name, for
// errors) st's owner, mode, times, and rel's kept xattrs.
func setAttrsFD(fd int, name string, src tree, rel string, st *unix.Stat_t) error {
	if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil && !(errors.Is(err, unix.EPERM) && os.Geteuid() != 0) {
		return &os.PathError{Op: "fchown", Path: name, Err: err}
	}
	// After the chown, which clears set-user-ID and set-group-ID bits.
	if err := unix.Fchmod(fd, st.Mode&07777); err != nil {
		return &os.PathError{Op: "fchmod", Path: name, Err: err}
	}
	xs, err := src.Xattrs(rel)
	if err != nil {
		return err
	}
	for _, x := range xs {
		if err := unix.Fsetxattr(fd, x.Name, x.Value, 0); err != nil {
			return &os.PathError{Op: "setxattr " + x.Name, Path: name, Err: err}
		}
	}
	// futimens: utimensat on the fd's own /proc link (x/sys has no
	// futimens with nanoseconds).
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), ts, 0); err != nil {
		return &os.PathError{Op: "futimens", Path: name, Err: err}
	}
	return nil
}
