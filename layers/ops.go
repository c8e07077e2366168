package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"strata/pathpolicy"
)

// Capture checkpoints the directory at path. The first capture of a
// directory enrolls it as a managed mount root.
func (s *Store) Capture(ctx context.Context, path, name string) (cp Checkpoint, err error) {
	if err := pathpolicy.CheckSyntax(path, s.policy().ExtraProtected); err != nil {
		return Checkpoint{}, err
	}
	release, err := s.begin(path)
	if err != nil {
		return Checkpoint{}, err
	}
	defer release()
	var root *rootRecord
	if err := s.db.View(func(btx *bolt.Tx) error {
		root, err = tx{btx}.rootByPath(path)
		return err
	}); err != nil {
		return Checkpoint{}, err
	}
	if root != nil && root.State == rootEnrolling {
		// An enrollment that failed after its exchange (guestd still
		// running): finish or undo it now, then go on.
		if err := s.resolveEnroll(ctx, root); err != nil {
			return Checkpoint{}, err
		}
		if err := s.db.View(func(btx *bolt.Tx) error {
			root, err = tx{btx}.rootByPath(path)
			return err
		}); err != nil {
			return Checkpoint{}, err
		}
		if root != nil && root.State == rootEnrolling {
			return Checkpoint{}, fmt.Errorf("managed root %s: interrupted enrollment cannot be resolved", path)
		}
		if root != nil {
			o := s.newOp(ctx, "capture", path)
			cp, err = s.capture(o, root, name)
			o.done(err)
			return cp, err
		}
	}
	if root == nil {
		o := s.newOp(ctx, "enroll", path)
		cp, err = s.enroll(o, path, name)
		o.done(err)
		return cp, err
	}
	o := s.newOp(ctx, "capture", path)
	cp, err = s.capture(o, root, name)
	o.done(err)
	return cp, err
}

// enroll turns the plain directory path into a managed mount root and
// takes its first checkpoint. Crash ordering: the new layer dirs are made
// first (orphans until recorded), then the intent is committed, then one
// rename exchange moves the contents into the store and an empty
// immutable directory to path; recovery finds out which side of that
// exchange it is on by inode and finishes or undoes it.
func (s *Store) enroll(o *op, path, name string) (Checkpoint, error) {
	var dev, origIno uint64
	s.enrollMu.Lock()
	locked := true
	defer func() {
		if locked {
			s.enrollMu.Unlock()
		}
	}()
	err := o.step("validate.path", func() error {
		managed, err := s.allRoots()
		if err != nil {
			return err
		}
		if err := s.policy().CheckEnroll(o.ctx, path, managed); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		dev, origIno = st.Dev, st.Ino
		return nil
	})
	if err != nil {
		return Checkpoint{}, err
	}
	if err := o.step("busy.check", func() error {
		return s.busyError(o.ctx, pathpolicy.Target{Path: path, Dev: dev})
	}); err != nil {
		return Checkpoint{}, err
	}
	if err := o.step("space.check", func() error { return s.checkSpace(path) }); err != nil {
		return Checkpoint{}, err
	}
	base, upper := s.newLayerID(), s.newLayerID()
	defer s.unpin(base, upper)
	rootID := s.newLayerID() // ids share one sequence; a root id never names a dir
	defer s.unpin(rootID)
	intent := &enrollIntent{OrigIno: origIno, Base: base, Checkpoint: newCheckpointID(), Name: name, Created: time.Now().UTC()}
	mountpoint := s.fsDir(base)
	cleanup := func() {
		s.removeLayerDir(base)
		s.removeLayerDir(upper)
	}
	err = o.step("prepare", func() error {
		if err := s.makeLayerDir(base, false, path); err != nil {
			return err
		}
		if err := s.makeLayerDir(upper, true, path); err != nil {
			return err
		}
		ino, err := lstatIno(mountpoint)
		intent.MountpointIno = ino
		return err
	})
	if err != nil {
		cleanup()
		return Checkpoint{}, err
	}
	root := &rootRecord{ID: rootID, Path: path, State: rootEnrolling, Active: upper, Enroll: intent,
		Mounted: Stack{Layers: s.layers, Upper: upper, Lowers: []uint64{base}}}
	err = o.step("intent", func() error {
		return s.db.Update(func(btx *bolt.Tx) error {
			t := tx{btx}
			if err := t.putLayer(&layerRecord{ID: base, Root: rootID, Sealed: true, Created: intent.Created}); err != nil {
				return err
			}
			if err := t.putLayer(&layerRecord{ID: upper, Root: rootID, Parent: base, Created: intent.Created}); err != nil {
				return err
			}
			return t.putRoot(root)
		})
	})
	if err != nil {
		cleanup()
		return Checkpoint{}, err
	}
	// Recorded: the next enrollment's nesting check sees this root.
	s.enrollMu.Unlock()
	locked = false
	// From here the enrollment must be finished or undone: a request that
	// ends (the client hung up) must not stop it half way, with the
	// directory's contents in the store and its path an empty directory.
	o.ctx = context.WithoutCancel(o.ctx)
	undo := func(cause error) (Checkpoint, error) {
		if err := s.abandonEnroll(root); err != nil {
			s.log.Error("undo enrollment", "path", path, "err", err)
		}
		return Checkpoint{}, cause
	}
	if err := o.step("exchange", func() error { return exchange(path, mountpoint) }); err != nil {
		return undo(err)
	}
	// The path is now an empty directory: make it refuse writes at once,
	// so that nothing lands where the mount will hide it.
	immErr := setImmutable(path, true)
	// The gate: after the exchange nothing new can enter the old contents
	// through path, so whoever still holds them held them before; and
	// nothing may have slipped into the empty directory in between.
	if err := o.step("busy.gate", func() error {
		if immErr != nil {
			return immErr
		}
		if err := s.busyError(o.ctx, pathpolicy.Target{Path: mountpoint, Dev: dev}); err != nil {
			return err
		}
		if ents, err := os.ReadDir(path); err != nil || len(ents) > 0 {
			return errors.Join(err, pathpolicy.BusyError(path, nil))
		}
		return nil
	}); err != nil {
		return s.undoExchange(root, err)
	}
	return s.finishEnroll(o, root)
}

