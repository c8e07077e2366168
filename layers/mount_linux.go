package layers

import (
	"context"
	"errors"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// moveMountBeneath is MOVE_MOUNT_BENEATH (Linux 6.5), not yet named in x/sys.
const moveMountBeneath = 0x200

// fsMounter builds stacks with fsopen/fsconfig/fsmount and swaps them in
// with move_mount(MOVE_MOUNT_BENEATH): the directory is never empty. Every
// kernel with "lowerdir+" (6.8) also has MOVE_MOUNT_BENEATH (6.5).
type fsMounter struct{}

func (m *fsMounter) Name() string { return "fsmount" }

// build creates a detached mount of s and returns its fd.
func (m *fsMounter) build(s Stack) (int, error) {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, &MountError{Op: "fsopen", Target: "overlay", Err: err}
	}
	defer unix.Close(fd)
	for _, kv := range s.Config() {
		if err := unix.FsconfigSetString(fd, kv[0], kv[1]); err != nil {
			return -1, &MountError{Op: "fsconfig " + kv[0], Target: kv[1], Err: err}
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return -1, &MountError{Op: "fsconfig create", Target: s.Layers, Err: err}
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return -1, &MountError{Op: "fsmount", Target: s.Layers, Err: err}
	}
	return mfd, nil
}

func (m *fsMounter) Mount(ctx context.Context, target string, s Stack) error {
	mfd, err := m.build(s)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return &MountError{Op: "move_mount", Target: target, Err: err}
	}
	return nil
}

func (m *fsMounter) Replace(ctx context.Context, target string, s Stack) (bool, error) {
	mfd, err := m.build(s)
	if err != nil {
		return false, err
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH|moveMountBeneath); err != nil {
		return false, &MountError{Op: "move_mount beneath", Target: target, Err: err}
	}
	return unmountTop(target)
}

// unmountTop removes the top mount at target: a plain umount when nothing
// uses it, a lazy detach when something does.
func unmountTop(target string) (lazy bool, err error) {
	err = unix.Unmount(target, 0)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, unix.EBUSY) {
		return false, &MountError{Op: "umount", Target: target, Err: err}
	}
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
		return false, &MountError{Op: "umount lazy", Target: target, Err: err}
	}
	return true, nil
}

// legacyMounter uses mount(2). The option string is cut silently at one
// page, so layers are named relative to the layers directory from a thread
// that has its own working directory (unshare(CLONE_FS) + chdir).
type legacyMounter struct{}

func (legacyMounter) Name() string { return "mount2" }

func (legacyMounter) Mount(ctx context.Context, target string, s Stack) error {
	data := s.LegacyData()
	if len(data) >= os.Getpagesize() {
		return &MountError{Op: "mount", Target: target, Err: errors.New("overlay options exceed one page")}
	}
	errc := make(chan error, 1)
	go func() {
		// The thread's fs context is changed for good; LockOSThread without
		// Unlock makes the runtime discard the thread when this goroutine ends.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- &MountError{Op: "unshare CLONE_FS", Target: target, Err: err}
			return
		}
		if err := unix.Chdir(s.Layers); err != nil {
			errc <- &MountError{Op: "chdir", Target: s.Layers, Err: err}
			return
		}
		if err := unix.Mount("overlay", target, "overlay", 0, data); err != nil {
			errc <- &MountError{Op: "mount", Target: target, Err: err}
			return
		}
		errc <- nil
	}()
	return <-errc
}

func (l legacyMounter) Replace(ctx context.Context, target string, s Stack) (bool, error) {
	lazy, err := unmountTop(target)
	if err != nil {
		return false, err
	}
	return lazy, l.Mount(ctx, target, s)
}

// freeze makes the overlay superblock at target read-only. It fails with
// EBUSY while any process has a file open for writing on it (a writable
// shared mapping too): the atomic gate of every capture and restore.
func freeze(target string) error {
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return &MountError{Op: "remount ro", Target: target, Err: err}
	}
	return nil
}

// thaw makes the overlay superblock at target writable again.
func thaw(target string) error {
	if err := unix.Mount("", target, "", unix.MS_REMOUNT, ""); err != nil {
		return &MountError{Op: "remount rw", Target: target, Err: err}
	}
	return nil
}

// setImmutable sets or clears FS_IMMUTABLE_FL on the directory dir. An
// immutable empty mountpoint refuses every write that would land under a
// mount while the mount is away, and mounting over it still works.
func setImmutable(dir string, on bool) error {
	const fsImmutableFL = 0x10
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		return &os.PathError{Op: "FS_IOC_GETFLAGS", Path: dir, Err: err}
	}
	nf := flags &^ fsImmutableFL
	if on {
		nf |= fsImmutableFL
	}
	if nf == flags {
		return nil
	}
	if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(nf)); err != nil {
		return &os.PathError{Op: "FS_IOC_SETFLAGS", Path: dir, Err: err}
	}
	return nil
}

// ProbeMounter picks the best Mounter the kernel supports by mounting a
// tiny overlay under scratch (an empty directory on the store's filesystem)
// with each candidate, newest first. legacy forces mount(2).
func ProbeMounter(ctx context.Context, scratch string, legacy bool) (Mounter, error) {
	if legacy {
		return legacyMounter{}, probeOne(ctx, scratch, legacyMounter{})
	}
	if err := probeOne(ctx, scratch, &fsMounter{}); err == nil {
		return &fsMounter{}, nil
	}
	if err := probeOne(ctx, scratch, legacyMounter{}); err != nil {
		return nil, err
	}
	return legacyMounter{}, nil
}

// probeOne mounts a two-layer stack, swaps it for another with Replace,
// and unmounts, all under scratch.
func probeOne(ctx context.Context, scratch string, m Mounter) error {
	if err := os.RemoveAll(scratch); err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	s := Stack{Layers: scratch, Upper: 3, Lowers: []uint64{1}}
	for _, d := range []string{s.FSDir(1), s.FSDir(2), s.FSDir(3), s.WorkDir(3), s.FSDir(4), s.WorkDir(4), scratch + "/m"} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	target := scratch + "/m"
	if err := m.Mount(ctx, target, s); err != nil {
		return err
	}
	defer unix.Unmount(target, unix.MNT_DETACH)
	if err := freeze(target); err != nil {
		return err
	}
	if _, err := m.Replace(ctx, target, Stack{Layers: scratch, Upper: 4, Lowers: []uint64{3, 2, 1}}); err != nil {
		return err
	}
	return unix.Unmount(target, 0)
}
