package layers

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"strata/internal/failpoint"
)

// moveMountBeneath is MOVE_MOUNT_BENEATH (Linux 6.5), not yet named in x/sys.
const moveMountBeneath = 0x200

// fsMounter builds stacks with fsopen/fsconfig/fsmount and swaps them in
// with move_mount(MOVE_MOUNT_BENEATH): the directory is never empty. Every
// kernel with "lowerdir+" (6.8) also has MOVE_MOUNT_BENEATH (6.5).
type fsMounter struct {
	// probe: the startup probe's mounter, which is no crash point.
	probe bool
}

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

func (m *fsMounter) Mount(ctx context.Context, t target, s Stack) error {
	mfd, err := m.build(s)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", t.Dir, t.Name, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return &MountError{Op: "move_mount", Target: t.Name, Err: err}
	}
	return nil
}

func (m *fsMounter) Replace(ctx context.Context, t target, s Stack) (bool, error) {
	mfd, err := m.build(s)
	if err != nil {
		return false, err
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", t.Dir, t.Name, unix.MOVE_MOUNT_F_EMPTY_PATH|moveMountBeneath); err != nil {
		return false, &MountError{Op: "move_mount beneath", Target: t.Name, Err: err}
	}
	// The new stack is beneath the old one: a crash here leaves both, the
	// frozen old one on top, and recovery finishes the swap.
	if !m.probe {
		failpoint.Hit(fpSwapBeneath)
	}
	return unmountTop(t)
}

// unmountTop removes the top mount at t: a plain umount when nothing uses
// it, a lazy detach when something does.
func unmountTop(t target) (lazy bool, err error) {
	err = unix.Unmount(t.Path(), unix.UMOUNT_NOFOLLOW)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, unix.EBUSY) {
		return false, &MountError{Op: "umount", Target: t.Name, Err: err}
	}
	if err := unix.Unmount(t.Path(), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		return false, &MountError{Op: "umount lazy", Target: t.Name, Err: err}
	}
	return true, nil
}

// legacyMounter uses mount(2). The option string is cut silently at one
// page, so layers are named relative to the layers directory from a thread
// that has its own working directory (unshare(CLONE_FS) + chdir).
type legacyMounter struct {
	probe bool // see fsMounter
}

func (legacyMounter) Name() string { return "mount2" }

func (legacyMounter) Mount(ctx context.Context, t target, s Stack) error {
	data := s.LegacyData()
	if len(data) >= os.Getpagesize() {
		return &MountError{Op: "mount", Target: t.Name, Err: errors.New("overlay options exceed one page")}
	}
	errc := make(chan error, 1)
	go func() {
		// The thread's fs context is changed for good; LockOSThread without
		// Unlock makes the runtime discard the thread when this goroutine ends.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- &MountError{Op: "unshare CLONE_FS", Target: t.Name, Err: err}
			return
		}
		if err := unix.Chdir(s.Layers); err != nil {
			errc <- &MountError{Op: "chdir", Target: s.Layers, Err: err}
			return
		}
		if err := unix.Mount(s.LegacySource(), t.Path(), "overlay", 0, data); err != nil {
			errc <- &MountError{Op: "mount", Target: t.Name, Err: err}
			return
		}
		errc <- nil
	}()
	return <-errc
}

func (l legacyMounter) Replace(ctx context.Context, t target, s Stack) (bool, error) {
	lazy, err := unmountTop(t)
	if err != nil {
		return false, err
	}
	// Nothing is mounted: a crash here leaves the immutable mountpoint,
	// and recovery mounts the recorded stack.
	if !l.probe {
		failpoint.Hit(fpSwapUnmounted)
	}
	return lazy, l.Mount(ctx, t, s)
}

// freeze makes the overlay superblock at t read-only. It fails with
// EBUSY while any process has a file open for writing on it (a writable
// shared mapping too): the atomic gate of every capture and restore.
func freeze(t target) error {
	if err := unix.Mount("", t.Path(), "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return &MountError{Op: "remount ro", Target: t.Name, Err: err}
	}
	return nil
}

// thaw makes the overlay superblock at t writable again.
func thaw(t target) error {
	if err := unix.Mount("", t.Path(), "", unix.MS_REMOUNT, ""); err != nil {
		return &MountError{Op: "remount rw", Target: t.Name, Err: err}
	}
	return nil
}

// setImmutable sets or clears FS_IMMUTABLE_FL on the directory dir (a
// path the store controls). An immutable empty mountpoint refuses every
// write that would land under a mount while the mount is away, and
// mounting over it still works.
func setImmutable(dir string, on bool) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	return setImmutableFD(fd, on)
}

// setImmutableFD is setImmutable on an open directory.
func setImmutableFD(fd int, on bool) error {
	const fsImmutableFL = 0x10
	dir := "fd " + strconv.Itoa(fd)
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
		return legacyMounter{}, probeOne(ctx, scratch, legacyMounter{probe: true})
	}
	if err := probeOne(ctx, scratch, &fsMounter{probe: true}); err == nil {
		return &fsMounter{}, nil
	}
	if err := probeOne(ctx, scratch, legacyMounter{probe: true}); err != nil {
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
	dfd, err := openDirAt(unix.AT_FDCWD, scratch)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	t := target{Dir: dfd, Name: "m"}
	if err := m.Mount(ctx, t, s); err != nil {
		return err
	}
	defer unix.Unmount(t.Path(), unix.MNT_DETACH)
	if err := freeze(t); err != nil {
		return err
	}
	if _, err := m.Replace(ctx, t, Stack{Layers: scratch, Upper: 4, Lowers: []uint64{3, 2, 1}}); err != nil {
		return err
	}
	return unix.Unmount(t.Path(), 0)
}

// probeNoWrite picks a Mounter without creating anything (the store's
// filesystem is full): the new mount API when the kernel's overlayfs
// takes "lowerdir+" (6.8+), mount(2) otherwise. Nothing is mounted.
func probeNoWrite(dir string, legacy bool) (Mounter, error) {
	if legacy {
		return legacyMounter{}, nil
	}
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return legacyMounter{}, nil
	}
	defer unix.Close(fd)
	if err := unix.FsconfigSetString(fd, "lowerdir+", dir); err != nil {
		return legacyMounter{}, nil
	}
	return &fsMounter{}, nil
}