// undoExchange puts the user's directory back after a refused enrollment:
// exchange again, move anything that was written into the empty directory
// meanwhile back into the user's (renamed aside on a name clash), forget.
func (s *Store) undoExchange(root *rootRecord, cause error) (Checkpoint, error) {
	path, mountpoint := root.Path, s.fsDir(root.Enroll.Base)
	if err := setImmutable(path, false); err != nil {
		s.log.Error("undo enrollment: clear immutable", "path", path, "err", err)
		return Checkpoint{}, cause
	}
	if err := exchange(path, mountpoint); err != nil {
		s.log.Error("undo enrollment: exchange back", "path", path, "err", err)
		return Checkpoint{}, cause
	}
	ents, _ := os.ReadDir(mountpoint)
	for _, e := range ents {
		dst := filepath.Join(path, e.Name())
		if _, err := os.Lstat(dst); err == nil {
			dst += ".strata-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		}
		if err := os.Rename(filepath.Join(mountpoint, e.Name()), dst); err != nil {
			// Keep the store's copy rather than lose it.
			s.log.Error("undo enrollment: a file written meanwhile stays in the store", "path", path, "name", e.Name(), "err", err)
			return Checkpoint{}, cause
		}
	}
	if err := s.abandonEnroll(root); err != nil {
		s.log.Error("undo enrollment", "path", path, "err", err)
	}
	return Checkpoint{}, cause
}

// finishEnroll runs the steps after the exchange; recovery runs it too.
func (s *Store) finishEnroll(o *op, root *rootRecord) (Checkpoint, error) {
	in := root.Enroll
	if err := o.step("immutable", func() error { return setImmutable(root.Path, true) }); err != nil {
		return Checkpoint{}, err
	}
	if err := o.step("sync", func() error { return syncFS(s.layers) }); err != nil {
		return Checkpoint{}, err
	}
	cp := &checkpointRecord{ID: in.Checkpoint, Root: root.ID, Layer: in.Base, Name: in.Name, Created: in.Created}
	err := o.step("commit", func() error {
		return s.db.Update(func(btx *bolt.Tx) error {
			t := tx{btx}
			seq, err := btx.Bucket(bucketCheckpoints).NextSequence()
			if err != nil {
				return err
			}
			cp.Seq = seq
			root.State, root.Enroll, root.Head = rootReady, nil, cp.ID
			if err := t.putCheckpoint(cp); err != nil {
				return err
			}
			return t.putRoot(root)
		})
	})
	if err != nil {
		return Checkpoint{}, err
	}
	if err := o.step("mount", func() error { return s.mounter.Mount(o.ctx, root.Path, root.Mounted) }); err != nil {
		return Checkpoint{}, err
	}
	return Checkpoint{ID: cp.ID, Path: root.Path, Name: cp.Name, CreatedAt: cp.Created}, nil
}

// abandonEnroll forgets an enrollment whose exchange did not happen (or
// was undone): records first, then the layer dirs.
func (s *Store) abandonEnroll(root *rootRecord) error {
	err := s.db.Update(func(btx *bolt.Tx) error {
		t := tx{btx}
		if err := t.deleteLayer(root.Enroll.Base); err != nil {
			return err
		}
		if err := t.deleteLayer(root.Active); err != nil {
			return err
		}
		return t.deleteRoot(root.ID)
	})
	if err != nil {
		return err
	}
	return errors.Join(s.removeLayerDir(root.Enroll.Base), s.removeLayerDir(root.Active))
}

// capture seals the active layer of a managed root as a checkpoint and
// mounts a fresh one on top. Crash ordering: the new layer dir is an
// orphan until the commit; the old mount is frozen read-only before the
// commit, so nothing written after the freeze can be lost or land in a
// sealed layer; after the commit, recovery mounts the new stack.
func (s *Store) capture(o *op, root *rootRecord, name string) (Checkpoint, error) {
	if err := o.step("mount.check", func() error { return s.ensureMounted(o.ctx, root) }); err != nil {
		return Checkpoint{}, err
	}
	path := root.Path
	if err := o.step("validate.mounts", func() error { return s.cfg.Policy.CheckNoMountsBelow(path) }); err != nil {
		return Checkpoint{}, err
	}
	unpinOld := s.pin(root.Mounted.Dirs()...)
	defer unpinOld()
	if err := o.step("busy.check", func() error { return s.busyCheckMounted(o.ctx, root) }); err != nil {
		return Checkpoint{}, err
	}
	if err := o.step("space.check", func() error { return s.checkSpace(path) }); err != nil {
		return Checkpoint{}, err
	}
	if len(root.Mounted.Lowers) > syncCompactDepth {
		// Background compaction fell behind; catch up before this stack
		// grows further. It reads only sealed layers.
		if err := o.step("compact", func() error {
			s.compactMu.Lock()
			defer s.compactMu.Unlock()
			return s.compactRoot(o.ctx, root.ID)
		}); err != nil {
			return Checkpoint{}, err
		}
	}
	sealed := root.Active
	next := s.newLayerID()
	defer s.unpin(next)
	if err := o.step("prepare", func() error { return s.makeLayerDir(next, true, "") }); err != nil {
		s.removeLayerDir(next)
		return Checkpoint{}, err
	}
	fail := func(err error, thawOld bool) (Checkpoint, error) {
		if thawOld {
			if terr := thaw(path); terr != nil {
				s.log.Error("thaw after failed capture", "path", path, "err", terr)
			}
		}
		s.removeLayerDir(next)
		return Checkpoint{}, err
	}
	if err := o.step("freeze", func() error { return s.freezeOrBusy(o.ctx, root) }); err != nil {
		return fail(err, false)
	}
	if err := o.step("validate.layer", func() error {
		return pathpolicy.CheckTree(o.ctx, s.fsDir(sealed), true, func(rel string) string { return filepath.Join(path, rel) })
	}); err != nil {
		return fail(err, true)
	}
	if err := o.step("seal", func() error {
		if err := copyDirAttrs(s.fsDir(sealed), s.fsDir(next)); err != nil {
			return err
		}
		return syncFS(s.layers)
	}); err != nil {
		return fail(err, true)
	}
	cp := &checkpointRecord{ID: newCheckpointID(), Root: root.ID, Layer: sealed, Name: name, Created: time.Now().UTC(), Parent: root.Head}
	newRoot := *root
	squash := false
	err := o.step("commit", func() error {
		return s.db.Update(func(btx *bolt.Tx) error {
			t := tx{btx}
			l, err := t.layer(sealed)
			if err != nil {
				return err
			}
			l.Sealed = true
			if err := t.putLayer(l); err != nil {
				return err
			}
			if err := t.putLayer(&layerRecord{ID: next, Root: root.ID, Parent: sealed, Created: cp.Created}); err != nil {
				return err
			}
			if cp.Seq, err = btx.Bucket(bucketCheckpoints).NextSequence(); err != nil {
				return err
			}
			if err := t.putCheckpoint(cp); err != nil {
				return err
			}
			stack, err := s.stackFor(t, next, sealed)
			if err != nil {
				return err
			}
			// Sealing the only child of a layer no checkpoint names makes
			// that layer squashable.
			squash = l.Parent != 0 && !t.referenced(l.Parent)
			newRoot.Active, newRoot.Head, newRoot.Mounted = next, cp.ID, stack
			return t.putRoot(&newRoot)
		})
	})
	if err != nil {
		return fail(err, true)
	}
	// Committed: the swap must run even if the request has ended, or the
	// directory stays frozen on the old stack.
	o.ctx = context.WithoutCancel(o.ctx)
	if err := o.step("mount.swap", func() error { return s.swapOrRecover(o.ctx, root, &newRoot) }); err != nil {
		return Checkpoint{}, err
	}
	s.kick(root.ID, squash)
	return Checkpoint{ID: cp.ID, Path: path, Name: cp.Name, CreatedAt: cp.Created, ParentID: cp.Parent}, nil
}

// Restore puts the directory of checkpoint id back to its content: a
// fresh upper layer on the checkpoint's layer chain. Unsaved changes of
// the live directory are discarded; every checkpoint stays restorable.
func (s *Store) Restore(ctx context.Context, id string) (Checkpoint, error) {
	_, root, err := s.lookup(id)
	if err != nil {
		return Checkpoint{}, err
	}
	release, err := s.begin(root.Path)
	if err != nil {
		return Checkpoint{}, err
	}
	defer release()
	o := s.newOp(ctx, "restore", root.Path)
	res, err := s.restore(o, id)
	if err == nil {
		// After restore's pins are gone: the discarded upper goes now,
		// and a layer whose other child it was may be squashable.
		s.collect(ctx)
		s.kick(root.ID, true)
	}
	o.done(err)
	return res, err
}

// restore: the new upper is an orphan until the commit; the old mount is
// frozen first, so its unsaved changes stop changing; the commit drops the
// old upper's record and recovery mounts the new stack.
func (s *Store) restore(o *op, id string) (Checkpoint, error) {
	// Re-read under the operation claim: a delete may have won the race.
	cp, root, err := s.lookup(id)
	if err != nil {
		return Checkpoint{}, err
	}
	path := root.Path
	if err := o.step("mount.check", func() error { return s.ensureMounted(o.ctx, root) }); err != nil {
		return Checkpoint{}, err
	}
	unpinOld := s.pin(root.Mounted.Dirs()...)
	defer unpinOld()
	if err := o.step("validate.mounts", func() error { return s.cfg.Policy.CheckNoMountsBelow(path) }); err != nil {
		return Checkpoint{}, err
	}
	if err := o.step("busy.check", func() error { return s.busyCheckMounted(o.ctx, root) }); err != nil {
		return Checkpoint{}, err
	}
	if err := o.step("space.check", func() error { return s.checkSpace(path) }); err != nil {
		return Checkpoint{}, err
	}
	defer s.pin(cp.Layer)()
	next := s.newLayerID()
	defer s.unpin(next)
	if err := o.step("prepare", func() error {
		if err := s.makeLayerDir(next, true, s.fsDir(cp.Layer)); err != nil {
			return err
		}
		// The commit names it: its rename into layers/ must be durable
		// first (bbolt's fdatasync does not commit the fs journal).
		return syncDir(s.layers)
	}); err != nil {
		s.removeLayerDir(next)
		return Checkpoint{}, err
	}
	if err := o.step("freeze", func() error { return s.freezeOrBusy(o.ctx, root) }); err != nil {
		s.removeLayerDir(next)
		return Checkpoint{}, err
	}
	discarded := root.Active
	newRoot := *root
	err = o.step("commit", func() error {
		return s.db.Update(func(btx *bolt.Tx) error {
			t := tx{btx}
			// Squashing may have replaced the checkpoint's layer by one with
			// the same content since it was read: use the current one.
			c, err := t.mustCheckpoint(id)
			if err != nil {
				return err
			}
			if err := t.deleteLayer(discarded); err != nil {
				return err
			}
			if err := t.putLayer(&layerRecord{ID: next, Root: root.ID, Parent: c.Layer, Created: time.Now().UTC()}); err != nil {
				return err
			}
			stack, err := s.stackFor(t, next, c.Layer)
			if err != nil {
				return err
			}
			newRoot.Active, newRoot.Head, newRoot.Mounted = next, cp.ID, stack
			if err := t.putRoot(&newRoot); err != nil {
				return err
			}
			// The discarded upper may have been the last user of a branch.
			return s.sweepRecords(t)
		})
	})
	if err != nil {
		if terr := thaw(path); terr != nil {
			s.log.Error("thaw after failed restore", "path", path, "err", terr)
		}
		s.removeLayerDir(next)
		return Checkpoint{}, err
	}
	o.ctx = context.WithoutCancel(o.ctx) // committed: the swap must run
	if err := o.step("mount.swap", func() error { return s.swapOrRecover(o.ctx, root, &newRoot) }); err != nil {
		return Checkpoint{}, err
	}
	return Checkpoint{ID: cp.ID, Path: path}, nil
}

// Delete removes checkpoint id's record, never the live directory. Layers
// that no checkpoint and no live directory needs any more are freed.
func (s *Store) Delete(ctx context.Context, id string) error {
	_, root, err := s.lookup(id)
	if err != nil {
		return err
	}
	release, err := s.begin(root.Path)
	if err != nil {
		return err
	}
	defer release()
	o := s.newOp(ctx, "delete", root.Path)
	err = o.step("commit", func() error {
		return s.db.Update(func(btx *bolt.Tx) error {
			t := tx{btx}
			c, err := t.mustCheckpoint(id)
			if err != nil {
				return err
			}
			if err := t.deleteCheckpoint(c); err != nil {
				return err
			}
			return s.sweepRecords(t)
		})
	})
	if err == nil {
		o.ctx = context.WithoutCancel(o.ctx) // committed: report success
		err = o.step("collect", func() error { s.collect(o.ctx); return nil })
		s.kick(root.ID, true)
	}
	o.done(err)
	return err
}

// swapOrRecover swaps after a commit. The commit cannot be taken back (the
// old upper is sealed), so a failed swap is retried the way startup would
// do it before the operation reports failure; if that fails too, the next
// operation on the root or the next start tries again.
func (s *Store) swapOrRecover(ctx context.Context, old, newRoot *rootRecord) error {
	err := s.swap(ctx, old, newRoot)
	if err == nil {
		return nil
	}
	s.log.Error("swap after commit failed; retrying as recovery would", "path", old.Path, "err", err)
	if rerr := s.ensureMounted(ctx, newRoot); rerr != nil {
		return errors.Join(err, rerr)
	}
	return nil
}

// mustCheckpoint returns checkpoint id, or checkpoint_not_found.
func (t tx) mustCheckpoint(id string) (*checkpointRecord, error) {
	c, err := t.checkpoint(id)
	if err == nil && c == nil {
		err = ErrCheckpointNotFound.With("checkpoint_id", id)
	}
	return c, err
}

// lookup returns checkpoint id and its root, or checkpoint_not_found.
func (s *Store) lookup(id string) (cp *checkpointRecord, root *rootRecord, err error) {
	err = s.db.View(func(btx *bolt.Tx) error {
		t := tx{btx}
		if cp, err = t.checkpoint(id); err != nil || cp == nil {
			return err
		}
		root, err = t.root(cp.Root)
		return err
	})
	if err == nil && (cp == nil || root == nil) {
		err = ErrCheckpointNotFound.With("checkpoint_id", id)
	}
	return cp, root, err
}

// stackFor is the mount stack for an upper layer on top of layer top,
// served by the fewest segments the spans allow.
func (s *Store) stackFor(t tx, upper, top uint64) (Stack, error) {
	segs, err := t.decompose(top)
	if err != nil {
		return Stack{}, err
	}
	if len(segs) > maxLowers {
		return Stack{}, fmt.Errorf("layer chain of %d segments exceeds overlayfs's %d lower layers", len(segs), maxLowers)
	}
	st := Stack{Layers: s.layers, Upper: upper, Lowers: make([]uint64, len(segs))}
	for i, sg := range segs {
		st.Lowers[i] = sg.dir
	}
	return st, nil
}

// maxLowers is overlayfs's limit of lower layers per mount.
const maxLowers = 500

// syncCompactDepth is the stack depth at which a capture compacts in line
// instead of leaving it to the background worker.
const syncCompactDepth = 64
