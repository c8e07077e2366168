package layers

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"strata/layers/meta"
)

// A tree is a read-only view of a directory tree, addressed by paths
// relative to its root ("" is the root; slash-separated, clean, never
// ".."): a checkpoint's layered view (layerTree, read from the layer dirs
// the way overlayfs looks them up, without mounting) or a plain directory
// such as the live mount (dirTree, read by handle). Nothing is followed:
// a symlink is an entry, never a way elsewhere. Absent paths fail with an
// error that matches fs.ErrNotExist.
//
// Reads are not atomic: a dirTree of a directory that is written
// meanwhile shows each entry as it was when it was read.
type tree interface {
	// Lstat returns the entry's stat (a layerTree's: the topmost layer's
	// entry, whose device and inode are the layer's).
	Lstat(rel string) (unix.Stat_t, error)
	// ReadDir returns a directory's names, sorted.
	ReadDir(rel string) ([]string, error)
	// Open opens a regular file for reading.
	Open(rel string) (*os.File, error)
	// Readlink returns a symlink's target.
	Readlink(rel string) (string, error)
	// Xattrs returns an entry's user.* and security.* xattrs (the ones a
	// copy keeps); never overlayfs's own.
	Xattrs(rel string) ([]xattr, error)
	// Close releases what the tree holds (fds, pins).
	Close() error
}

// xattr is one extended attribute.
type xattr struct {
	Name  string
	Value []byte
}

// keptXattr reports whether a copy keeps the xattr name: user.* and
// security.*, never trusted.* (overlayfs's own markers live there) nor
// system.* (ACLs follow the mode bits on the filesystems we serve).
func keptXattr(name string) bool {
	return strings.HasPrefix(name, "user.") || strings.HasPrefix(name, "security.")
}

// notExist is the error of an absent path of a tree.
func notExist(rel string) error {
	return &fs.PathError{Op: "lookup", Path: rel, Err: fs.ErrNotExist}
}

// layerTree is the view of a stack of layer directories, topmost first,
// as an overlay mount of them would show it, read without mounting:
// stackView's lookups (redirects, opaque directories, whiteouts), every
// resolved path cached, so a walk costs one lookup per entry.
type layerTree struct {
	v     *stackView
	nodes map[string]*layerNode
	unpin func()
}

// layerNode is one resolved entry of a layerTree.
type layerNode struct {
	found []layerPath // where the layers hold it, topmost first
	st    unix.Stat_t // the topmost one's stat
	dir   mergedDir   // a directory's layers, for the lookups inside it
}

// newLayerTree is the view of the layer dirs (topmost first). unpin, when
// set, is called by Close (the dirs' pins).
func newLayerTree(dirs []string, unpin func()) (*layerTree, error) {
	if len(dirs) == 0 {
		return nil, errors.New("layer view: no layers")
	}
	v := &stackView{dirs: dirs, nsrc: len(dirs)}
	root := &layerNode{}
	if err := unix.Lstat(dirs[0], &root.st); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: dirs[0], Err: err}
	}
	for l := range dirs {
		root.found = append(root.found, layerPath{layer: l})
	}
	root.dir.srcs = root.found
	return &layerTree{v: v, nodes: map[string]*layerNode{"": root}, unpin: unpin}, nil
}

// emptyTree is a view of an empty directory (the state before anything).
func emptyTree() (*layerTree, error) {
	dir, err := os.MkdirTemp("", "strata-empty-")
	if err != nil {
		return nil, err
	}
	return newLayerTree([]string{dir}, func() { os.Remove(dir) })
}

func (lt *layerTree) Close() error {
	if lt.unpin != nil {
		lt.unpin()
		lt.unpin = nil
	}
	return nil
}

// node resolves rel, parent by parent.
func (lt *layerTree) node(rel string) (*layerNode, error) {
	if n, ok := lt.nodes[rel]; ok {
		return n, nil
	}
	if rel == "." || rel == "" {
		return lt.nodes[""], nil
	}
	dir, name := path.Split(rel)
	parent, err := lt.node(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return nil, err
	}
	if parent.st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, &fs.PathError{Op: "lookup", Path: rel, Err: unix.ENOTDIR}
	}
	return lt.child(parent, rel, name)
}

// child looks up name in the directory parent (at rel's parent).
func (lt *layerTree) child(parent *layerNode, rel, name string) (*layerNode, error) {
	if len(lt.nodes) > maxCachedNodes {
		// A walk of a huge tree: start the cache over rather than hold it
		// all (each entry is looked up again from the root when asked).
		root := lt.nodes[""]
		clear(lt.nodes)
		lt.nodes[""] = root
	}
	found, st, child, err := lt.v.lookup(&parent.dir, name)
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, notExist(rel)
	}
	n := &layerNode{found: found, st: st, dir: child}
	lt.nodes[rel] = n
	return n, nil
}

// maxCachedNodes bounds a layerTree's cache of resolved paths.
const maxCachedNodes = 1 << 18

