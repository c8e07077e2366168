package layers

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"strata/internal/fault"
	"strata/layers/meta"
	"strata/layers/overlay"
)

// A managed root is a directory inode, not a path name. Its record keeps
// the (device, inode) of the empty mountpoint directory that enrollment
// left at its path; every operation first opens the parent directory
// without following symlinks and checks that the entry with the root's
// name is still that inode, then names the root as (parent fd, name) for
// every later syscall. A rename of an ancestor or a symlink swapped in
// between two steps then changes nothing: the fd still names the same
// parent, and a mountpoint cannot itself be renamed.

// ErrDirectoryMoved answers an operation on a managed root whose recorded
// path no longer leads to it (a parent renamed, the directory replaced).
var ErrDirectoryMoved = fault.New(fault.Conflict, "directory_moved",
	"The managed directory is no longer at its path (a parent was renamed or replaced); move it back and retry.")

// resolve is the open flags' resolution rule for every path the store
// opens on behalf of a managed root: no symlinks, no /proc magic links.
const resolve = unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openDirAt opens the directory name relative to dirfd (AT_FDCWD with an
// absolute name for the first) for reading, refusing symlinks anywhere.
func openDirAt(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: resolve,
		})
		if err != unix.EINTR {
			if err != nil {
				return -1, &os.PathError{Op: "openat2", Path: name, Err: err}
			}
			return fd, nil
		}
	}
}

// mountIDAt is the id of the mount that dirfd/name resolves to (the top
// mount when something is mounted there); name "" means dirfd itself.
func mountIDAt(dirfd int, name string) (uint64, error) {
	var stx unix.Statx_t
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if err := unix.Statx(dirfd, name, flags, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, &os.PathError{Op: "statx", Path: name, Err: err}
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		return 0, errors.New("statx: kernel gave no mount id")
	}
	return stx.Mnt_id, nil
}

// entryIno returns the inode number the directory open at dirfd records
// for name. Unlike a stat, it does not cross into a mount on name: it is
// the mountpoint itself, which is what identifies a managed root.
func entryIno(dirfd int, name string) (ino uint64, found bool, err error) {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false, &os.PathError{Op: "open", Path: ".", Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 16<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, false, &os.PathError{Op: "getdents", Path: name, Err: err}
		}
		if n <= 0 {
			return 0, false, nil
		}
		for off := 0; off < n; {
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			ent := buf[off+19 : off+reclen]
			if i := bytes.IndexByte(ent, 0); i >= 0 {
				ent = ent[:i]
			}
			if string(ent) == name {
				return binary.NativeEndian.Uint64(buf[off:]), true, nil
			}
			off += reclen
		}
	}
}

// rootHandle is an open managed root: its parent directory's fd, its
// name there, and the mounts stacked on it when it was opened.
type rootHandle struct {
	parent int
	name   string
	// stack is every mount at the root, topmost first; empty when
	// nothing is mounted there.
	stack []*mountinfo.Info
	// table is the whole mount table when the handle was opened.
	table []*mountinfo.Info
}

func (h *rootHandle) target() overlay.Target { return overlay.Target{Dir: h.parent, Name: h.name} }

// top is the mount on top of the root, or nil.
func (h *rootHandle) top() *mountinfo.Info {
	if len(h.stack) == 0 {
		return nil
	}
	return h.stack[0]
}

func (h *rootHandle) Close() {
	if h != nil && h.parent >= 0 {
		unix.Close(h.parent)
		h.parent = -1
	}
}

// openRoot opens root by identity. It fails with directory_moved when
// root.Path no longer leads to the root's mountpoint inode; the error
// then says where the root's live mount is now, when the mount table
// shows it. A record from before identities were kept (Ino 0) adopts the
// inode found at its path.
func (s *Store) openRoot(root *meta.Root) (*rootHandle, error) {
	dir, name := filepath.Dir(root.Path), filepath.Base(root.Path)
	for attempt := 0; ; attempt++ {
		h, retry, err := s.tryOpenRoot(root, dir, name)
		if err == nil || !retry || attempt >= 4 {
			return h, err
		}
	}
}

func (s *Store) tryOpenRoot(root *meta.Root, dir, name string) (h *rootHandle, retry bool, err error) {
	moved := func(cause error) error {
		fe := ErrDirectoryMoved.With("path", root.Path)
		if where := s.whereMounted(root); where != "" && where != root.Path {
			fe = fe.With("now_at", where)
		}
		return fe.Wrap(cause)
	}
	pfd, err := openDirAt(unix.AT_FDCWD, dir)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			return nil, false, moved(err)
		}
		return nil, false, err
	}
	h = &rootHandle{parent: pfd, name: name}
	fail := func(err error) (*rootHandle, bool, error) {
		h.Close()
		return nil, false, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return fail(err)
	}
	ino, found, err := entryIno(pfd, name)
	if err != nil {
		return fail(err)
	}
	if !found {
		return fail(moved(fmt.Errorf("%s has no entry %q", dir, name)))
	}
	if root.Ino == 0 {
		// A record from before roots kept their identity: adopt the inode
		// at the path only when it evidently is the root (its live mount
		// on it, or the empty immutable mountpoint of a cold boot).
		if !s.looksLikeRoot(root, pfd, name) {
			return fail(moved(fmt.Errorf("%s does not look like the managed root (no identity recorded)", root.Path)))
		}
		root.Dev, root.Ino = st.Dev, ino
		s.adoptIdentity(root)
	}
	if ino != root.Ino || st.Dev != root.Dev {
		return fail(moved(fmt.Errorf("%s is inode %d:%d, the root is %d:%d", root.Path, st.Dev, ino, root.Dev, root.Ino)))
	}
	table, err := mountinfo.GetMounts(nil)
	if err != nil {
		return fail(fmt.Errorf("read mountinfo: %w", err))
	}
	h.table = table
	h.stack = stackAt(table, root.Path)
	// The mount table names mounts by path: check that the path, read
	// through the parent fd, leads to the same top mount.
	got, err := mountIDAt(pfd, name)
	if err != nil {
		return fail(err)
	}
	want, err := mountIDAt(pfd, "")
	if err != nil {
		return fail(err)
	}
	if top := h.top(); top != nil {
		want = uint64(top.ID)
	}
	if got != want {
		h.Close()
		return nil, true, fmt.Errorf("managed root %s: mount table changed while it was read (mount %d, expected %d)", root.Path, got, want)
	}
	return h, false, nil
}

