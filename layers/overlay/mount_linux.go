package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"strata/internal/failpoint"
)

// MoveMountBeneath is MOVE_MOUNT_BENEATH (Linux 6.5), not yet named in x/sys.
const MoveMountBeneath = 0x200

// fsMounter builds stacks with fsopen/fsconfig/fsmount and swaps them in
// with move_mount(MOVE_MOUNT_BENEATH): the directory is never empty. Every
// kernel with "lowerdir+" (6.8) also has MOVE_MOUNT_BENEATH (6.5).
type fsMounter struct {
	// probe: the startup probe's mounter, which is no crash point.
	probe bool
	opts  Options
}

func (m *fsMounter) Name() string { return "fsmount" }

func (m *fsMounter) Options() Options { return m.opts }

// build creates a detached mount of s and returns its fd.
func (m *fsMounter) build(s Stack) (int, error) {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, &MountError{Op: "fsopen", Target: "overlay", Err: err}
	}
	defer unix.Close(fd)
	for _, kv := range s.Config(m.opts) {
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

func (m *fsMounter) Mount(ctx context.Context, t Target, s Stack) error {
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

func (m *fsMounter) Replace(ctx context.Context, t Target, s Stack) (bool, error) {
	mfd, err := m.build(s)
	if err != nil {
		return false, err
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", t.Dir, t.Name, unix.MOVE_MOUNT_F_EMPTY_PATH|MoveMountBeneath); err != nil {
		return false, &MountError{Op: "move_mount beneath", Target: t.Name, Err: err}
	}
	// The new stack is beneath the old one: a crash here leaves both, the
	// frozen old one on top, and recovery finishes the swap.
	if !m.probe {
		failpoint.Hit(FailpointSwapBeneath)
	}
	return UnmountTop(t)
}

// Hold returns a detached clone of the mount on top of t (open_tree with
// OPEN_TREE_CLONE): another mount of the same superblock, reachable only
// through the returned fd, read-only when the mount is. It keeps the
// superblock alive when the mount itself is unmounted, until the fd is
// closed; the unmount then only detaches, and the superblock's teardown
// (overlayfs writes back the upper's whole filesystem when its last
// mount goes) runs in whoever closes the fd. It does not count as a use
// of the mount: a plain umount of it still succeeds.
func Hold(t Target) (int, error) {
	fd, err := unix.OpenTree(t.Dir, t.Name, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, &MountError{Op: "open_tree clone", Target: t.Name, Err: err}
	}
	return fd, nil
}

// FreezeSuper makes the superblock of the mount open at fd (a clone from
// Hold) read-only: every mount of it, in every mount namespace, refuses
// writes from then on. It writes back the upper's whole filesystem first
// (overlayfs does when its superblock turns read-only). It fails with
// EBUSY while a file is open for writing through any of its mounts.
func FreezeSuper(fd int) error {
	return freezeSuper(fd, "", unix.FSPICK_EMPTY_PATH)
}

// FreezeSuperAt is FreezeSuper for the mount on top of t.
func FreezeSuperAt(t Target) error {
	return freezeSuper(t.Dir, t.Name, 0)
}

func freezeSuper(dirfd int, name string, flags int) error {
	fs, err := unix.Fspick(dirfd, name, flags|unix.FSPICK_CLOEXEC)
	if err != nil {
		return &MountError{Op: "fspick", Target: "held mount", Err: err}
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetFlag(fs, "ro"); err != nil {
		return &MountError{Op: "fsconfig ro", Target: "held mount", Err: err}
	}
	if err := unix.FsconfigReconfigure(fs); err != nil {
		return &MountError{Op: "reconfigure read-only", Target: "held mount", Err: err}
	}
	return nil
}

// ErrExpiredUnmount says that the in-use probe unmounted the mount: an
// expiry mark was left set on it (a crash between the probe and the
// clearing). The caller mounts the stack again.
var ErrExpiredUnmount = errors.New("the in-use probe unmounted the mount (an expiry mark was left set)")

// UnmountTop removes the top mount at t: a plain umount when nothing uses
// it, a lazy detach when something does.
func UnmountTop(t Target) (lazy bool, err error) {
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
	opts  Options
}

func (legacyMounter) Name() string { return "mount2" }

func (l legacyMounter) Options() Options { return l.opts }

func (l legacyMounter) Mount(ctx context.Context, t Target, s Stack) error {
	data := s.LegacyData(l.opts)
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

func (l legacyMounter) Replace(ctx context.Context, t Target, s Stack) (bool, error) {
	lazy, err := UnmountTop(t)
	if err != nil {
		return false, err
	}
	// Nothing is mounted: a crash here leaves the immutable mountpoint,
	// and recovery mounts the recorded stack.
	if !l.probe {
		failpoint.Hit(FailpointSwapUnmounted)
	}
	return lazy, l.Mount(ctx, t, s)
}

// Freeze makes the mount on top of t read-only: this mount only, not its
// superblock (mount_setattr MOUNT_ATTR_RDONLY; remount,bind,ro where that
// call is missing). It fails with EBUSY while any process has a file open
// for writing through the mount (a writable shared mapping too): the
// atomic gate of every capture and restore. Unlike remount,ro of the
// superblock, it writes nothing back: overlayfs syncs the upper's whole
// filesystem when its superblock turns read-only, which put every dirty
// page of unrelated files inside the window in which writers see EROFS.
func Freeze(t Target) error {
	err := unix.MountSetattr(t.Dir, t.Name, 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY})
	if errors.Is(err, unix.ENOSYS) {
		err = unix.Mount("", t.Path(), "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, "")
	}
	if err != nil {
		return &MountError{Op: "make the mount read-only", Target: t.Name, Err: err}
	}
	return nil
}

// InUse reports whether anything uses the mount on top of t: a working
// directory, a root, an open file or a mapping in it, or a mount under
// it. It is the kernel's own answer, atomic and exact for this mount
// namespace, and costs one syscall: umount2(MNT_EXPIRE) fails with EBUSY
// while the mount is used and otherwise only marks it expired (EAGAIN).
// A second MNT_EXPIRE with the mark still set would unmount it, so the
// mark is cleared at once: any reference taken and dropped clears it, and
// an O_PATH open and close is the smallest one.
func InUse(t Target) (bool, error) {
	err := unix.Unmount(t.Path(), unix.MNT_EXPIRE)
	switch {
	case errors.Is(err, unix.EBUSY):
		return true, nil
	case errors.Is(err, unix.EAGAIN):
		var oerr error
		for range 3 {
			var fd int
			if fd, oerr = unix.Open(t.Path(), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); oerr == nil {
				unix.Close(fd)
				return false, nil
			}
		}
		return false, &MountError{Op: "clear expiry mark", Target: t.Name, Err: oerr}
	case err == nil:
		// Only a mark left set could do this: a crash (or a failed
		// clearing) between a probe and its clearing.
		return false, &MountError{Op: "in-use probe", Target: t.Name, Err: ErrExpiredUnmount}
	default:
		return false, &MountError{Op: "in-use probe", Target: t.Name, Err: err}
	}
}

// Thaw makes the mount on top of t writable again, and its superblock
// too: a store from before per-mount freezes froze the superblock.
func Thaw(t Target) error {
	err := unix.MountSetattr(t.Dir, t.Name, 0, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY})
	if errors.Is(err, unix.ENOSYS) {
		err = unix.Mount("", t.Path(), "", unix.MS_REMOUNT|unix.MS_BIND, "")
	}
	if err != nil {
		return &MountError{Op: "make the mount writable", Target: t.Name, Err: err}
	}
	if err := unix.Mount("", t.Path(), "", unix.MS_REMOUNT, ""); err != nil {
		return &MountError{Op: "remount rw", Target: t.Name, Err: err}
	}
	return nil
}

// SetImmutable sets or clears FS_IMMUTABLE_FL on the directory dir (a
// path the store controls). An immutable empty mountpoint refuses every
// write that would land under a mount while the mount is away, and
// mounting over it still works.
func SetImmutable(dir string, on bool) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	return SetImmutableFD(fd, on)
}

// SetImmutableFD is SetImmutable on an open directory.
func SetImmutableFD(fd int, on bool) error {
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

// Probe picks the best Mounter the kernel supports by mounting a tiny
// overlay under scratch (an empty directory on the store's filesystem)
// with each candidate, newest first, asking for the options want. legacy
// forces mount(2). A kernel that refuses redirect_dir=on, or takes it and
// still fails a directory rename with EXDEV, gets a Mounter with
// redirect_dir=off, and refused says why; refused is nil otherwise.
func Probe(ctx context.Context, scratch string, legacy bool, want Options) (m Mounter, refused, err error) {
	kinds := []func(probe bool, o Options) Mounter{
		func(probe bool, o Options) Mounter { return &fsMounter{probe: probe, opts: o} },
		func(probe bool, o Options) Mounter { return legacyMounter{probe: probe, opts: o} },
	}
	if legacy {
		kinds = kinds[1:]
	}
	for _, kind := range kinds {
		err = probeOne(ctx, scratch, kind(true, want))
		if err == nil {
			return kind(false, want), nil, nil
		}
		if !want.RedirectDir || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			continue
		}
		off := want
		off.RedirectDir = false
		if offErr := probeOne(ctx, scratch, kind(true, off)); offErr == nil {
			return kind(false, off), err, nil
		}
	}
	return nil, nil, err
}

// probeOne mounts a two-layer stack, renames a directory of its lower
// layer when m's options let it, swaps the stack for another with
// Replace, and unmounts, all under scratch.
func probeOne(ctx context.Context, scratch string, m Mounter) error {
	if err := os.RemoveAll(scratch); err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	s := Stack{Layers: scratch, Upper: 3, Lowers: []uint64{1}}
	for _, d := range []string{s.FSDir(1) + "/d", s.FSDir(2), s.FSDir(3), s.WorkDir(3), s.FSDir(4), s.WorkDir(4), scratch + "/m"} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	dfd, err := unix.Open(scratch, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: scratch, Err: err}
	}
	defer unix.Close(dfd)
	t := Target{Dir: dfd, Name: "m"}
	if err := m.Mount(ctx, t, s); err != nil {
		return err
	}
	defer unix.Unmount(t.Path(), unix.MNT_DETACH)
	if m.Options().RedirectDir {
		// The kernel may take redirect_dir=on and still not redirect (an
		// upper filesystem without xattrs): what counts is the rename.
		if err := unix.Rename(t.Path()+"/d", t.Path()+"/e"); err != nil {
			return &MountError{Op: "rename a lower directory (redirect_dir=on)", Target: t.Name, Err: err}
		}
	}
	if err := Freeze(t); err != nil {
		return err
	}
	if _, err := m.Replace(ctx, t, Stack{Layers: scratch, Upper: 4, Lowers: []uint64{3, 2, 1}}); err != nil {
		return err
	}
	return unix.Unmount(t.Path(), 0)
}

// ProbeNoWrite picks a Mounter without creating anything (the store's
// filesystem is full): the new mount API when the kernel's overlayfs
// takes "lowerdir+" (6.8+), mount(2) otherwise. Nothing is mounted, so
// redirect_dir=on is checked only as far as fsconfig parses it (mount(2)
// parses the same options the same way); refused is as in Probe.
func ProbeNoWrite(dir string, legacy bool, want Options) (m Mounter, refused error) {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		// No new mount API: nothing to ask without a mount.
		return legacyMounter{opts: want}, nil
	}
	defer unix.Close(fd)
	if want.RedirectDir {
		if err := unix.FsconfigSetString(fd, "redirect_dir", "on"); err != nil {
			refused = &MountError{Op: "fsconfig redirect_dir", Target: "on", Err: err}
			want.RedirectDir = false
		}
	}
	if legacy {
		return legacyMounter{opts: want}, refused
	}
	if err := unix.FsconfigSetString(fd, "lowerdir+", dir); err != nil {
		return legacyMounter{opts: want}, refused
	}
	return &fsMounter{opts: want}, refused
}

