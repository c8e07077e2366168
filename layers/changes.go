package layers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"strata/layers/meta"
)

// Changes returns what checkpoint id changed, sorted by path: against its
// parent ("" as against), against the live directory (AgainstLive), or
// against another checkpoint of the same directory (its id).
//
// The two states compared, older and newer:
//   - against "": the state below the checkpoint's own layer (its layer's
//     parent chain), and the checkpoint. That is its parent checkpoint's
//     state; after the parent was deleted and squashed into it, the state
//     of the nearest older layer kept. A checkpoint whose layer is the
//     base of its chain has none: the enrollment checkpoint has no
//     changes (an empty list), and a later one whose older layers were all
//     squashed into it is compared with an empty directory (everything in
//     it added).
//   - AgainstLive: the checkpoint, and the live directory as it is read
//     (read entry by entry, while it may be written: best effort, no
//     freeze).
//   - another checkpoint's id: that checkpoint, and checkpoint id. It must
//     be of the same directory (422 checkpoint_other_directory).
//
// What is listed, exactly: every path whose entry differs between the two
// states. A path present only in the newer state is "added", only in the
// older "deleted"; a subtree added or deleted lists every path in it. An
// entry whose type changed is "modified" with its newer type, the paths
// of its older subtree "deleted" and of its newer one "added". A
// non-directory of the same type is "modified" when its mode, owner
// (uid, gid), size, modification time or symlink target differ, or, when
// all of those are equal, its content. A directory is "modified" only
// when its mode or owner differ (its times and size follow its entries).
// Extended attributes are not compared. The root itself is listed as "."
// when its mode or owner differ. Special files (which a capture refuses)
// are never listed. Type and Size are the newer state's (the older's for
// a deletion); a symlink's size is its target's length.
//
// Against its parent, the cost follows what the checkpoint changed, not
// the size of the directory: only the checkpoint's own layer is walked. A
// whiteout there is a deletion; a directory there that is neither opaque
// nor redirected and was a directory below is merged (only the names the
// layer holds can differ); any other entry is compared in full with what
// was below it (an opaque directory replaces the whole subtree, a
// renamed one shows its old contents at its new place). Against another
// checkpoint or the live directory, the same walk covers the layers of
// both chains above the newest layer they share (walkLayers); chains
// further apart than maxWalkLayers are compared in full.
func (s *Store) Changes(ctx context.Context, id, against string) ([]Change, error) {
	switch against {
	case "":
		return s.changesAgainstParent(ctx, id)
	case AgainstLive:
		return s.changesAgainstLive(ctx, id)
	default:
		return s.changesAgainstCheckpoint(ctx, id, against)
	}
}

// changesAgainstParent walks the checkpoint's own layer (see Changes).
func (s *Store) changesAgainstParent(ctx context.Context, id string) ([]Change, error) {
	var cp *meta.Checkpoint
	var own uint64
	var below []uint64
	unpin, err := s.viewPinned(func(t meta.Tx) (_ []uint64, err error) {
		if cp, err = mustCheckpoint(t, id); err != nil {
			return nil, err
		}
		l, err := t.Layer(cp.Layer)
		if err != nil {
			return nil, err
		}
		own = l.ID
		if below, err = segDirs(t, l.Parent); err != nil {
			return nil, err
		}
		return append([]uint64{own}, below...), nil
	})
	if err != nil {
		return nil, err
	}
	defer unpin()
	if len(below) == 0 && cp.Parent == "" {
		return []Change{}, nil // the enrollment state itself
	}
	newer, err := s.layerTreeOf(append([]uint64{own}, below...), nil)
	if err != nil {
		return nil, err
	}
	defer newer.Close()
	older, err := s.layerTreeOf(below, nil)
	if err != nil {
		return nil, err
	}
	defer older.Close()
	d := &differ{ctx: ctx, older: older, newer: newer}
	if len(below) == 0 {
		// Nothing older is held: everything in it is added (the root,
		// which has nothing to differ from, is not listed).
		if err := d.subtree(newer, "", ChangeAdded); err != nil {
			return nil, err
		}
		return d.sorted(), nil
	}
	if err := d.rootAttrs(); err != nil {
		return nil, err
	}
	if err := d.walkLayers([]string{s.fsDir(own)}, ""); err != nil {
		return nil, err
	}
	return d.sorted(), nil
}

