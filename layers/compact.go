package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"strata/layers/meta"
	"strata/layers/overlay"
)

// Compaction keeps mount stacks short however many checkpoints a chain
// has. A chain is served as segments: single layers, or spans (merged
// runs of layers). Like a binary counter, whenever the top meta.Segment of a
// chain is at least as large as the one under it, the two are merged into
// one span; meta.Segment sizes then grow strictly downwards, so a chain of n
// sealed layers is served by at most log2(n)+1 segments plus its base.
// Every layer was once the top of its chain, so every checkpoint's own
// chain is as short, and restoring any of them mounts a short stack.
//
// The base layer (the directory's contents at enrollment) is never merged:
// a span holds only changes, so compaction costs grow with what was
// changed, never with the size of the directory.

// compactChain merges segments of the chain of top until the rule holds.
// It reads only sealed layers, which never change, so it runs beside the
// operations on the root; each span is committed only if the layers it
// covers are still there.
func (s *Store) compactChain(ctx context.Context, rootID, top uint64) error {
	for {
		var segs []meta.Segment
		if err := s.view(func(t meta.Tx) (err error) {
			if l, err := t.Layer(top); err != nil || !l.Sealed {
				segs = nil
				return nil
			}
			segs, err = t.Decompose(top)
			return err
		}); err != nil {
			return err
		}
		i := meta.NextMerge(segs)
		if i < 0 {
			return nil
		}
		upper, lower := segs[i], segs[i+1]
		var below []uint64
		for _, sg := range segs[i+2:] {
			below = append(below, sg.Dir)
		}
		if err := s.buildSpan(ctx, rootID, upper, lower, below); err != nil {
			if errors.Is(err, errStale) {
				return nil // the chain changed under us; the next kick retries
			}
			return err
		}
	}
}

// buildSpan merges two adjacent segments into a new span. Crash
// ordering: built in tmp/, renamed into layers/ (an orphan until the
// commit, swept at startup), then recorded.
func (s *Store) buildSpan(ctx context.Context, rootID uint64, upper, lower meta.Segment, below []uint64) error {
	id := s.newLayerID()
	defer s.unpin(id)
	defer s.pin(append([]uint64{upper.Dir, lower.Dir}, below...)...)()
	o := s.newOp(ctx, opCompact, "")
	if err := s.buildMerged(o, id, lower.Dir, upper.Dir, below); err != nil {
		o.done(err)
		return err
	}
	sp := &meta.Span{ID: id, Root: rootID, Top: upper.Top, Bottom: lower.Bottom, Count: upper.Count + lower.Count}
	err := o.step(stepCommit, func() error {
		return s.update(func(t meta.Tx) error {
			// The covered run must be intact: walk it again, and count
			// what it covers now (a squash may have shortened it).
			cur, n := sp.Top, 1
			for ; cur != sp.Bottom; n++ {
				l, err := t.Layer(cur)
				if err != nil || l.Parent == 0 || n > meta.MaxChain {
					return errStale
				}
				cur = l.Parent
			}
			if _, err := t.Layer(cur); err != nil {
				return errStale
			}
			sp.Count = n
			return t.PutSpan(sp)
		})
	})
	if err != nil {
		s.removeLayerDir(id)
	}
	o.done(err)
	return err
}

var errStale = fmt.Errorf("the layers under compaction changed")

