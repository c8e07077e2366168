package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
	"strata/layers/meta"
	"strata/layers/overlay"
	"strata/pathpolicy"
)

// A release turns a managed root back into a plain directory: its live
// content is copied (cloned where the filesystem can) from the frozen
// live mount into a staging directory in the store, and that directory
// then takes the empty mountpoint's place at the path by one rename
// exchange; the root's records and checkpoints go last, and the layers
// nothing else needs are freed (a clone's chain stays).
//
// Crash ordering: the staging is built in tmp/ (swept at startup), moved
// to release/ and named by the intent (state releasing, the staging's
// inode); then unmount, clear the flag, exchange, commit. Recovery
// finishes a release whose path holds the staging's inode and undoes one
// whose path still holds the mountpoint (the root is ready again,
// remounted from its records): the directory is either managed as before
// or plain with everything, never a mix.

// ErrNotManaged answers a release of a path that is no managed directory.
var ErrNotManaged = fault.New(fault.NotFound, "directory_not_managed", "no managed directory is at this path")

// releaseDir is where a release's staging waits once its intent names
// it, relative to the store dir: unlike tmp/, recovery reads it.
const releaseDir = "release"

// Release turns the managed directory at path back into a plain
// directory holding its live content, and deletes its checkpoints; it
// returns their ids, oldest first.
func (s *Store) Release(ctx context.Context, path string) ([]string, error) {
	if err := pathpolicy.CheckSyntax(path, s.policy().ExtraProtected); err != nil {
		return nil, err
	}
	done, err := s.begin(path)
	if err != nil {
		return nil, err
	}
	defer done()
	root, err := s.rootResolved(ctx, path)
	if err != nil {
		return nil, err
	}
	// An interrupted restore of paths: its hidden names must not become
	// files of the plain directory.
	if err := s.finishPaths(ctx, root); err != nil {
		return nil, err
	}
	o := s.newOp(ctx, opRelease, path)
	ids, err := s.release(o, root)
	o.done(err)
	return ids, err
}