// looksLikeRoot reports whether dirfd/name is root's mountpoint by what
// can be seen: our overlay with the root's upper on top of it, or, with
// nothing mounted, an empty directory with the immutable flag.
func (s *Store) looksLikeRoot(root *meta.Root, dirfd int, name string) bool {
	table, err := mountinfo.GetMounts(nil)
	if err != nil {
		return false
	}
	if st := stackAt(table, root.Path); len(st) > 0 {
		up, ok := s.upperOf(st[0])
		return ok && (up == root.Active || up == root.Mounted.Upper)
	}
	fd, err := openDirAt(dirfd, name)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil || flags&0x10 == 0 { // FS_IMMUTABLE_FL
		return false
	}
	n, err := countEntries(fd)
	return err == nil && n == 0
}

// adoptIdentity records the identity of a root enrolled before the store
// kept one. Failure is logged: the next operation adopts it again.
func (s *Store) adoptIdentity(root *meta.Root) {
	err := s.update(func(t meta.Tx) error {
		r, err := t.Root(root.ID)
		if err != nil || r == nil {
			return err
		}
		r.Dev, r.Ino = root.Dev, root.Ino
		return t.PutRoot(r)
	})
	if err != nil {
		s.log.Error("record managed root identity", "path", root.Path, "err", err)
	}
}

// stackAt returns every mount whose mountpoint is path, topmost first. A
// mount slid beneath another sits between that one and its parent, so
// the order comes from the parent links, not from the table's order.
func stackAt(table []*mountinfo.Info, path string) []*mountinfo.Info {
	var at []*mountinfo.Info
	ids := map[int]*mountinfo.Info{}
	for _, m := range table {
		if m.Mountpoint == path {
			at = append(at, m)
			ids[m.ID] = m
		}
	}
	if len(at) == 0 {
		return nil
	}
	// The top is the one no other mount here has as its parent.
	isParent := map[int]bool{}
	for _, m := range at {
		isParent[m.Parent] = true
	}
	var top *mountinfo.Info
	for _, m := range at {
		if !isParent[m.ID] {
			top = m
			break
		}
	}
	if top == nil {
		top = at[len(at)-1]
	}
	out := make([]*mountinfo.Info, 0, len(at))
	for m := top; m != nil && len(out) < len(at); m = ids[m.Parent] {
		out = append(out, m)
	}
	return out
}

// whereMounted returns the mountpoint of a live overlay of ours whose
// upper layer is root's active one, or "" when the table shows none.
func (s *Store) whereMounted(root *meta.Root) string {
	table, err := mountinfo.GetMounts(func(m *mountinfo.Info) (bool, bool) { return m.FSType != "overlay", false })
	if err != nil {
		return ""
	}
	for _, m := range table {
		if up, ok := s.upperOf(m); ok && (up == root.Active || up == root.Mounted.Upper) {
			return m.Mountpoint
		}
	}
	return ""
}

// upperOf returns the layer id of an overlay mount's upper layer when the
// mount is one of this store's and writable-stacked.
func (s *Store) upperOf(m *mountinfo.Info) (uint64, bool) {
	if !s.ours(m) {
		return 0, false
	}
	upper, _ := overlay.ParseOptions(m.VFSOptions, s.layers)
	return overlay.LayerIDOf(s.layers, upper)
}

// mountDev is the device number of a mount's superblock.
func mountDev(m *mountinfo.Info) uint64 {
	return unix.Mkdev(uint32(m.Major), uint32(m.Minor))
}

// checkOneWriter refuses to mount a stack whose upper layer is already the
// upper of a live superblock, other than replacing, the frozen top being
// replaced. Two writable overlays on one upper would let writes through
// one land in a layer the other is about to seal. The upper in use
// elsewhere means the root's live mount is elsewhere: directory_moved,
// with where.
func (s *Store) checkOneWriter(path string, table []*mountinfo.Info, upper uint64, replacing *mountinfo.Info) error {
	if upper == 0 {
		return nil
	}
	for _, m := range table {
		up, ok := s.upperOf(m)
		if !ok || up != upper {
			continue
		}
		if replacing != nil && mountDev(m) == mountDev(replacing) && overlay.Frozen(m.Options, m.VFSOptions) {
			continue // the frozen stack being swapped out (or a bind of it)
		}
		return ErrDirectoryMoved.With("path", path).With("now_at", m.Mountpoint).
			Wrap(fmt.Errorf("layer %d is already the upper layer of the overlay at %s", upper, m.Mountpoint))
	}
	return nil
}