// Target is where a mount goes: the entry Name of the directory open at
// Dir. Syscalls that take a path get Path(), which the kernel resolves
// through the fd, not from the root of the filesystem.
type Target struct {
	Dir  int
	Name string
}

// Path names the Target through /proc/self/fd: the kernel follows the fd
// to the parent directory it was opened on, wherever that now is.
func (t Target) Path() string {
	return "/proc/self/fd/" + strconv.Itoa(t.Dir) + "/" + t.Name
}

// ReadOnly reports whether a mount's super options say read-only (a
// frozen stack).
func ReadOnly(vfsOpts string) bool {
	return vfsOpts == "ro" || strings.HasPrefix(vfsOpts, "ro,")
}

// Frozen reports whether a mount is frozen, by mountinfo's mount options
// (a per-mount freeze) and super options (a superblock frozen by an
// earlier version).
func Frozen(mountOpts, superOpts string) bool {
	return ReadOnly(mountOpts) || ReadOnly(superOpts)
}

// StackOf describes a mounted overlay of ours as a read-only Stack (its
// upper listed first among the lowers: what matters is the dirs it uses).
func StackOf(layers, vfsOpts string) Stack {
	upper, lowers := ParseOptions(vfsOpts, layers)
	st := Stack{Layers: layers}
	for _, d := range append([]string{upper}, lowers...) {
		if id, ok := LayerIDOf(layers, d); ok {
			st.Lowers = append(st.Lowers, id)
		}
	}
	return st
}

