package layers

import (
	"cmp"
	"context"
	"errors"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// Squash: a sealed layer that no checkpoint names any more and that has
// exactly one child is merged into that child, so that storage held only
// for a deleted checkpoint (old versions of rewritten files, files deleted
// later) is freed and chains stay as short as the checkpoints on them.
// The merged layer replaces the child under a new id: checkpoints and
// children of the child follow it, spans are re-pointed or dropped. The
// old directories stay until no mount uses them.

// squashPair is a layer to merge into its only child.
type squashPair struct{ upper, lower uint64 } // child, parent

// squashCandidates lists the squashable pairs of rootID, lowest first.
func (t tx) squashCandidates(rootID uint64) ([]squashPair, error) {
	all, err := t.layers()
	if err != nil {
		return nil, err
	}
	referenced := map[uint64]bool{}
	cps, err := t.checkpoints()
	if err != nil {
		return nil, err
	}
	for _, c := range cps {
		referenced[c.Layer] = true
	}
	roots, err := t.roots()
	if err != nil {
		return nil, err
	}
	for _, r := range roots {
		referenced[r.Active] = true
		if r.Enroll != nil {
			return nil, nil // never while an enrollment is pending
		}
	}
	children := map[uint64][]uint64{}
	for _, l := range all {
		if l.Parent != 0 {
			children[l.Parent] = append(children[l.Parent], l.ID)
		}
	}
	var out []squashPair
	for _, l := range all {
		if l.Root != rootID || !l.Sealed || referenced[l.ID] || len(children[l.ID]) != 1 {
			continue
		}
		child := all[children[l.ID][0]]
		if child == nil || !child.Sealed {
			continue // an active upper cannot be rewritten
		}
		out = append(out, squashPair{upper: child.ID, lower: l.ID})
	}
	slices.SortFunc(out, func(a, b squashPair) int { return cmp.Compare(a.lower, b.lower) })
	return out, nil
}

// squashRoot merges every squashable pair of a root. The caller holds
// compactMu.
func (s *Store) squashRoot(ctx context.Context, rootID uint64) error {
	for {
		var pair squashPair
		var below []uint64
		var ok bool
		err := s.db.View(func(btx *bolt.Tx) error {
			t := tx{btx}
			cands, err := t.squashCandidates(rootID)
			if err != nil || len(cands) == 0 {
				return err
			}
			pair, ok = cands[0], true
			l, err := t.layer(pair.lower)
			if err != nil {
				return err
			}
			segs, err := t.decompose(l.Parent)
			for _, sg := range segs {
				below = append(below, sg.dir)
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

func (s *Store) squash(ctx context.Context, rootID uint64, p squashPair, below []uint64) error {
	id := s.newLayerID()
	defer s.unpin(id)
	defer s.pin(append([]uint64{p.upper, p.lower}, below...)...)()
	o := s.newOp(ctx, opSquash, "")
	if err := s.buildMerged(o, id, p.lower, p.upper, below); err != nil {
		o.done(err)
		return err
	}
	err := o.step(stepCommit, func() error {
		return s.db.Update(func(btx *bolt.Tx) error {
			t := tx{btx}
			// Still the same situation? Anything else: drop the work.
			cands, err := t.squashCandidates(rootID)
			if err != nil {
				return err
			}
			if !slices.Contains(cands, p) {
				return errStale
			}
			lower, err := t.layer(p.lower)
			if err != nil {
				return err
			}
			upper, err := t.layer(p.upper)
			if err != nil {
				return err
			}
			merged := &layerRecord{ID: id, Root: rootID, Parent: lower.Parent, Sealed: true, Created: upper.Created}
			if err := t.putLayer(merged); err != nil {
				return err
			}
			cps, err := t.checkpoints()
			if err != nil {
				return err
			}
			for _, c := range cps {
				if c.Layer == p.upper {
					if err := t.moveCheckpoint(c, id); err != nil {
						return err
					}
				}
			}
			all, err := t.layers()
			if err != nil {
				return err
			}
			for _, l := range all {
				if l.Parent == p.upper {
					l.Parent = id
					if err := t.putLayer(l); err != nil {
						return err
					}
				}
			}
			spans, err := t.spans()
			if err != nil {
				return err
			}
			for _, sp := range spans {
				switch {
				case sp.Top == p.lower, sp.Bottom == p.upper, sp.Top == p.upper && sp.Bottom == p.lower:
					// Ends between the two, or is the merged layer itself.
					if err := t.deleteSpan(sp); err != nil {
						return err
					}
				case sp.Bottom == p.lower || sp.Top == p.upper:
					if err := t.deleteSpan(sp); err != nil {
						return err
					}
					if sp.Bottom == p.lower {
						sp.Bottom = id
					}
					if sp.Top == p.upper {
						sp.Top = id
					}
					sp.Count--
					if err := t.putSpan(sp); err != nil {
						return err
					}
				default:
					// A span over both, from above the child to below the
					// parent, covers one layer fewer now. Left as it was,
					// its count is one too high: compaction then merges by
					// wrong sizes, and buildSpan's walk misses Bottom, so
					// every span it builds is stale and compactChain
					// retries forever.
					inside, err := t.spanCovers(sp, id)
					if err != nil {
						return err
					}
					if inside {
						sp.Count--
						if err := t.putSpan(sp); err != nil {
							return err
						}
					}
				}
			}
			if err := t.deleteLayer(p.lower); err != nil {
				return err
			}
			return t.deleteLayer(p.upper)
		})
	})
	if err != nil {
		s.removeLayerDir(id)
	}
	o.done(err)
	return err
}

// spanCovers reports whether layer id lies strictly inside span sp: below
// sp.Top on the walk down to sp.Bottom, and above sp.Bottom.
func (t tx) spanCovers(sp *spanRecord, id uint64) (bool, error) {
	cur := sp.Top
	for n := 1; n < sp.Count && cur != sp.Bottom; n++ {
		l, err := t.layer(cur)
		if err != nil {
			return false, err
		}
		if l.Parent == id {
			return true, nil
		}
		cur = l.Parent
	}
	return false, nil
}