// real is the path of rel's topmost entry in its layer.
func (lt *layerTree) real(n *layerNode) string {
	return filepath.Join(lt.v.dirs[n.found[0].layer], n.found[0].path)
}

func (lt *layerTree) Lstat(rel string) (unix.Stat_t, error) {
	n, err := lt.node(rel)
	if err != nil {
		return unix.Stat_t{}, err
	}
	return n.st, nil
}

func (lt *layerTree) ReadDir(rel string) ([]string, error) {
	n, err := lt.node(rel)
	if err != nil {
		return nil, err
	}
	if n.st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, &fs.PathError{Op: "readdir", Path: rel, Err: unix.ENOTDIR}
	}
	names, err := lt.v.dirNames(&n.dir)
	if err != nil {
		return nil, err
	}
	out := names[:0]
	for _, name := range names {
		// Whiteouts, and files under a directory above them, hide names.
		if _, err := lt.child(n, path.Join(rel, name), name); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, err
		}
		out = append(out, name)
	}
	return out, nil
}

func (lt *layerTree) Open(rel string) (*os.File, error) {
	n, err := lt.node(rel)
	if err != nil {
		return nil, err
	}
	if n.st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, &fs.PathError{Op: "open", Path: rel, Err: unix.EINVAL}
	}
	p := lt.real(n)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

func (lt *layerTree) Readlink(rel string) (string, error) {
	n, err := lt.node(rel)
	if err != nil {
		return "", err
	}
	return os.Readlink(lt.real(n))
}

func (lt *layerTree) Xattrs(rel string) ([]xattr, error) {
	n, err := lt.node(rel)
	if err != nil {
		return nil, err
	}
	p := lt.real(n)
	return readXattrs(func() ([]string, error) { return listXattrs(p) }, func(name string) ([]byte, error) { return getXattr(p, name) })
}

// readXattrs reads the kept xattrs (keptXattr) of one entry.
func readXattrs(list func() ([]string, error), get func(string) ([]byte, error)) ([]xattr, error) {
	names, err := list()
	if err != nil {
		return nil, err
	}
	var out []xattr
	for _, name := range names {
		if !keptXattr(name) {
			continue
		}
		v, err := get(name)
		if errors.Is(err, unix.ENODATA) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, xattr{Name: name, Value: v})
	}
	slices.SortFunc(out, func(a, b xattr) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// dirNames returns the names the layers of dir hold, each once, sorted:
// what overlayfs's readdir merges before it drops the hidden ones.
func (v *stackView) dirNames(dir *mergedDir) ([]string, error) {
	seen := map[string]bool{}
	var names []string
	for _, e := range dir.srcs {
		p := filepath.Join(v.dirs[e.layer], e.path)
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		ents, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return nil, err
		}
		for _, name := range ents {
			if !seen[name] {
				seen[name] = true
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return names, nil
}

// dirTree is a plain directory (the live mount, a released or exported
// directory) read by handle: every path is resolved beneath the root fd
// with no symlinks, no magic links and no mount crossing, so a rename or
// a symlink swapped in cannot lead the read outside it.
type dirTree struct {
	root int
	// the last directory opened, kept for the next entries of a walk
	lastRel string
	lastFD  int
}

// openDirTree opens the directory name of dirfd (AT_FDCWD and an
// absolute path for a directory by path) as a tree; Close closes it.
func openDirTree(dirfd int, name string) (*dirTree, error) {
	fd, err := openDirAt(dirfd, name)
	if err != nil {
		return nil, err
	}
	return &dirTree{root: fd, lastFD: -1}, nil
}

func (d *dirTree) Close() error {
	if d.lastFD >= 0 {
		unix.Close(d.lastFD)
		d.lastFD = -1
	}
	if d.root >= 0 {
		err := unix.Close(d.root)
		d.root = -1
		return err
	}
	return nil
}

// dir returns an fd of the directory rel (owned by d: not to be closed).
func (d *dirTree) dir(rel string) (int, error) {
	if rel == "" || rel == "." {
		return d.root, nil
	}
	if d.lastFD >= 0 && d.lastRel == rel {
		return d.lastFD, nil
	}
	fd, err := openBeneath(d.root, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return -1, err
	}
	if d.lastFD >= 0 {
		unix.Close(d.lastFD)
	}
	d.lastRel, d.lastFD = rel, fd
	return fd, nil
}

// openBeneath opens rel beneath the directory root, following nothing.
func openBeneath(root int, rel string, flags int) (int, error) {
	for {
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return -1, notExist(rel)
			}
			return -1, &os.PathError{Op: "openat2", Path: rel, Err: err}
		}
		return fd, nil
	}
}

// parent returns the fd of rel's parent directory and rel's name in it.
func (d *dirTree) parent(rel string) (int, string, error) {
	dir, name := path.Split(rel)
	fd, err := d.dir(strings.TrimSuffix(dir, "/"))
	return fd, name, err
}

func (d *dirTree) Lstat(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if rel == "" || rel == "." {
		err := unix.Fstat(d.root, &st)
		return st, err
	}
	fd, name, err := d.parent(rel)
	if err != nil {
		return st, err
	}
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return st, notExist(rel)
		}
		return st, &os.PathError{Op: "fstatat", Path: rel, Err: err}
	}
	return st, nil
}

