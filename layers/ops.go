package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"strata/holders"
	"strata/internal/fault"
	"strata/layers/meta"
	"strata/layers/overlay"
	"strata/pathpolicy"
)

// Capture checkpoints the directory at path. The first capture of a
// directory enrolls it as a managed mount root.
func (s *Store) Capture(ctx context.Context, path, name string, opts ...Option) (cp Checkpoint, err error) {
	if err := pathpolicy.CheckSyntax(path, s.policy().ExtraProtected); err != nil {
		return Checkpoint{}, err
	}
	opt := applyOptions(opts)
	if opt.retention < 0 || opt.retention > MaxCheckpoints {
		return Checkpoint{}, fmt.Errorf("retention %d: want 1 to %d", opt.retention, MaxCheckpoints)
	}
	req := createRequest(opt.idemKey, path, name, opt.retention)
	release, err := s.begin(path)
	if err != nil {
		return Checkpoint{}, err
	}
	defer release()
	if prior, err := s.replay(req); err != nil || prior != nil {
		if prior != nil {
			return *prior, nil
		}
		return Checkpoint{}, err
	}
	var root *meta.Root
	if err := s.view(func(t meta.Tx) (err error) {
		root, err = t.RootByPath(path)
		return err
	}); err != nil {
		return Checkpoint{}, err
	}
	if root != nil && root.State != meta.RootReady {
		// An enrollment (a clone, a release) that failed half way (guestd
		// still running): finish or undo it now, then go on. Finishing
		// does not depend on this request: a client that hangs up must
		// not leave the directory half enrolled.
		if err := s.resolvePending(context.WithoutCancel(ctx), root); err != nil {
			return Checkpoint{}, err
		}
		if err := s.view(func(t meta.Tx) error {
			root, err = t.RootByPath(path)
			return err
		}); err != nil {
			return Checkpoint{}, err
		}
		if root != nil && root.State != meta.RootReady {
			return Checkpoint{}, fmt.Errorf("managed root %s: interrupted %s cannot be resolved", path, root.State)
		}
	}
	if root == nil {
		o := s.newOp(ctx, opEnroll, path)
		cp, err = s.enroll(o, path, name, req)
		o.done(err)
		if err == nil {
			cp.SizeBytes = s.sizeOf(cp.ID)
		}
		return cp, err
	}
	// A restore of paths that was interrupted: its hidden names must not
	// be captured.
	if err := s.finishPaths(ctx, root); err != nil {
		return Checkpoint{}, err
	}
	// The cap, before any work: the commit checks it again.
	if err := s.view(func(t meta.Tx) error { return checkCap(t, root.ID, opt.retention) }); err != nil {
		return Checkpoint{}, err
	}
	o := s.newOp(ctx, opCapture, path)
	cp, err = s.capture(o, root, name, req, opt)
	o.done(err)
	if err == nil {
		cp.SizeBytes = s.sizeOf(cp.ID)
	}
	return cp, err
}

// checkpointCap is MaxCheckpoints; tests lower it.
var checkpointCap = MaxCheckpoints

// checkCap refuses a new checkpoint of root when the root holds
// MaxCheckpoints (automatic ones included) and no retention makes room.
func checkCap(t meta.Tx, root uint64, retention int) error {
	if retention == 0 && countAll(t, root) >= checkpointCap {
		return ErrCheckpointLimit.With("limit", checkpointCap)
	}
	return nil
}

// countAll counts root's checkpoints, automatic ones included.
func countAll(t meta.Tx, root uint64) int { return t.CountOf(root, false) + t.CountOf(root, true) }

// retain deletes the oldest checkpoints of root made by clients (auto is
// false) or by the store (auto is true) so that keep remain, never the
// checkpoint except (the one a restore is restoring), and reports whether
// it deleted any. The caller sweeps.
func retain(t meta.Tx, root uint64, auto bool, keep int, except string) (bool, error) {
	excess := t.CountOf(root, auto) - keep
	if excess <= 0 {
		return false, nil
	}
	old, err := t.OldestOf(root, auto, excess+1)
	if err != nil {
		return false, err
	}
	deleted := 0
	for _, c := range old {
		if deleted == excess {
			break
		}
		if c.ID == except {
			continue
		}
		if err := t.DeleteCheckpoint(c); err != nil {
			return false, err
		}
		deleted++
	}
	return deleted > 0, nil
}

// enrollee is the plain directory being enrolled, held open: its parent
// and itself, opened without following symlinks once the path rules
// passed. Every later step uses these fds, so a rename or a symlink
// swapped into the path after the checks cannot redirect the enrollment
// to another directory.
type enrollee struct {
	parent int
	name   string
	dir    int
	dev    uint64
	ino    uint64
}

func (e *enrollee) close() {
	if e == nil {
		return
	}
	unix.Close(e.dir)
	unix.Close(e.parent)
}

