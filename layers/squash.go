package layers

import (
	"context"
	"errors"
	"slices"

	"strata/layers/meta"
)

// Squash: a sealed layer that no checkpoint names any more and that has
// exactly one child is merged into that child, so that storage held only
// for a deleted checkpoint (old versions of rewritten files, files deleted
// later) is freed and chains stay as short as the checkpoints on them.
// The merged layer replaces the child under a new id: checkpoints and
// children of the child follow it, spans are re-pointed or dropped. The
// old directories stay until no mount uses them.

// squashRoot merges every squashable pair of a root. The caller holds
// compactMu.
func (s *Store) squashRoot(ctx context.Context, rootID uint64) error {
	for {
		var pair meta.SquashPair
		var below []uint64
		var ok bool
		err := s.view(func(t meta.Tx) error {
			cands, err := t.SquashCandidates(rootID)
			if err != nil || len(cands) == 0 {
				return err
			}
			pair, ok = cands[0], true
			l, err := t.Layer(pair.Lower)
			if err != nil {
				return err
			}
			segs, err := t.Decompose(l.Parent)
			for _, sg := range segs {
				below = append(below, sg.Dir)
			}
			return err
		})
		if err != nil || !ok {
			return err
		}
		if err := s.squash(ctx, rootID, pair, below); err != nil {
			if errors.Is(err, errStale) {
				return nil // changed under us; the next kick retries
			}
			return err
		}
	}
}

func (s *Store) squash(ctx context.Context, rootID uint64, p meta.SquashPair, below []uint64) error {
	id := s.newLayerID()
	defer s.unpin(id)
	defer s.pin(append([]uint64{p.Upper, p.Lower}, below...)...)()
	o := s.newOp(ctx, opSquash, "")
	if err := s.buildMerged(o, id, p.Lower, p.Upper, below); err != nil {
		o.done(err)
		return err
	}
	err := o.step(stepCommit, func() error {
		return s.update(func(t meta.Tx) error {
			// Still the same situation? Anything else: drop the work.
			cands, err := t.SquashCandidates(rootID)
			if err != nil {
				return err
			}
			if !slices.Contains(cands, p) {
				return errStale
			}
			lower, err := t.Layer(p.Lower)
			if err != nil {
				return err
			}
			upper, err := t.Layer(p.Upper)
			if err != nil {
				return err
			}
			// The merge belongs with the child: the parent may be a
			// clone's source layer, the child the clone's.
			merged := &meta.Layer{ID: id, Root: upper.Root, Parent: lower.Parent, Sealed: true, Created: upper.Created}
			if err := t.PutLayer(merged); err != nil {
				return err
			}
			cps, err := t.Checkpoints()
			if err != nil {
				return err
			}
			for _, c := range cps {
				if c.Layer == p.Upper {
					if err := t.MoveCheckpoint(c, id); err != nil {
						return err
					}
				}
			}
			all, err := t.Layers()
			if err != nil {
				return err
			}
			for _, l := range all {
				if l.Parent == p.Upper {
					l.Parent = id
					if err := t.PutLayer(l); err != nil {
						return err
					}
				}
			}
			spans, err := t.Spans()
			if err != nil {
				return err
			}
			for _, sp := range spans {
				switch {
				case sp.Top == p.Lower, sp.Bottom == p.Upper, sp.Top == p.Upper && sp.Bottom == p.Lower:
					// Ends between the two, or is the merged layer itself.
					if err := t.DeleteSpan(sp); err != nil {
						return err
					}
				case sp.Bottom == p.Lower || sp.Top == p.Upper:
					if err := t.DeleteSpan(sp); err != nil {
						return err
					}
					if sp.Bottom == p.Lower {
						sp.Bottom = id
					}
					if sp.Top == p.Upper {
						sp.Top = id
					}
					sp.Count--
					if err := t.PutSpan(sp); err != nil {
						return err
					}
				default:
					// A span over both, from above the child to below the
					// parent, covers one layer fewer now. Left as it was,
					// its count is one too high: compaction then merges by
					// wrong sizes, and buildSpan's walk misses Bottom, so
					// every span it builds is stale and compactChain
					// retries forever.
					inside, err := t.SpanCovers(sp, id)
					if err != nil {
						return err
					}
					if inside {
						sp.Count--
						if err := t.PutSpan(sp); err != nil {
							return err
						}
					}
				}
			}
			if err := t.DeleteLayer(p.Lower); err != nil {
				return err
			}
			return t.DeleteLayer(p.Upper)
		})
	})
	if err != nil {
		s.removeLayerDir(id)
	}
	o.done(err)
	return err
}
