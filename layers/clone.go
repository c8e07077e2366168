package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"strata/internal/fault"
	"strata/layers/meta"
	"strata/layers/overlay"
	"strata/pathpolicy"
)

// A clone is a new managed root whose first upper layer sits on a
// checkpoint's layer: the checkpoint's chain is shared, never copied, and
// the clone's lineage starts at the checkpoint (its Head). Layers belong
// to no root in particular: mark-and-sweep keeps a layer while any
// checkpoint or any root's live chain needs it, so deleting the source's
// checkpoints, or releasing the source, leaves the clone's chain alone.
//
// Crash ordering: the clone's upper layer dir and its mountpoint (an
// empty directory in tmp/) are made first, then the intent (a root record
// in state cloning that names the mountpoint's inode), then one rename
// that refuses to replace puts the mountpoint at the path, then the flag,
// the mount, and the commit (state ready). Recovery finishes a clone
// whose path holds the recorded inode and forgets one whose does not.

// Clone makes path (which must not exist; its parent must) a new managed
// directory whose content is checkpoint id's, sharing its layers. Its
// lineage starts at id: its first checkpoint's parent is id.
func (s *Store) Clone(ctx context.Context, id, path string) error {
	if err := pathpolicy.CheckSyntax(path, s.policy().ExtraProtected); err != nil {
		return err
	}
	release, err := s.begin(path)
	if err != nil {
		return err
	}
	defer release()
	o := s.newOp(ctx, opClone, path)
	err = s.cloneAt(o, id, path)
	o.done(err)
	return err
}

func (s *Store) cloneAt(o *op, id, path string) error {
	cp, _, unpinCP, err := s.lookupPinned(id)
	if err != nil {
		return err
	}
	defer unpinCP()
	// The checks and the intent are one step for the other enrollments
	// and clones: two nested paths must not both pass the nesting check.
	s.enrollMu.Lock()
	locked := true
	defer func() {
		if locked {
			s.enrollMu.Unlock()
		}
	}()
	parent := -1
	defer func() {
		if parent >= 0 {
			unix.Close(parent)
		}
	}()
	var dev uint64
	if err := o.step(stepValidatePath, func() error {
		managed, err := s.allRoots()
		if err != nil {
			return err
		}
		if err := s.policy().CheckNewPath(path, managed); err != nil {
			return err
		}
		if err := s.view(func(t meta.Tx) error {
			r, err := t.RootByPath(path)
			if err == nil && r != nil {
				err = pathpolicy.ErrPathExists(path)
			}
			return err
		}); err != nil {
			return err
		}
		parent, dev, err = s.openNewParent(path)
		return err
	}); err != nil {
		return err
	}
	if err := o.step(stepSpaceCheck, func() error { return s.checkSpace(path, false) }); err != nil {
		return err
	}
	upper, rootID := s.newLayerID(), s.newLayerID()
	defer s.unpin(upper, rootID)
	stage := filepath.Join(s.tmp, "clone-"+strconv.FormatUint(rootID, 10))
	var ino uint64
	if err := o.step(stepPrepare, func() error {
		src, err := openDirAt(unix.AT_FDCWD, s.fsDir(cp.Layer))
		if err != nil {
			return err
		}
		defer unix.Close(src)
		// The new upper's root carries the merged root's attributes, as
		// a restore's does.
		if err := s.makeLayerDir(upper, true, src); err != nil {
			return err
		}
		if err := os.Mkdir(stage, 0o755); err != nil {
			return err
		}
		if ino, err = lstatIno(stage); err != nil {
			return err
		}
		// The intent names both: their entries must be durable first.
		return errors.Join(syncDir(s.layers), syncDir(s.tmp))
	}); err != nil {
		s.removeLayerDir(upper)
		os.Remove(stage)
		return err
	}
	rel, err := filepath.Rel(s.dir, stage)
	if err != nil {
		return err
	}
	root := &meta.Root{ID: rootID, Path: path, Dev: dev, Ino: ino, State: meta.RootCloning, Active: upper, Head: id,
		Move: &meta.MoveIntent{Stage: rel, StageIno: ino}}
	if err := o.step(stepIntent, func() error {
		return s.update(func(t meta.Tx) error {
			// A squash may have replaced the checkpoint's layer since it
			// was read (by one with the same content): use the current one.
			c, err := mustCheckpoint(t, id)
			if err != nil {
				return err
			}
			if err := t.PutLayer(&meta.Layer{ID: upper, Root: rootID, Parent: c.Layer, Created: time.Now().UTC()}); err != nil {
				return err
			}
			if root.Mounted, err = s.stackFor(t, upper, c.Layer); err != nil {
				return err
			}
			return t.PutRoot(root)
		})
	}); err != nil {
		s.removeLayerDir(upper)
		os.Remove(stage)
		return err
	}
	s.enrollMu.Unlock()
	locked = false
	// From here the clone is finished or undone, whatever the request
	// does: a half clone is never left behind.
	o.ctx = context.WithoutCancel(o.ctx)
	if err := o.step(stepPlace, func() error {
		err := unix.Renameat2(unix.AT_FDCWD, stage, parent, filepath.Base(path), unix.RENAME_NOREPLACE)
		switch {
		case errors.Is(err, unix.EEXIST):
			return pathpolicy.ErrPathExists(path)
		case errors.Is(err, unix.EXDEV):
			return pathpolicy.Violation(pathpolicy.CodePathMount, path, filepath.Dir(path), "The directory would be on another mount than the store's.")
		case err != nil:
			return &os.LinkError{Op: "rename", Old: stage, New: path, Err: err}
		}
		// The commit says the directory is at path: the rename must be
		// durable before it.
		return unix.Fsync(parent)
	}); err != nil {
		s.abandonClone(root, -1)
		return err
	}
	if err := s.finishClone(o, root); err != nil {
		if fault.CodeOf(err) == ErrDirectoryMoved.Code {
			// The path leads elsewhere now: whatever is there is not
			// ours to remove. Recovery forgets the clone at the next
			// start unless it is back.
			return err
		}
		s.abandonClone(root, parent)
		return err
	}
	return nil
}