// changesAgainstLive compares checkpoint id with the live directory,
// read through its mount; the layers walked are the live chain's (its
// upper layer first) above the newest layer it shares with the
// checkpoint's: only the upper layer when the live directory goes on
// from the checkpoint (the newest capture or the last restore).
func (s *Store) changesAgainstLive(ctx context.Context, id string) ([]Change, error) {
	var root *meta.Root
	var cpDirs, walk []uint64
	unpin, err := s.viewPinned(func(t meta.Tx) (_ []uint64, err error) {
		cp, err := mustCheckpoint(t, id)
		if err != nil {
			return nil, err
		}
		if root, err = t.Root(cp.Root); err != nil {
			return nil, err
		}
		if root == nil {
			return nil, ErrCheckpointNotFound.With("checkpoint_id", id)
		}
		if cpDirs, err = segDirs(t, cp.Layer); err != nil {
			return nil, err
		}
		if root.State == meta.RootReady {
			if walk, err = layersApart(t, root.Active, cp.Layer); err != nil {
				return nil, err
			}
		}
		return append(slices.Clone(cpDirs), walk...), nil
	})
	if err != nil {
		return nil, err
	}
	defer unpin()
	older, err := s.layerTreeOf(cpDirs, nil)
	if err != nil {
		return nil, err
	}
	defer older.Close()
	live, err := s.liveTree(root)
	if err != nil {
		return nil, err
	}
	defer live.Close()
	return s.compareWalking(ctx, older, live, walk)
}

// changesAgainstCheckpoint compares checkpoint against (older) with id
// (newer), two checkpoints of one directory, walking the layers of their
// chains above the newest one they share.
func (s *Store) changesAgainstCheckpoint(ctx context.Context, id, against string) ([]Change, error) {
	var newerDirs, olderDirs, walk []uint64
	unpin, err := s.viewPinned(func(t meta.Tx) (_ []uint64, err error) {
		cp, err := mustCheckpoint(t, id)
		if err != nil {
			return nil, err
		}
		other, err := mustCheckpoint(t, against)
		if err != nil {
			return nil, err
		}
		if other.Root != cp.Root {
			return nil, ErrCheckpointOtherDirectory.With("checkpoint_id", id).With("against", against)
		}
		if newerDirs, err = segDirs(t, cp.Layer); err != nil {
			return nil, err
		}
		if olderDirs, err = segDirs(t, other.Layer); err != nil {
			return nil, err
		}
		if walk, err = layersApart(t, cp.Layer, other.Layer); err != nil {
			return nil, err
		}
		return append(append(slices.Clone(newerDirs), olderDirs...), walk...), nil
	})
	if err != nil {
		return nil, err
	}
	defer unpin()
	newer, err := s.layerTreeOf(newerDirs, nil)
	if err != nil {
		return nil, err
	}
	defer newer.Close()
	older, err := s.layerTreeOf(olderDirs, nil)
	if err != nil {
		return nil, err
	}
	defer older.Close()
	return s.compareWalking(ctx, older, newer, walk)
}

// maxWalkLayers is the most layers a comparison walks; further apart, two
// states are compared in full.
const maxWalkLayers = 256