// rootResolved returns the ready root at path, finishing or undoing an
// interrupted operation it was left in first (as Capture does for an
// enrollment), or directory_not_managed.
func (s *Store) rootResolved(ctx context.Context, path string) (*meta.Root, error) {
	for range 2 {
		var root *meta.Root
		if err := s.view(func(t meta.Tx) (err error) {
			root, err = t.RootByPath(path)
			return err
		}); err != nil {
			return nil, err
		}
		switch {
		case root == nil:
			return nil, ErrNotManaged.With("path", path)
		case root.State == meta.RootReady:
			return root, nil
		}
		if err := s.resolvePending(context.WithoutCancel(ctx), root); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("managed root %s: an interrupted operation cannot be resolved", path)
}

func (s *Store) release(o *op, root *meta.Root) ([]string, error) {
	path := root.Path
	var h *rootHandle
	defer func() { h.Close() }()
	if err := o.step(stepMountCheck, func() (err error) {
		h, err = s.openSettled(o.ctx, root)
		return err
	}); err != nil {
		return nil, err
	}
	if err := o.step(stepValidateMounts, func() error { return pathpolicy.CheckNoMountsIn(path, h.table) }); err != nil {
		return nil, err
	}
	unpinOld := s.pin(root.Mounted.Dirs()...)
	unpinned := false
	defer func() {
		if !unpinned {
			unpinOld()
		}
	}()
	var pending func() error
	if err := o.step(stepBusyCheck, func() (err error) {
		pending, err = s.busyCheckMounted(o.ctx, root, h)
		return err
	}); err != nil {
		return nil, err
	}
	if err := o.step(stepSpaceCheck, func() error { return s.checkSpace(path, false) }); err != nil {
		return nil, err
	}
	if err := o.step(stepFreeze, func() error { return s.freezeOrBusy(o.ctx, root, h, pending) }); err != nil {
		return nil, err
	}
	top := h.top()
	name := strconv.FormatUint(root.ID, 10)
	staged := filepath.Join(s.tmp, "release-"+name)
	stage := filepath.Join(s.dir, releaseDir, name)
	fail := func(err error) ([]string, error) {
		if terr := overlay.Thaw(h.target()); terr != nil {
			s.log.Error("thaw after failed release", "path", path, "err", terr)
		}
		os.RemoveAll(staged)
		os.RemoveAll(stage)
		return nil, err
	}
	// The live content, read through the frozen mount: nothing changes
	// it while it is copied.
	if err := o.step(stepMaterialize, func() error {
		live, err := openDirTree(h.parent, h.name)
		if err != nil {
			return err
		}
		defer live.Close()
		tmp, err := openDirAt(unix.AT_FDCWD, s.tmp)
		if err != nil {
			return err
		}
		defer unix.Close(tmp)
		if err := materialize(o.ctx, live, "", tmp, filepath.Base(staged)); err != nil {
			return err
		}
		// The copy replaces the directory: it must be on disk first.
		return syncFS(s.tmp)
	}); err != nil {
		return fail(err)
	}
	move := &meta.MoveIntent{Stage: filepath.Join(releaseDir, name)}
	if err := o.step(stepIntent, func() error {
		if err := os.MkdirAll(filepath.Dir(stage), 0o700); err != nil {
			return err
		}
		if err := os.Rename(staged, stage); err != nil {
			return err
		}
		if err := syncDir(filepath.Dir(stage)); err != nil {
			return err
		}
		ino, err := lstatIno(stage)
		if err != nil {
			return err
		}
		move.StageIno = ino
		return s.update(func(t meta.Tx) error {
			r, err := t.Root(root.ID)
			if err != nil {
				return err
			}
			if r == nil || r.State != meta.RootReady || r.Active != root.Active {
				return fmt.Errorf("managed root %s changed under the release", path)
			}
			r.State, r.Move = meta.RootReleasing, move
			return t.PutRoot(r)
		})
	}); err != nil {
		return fail(err)
	}
	// Recorded: from here the release is finished or undone, whatever the
	// request does.
	o.ctx = context.WithoutCancel(o.ctx)
	relRoot := *root
	relRoot.State, relRoot.Move = meta.RootReleasing, move
	undo := func(cause error) ([]string, error) {
		if err := s.undoRelease(o.ctx, &relRoot); err != nil {
			s.log.Error("undo release", "path", path, "err", err)
		}
		return nil, cause
	}
	if err := o.step(stepUnmount, func() error {
		lazy, err := overlay.UnmountTop(h.target())
		if lazy {
			// Still used (someone came in after the gates): its layers
			// stay until it is gone; it is frozen, so nothing more is
			// written through it.
			s.recordZombie(path, mountDev(top), root.Mounted)
		}
		return err
	}); err != nil {
		return undo(err)
	}
	if err := o.step(stepImmutable, func() error {
		fd, err := openDirAt(h.parent, h.name)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		if st.Ino != root.Ino || st.Dev != root.Dev {
			return ErrDirectoryMoved.With("path", path)
		}
		return overlay.SetImmutableFD(fd, false)
	}); err != nil {
		return undo(err)
	}
	if err := o.step(stepExchange, func() error {
		sfd, err := openDirAt(unix.AT_FDCWD, filepath.Dir(stage))
		if err != nil {
			return err
		}
		defer unix.Close(sfd)
		if err := unix.Renameat2(sfd, name, h.parent, h.name, unix.RENAME_EXCHANGE); err != nil {
			return &os.LinkError{Op: "rename exchange", Old: stage, New: path, Err: err}
		}
		// By name inside the parent: check it took the mountpoint's
		// place, and put it back at once if another directory had been
		// renamed there.
		if ino, found, err := entryIno(h.parent, h.name); err != nil || !found || ino != move.StageIno {
			if xerr := unix.Renameat2(sfd, name, h.parent, h.name, unix.RENAME_EXCHANGE); xerr != nil {
				s.log.Error("undo an exchange with a replaced directory", "path", path, "err", xerr)
			}
			return errors.Join(err, ErrDirectoryMoved.With("path", path))
		}
		return errors.Join(unix.Fsync(h.parent), unix.Fsync(sfd))
	}); err != nil {
		return undo(err)
	}
	// The path is the plain directory now: only forward from here. A
	// failed commit leaves the root releasing; the next Open (or a retry
	// of the release) finishes it.
	var ids []string
	if err := o.step(stepCommit, func() (err error) {
		ids, err = s.commitRelease(root.ID)
		return err
	}); err != nil {
		return nil, err
	}
	unpinOld()
	unpinned = true
	err := o.step(stepCollect, func() error {
		s.removeOldMountpoint(&relRoot, stage)
		s.collect(o.ctx)
		return nil
	})
	return ids, err
}

// commitRelease forgets a released root: its checkpoints (their ids are
// returned, oldest first), its record, and the layers nothing else needs.
// Layers a clone still needs stay, and become the clone's.
func (s *Store) commitRelease(rootID uint64) ([]string, error) {
	var ids []string
	err := s.update(func(t meta.Tx) error {
		ids = nil
		cps, err := t.CheckpointsOf(rootID)
		if err != nil {
			return err
		}
		for _, c := range cps {
			if err := t.DeleteCheckpoint(c); err != nil {
				return err
			}
			ids = append(ids, c.ID)
		}
		if err := t.DeleteRoot(rootID); err != nil {
			return err
		}
		if err := t.Sweep(); err != nil {
			return err
		}
		return adoptLayers(t, rootID)
	})
	return ids, err
}

// adoptLayers gives the layers of a root that is gone to a root whose
// chains still use them (a clone's), so that squash, which works on one
// root's layers, still merges them.
func adoptLayers(t meta.Tx, gone uint64) error {
	all, err := t.Layers()
	if err != nil {
		return err
	}
	seen := map[uint64]bool{}
	walk := func(id, owner uint64) error {
		for id != 0 && !seen[id] {
			seen[id] = true
			l := all[id]
			if l == nil {
				return nil
			}
			if l.Root == gone {
				l.Root = owner
				if err := t.PutLayer(l); err != nil {
					return err
				}
			}
			id = l.Parent
		}
		return nil
	}
	roots, err := t.Roots()
	if err != nil {
		return err
	}
	for _, r := range roots {
		if err := walk(r.Active, r.ID); err != nil {
			return err
		}
	}
	cps, err := t.Checkpoints()
	if err != nil {
		return err
	}
	for _, c := range cps {
		if err := walk(c.Layer, c.Root); err != nil {
			return err
		}
	}
	return nil
}

// undoRelease puts a release whose exchange did not happen back: the
// root is ready again, its recorded stack mounted (thawed if frozen), and
// the staging goes.
func (s *Store) undoRelease(ctx context.Context, root *meta.Root) error {
	err := s.update(func(t meta.Tx) error {
		r, err := t.Root(root.ID)
		if err != nil || r == nil || r.State != meta.RootReleasing {
			return err
		}
		r.State, r.Move = meta.RootReady, nil
		return t.PutRoot(r)
	})
	if err != nil {
		return err
	}
	ready := *root
	ready.State, ready.Move = meta.RootReady, nil
	merr := s.ensureMounted(ctx, &ready)
	if root.Move != nil {
		os.RemoveAll(filepath.Join(s.dir, root.Move.Stage))
	}
	return merr
}

// removeOldMountpoint removes the empty mountpoint a finished exchange
// left at the staging's place in release/.
func (s *Store) removeOldMountpoint(root *meta.Root, stage string) {
	if ino, err := lstatIno(stage); err != nil || ino != root.Ino {
		return
	}
	overlay.SetImmutable(stage, false)
	// Anything written into the empty mountpoint between its flag's
	// removal and the exchange goes to the released directory (renamed
	// aside on a name clash), never away.
	if ents, err := os.ReadDir(stage); err == nil && len(ents) > 0 {
		if dst, err := openDirAt(unix.AT_FDCWD, root.Path); err == nil {
			var st unix.Stat_t
			if unix.Fstat(dst, &st) == nil && root.Move != nil && st.Ino == root.Move.StageIno {
				for _, e := range ents {
					n := e.Name()
					err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(stage, n), dst, n, unix.RENAME_NOREPLACE)
					if errors.Is(err, unix.EEXIST) {
						n += ".strata-" + strconv.FormatInt(time.Now().UnixNano(), 36)
						err = unix.Renameat2(unix.AT_FDCWD, filepath.Join(stage, n[:len(e.Name())]), dst, n, unix.RENAME_NOREPLACE)
					}
					if err != nil {
						s.log.Error("move a file written during a release into the released directory", "path", root.Path, "name", e.Name(), "err", err)
					}
				}
			}
			unix.Close(dst)
		}
	}
	if err := os.Remove(stage); err != nil {
		// Still not empty: kept under recovered/, never where the next
		// start clears release staging.
		kept := filepath.Join(s.dir, "recovered", strconv.FormatInt(time.Now().UnixNano(), 36))
		if os.MkdirAll(filepath.Dir(kept), 0o700) == nil && os.Rename(stage, kept) == nil {
			s.log.Warn("files written during a release are kept in the store", "path", root.Path, "kept", kept)
			return
		}
		s.log.Warn("remove a released directory's old mountpoint", "dir", stage, "err", err)
	}
}