// openNewParent opens the parent of a path to be created, by handle,
// and checks that it is on the store's filesystem: a clone is a rename
// out of the store.
func (s *Store) openNewParent(path string) (fd int, dev uint64, err error) {
	dir := filepath.Dir(path)
	fd, err = openDirAt(unix.AT_FDCWD, dir)
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return -1, 0, pathpolicy.Violation(pathpolicy.CodePathSymlink, path, dir, "The path contains a symlink.")
	case errors.Is(err, unix.ENOENT):
		return -1, 0, pathpolicy.Violation(pathpolicy.CodePathNotFound, path, dir, "The parent directory does not exist.")
	case errors.Is(err, unix.ENOTDIR):
		return -1, 0, pathpolicy.Violation(pathpolicy.CodePathNotDirectory, path, dir, "The parent is not a directory.")
	case err != nil:
		return -1, 0, err
	}
	var st, store unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	if err := unix.Stat(s.tmp, &store); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	if st.Dev != store.Dev {
		unix.Close(fd)
		return -1, 0, pathpolicy.Violation(pathpolicy.CodePathMount, path, dir, "The directory would be on another filesystem than the checkpoint's store.")
	}
	return fd, st.Dev, nil
}

// finishClone runs the steps after the mountpoint is at the path: the
// flag, the mount, the commit. Recovery runs it too; nothing in it
// depends on the caller's context.
func (s *Store) finishClone(o *op, root *meta.Root) error {
	o.ctx = context.WithoutCancel(o.ctx)
	var h *rootHandle
	defer func() { h.Close() }()
	if err := o.step(stepImmutable, func() error {
		var err error
		if h, err = s.openRoot(root); err != nil {
			return err
		}
		if m := h.top(); m != nil {
			if s.ours(m) && root.Mounted.Matches(m.VFSOptions) {
				return nil // mounted before a crash: the flag went first
			}
			return fmt.Errorf("managed root %s: something is mounted on the directory being cloned", root.Path)
		}
		if err := s.immutableAt(root, h); err != nil {
			return err
		}
		// Nothing may have been written into the new directory between
		// the rename and the flag: the mount would hide it.
		fd, err := openDirAt(h.parent, h.name)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if n, err := countEntries(fd); err != nil || n > 0 {
			if err != nil {
				return err
			}
			return busyUnseen(root.Path, nil, "Something was written into the directory while it was being cloned")
		}
		return nil
	}); err != nil {
		return err
	}
	if err := o.step(stepMount, func() error {
		_, err := s.settle(o.ctx, root, h)
		return err
	}); err != nil {
		return err
	}
	return o.step(stepCommit, func() error {
		return s.update(func(t meta.Tx) error {
			r, err := t.Root(root.ID)
			if err != nil {
				return err
			}
			if r == nil || r.State != meta.RootCloning {
				return fmt.Errorf("managed root %s: the clone's record changed under it", root.Path)
			}
			r.State, r.Move = meta.RootReady, nil
			return t.PutRoot(r)
		})
	})
}