// openEnrollee opens path's parent and path by handle and checks what the
// path rules checked by name: no symlink on the way, a directory, not a
// mount point.
func openEnrollee(path string) (*enrollee, error) {
	e := &enrollee{parent: -1, dir: -1, name: filepath.Base(path)}
	classify := func(err error, offending string) error {
		switch {
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
			return pathpolicy.Violation(pathpolicy.CodePathSymlink, path, offending, "The path contains a symlink.")
		case errors.Is(err, unix.ENOENT):
			return pathpolicy.Violation(pathpolicy.CodePathNotFound, path, offending, "The directory does not exist.")
		case errors.Is(err, unix.ENOTDIR):
			return pathpolicy.Violation(pathpolicy.CodePathNotDirectory, path, offending, "The path is not a directory.")
		}
		return err
	}
	var err error
	if e.parent, err = openDirAt(unix.AT_FDCWD, filepath.Dir(path)); err != nil {
		return nil, classify(err, filepath.Dir(path))
	}
	if e.dir, err = openDirAt(e.parent, e.name); err != nil {
		unix.Close(e.parent)
		return nil, classify(err, path)
	}
	fail := func(err error) (*enrollee, error) {
		e.close()
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(e.dir, &st); err != nil {
		return fail(err)
	}
	e.dev, e.ino = st.Dev, st.Ino
	pm, err := mountIDAt(e.parent, "")
	if err != nil {
		return fail(err)
	}
	dm, err := mountIDAt(e.dir, "")
	if err != nil {
		return fail(err)
	}
	if pm != dm {
		return fail(pathpolicy.Violation(pathpolicy.CodePathMount, path, path, "The directory is a mount point."))
	}
	return e, nil
}

// enroll turns the plain directory path into a managed mount root and
// takes its first checkpoint. Crash ordering: the new layer dirs are made
// first (orphans until recorded), then the intent is committed, then one
// rename exchange moves the contents into the store and an empty
// immutable directory to path; recovery finds out which side of that
// exchange it is on by inode and finishes or undoes it.
func (s *Store) enroll(o *op, path, name string, req meta.Request) (_ Checkpoint, err error) {
	var e *enrollee
	var baseBytes int64
	defer func() { e.close() }()
	s.enrollMu.Lock()
	locked := true
	defer func() {
		if locked {
			s.enrollMu.Unlock()
		}
	}()
	err = o.step(stepValidatePath, func() error {
		managed, err := s.allRoots()
		if err != nil {
			return err
		}
		if err := s.policy().CheckEnrollPath(path, managed); err != nil {
			return err
		}
		if e, err = openEnrollee(path); err != nil {
			return err
		}
		// The tree rules run on the handle: the tree checked is the
		// tree enrolled. The walk also measures it: the base layer's
		// size_bytes, with no second walk.
		baseBytes, err = pathpolicy.CheckTreeFDBytes(o.ctx, e.dir, path, false, nil)
		return err
	})
	if err != nil {
		return Checkpoint{}, err
	}
	if err := o.step(stepBusyCheck, func() error {
		return s.busyError(o.ctx, holders.Target{Path: path, Dev: e.dev})
	}); err != nil {
		return Checkpoint{}, err
	}
	if err := o.step(stepSpaceCheck, func() error { return s.checkSpace(path, false) }); err != nil {
		return Checkpoint{}, err
	}
	base, upper := s.newLayerID(), s.newLayerID()
	defer func() {
		if err == nil {
			s.measured(base, baseBytes)
		}
	}()
	defer s.unpin(base, upper)
	rootID := s.newLayerID() // ids share one sequence; a root id never names a dir
	defer s.unpin(rootID)
	intent := &meta.EnrollIntent{OrigIno: e.ino, Base: base, Checkpoint: newCheckpointID(), Name: name, Created: time.Now().UTC()}
	if req.Key != "" {
		intent.Idempotency = &meta.Idempotency{Key: req.Key, Request: req.Body}
	}
	mountpoint := s.fsDir(base)
	cleanup := func() {
		s.removeLayerDir(base)
		s.removeLayerDir(upper)
	}
	err = o.step(stepPrepare, func() error {
		if err := s.makeLayerDir(base, false, e.dir); err != nil {
			return err
		}
		if err := s.makeLayerDir(upper, true, e.dir); err != nil {
			return err
		}
		ino, err := lstatIno(mountpoint)
		intent.MountpointIno = ino
		if err != nil {
			return err
		}
		// Whatever is dirty on the filesystem (the directory's own
		// files included) is written now, while the directory is still
		// the user's: the sync after the exchange then has almost
		// nothing left.
		return syncFS(s.layers)
	})
	if err != nil {
		cleanup()
		return Checkpoint{}, err
	}
	// The prepared mountpoint, held open: after the exchange it is the
	// directory at path, and the flag and the emptiness check go to it.
	mp, err := openDirAt(unix.AT_FDCWD, mountpoint)
	if err != nil {
		cleanup()
		return Checkpoint{}, err
	}
	defer unix.Close(mp)
	root := &meta.Root{ID: rootID, Path: path, Dev: e.dev, Ino: intent.MountpointIno, State: meta.RootEnrolling, Active: upper, Enroll: intent,
		Mounted: overlay.Stack{Layers: s.layers, Upper: upper, Lowers: []uint64{base}}}
	err = o.step(stepIntent, func() error {
		return s.update(func(t meta.Tx) error {
			if err := t.PutLayer(&meta.Layer{ID: base, Root: rootID, Sealed: true, Created: intent.Created}); err != nil {
				return err
			}
			if err := t.PutLayer(&meta.Layer{ID: upper, Root: rootID, Parent: base, Created: intent.Created}); err != nil {
				return err
			}
			return t.PutRoot(root)
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
	if err := o.step(stepExchange, func() error {
		if err := exchangeAt(e.parent, e.name, mountpoint); err != nil {
			return err
		}
		// The exchange went by name inside the parent: check it moved
		// the directory that was checked, and undo it at once if
		// another one had been renamed into its place.
		if ino, err := lstatIno(mountpoint); err != nil || ino != e.ino {
			if xerr := exchangeAt(e.parent, e.name, mountpoint); xerr != nil {
				s.log.Error("undo an exchange with a replaced directory", "path", path, "err", xerr)
				return errors.Join(err, xerr)
			}
			return ErrDirectoryMoved.With("path", path)
		}
		return nil
	}); err != nil {
		return undo(err)
	}
	// The path is now an empty directory: make it refuse writes at once,
	// so that nothing lands where the mount will hide it.
	immErr := overlay.SetImmutableFD(mp, true)
	// The gate: after the exchange nothing new can enter the old contents
	// through path, so whoever still holds them held them before; and
	// nothing may have slipped into the empty directory in between.
	if err := o.step(stepBusyGate, func() error {
		if immErr != nil {
			return immErr
		}
		if err := s.busyError(o.ctx, holders.Target{Path: mountpoint, Dev: e.dev}); err != nil {
			return err
		}
		if n, err := countEntries(mp); err != nil || n > 0 {
			if err != nil {
				return err
			}
			return busyUnseen(path, nil, "Something was written into the directory while it was being enrolled")
		}
		return nil
	}); err != nil {
		return s.undoExchange(root, e, mp, err)
	}
	// The path must still lead to the new mountpoint: if a parent was
	// renamed or swapped meanwhile, put everything back rather than
	// enroll a directory that is no longer where the caller named it.
	h, err := s.openRoot(root)
	if err != nil {
		return s.undoExchange(root, e, mp, err)
	}
	return s.finishEnroll(o, root, h)
}

// countEntries counts the entries of the directory open at fd.
func countEntries(fd int) (int, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(dup), "mountpoint")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	return len(names), err
}

// undoExchange puts the user's directory back after a refused enrollment:
// exchange again, move anything that was written into the empty directory
// meanwhile back into the user's (renamed aside on a name clash), forget.
// Whatever cannot be moved back is kept under recovered/ in the store.
func (s *Store) undoExchange(root *meta.Root, e *enrollee, mp int, cause error) (Checkpoint, error) {
	path, mountpoint := root.Path, s.fsDir(root.Enroll.Base)
	if err := overlay.SetImmutableFD(mp, false); err != nil {
		s.log.Error("undo enrollment: clear immutable", "path", path, "err", err)
		return Checkpoint{}, cause
	}
	if err := exchangeAt(e.parent, e.name, mountpoint); err != nil {
		s.log.Error("undo enrollment: exchange back", "path", path, "err", err)
		return Checkpoint{}, cause
	}
	ents, _ := os.ReadDir(mountpoint)
	for _, ent := range ents {
		dst := ent.Name()
		err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(mountpoint, ent.Name()), e.dir, dst, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EEXIST) {
			dst += ".strata-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			err = unix.Renameat2(unix.AT_FDCWD, filepath.Join(mountpoint, ent.Name()), e.dir, dst, unix.RENAME_NOREPLACE)
		}
		if err != nil {
			// abandonEnroll keeps a non-empty prepared directory.
			s.log.Error("undo enrollment: a file written meanwhile could not be moved back", "path", path, "name", ent.Name(), "err", err)
		}
	}
	if err := s.abandonEnroll(root); err != nil {
		s.log.Error("undo enrollment", "path", path, "err", err)
	}
	return Checkpoint{}, cause
}

// finishEnroll runs the steps after the exchange on the open root h (nil:
// open it by path; recovery runs it so). Nothing after the exchange
// depends on the caller's context. The stack is mounted before the sync
// and the commit, so that the directory looks empty only for the few
// syscalls between the exchange and the mount; a crash before the commit
// leaves the root enrolling with its recorded stack mounted, which the
// next finishEnroll keeps. A root whose path no longer leads to it
// (recovery after a parent was renamed) is still committed, so the
// checkpoint the client asked for exists, and is mounted once it is back
// at its path.
func (s *Store) finishEnroll(o *op, root *meta.Root, h *rootHandle) (Checkpoint, error) {
	o.ctx = context.WithoutCancel(o.ctx)
	in := root.Enroll
	defer func() { h.Close() }()
	var moved error
	if err := o.step(stepImmutable, func() error {
		if h == nil {
			var err error
			if h, err = s.openRoot(root); err != nil {
				if fault.CodeOf(err) == ErrDirectoryMoved.Code {
					moved = err
					return nil
				}
				return err
			}
		}
		if m := h.top(); m != nil {
			if s.ours(m) && root.Mounted.Matches(m.VFSOptions) {
				return nil // mounted before a crash: the flag went first
			}
			return fmt.Errorf("managed root %s: something is mounted on the directory being enrolled", root.Path)
		}
		return s.immutableAt(root, h)
	}); err != nil {
		return Checkpoint{}, err
	}
	if err := o.step(stepMount, func() error {
		if moved != nil {
			return nil
		}
		_, err := s.settle(o.ctx, root, h)
		return err
	}); err != nil {
		return Checkpoint{}, err
	}
	if err := o.step(stepSync, func() error { return syncFS(s.layers) }); err != nil {
		return Checkpoint{}, err
	}
	cp := &meta.Checkpoint{ID: in.Checkpoint, Root: root.ID, Layer: in.Base, Name: in.Name, Created: in.Created}
	res := Checkpoint{ID: cp.ID, Path: root.Path, Name: cp.Name, CreatedAt: cp.Created}
	err := o.step(stepCommit, func() error {
		return s.update(func(t meta.Tx) error {
			seq, err := t.NextCheckpointSeq()
			if err != nil {
				return err
			}
			cp.Seq = seq
			if r := in.Idempotency; r != nil {
				if err := t.Record(meta.Request{Key: r.Key, Body: r.Request}, answer(res), time.Now()); err != nil {
					return err
				}
			}
			root.State, root.Enroll, root.Head = meta.RootReady, nil, cp.ID
			if err := t.PutCheckpoint(cp); err != nil {
				return err
			}
			return t.PutRoot(root)
		})
	})
	if err != nil {
		return Checkpoint{}, err
	}
	if moved != nil {
		return Checkpoint{}, moved
	}
	return res, nil
}

// abandonEnroll forgets an enrollment whose exchange did not happen (or
// was undone): records first, then the layer dirs. A prepared directory
// that is not empty (files written into the path during a refused
// enrollment that could not be moved back) is kept under recovered/.
func (s *Store) abandonEnroll(root *meta.Root) error {
	err := s.update(func(t meta.Tx) error {
		if err := t.DeleteLayer(root.Enroll.Base); err != nil {
			return err
		}
		if err := t.DeleteLayer(root.Active); err != nil {
			return err
		}
		return t.DeleteRoot(root.ID)
	})
	if err != nil {
		return err
	}
	base := root.Enroll.Base
	if ents, err := os.ReadDir(s.fsDir(base)); err == nil && len(ents) > 0 {
		kept := filepath.Join(s.dir, "recovered", strconv.FormatInt(time.Now().UnixNano(), 36))
		if err := os.MkdirAll(filepath.Dir(kept), 0o700); err == nil {
			if err := os.Rename(s.fsDir(base), kept); err == nil {
				s.log.Warn("files written during a refused enrollment are kept in the store", "path", root.Path, "kept", kept)
			}
		}
	}
	return errors.Join(s.removeLayerDir(base), s.removeLayerDir(root.Active))
}

// openSettled opens root by identity and settles its mount (see settle);
// the handle it returns shows the mounts as they are afterwards.
func (s *Store) openSettled(ctx context.Context, root *meta.Root) (*rootHandle, error) {
	h, err := s.openRoot(root)
	if err != nil {
		return nil, err
	}
	// A capture interrupted after its swap: finished first, or the settle
	// would put the old stack back over writes made since.
	in, err := s.pendingCapture(root)
	if err == nil && in != nil {
		var done *meta.Root
		var squash bool
		if done, squash, err = s.finishCapture(context.WithoutCancel(ctx), root, h, in); err == nil {
			*root = *done
			s.kick(root.ID, squash)
		}
	}
	if err != nil {
		h.Close()
		return nil, err
	}
	changed, err := s.settle(ctx, root, h)
	if err != nil || !changed {
		if err != nil {
			h.Close()
			return nil, err
		}
		return h, nil
	}
	h.Close()
	return s.openRoot(root)
}

// capture seals the active layer of a managed root as a checkpoint and
// mounts a fresh one on top. The window in which writers see EROFS holds
// the freeze, the layer's check and the swap; the seal (fsyncs) and the
// commit come after it, before the answer. Crash ordering: the capture's
// intent (intent.go) is durable before the freeze, so from there on a
// crash, or a failure after the swap, finishes the capture (the sealed
// layer frozen if still live, made durable, committed; the new stack
// mounted) rather than undoing it: nothing written after the freeze lands
// in the sealed layer, nothing written after the swap is lost, and no
// checkpoint is listed before its layer is durable.
func (s *Store) capture(o *op, root *meta.Root, name string, req meta.Request, opt options) (Checkpoint, error) {
	var h *rootHandle
	defer func() { h.Close() }()
	if err := o.step(stepMountCheck, func() (err error) {
		h, err = s.openSettled(o.ctx, root)
		return err
	}); err != nil {
		return Checkpoint{}, err
	}
	path := root.Path
	if err := o.step(stepValidateMounts, func() error { return pathpolicy.CheckNoMountsIn(path, h.table) }); err != nil {
		return Checkpoint{}, err
	}
	unpinOld := sync.OnceFunc(s.pin(root.Mounted.Dirs()...))
	defer unpinOld()
	var pending func() error
	if err := o.step(stepBusyCheck, func() (err error) {
		pending, err = s.busyCheckMounted(o.ctx, root, h)
		return err
	}); err != nil {
		return Checkpoint{}, err
	}
	if err := o.step(stepSpaceCheck, func() error { return s.checkSpace(path, false) }); err != nil {
		return Checkpoint{}, err
	}
	if len(root.Mounted.Lowers) > syncCompactDepth {
		// Background compaction fell behind; catch up before this stack
		// grows further. It reads only sealed layers.
		if err := o.step(stepCompact, func() error {
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
	if !opt.auto && opt.retention == 0 {
		// The cap is checked before anything is frozen: once swapped, a
		// capture is finished, never refused.
		var n int
		if err := s.view(func(t meta.Tx) error { n = countAll(t, root.ID); return nil }); err != nil {
			return Checkpoint{}, err
		}
		if n+1 > checkpointCap {
			return Checkpoint{}, ErrCheckpointLimit.With("limit", checkpointCap)
		}
	}
	var in *captureIntent
	unpinNew := func() {}
	defer func() { unpinNew() }()
	// The new upper's root takes the sealed root's attributes (the merged
	// root's live there) now, the capture's intent is written, and the
	// filesystem is synced, all before the freeze: inside the window
	// (freeze to swap, in which writers see EROFS) nothing waits on the
	// disk, and after it the seal finds almost nothing left to write.
	if err := o.step(stepPrepare, func() error {
		if err := s.makeLayerDir(next, true, -1); err != nil {
			return err
		}
		if err := copyDirAttrs(s.fsDir(sealed), s.fsDir(next)); err != nil {
			return err
		}
		stack, unpin, err := s.stackPinned(next, sealed)
		if err != nil {
			return err
		}
		unpinNew = unpin
		cp := meta.Checkpoint{ID: newCheckpointID(), Root: root.ID, Layer: sealed, Name: name, Created: time.Now().UTC(), Parent: root.Head, Auto: opt.auto}
		res := Checkpoint{ID: cp.ID, Path: path, Name: cp.Name, CreatedAt: cp.Created, ParentID: cp.Parent, Auto: opt.auto}
		in = &captureIntent{Root: root.ID, Sealed: sealed, Next: next, Stack: stack, Cp: cp, Request: req, Answer: answer(res),
			Auto: opt.auto, Except: opt.except, Retention: opt.retention}
		if err := s.writeIntent(in); err != nil {
			return err
		}
		// One syncfs: the new layer dir, the intent and everything
		// written so far. Unrelated dirty data makes it longer, but it
		// is outside the window; after it, the layer's own fsyncs find
		// it clean.
		return syncFS(s.layers)
	}); err != nil {
		s.removeLayerDir(next)
		s.removeIntent(next)
		return Checkpoint{}, err
	}
	res := Checkpoint{ID: in.Cp.ID, Path: path, Name: in.Cp.Name, CreatedAt: in.Cp.Created, ParentID: in.Cp.Parent, Auto: opt.auto}
	back := func(err error, thawOld bool) (Checkpoint, error) {
		if thawOld {
			if terr := overlay.Thaw(h.target()); terr != nil {
				s.log.Error("thaw after failed capture", "path", path, "err", terr)
			}
		}
		s.removeLayerDir(next)
		s.removeIntent(next)
		return Checkpoint{}, err
	}
	if err := o.step(stepFreeze, func() error { return s.freezeOrBusy(o.ctx, root, h, pending) }); err != nil {
		return back(err, false)
	}
	var sealedBytes int64
	if err := o.step(stepValidateLayer, func() (err error) {
		// The walk measures the layer too: its size_bytes.
		sealedBytes, err = pathpolicy.CheckTreeBytes(o.ctx, s.fsDir(sealed), true, func(rel string) string { return filepath.Join(path, rel) })
		return err
	}); err != nil {
		return back(err, true)
	}
	swapped := *root
	swapped.Active, swapped.Mounted = next, in.Stack
	// From the swap on, the capture is finished, whatever happens: the
	// live directory is on the new upper.
	o.ctx = context.WithoutCancel(o.ctx)
	if err := o.step(stepMountSwap, func() error {
		// The root's attributes again, exactly (xattrs removed since
		// prepare go too), while the old stack is frozen.
		if err := replaceDirAttrs(s.fsDir(sealed), s.fsDir(next)); err != nil {
			return err
		}
		return s.swap(o.ctx, h, root, &swapped)
	}); err != nil {
		if st := s.liveStack(root); len(st) == 1 && root.Mounted.Matches(st[0].VFSOptions) {
			// The old stack alone is still there: nothing was written
			// to the new upper.
			return back(err, true)
		}
		s.log.Error("swap failed half way; finishing the capture as recovery would", "path", path, "err", err)
		if ferr := s.ensureMounted(o.ctx, root); ferr != nil {
			return Checkpoint{}, errors.Join(err, ferr)
		}
		return res, nil
	}
	if err := o.step(stepSeal, func() error {
		// The sealed layer and the new root reach the disk: the layer's
		// own entries fsynced, or past sealLimit of them one syncfs
		// (prepare's ran a moment ago: it writes back only what was
		// dirtied since). Writers are on the new upper already.
		return syncLayer(o.ctx, s.fsDir(sealed), sealLimit, s.fsDir(next))
	}); err != nil {
		// The intent stays: the next operation on the root (or the next
		// start) finishes the capture before anything else.
		return Checkpoint{}, err
	}
	var squash bool
	if err := o.step(stepCommit, func() (err error) {
		_, squash, err = s.commitCapture(in)
		return err
	}); err != nil {
		return Checkpoint{}, err
	}
	s.removeIntent(next)
	// The old stack's teardown began at the swap, before the commit: a
	// layer it alone still held (a released source's, under a clone) was
	// kept by the recorded stack then; the background worker collects it.
	squash = squash || s.anyGone(root.Mounted.Dirs())
	s.measured(sealed, sealedBytes)
	// The old stack's layers are the records', the new stack's or the
	// teardown's now: unpinned before the worker looks, or a layer only
	// this pin held would wait for a later collection.
	unpinOld()
	s.kick(root.ID, squash)
	return res, nil
}

// anyGone tells whether any of dirs is neither a layer nor a span any
// more.
func (s *Store) anyGone(dirs []uint64) bool {
	gone := false
	s.view(func(t meta.Tx) error {
		sps, err := t.Spans()
		if err != nil {
			return err
		}
		spans := make(map[uint64]bool, len(sps))
		for _, sp := range sps {
			spans[sp.ID] = true
		}
		for _, d := range dirs {
			if _, err := t.Layer(d); errors.Is(err, meta.ErrInconsistent) && !spans[d] {
				gone = true
			}
		}
		return nil
	})
	return gone
}

// liveStack is the mounts at root now, the top first, or nil.
func (s *Store) liveStack(root *meta.Root) []*mountinfo.Info {
	h, err := s.openRoot(root)
	if err != nil {
		return nil
	}
	defer h.Close()
	return h.stack
}

// Restore puts the directory of checkpoint id back to its content: a
// fresh upper layer on the checkpoint's layer chain. Unsaved changes of
// the live directory are discarded; every checkpoint stays restorable.
func (s *Store) Restore(ctx context.Context, id string, opts ...Option) (Checkpoint, error) {
	req := restoreRequest(applyOptions(opts).idemKey, id)
	if prior, err := s.replay(req); err != nil || prior != nil {
		if prior != nil {
			return *prior, nil
		}
		return Checkpoint{}, err
	}
	_, root, err := s.lookup(id)
	if err != nil {
		return Checkpoint{}, err
	}
	release, err := s.begin(root.Path)
	if err != nil {
		return Checkpoint{}, err
	}
	defer release()
	o := s.newOp(ctx, opRestore, root.Path)
	res, err := s.restore(o, id, req)
	if err == nil {
		// The discarded upper is collected by the swap's teardown once
		// its old superblock is gone; a layer whose other child it was
		// may be squashable.
		s.kick(root.ID, true)
	}
	o.done(err)
	return res, err
}

// restore: the new upper is an orphan until the commit; the old mount is
// frozen first, so its unsaved changes stop changing; the commit drops the
// old upper's record and recovery mounts the new stack.
func (s *Store) restore(o *op, id string, req meta.Request) (Checkpoint, error) {
	// Re-read under the operation claim (a delete may have won the race),
	// and pin the checkpoint's layer in the same breath: a squash that
	// replaces it afterwards cannot take its dir away.
	cp, root, unpinCP, err := s.lookupPinned(id)
	if err != nil {
		return Checkpoint{}, err
	}
	defer unpinCP()
	if prior, err := s.replay(req); err != nil || prior != nil {
		if prior != nil {
			return *prior, nil
		}
		return Checkpoint{}, err
	}
	path := root.Path
	if err := s.finishPaths(o.ctx, root); err != nil {
		return Checkpoint{}, err
	}
	var h *rootHandle
	defer func() { h.Close() }()
	if err := o.step(stepMountCheck, func() (err error) {
		h, err = s.openSettled(o.ctx, root)
		return err
	}); err != nil {
		return Checkpoint{}, err
	}
	unpinOld := s.pin(root.Mounted.Dirs()...)
	defer unpinOld()
	if err := o.step(stepValidateMounts, func() error { return pathpolicy.CheckNoMountsIn(path, h.table) }); err != nil {
		return Checkpoint{}, err
	}
	var pending func() error
	if err := o.step(stepBusyCheck, func() (err error) {
		pending, err = s.busyCheckMounted(o.ctx, root, h)
		return err
	}); err != nil {
		return Checkpoint{}, err
	}
	// A restore discards the live upper: it may free space, so it needs
	// only the hard floor, not the reserve.
	if err := o.step(stepSpaceCheck, func() error { return s.checkSpace(path, true) }); err != nil {
		return Checkpoint{}, err
	}
	next := s.newLayerID()
	defer s.unpin(next)
	discarded := root.Active
	keepAuto := s.cfg.AutoCheckpoints > 0
	if err := o.step(stepPrepare, func() error {
		src, err := openDirAt(unix.AT_FDCWD, s.fsDir(cp.Layer))
		if err != nil {
			return err
		}
		defer unix.Close(src)
		if err := s.makeLayerDir(next, true, src); err != nil {
			return err
		}
		if keepAuto {
			// Unsaved changes that may become a safety checkpoint are
			// written now, outside the window: seal's fsyncs then find
			// them clean.
			if n, err := countEntriesAt(s.fsDir(discarded)); err != nil || n > 0 {
				if err != nil {
					return err
				}
				return syncFS(s.layers)
			}
		}
		// The commit names it: its rename into layers/ must be durable
		// first (bbolt's fdatasync does not commit the fs journal).
		return syncDir(s.layers)
	}); err != nil {
		s.removeLayerDir(next)
		return Checkpoint{}, err
	}
	if err := o.step(stepFreeze, func() error { return s.freezeOrBusy(o.ctx, root, h, pending) }); err != nil {
		s.removeLayerDir(next)
		return Checkpoint{}, err
	}
	fail := func(err error) (Checkpoint, error) {
		if terr := overlay.Thaw(h.target()); terr != nil {
			s.log.Error("thaw after failed restore", "path", path, "err", terr)
		}
		s.removeLayerDir(next)
		return Checkpoint{}, err
	}
	// The unsaved changes, frozen now, are kept as an automatic
	// checkpoint: the discarded upper is sealed instead of dropped, as a
	// capture seals it (no copy).
	var safety *meta.Checkpoint
	var safetyBytes int64
	if keepAuto {
		changed, err := s.unsaved(discarded)
		if err != nil {
			return fail(err)
		}
		if changed {
			if err := o.step(stepValidateLayer, func() (err error) {
				safetyBytes, err = pathpolicy.CheckTreeBytes(o.ctx, s.fsDir(discarded), true, func(rel string) string { return filepath.Join(path, rel) })
				return err
			}); err != nil {
				if fault.As(err) == nil {
					return fail(err)
				}
				// Changes a capture refuses (a special file, a hard link):
				// the seed's restore discards them and answers, and so
				// does this one, without a safety checkpoint.
				s.log.Warn("unsaved changes a capture would refuse cannot be kept as an automatic checkpoint; the restore discards them", "path", path, "err", err)
				changed = false
			}
		}
		if changed {
			if err := o.step(stepSeal, func() error { return syncLayer(o.ctx, s.fsDir(discarded), syncLayerLimit) }); err != nil {
				return fail(err)
			}
			safety = &meta.Checkpoint{ID: newCheckpointID(), Root: root.ID, Layer: discarded, Name: "before restoring " + id,
				Created: time.Now().UTC(), Parent: root.Head, Auto: true}
		}
	}
	newRoot := *root
	res := Checkpoint{ID: cp.ID, Path: path}
	if safety != nil {
		res.SafetyCheckpointID = safety.ID
	}
	err = o.step(stepCommit, func() error {
		return s.update(func(t meta.Tx) error {
			// Squashing may have replaced the checkpoint's layer by one with
			// the same content since it was read: use the current one.
			c, err := mustCheckpoint(t, id)
			if err != nil {
				return err
			}
			if err := t.Record(req, answer(res), time.Now()); err != nil {
				return err
			}
			if err := s.keepOrDrop(t, discarded, safety, id); err != nil {
				return err
			}
			if err := t.PutLayer(&meta.Layer{ID: next, Root: root.ID, Parent: c.Layer, Created: time.Now().UTC()}); err != nil {
				return err
			}
			stack, err := s.stackFor(t, next, c.Layer)
			if err != nil {
				return err
			}
			newRoot.Active, newRoot.Head, newRoot.Mounted = next, cp.ID, stack
			if err := t.PutRoot(&newRoot); err != nil {
				return err
			}
			// The discarded upper may have been the last user of a branch.
			return t.Sweep()
		})
	})
	if err != nil {
		return fail(err)
	}
	o.ctx = context.WithoutCancel(o.ctx) // committed: the swap must run
	if safety != nil {
		s.measured(discarded, safetyBytes)
	}
	if err := o.step(stepMountSwap, func() error { return s.swapOrRecover(o.ctx, h, root, &newRoot) }); err != nil {
		return Checkpoint{}, err
	}
	return res, nil
}

// unsaved reports whether the active layer upper holds changes: an entry,
// or root attributes other than its parent layer's root's.
func (s *Store) unsaved(upper uint64) (bool, error) {
	n, err := countEntriesAt(s.fsDir(upper))
	if err != nil || n > 0 {
		return n > 0, err
	}
	var parent uint64
	if err := s.view(func(t meta.Tx) error {
		l, err := t.Layer(upper)
		if err == nil {
			parent = l.Parent
		}
		return err
	}); err != nil {
		return false, err
	}
	var a, b unix.Stat_t
	if err := unix.Lstat(s.fsDir(upper), &a); err != nil {
		return false, err
	}
	if err := unix.Lstat(s.fsDir(parent), &b); err != nil {
		return false, err
	}
	return a.Mode != b.Mode || a.Uid != b.Uid || a.Gid != b.Gid, nil
}

// keepOrDrop, inside a restore's commit, seals the discarded upper as the
// safety checkpoint (keeping the newest AutoCheckpoints automatic ones of
// the root, and always except, the checkpoint restored), or drops its
// record when there is none.
func (s *Store) keepOrDrop(t meta.Tx, discarded uint64, safety *meta.Checkpoint, except string) error {
	if safety == nil {
		return t.DeleteLayer(discarded)
	}
	l, err := t.Layer(discarded)
	if err != nil {
		return err
	}
	l.Sealed = true
	if err := t.PutLayer(l); err != nil {
		return err
	}
	if safety.Seq, err = t.NextCheckpointSeq(); err != nil {
		return err
	}
	if err := t.PutCheckpoint(safety); err != nil {
		return err
	}
	_, err = retain(t, safety.Root, true, s.cfg.AutoCheckpoints, except)
	return err
}

// countEntriesAt counts the entries of the directory dir.
func countEntriesAt(dir string) (int, error) {
	fd, err := openDirAt(unix.AT_FDCWD, dir)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return countEntries(fd)
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
	o := s.newOp(ctx, opDelete, root.Path)
	err = o.step(stepCommit, func() error {
		return s.update(func(t meta.Tx) error {
			c, err := mustCheckpoint(t, id)
			if err != nil {
				return err
			}
			if err := t.DeleteCheckpoint(c); err != nil {
				return err
			}
			return t.Sweep()
		})
	})
	if err == nil {
		o.ctx = context.WithoutCancel(o.ctx) // committed: report success
		err = o.step(stepCollect, func() error { s.collect(o.ctx); return nil })
		s.kick(root.ID, true)
	}
	o.done(err)
	return err
}

// swapOrRecover swaps after a commit. The commit cannot be taken back (the
// old upper is sealed), so a failed swap is retried the way startup would
// do it before the operation reports failure; if that fails too, the next
// operation on the root or the next start tries again.
func (s *Store) swapOrRecover(ctx context.Context, h *rootHandle, old, newRoot *meta.Root) error {
	err := s.swap(ctx, h, old, newRoot)
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
func mustCheckpoint(t meta.Tx, id string) (*meta.Checkpoint, error) {
	c, err := t.Checkpoint(id)
	if err == nil && c == nil {
		err = ErrCheckpointNotFound.With("checkpoint_id", id)
	}
	return c, err
}

// lookupPinned is lookup with the checkpoint's layer pinned, read and
// pinned under the lock that collect holds while it decides what to
// delete: collect sees either the record or the pin.
func (s *Store) lookupPinned(id string) (cp *meta.Checkpoint, root *meta.Root, unpin func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp, root, err = s.lookup(id)
	if err != nil {
		return nil, nil, nil, err
	}
	s.pins[cp.Layer]++
	layer := cp.Layer
	return cp, root, func() { s.unpin(layer) }, nil
}

// lookup returns checkpoint id and its root, or checkpoint_not_found.
func (s *Store) lookup(id string) (cp *meta.Checkpoint, root *meta.Root, err error) {
	err = s.view(func(t meta.Tx) error {
		if cp, err = t.Checkpoint(id); err != nil || cp == nil {
			return err
		}
		root, err = t.Root(cp.Root)
		return err
	})
	if err == nil && (cp == nil || root == nil) {
		err = ErrCheckpointNotFound.With("checkpoint_id", id)
	}
	return cp, root, err
}

// stackPinned is stackFor read and pinned under the lock that collect
// holds while it decides what to delete: a capture mounts its stack before
// any record names it, and the worker may meanwhile replace a segment of
// it (a squash, a span) and collect the old one. collect sees either the
// segment's record or the pin.
func (s *Store) stackPinned(upper, top uint64) (overlay.Stack, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var stack overlay.Stack
	if err := s.view(func(t meta.Tx) (err error) {
		stack, err = s.stackFor(t, upper, top)
		return err
	}); err != nil {
		return overlay.Stack{}, nil, err
	}
	dirs := stack.Dirs()
	for _, id := range dirs {
		s.pins[id]++
	}
	return stack, func() { s.unpin(dirs...) }, nil
}

// stackFor is the mount stack for an upper layer on top of layer top,
// served by the fewest segments the spans allow.
func (s *Store) stackFor(t meta.Tx, upper, top uint64) (overlay.Stack, error) {
	segs, err := t.Decompose(top)
	if err != nil {
		return overlay.Stack{}, err
	}
	if len(segs) > maxLowers {
		return overlay.Stack{}, fmt.Errorf("layer chain of %d segments exceeds overlayfs's %d lower layers", len(segs), maxLowers)
	}
	st := overlay.Stack{Layers: s.layers, Upper: upper, Lowers: make([]uint64, len(segs))}
	for i, sg := range segs {
		st.Lowers[i] = sg.Dir
	}
	return st, nil
}

// maxLowers is overlayfs's limit of lower layers per mount.
const maxLowers = 500

// syncCompactDepth is the stack depth at which a capture compacts in line
// instead of leaving it to the background worker.
const syncCompactDepth = 64