func (d *dirTree) ReadDir(rel string) ([]string, error) {
	fd, err := d.dir(rel)
	if err != nil {
		return nil, err
	}
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	f := os.NewFile(uintptr(dup), rel)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

func (d *dirTree) Open(rel string) (*os.File, error) {
	fd, err := openBeneath(d.root, rel, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		if err == nil {
			err = unix.EINVAL
		}
		return nil, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

func (d *dirTree) Readlink(rel string) (string, error) {
	fd, name, err := d.parent(rel)
	if err != nil {
		return "", err
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, name, buf)
	if err != nil {
		return "", &os.PathError{Op: "readlinkat", Path: rel, Err: err}
	}
	return string(buf[:n]), nil
}

func (d *dirTree) Xattrs(rel string) ([]xattr, error) {
	// An O_PATH fd does not serve xattr calls; /proc's magic link of it
	// does, without following the entry itself (a symlink stays one).
	fd, err := openBeneath(d.root, rel, unix.O_PATH|unix.O_NOFOLLOW)
	if rel == "" || rel == "." {
		fd, err = unix.Openat(d.root, ".", unix.O_PATH|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	p := "/proc/self/fd/" + strconv.Itoa(fd)
	// Listxattr and Getxattr, not the L variants: the magic link is the
	// one thing followed.
	return readXattrs(
		func() ([]string, error) {
			return listXattrsWith(func(b []byte) (int, error) { return unix.Listxattr(p, b) })
		},
		func(name string) ([]byte, error) {
			return getXattrWith(name, func(b []byte) (int, error) { return unix.Getxattr(p, name, b) })
		})
}

// segDirs returns the layer dirs serving the chain of layer top, topmost
// first (0: none).
func segDirs(t meta.Tx, top uint64) ([]uint64, error) {
	if top == 0 {
		return nil, nil
	}
	segs, err := t.Decompose(top)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, len(segs))
	for i, sg := range segs {
		out[i] = sg.Dir
	}
	return out, nil
}

// viewPinned runs fn in a read-only transaction under s.mu and pins the
// layer dirs it returns before the lock is let go: collect, which decides
// under s.mu, sees either the records or the pins. The returned unpin
// releases them.
func (s *Store) viewPinned(fn func(t meta.Tx) ([]uint64, error)) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []uint64
	err := s.view(func(t meta.Tx) (err error) {
		ids, err = fn(t)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		s.pins[id]++
	}
	return func() { s.unpin(ids...) }, nil
}

// layerTreeOf is the view of the given layer dirs (topmost first) of this
// store; unpin is handed to the tree (its Close calls it).
func (s *Store) layerTreeOf(ids []uint64, unpin func()) (*layerTree, error) {
	if len(ids) == 0 {
		if unpin != nil {
			unpin()
		}
		return emptyTree()
	}
	dirs := make([]string, len(ids))
	for i, id := range ids {
		dirs[i] = s.fsDir(id)
	}
	lt, err := newLayerTree(dirs, unpin)
	if err != nil && unpin != nil {
		unpin()
	}
	return lt, err
}

// checkpointTree returns the view of checkpoint id (its layer's chain,
// pinned until the tree is closed), its record and its root's.
func (s *Store) checkpointTree(id string) (*layerTree, *meta.Checkpoint, *meta.Root, error) {
	var cp *meta.Checkpoint
	var root *meta.Root
	var ids []uint64
	unpin, err := s.viewPinned(func(t meta.Tx) (_ []uint64, err error) {
		if cp, err = mustCheckpoint(t, id); err != nil {
			return nil, err
		}
		if root, err = t.Root(cp.Root); err != nil {
			return nil, err
		}
		if root == nil {
			return nil, ErrCheckpointNotFound.With("checkpoint_id", id)
		}
		ids, err = segDirs(t, cp.Layer)
		return ids, err
	})
	if err != nil {
		return nil, nil, nil, err
	}
	lt, err := s.layerTreeOf(ids, unpin)
	if err != nil {
		return nil, nil, nil, err
	}
	return lt, cp, root, nil
}

// liveTree opens the live directory of root (its mount, by handle). The
// directory may be written meanwhile: reads are best effort, entry by
// entry.
func (s *Store) liveTree(root *meta.Root) (*dirTree, error) {
	h, err := s.openRoot(root)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if m := h.top(); m == nil || !s.ours(m) {
		return nil, ErrLiveUnavailable.With("path", root.Path)
	}
	return openDirTree(h.parent, h.name)
}