// abandonClone undoes a clone that cannot be finished: with parent (an
// fd, -1 for none) the directory it put at the path is unmounted and
// removed when it is still the clone's mountpoint and empty (a directory
// written into meanwhile is left to the writer, plain); then the records,
// the upper layer and the staged mountpoint go.
func (s *Store) abandonClone(root *meta.Root, parent int) {
	name := filepath.Base(root.Path)
	if parent >= 0 {
		if ino, found, err := entryIno(parent, name); err == nil && found && ino == root.Ino {
			s.unplace(root, parent, name)
		}
	}
	err := s.update(func(t meta.Tx) error {
		r, err := t.Root(root.ID)
		if err != nil || r == nil || r.State != meta.RootCloning {
			return err
		}
		if err := t.DeleteLayer(r.Active); err != nil {
			return err
		}
		return t.DeleteRoot(r.ID)
	})
	if err != nil {
		s.log.Error("undo clone: forget its records", "path", root.Path, "err", err)
		return
	}
	if err := s.removeLayerDir(root.Active); err != nil {
		s.log.Error("undo clone: remove its upper layer", "path", root.Path, "err", err)
	}
	if root.Move != nil {
		stage := filepath.Join(s.dir, root.Move.Stage)
		if ino, err := lstatIno(stage); err == nil && ino == root.Move.StageIno {
			os.Remove(stage)
		}
	}
}

// unplace takes the clone's mountpoint away from parent/name: its mount
// (ours, the recorded stack) first, then the flag, then the directory if
// it is empty.
func (s *Store) unplace(root *meta.Root, parent int, name string) {
	h := &rootHandle{parent: parent, name: name}
	for range 4 {
		table, err := mountinfo.GetMounts(nil)
		if err != nil {
			s.log.Error("undo clone: read the mount table", "path", root.Path, "err", err)
			return
		}
		st := stackAt(table, root.Path)
		if len(st) == 0 {
			break
		}
		if !s.ours(st[0]) || !root.Mounted.Matches(st[0].VFSOptions) {
			s.log.Error("undo clone: a mount that is not the clone's covers its directory; left alone", "path", root.Path)
			return
		}
		if lazy, err := overlay.UnmountTop(h.target()); err != nil {
			s.log.Error("undo clone: unmount", "path", root.Path, "err", err)
			return
		} else if lazy {
			s.recordZombie(root.Path, mountDev(st[0]), root.Mounted)
		}
	}
	fd, err := openDirAt(parent, name)
	if err != nil {
		s.log.Error("undo clone: open its directory", "path", root.Path, "err", err)
		return
	}
	ferr := overlay.SetImmutableFD(fd, false)
	unix.Close(fd)
	if ferr != nil {
		s.log.Error("undo clone: clear the immutable flag", "path", root.Path, "err", ferr)
		return
	}
	if err := unix.Unlinkat(parent, name, unix.AT_REMOVEDIR); err != nil {
		s.log.Warn("undo clone: its directory is left in place (written into meanwhile?)", "path", root.Path, "err", err)
	}
}

// resolveClone finishes, at recovery, a clone whose mountpoint reached
// its path, and forgets one whose did not.
func (s *Store) resolveClone(ctx context.Context, r *meta.Root) error {
	parent, err := openDirAt(unix.AT_FDCWD, filepath.Dir(r.Path))
	if err != nil {
		s.log.Info("undoing interrupted clone: its parent is gone", "path", r.Path, "err", err)
		s.abandonClone(r, -1)
		return nil
	}
	defer unix.Close(parent)
	ino, found, err := entryIno(parent, filepath.Base(r.Path))
	if err != nil {
		return err
	}
	if !found || ino != r.Ino {
		s.log.Info("undoing interrupted clone", "path", r.Path)
		s.abandonClone(r, -1)
		return nil
	}
	s.log.Info("finishing interrupted clone", "path", r.Path)
	o := s.newOp(context.WithoutCancel(ctx), opRecoverClone, r.Path)
	err = s.finishClone(o, r)
	o.done(err)
	if err != nil && fault.CodeOf(err) != ErrDirectoryMoved.Code {
		s.abandonClone(r, parent)
	}
	return err
}