// layersApart returns the layers of a's chain and of b's above the newest
// layer both chains hold: every path where the two states can differ is
// one of theirs, or under an opaque or redirected directory of theirs.
// nil when the chains share no layer or more than maxWalkLayers lie
// between them (compare in full then).
func layersApart(t meta.Tx, a, b uint64) ([]uint64, error) {
	ca, err := t.Chain(a)
	if err != nil {
		return nil, err
	}
	cb, err := t.Chain(b)
	if err != nil {
		return nil, err
	}
	inB := make(map[uint64]int, len(cb))
	for i, id := range cb {
		inB[id] = i
	}
	for i, id := range ca {
		if j, ok := inB[id]; ok {
			if i+j > maxWalkLayers {
				return nil, nil
			}
			out := append(slices.Clone(ca[:i]), cb[:j]...)
			if len(out) == 0 {
				return []uint64{}, nil // one layer: nothing can differ
			}
			return out, nil
		}
	}
	return nil, nil
}

// compareWalking lists what changed from older to newer: walking only the
// layer dirs walk where they say where the two can differ (walk not nil),
// in full otherwise.
func (s *Store) compareWalking(ctx context.Context, older, newer tree, walk []uint64) ([]Change, error) {
	if walk == nil {
		return compareTrees(ctx, older, newer)
	}
	dirs := make([]string, len(walk))
	for i, id := range walk {
		dirs[i] = s.fsDir(id)
	}
	d := &differ{ctx: ctx, older: older, newer: newer}
	if err := d.rootAttrs(); err != nil {
		return nil, err
	}
	if err := d.walkLayers(dirs, ""); err != nil {
		return nil, err
	}
	return d.sorted(), nil
}

// compareTrees lists what changed from older to newer, comparing them in
// full (see Changes for what is listed).
func compareTrees(ctx context.Context, older, newer tree) ([]Change, error) {
	d := &differ{ctx: ctx, older: older, newer: newer}
	if err := d.rootAttrs(); err != nil {
		return nil, err
	}
	if err := d.compareDir(""); err != nil {
		return nil, err
	}
	return d.sorted(), nil
}

// differ collects the changes from older to newer.
type differ struct {
	ctx          context.Context
	older, newer tree
	out          []Change
	bufA, bufB   []byte // contentDiffers' buffers, made once
}

func (d *differ) sorted() []Change {
	slices.SortFunc(d.out, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	if d.out == nil {
		return []Change{}
	}
	return d.out
}

// entryType names st's type in Change's words; "" for a special file.
func entryType(st *unix.Stat_t) string {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return TypeFile
	case unix.S_IFDIR:
		return TypeDir
	case unix.S_IFLNK:
		return TypeSymlink
	}
	return ""
}

func (d *differ) add(rel, change string, st *unix.Stat_t) {
	if rel == "" {
		rel = "."
	}
	d.out = append(d.out, Change{Path: rel, Change: change, Type: entryType(st), Size: st.Size})
}

// rootAttrs lists the root when its mode or owner differ.
func (d *differ) rootAttrs() error {
	ost, err := d.older.Lstat("")
	if err != nil {
		return err
	}
	nst, err := d.newer.Lstat("")
	if err != nil {
		return err
	}
	if dirDiffers(&ost, &nst) {
		d.add("", ChangeModified, &nst)
	}
	return nil
}

// dirDiffers: a directory is modified when its mode or owner differ.
func dirDiffers(a, b *unix.Stat_t) bool {
	return a.Mode != b.Mode || a.Uid != b.Uid || a.Gid != b.Gid
}

// subtree lists every path under rel (not rel itself) in t as change.
func (d *differ) subtree(t tree, rel, change string) error {
	if err := d.ctx.Err(); err != nil {
		return err
	}
	names, err := t.ReadDir(rel)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := d.entry(t, path.Join(rel, name), change); err != nil {
			return err
		}
	}
	return nil
}

// entry lists rel and everything under it in t as change.
func (d *differ) entry(t tree, rel, change string) error {
	st, err := t.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) && t == d.newer {
		return nil // removed from the live directory since it was listed
	}
	if err != nil {
		return err
	}
	if entryType(&st) == "" {
		return nil
	}
	d.add(rel, change, &st)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return d.subtree(t, rel, change)
	}
	return nil
}