// LayerIDOf parses "<layers>/<id>/fs".
func LayerIDOf(layers, dir string) (uint64, bool) {
	rest, ok := strings.CutPrefix(dir, layers+"/")
	if !ok {
		return 0, false
	}
	name, ok := strings.CutSuffix(rest, "/fs")
	if !ok {
		return 0, false
	}
	var id uint64
	if _, err := fmt.Sscanf(name, "%d", &id); err != nil {
		return 0, false
	}
	return id, true
}

// Failpoints inside Replace, between two of its syscalls (see
// internal/failpoint); the crash tests kill guestd at each of them.
const (
	// FailpointSwapBeneath: the new stack is slid beneath the frozen old
	// one, which is still on top.
	FailpointSwapBeneath = "mount.swap.beneath"
	// FailpointSwapUnmounted: mount(2) fallback, the old stack is
	// unmounted and the new one not yet mounted.
	FailpointSwapUnmounted = "mount.swap.unmounted"
)

// FSMounter is the Mounter built on the new mount API (kernel 6.8+), with
// DefaultOptions.
func FSMounter() Mounter { return &fsMounter{opts: DefaultOptions} }

// LegacyMounter is the Mounter built on mount(2), with DefaultOptions.
func LegacyMounter() Mounter { return legacyMounter{opts: DefaultOptions} }

// Detached builds a detached mount of s (fsopen, fsconfig, fsmount) with
// DefaultOptions and returns its fd, for a caller that moves it itself
// (tests that stop a swap half way).
func Detached(s Stack) (int, error) { return (&fsMounter{opts: DefaultOptions}).build(s) }