// resolveRelease finishes, at recovery, a release whose staging took the
// path, and undoes one whose path still holds the mountpoint. When it
// cannot tell (the path leads elsewhere), it touches nothing.
func (s *Store) resolveRelease(ctx context.Context, r *meta.Root) error {
	stage := filepath.Join(s.dir, r.Move.Stage)
	parent, err := openDirAt(unix.AT_FDCWD, filepath.Dir(r.Path))
	if err != nil {
		return fmt.Errorf("interrupted release of %s left alone: %w", r.Path, err)
	}
	defer unix.Close(parent)
	ino, found, err := entryIno(parent, filepath.Base(r.Path))
	switch {
	case err != nil:
		return err
	case found && ino == r.Move.StageIno:
		s.log.Info("finishing interrupted release", "path", r.Path)
		o := s.newOp(context.WithoutCancel(ctx), opRecoverRelease, r.Path)
		err := o.step(stepCommit, func() error {
			_, err := s.commitRelease(r.ID)
			return err
		})
		if err == nil {
			s.removeOldMountpoint(r, stage)
		}
		o.done(err)
		return err
	case found && ino == r.Ino:
		s.log.Info("undoing interrupted release", "path", r.Path)
		return s.undoRelease(ctx, r)
	}
	return fmt.Errorf("interrupted release of %s left alone: its path holds neither the directory nor its released content", r.Path)
}

// clearReleaseStaging removes from release/ what no releasing root names:
// staging of a release that never recorded its intent, and old
// mountpoints of finished ones.
func (s *Store) clearReleaseStaging() {
	dir := filepath.Join(s.dir, releaseDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	named := map[string]bool{}
	rs, err := s.rootRecords()
	if err != nil {
		return
	}
	for _, r := range rs {
		if r.Move != nil {
			named[r.Move.Stage] = true
		}
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if named[filepath.Join(releaseDir, e.Name())] {
			continue
		}
		overlay.SetImmutable(p, false)
		if err := os.RemoveAll(p); err != nil {
			s.log.Warn("remove leftover release staging", "dir", p, "err", err)
		}
	}
}