// buildMerged makes layers/<id> the merge of layer dirs lower and upper
// (as seen over the layer dirs below), in the named steps merge and sync:
// built in tmp/, flushed, renamed into layers/. It is an orphan until the
// caller commits a record naming it.
func (s *Store) buildMerged(o *op, id, lower, upper uint64, below []uint64) error {
	belowDirs := make([]string, len(below))
	for i, b := range below {
		belowDirs[i] = s.fsDir(b)
	}
	stage := filepath.Join(s.tmp, overlay.LayerName(id))
	err := o.step(stepMerge, func() error {
		if err := os.MkdirAll(filepath.Join(stage, "fs"), 0o755); err != nil {
			return err
		}
		return merge(o.ctx, filepath.Join(stage, "fs"), []string{s.fsDir(lower), s.fsDir(upper)}, belowDirs, s.clone)
	})
	if err == nil {
		err = o.step(stepSync, func() error {
			if err := syncFS(stage); err != nil {
				return err
			}
			if err := os.Rename(stage, filepath.Join(s.layers, overlay.LayerName(id))); err != nil {
				return err
			}
			// The caller's commit names it (and lets the dirs it replaces
			// go): the rename must be durable first.
			return syncDir(s.layers)
		})
	}
	if err != nil {
		os.RemoveAll(stage)
	}
	return err
}

// compactRoot compacts the live chain of a root: its newest sealed layer.
// The caller holds compactMu.
func (s *Store) compactRoot(ctx context.Context, rootID uint64) error {
	var top uint64
	err := s.view(func(t meta.Tx) error {
		r, err := t.Root(rootID)
		if err != nil || r == nil || r.State != meta.RootReady {
			return err
		}
		l, err := t.Layer(r.Active)
		if err != nil {
			return err
		}
		top = l.Parent
		return nil
	})
	if err != nil || top == 0 {
		return err
	}
	return s.compactChain(ctx, rootID, top)
}

// maintain compacts a root, squashing first when a delete may have left
// something to squash (and then frees what that released). The caller
// holds compactMu.
func (s *Store) maintain(ctx context.Context, rootID uint64, squash bool) error {
	if squash {
		if err := s.squashRoot(ctx, rootID); err != nil {
			return err
		}
	}
	if err := s.compactRoot(ctx, rootID); err != nil {
		return err
	}
	if squash {
		s.collect(ctx)
	}
	return nil
}

// kick asks the background worker to maintain a root; squash after a
// delete, the only operation that can leave a layer no checkpoint names.
func (s *Store) kick(rootID uint64, squash bool) {
	if s.cfg.NoCompaction {
		return
	}
	s.mu.Lock()
	s.pending[rootID] = s.pending[rootID] || squash
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// worker compacts roots in the background until ctx is done.
func (s *Store) worker(ctx context.Context) {
	defer close(s.workerDone)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		for {
			// A root leaves pending only under compactMu: Settle, once
			// it holds it, sees every root not yet maintained.
			s.compactMu.Lock()
			s.mu.Lock()
			var id uint64
			var squash bool
			for r, sq := range s.pending {
				id, squash = r, sq
				break
			}
			delete(s.pending, id)
			s.mu.Unlock()
			if id == 0 {
				s.compactMu.Unlock()
				break
			}
			err := s.maintain(ctx, id, squash)
			s.compactMu.Unlock()
			if err != nil && ctx.Err() == nil {
				s.log.Error("compaction", "root", id, "err", err)
			}
		}
	}
}

// Settle waits until background compaction has caught up (tests, tools):
// nothing pending, and no old stack's teardown (whose collection frees
// the layers a squash replaced) in flight, including those the
// compaction run here or by the worker began.
func (s *Store) Settle(ctx context.Context) error {
	s.teardowns.wait()
	for !s.compactMu.TryLock() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	defer s.compactMu.Unlock()
	for {
		s.mu.Lock()
		pending := s.pending
		s.pending = map[uint64]bool{}
		s.mu.Unlock()
		if len(pending) == 0 {
			// The worker is held off: no teardown begins while this
			// waits, and the ones in flight do not kick it.
			s.teardowns.wait()
			s.mu.Lock()
			n := len(s.pending)
			s.mu.Unlock()
			if n == 0 {
				return nil
			}
			continue
		}
		for id, squash := range pending {
			if err := s.maintain(ctx, id, squash); err != nil {
				return err
			}
		}
	}
}