// compareDir compares the directory rel, present in both, name by name.
func (d *differ) compareDir(rel string) error {
	if err := d.ctx.Err(); err != nil {
		return err
	}
	on, err := d.older.ReadDir(rel)
	if err != nil {
		return err
	}
	nn, err := d.newer.ReadDir(rel)
	if err != nil {
		return err
	}
	i, j := 0, 0
	for i < len(on) || j < len(nn) {
		switch {
		case j == len(nn) || i < len(on) && on[i] < nn[j]:
			if err := d.entry(d.older, path.Join(rel, on[i]), ChangeDeleted); err != nil {
				return err
			}
			i++
		case i == len(on) || nn[j] < on[i]:
			if err := d.entry(d.newer, path.Join(rel, nn[j]), ChangeAdded); err != nil {
				return err
			}
			j++
		default:
			p := path.Join(rel, on[i])
			ost, err := d.older.Lstat(p)
			if err != nil {
				return err
			}
			nst, err := d.newer.Lstat(p)
			if errors.Is(err, fs.ErrNotExist) {
				// Removed from the live directory since it was listed.
				if err := d.entry(d.older, p, ChangeDeleted); err != nil {
					return err
				}
				i++
				j++
				continue
			}
			if err != nil {
				return err
			}
			if err := d.compareEntry(p, &ost, &nst); err != nil {
				return err
			}
			i++
			j++
		}
	}
	return nil
}

// compareEntry compares rel, present in both states, in full.
func (d *differ) compareEntry(rel string, ost, nst *unix.Stat_t) error {
	ot, nt := entryType(ost), entryType(nst)
	switch {
	case ot == "" && nt == "":
		return nil
	case ot == "":
		return d.entry(d.newer, rel, ChangeAdded)
	case nt == "":
		return d.entry(d.older, rel, ChangeDeleted)
	case ot != nt:
		d.add(rel, ChangeModified, nst)
		if ot == TypeDir {
			if err := d.subtree(d.older, rel, ChangeDeleted); err != nil {
				return err
			}
		}
		if nt == TypeDir {
			return d.subtree(d.newer, rel, ChangeAdded)
		}
		return nil
	case nt == TypeDir:
		if dirDiffers(ost, nst) {
			d.add(rel, ChangeModified, nst)
		}
		return d.compareDir(rel)
	}
	differs, err := d.nonDirDiffers(rel, ost, nst)
	if err != nil {
		return err
	}
	if differs {
		d.add(rel, ChangeModified, nst)
	}
	return nil
}

// nonDirDiffers compares a file or a symlink of the same type in both.
func (d *differ) nonDirDiffers(rel string, ost, nst *unix.Stat_t) (bool, error) {
	if ost.Mode != nst.Mode || ost.Uid != nst.Uid || ost.Gid != nst.Gid || ost.Size != nst.Size || ost.Mtim != nst.Mtim {
		return true, nil
	}
	if ost.Mode&unix.S_IFMT == unix.S_IFLNK {
		a, err := d.older.Readlink(rel)
		if err != nil {
			return false, err
		}
		b, err := d.newer.Readlink(rel)
		return a != b, err
	}
	if ost.Dev == nst.Dev && ost.Ino == nst.Ino {
		return false, nil // one file (layers of the same chain)
	}
	return d.contentDiffers(rel)
}

// contentDiffers compares two files' bytes.
func (d *differ) contentDiffers(rel string) (bool, error) {
	a, err := d.older.Open(rel)
	if err != nil {
		return false, err
	}
	defer a.Close()
	b, err := d.newer.Open(rel)
	if err != nil {
		return false, err
	}
	defer b.Close()
	if sameBlocks(a, b) {
		return false, nil // one file, or clones never written since
	}
	if d.bufA == nil {
		d.bufA, d.bufB = make([]byte, 256<<10), make([]byte, 256<<10)
	}
	ba, bb := d.bufA, d.bufB
	for {
		if err := d.ctx.Err(); err != nil {
			return false, err
		}
		na, ea := io.ReadFull(a, ba)
		nb, eb := io.ReadFull(b, bb)
		if !bytes.Equal(ba[:na], bb[:nb]) {
			return true, nil
		}
		aEnd := errors.Is(ea, io.EOF) || errors.Is(ea, io.ErrUnexpectedEOF)
		bEnd := errors.Is(eb, io.EOF) || errors.Is(eb, io.ErrUnexpectedEOF)
		if ea != nil && !aEnd {
			return false, ea
		}
		if eb != nil && !bEnd {
			return false, eb
		}
		if aEnd || bEnd {
			return aEnd != bEnd, nil
		}
	}
}

// walkLayers lists what differs in the directory rel, where every layer
// of dirs that holds it holds a directory that merges with what is below
// it (see Changes): only the names those layers hold there can differ. A
// name that every layer holding it holds as such a directory, over a
// directory in both states, is walked the same way; any other is compared
// in full (an opaque directory replaces a subtree, a renamed one shows its
// old contents at its new place, a whiteout or a file ends the lookup).
func (d *differ) walkLayers(dirs []string, rel string) error {
	if err := d.ctx.Err(); err != nil {
		return err
	}
	seen := map[string]bool{}
	var names []string
	for _, dir := range dirs {
		ns, err := readDirBeneath(dir, rel)
		if err != nil {
			return err
		}
		for _, n := range ns {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	for _, name := range names {
		p := path.Join(rel, name)
		ost, oerr := d.older.Lstat(p)
		if oerr != nil && !errors.Is(oerr, fs.ErrNotExist) {
			return oerr
		}
		nst, nerr := d.newer.Lstat(p)
		if nerr != nil && !errors.Is(nerr, fs.ErrNotExist) {
			return nerr
		}
		switch {
		case oerr != nil && nerr != nil:
			continue // a whiteout over nothing
		case nerr != nil:
			if err := d.entry(d.older, p, ChangeDeleted); err != nil {
				return err
			}
			continue
		case oerr != nil:
			if err := d.entry(d.newer, p, ChangeAdded); err != nil {
				return err
			}
			continue
		}
		if ost.Mode&unix.S_IFMT == unix.S_IFDIR && nst.Mode&unix.S_IFMT == unix.S_IFDIR {
			next, merged, err := mergedIn(dirs, p)
			if err != nil {
				return err
			}
			if merged {
				if dirDiffers(&ost, &nst) {
					d.add(p, ChangeModified, &nst)
				}
				if err := d.walkLayers(next, p); err != nil {
					return err
				}
				continue
			}
		}
		if err := d.compareEntry(p, &ost, &nst); err != nil {
			return err
		}
	}
	return nil
}

// mergedIn reports whether every layer of dirs that holds rel holds a
// directory that merges with what is below (mergesBelow), and returns
// those layers.
func mergedIn(dirs []string, rel string) (next []string, merged bool, err error) {
	for _, dir := range dirs {
		full := filepath.Join(dir, rel)
		var st unix.Stat_t
		if err := unix.Lstat(full, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, false, &os.PathError{Op: "lstat", Path: full, Err: err}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return nil, false, nil
		}
		ok, err := mergesBelow(full)
		if err != nil || !ok {
			return nil, false, err
		}
		next = append(next, dir)
	}
	return next, true, nil
}

// mergesBelow reports whether the layer directory full merges with the
// directory at its own path below: neither opaque nor redirected.
func mergesBelow(full string) (bool, error) {
	if isOpaque(full) {
		return false, nil
	}
	_, err := getXattr(full, xattrRedirect)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP):
		return true, nil
	}
	return false, err
}

// readDirBeneath lists the directory rel of the layer dir, resolved
// beneath it following no symlink: a live upper may have had a directory
// swapped for a symlink since it was looked at.
func readDirBeneath(dir, rel string) ([]string, error) {
	root, err := openDirAt(unix.AT_FDCWD, dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd := root
	if rel != "" && rel != "." {
		if fd, err = openBeneath(root, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW); err != nil {
			return nil, err
		}
	} else if fd, err = unix.Dup(root); err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, rel))
	defer f.Close()
	return f.Readdirnames(-1)
}
