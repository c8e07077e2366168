package layers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"strata/layers/meta"
	"strata/layers/overlay"
)

// A capture's intent. A capture swaps the live directory onto its new
// upper layer before it commits (the window in which writers see EROFS
// holds the freeze and the swap, nothing that waits on the disk), so from
// the swap to the commit the live directory is on a layer that no record
// names. The intent, written before the freeze and made durable by the
// syncfs that prepare runs anyway, names that layer and the checkpoint the
// capture is making, so that whatever interrupts it (a crash, a failed
// seal or commit), the capture is finished rather than undone: the live
// directory keeps every byte written to it, and the sealed layer gets its
// record. An intent whose root has moved on (committed, or another
// operation since) is stale and is removed.
//
// Intents are files in the store's captures/ directory, named by the new
// upper's layer id, written whole (a torn one does not parse and is
// treated as stale: its capture had not frozen anything).

// captureIntent is what finishing a capture needs.
type captureIntent struct {
	Root      uint64          `json:"root"`
	Sealed    uint64          `json:"sealed"`
	Next      uint64          `json:"next"`
	Stack     overlay.Stack   `json:"stack"`
	Cp        meta.Checkpoint `json:"checkpoint"`
	Request   meta.Request    `json:"request"`
	Answer    meta.Answer     `json:"answer"`
	Auto      bool            `json:"auto,omitempty"`
	Except    string          `json:"except,omitempty"`
	Retention int             `json:"retention,omitempty"`
}

// intentPath is the intent file of the capture whose new upper is next.
func (s *Store) intentPath(next uint64) string {
	return filepath.Join(s.intents, strconv.FormatUint(next, 10)+".json")
}

// writeIntent writes in's file; it reaches the disk with prepare's syncfs.
// It is written in tmp/ and renamed into captures/: another root's
// operation reads every intent (pendingCapture, collect) and removes one
// that does not parse, so a half-written one must never be seen there.
func (s *Store) writeIntent(in *captureIntent) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	stage := filepath.Join(s.tmp, "intent-"+strconv.FormatUint(in.Next, 10))
	if err := os.WriteFile(stage, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(stage, s.intentPath(in.Next)); err != nil {
		os.Remove(stage)
		return err
	}
	return nil
}

// removeIntent removes the intent of the capture whose upper is next; a
// stale one left by a crash here is removed at the next start.
func (s *Store) removeIntent(next uint64) {
	if err := os.Remove(s.intentPath(next)); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("capture intent not removed", "layer", next, "err", err)
	}
}

// intents reads the intents in the store, by new upper; a file that does
// not parse is removed.
func (s *Store) readIntents() ([]*captureIntent, error) {
	ents, err := os.ReadDir(s.intents)
	if err != nil {
		return nil, err
	}
	var out []*captureIntent
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		next, err := strconv.ParseUint(name, 10, 64)
		if !ok || err != nil {
			os.Remove(filepath.Join(s.intents, e.Name()))
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.intents, e.Name()))
		var in captureIntent
		if err != nil || json.Unmarshal(b, &in) != nil || in.Next != next {
			s.log.Warn("a torn capture intent removed", "file", e.Name())
			os.Remove(filepath.Join(s.intents, e.Name()))
			continue
		}
		out = append(out, &in)
	}
	return out, nil
}

// pendingCapture is the intent of root's capture that is not committed
// (the root's active layer, as recorded, is still the one it seals), or
// nil; root's intents that are stale (committed, or the root moved on)
// are removed on the way.
func (s *Store) pendingCapture(root *meta.Root) (*captureIntent, error) {
	all, err := s.readIntents()
	if err != nil || len(all) == 0 {
		return nil, err
	}
	var active uint64
	if err := s.view(func(t meta.Tx) error {
		r, err := t.Root(root.ID)
		if r != nil {
			active = r.Active
		}
		return err
	}); err != nil {
		return nil, err
	}
	var found *captureIntent
	for _, in := range all {
		if in.Root != root.ID {
			continue
		}
		if in.Sealed == active && found == nil {
			found = in
			continue
		}
		s.removeIntent(in.Next)
	}
	return found, nil
}

// finishCapture finishes the capture of intent in on root, open at h:
// the sealed layer is made durable (frozen first if it is still live) and
// the checkpoint committed; the caller then settles the mount, which puts
// (or keeps) the new upper on top. It reports the committed root.
func (s *Store) finishCapture(ctx context.Context, root *meta.Root, h *rootHandle, in *captureIntent) (*meta.Root, bool, error) {
	if _, err := os.Lstat(s.fsDir(in.Next)); err != nil {
		// No upper was made: nothing was frozen or swapped.
		s.removeIntent(in.Next)
		return root, false, nil
	}
	s.log.Info("finishing interrupted capture", "path", root.Path, "checkpoint", in.Cp.ID)
	o := s.newOp(ctx, opRecoverCapture, root.Path)
	var newRoot *meta.Root
	var squash bool
	err := o.step(stepFreeze, func() error {
		if m := h.top(); m != nil && root.Mounted.Matches(m.VFSOptions) && !overlay.Frozen(m.Options, m.VFSOptions) {
			// The old stack is still live: its writers stop before its
			// upper is sealed (they see EROFS until the settle swaps).
			return s.freezeOrBusy(ctx, root, h, nil)
		}
		return nil
	})
	if err == nil {
		err = o.step(stepSeal, func() error {
			if err := replaceDirAttrsIfLower(s.fsDir(in.Sealed), s.fsDir(in.Next), h, in.Stack); err != nil {
				return err
			}
			return syncLayer(ctx, s.fsDir(in.Sealed), sealLimit, s.fsDir(in.Next))
		})
	}
	if err == nil {
		err = o.step(stepCommit, func() (err error) {
			newRoot, squash, err = s.commitCapture(in)
			return err
		})
	}
	o.done(err)
	if err != nil {
		return nil, false, err
	}
	s.removeIntent(in.Next)
	return newRoot, squash || s.anyGone(root.Mounted.Dirs()), nil
}

// replaceDirAttrsIfLower gives next's root sealed's attributes unless the
// new stack was swapped in: it is live, or (nothing mounted: a cold boot)
// the new upper holds entries, written since the swap. Its root's
// attributes are then the directory's own.
func replaceDirAttrsIfLower(sealed, next string, h *rootHandle, stack overlay.Stack) error {
	if m := h.top(); m != nil && stack.Matches(m.VFSOptions) {
		return nil
	}
	if h.top() == nil {
		if ents, err := os.ReadDir(next); err != nil || len(ents) > 0 {
			return err
		}
	}
	return replaceDirAttrs(sealed, next)
}

// commitCapture commits the capture of in, in one transaction: the sealed
// layer sealed, the new upper recorded, the checkpoint, the request's
// answer, the root on its new stack, and retention. squash reports that a
// layer may have become squashable.
func (s *Store) commitCapture(in *captureIntent) (*meta.Root, bool, error) {
	var newRoot meta.Root
	squash := false
	err := s.update(func(t meta.Tx) error {
		root, err := t.Root(in.Root)
		if err != nil {
			return err
		}
		if root == nil || root.Active != in.Sealed {
			return fmt.Errorf("managed root %d moved on from layer %d: its capture cannot be committed", in.Root, in.Sealed)
		}
		l, err := t.Layer(in.Sealed)
		if err != nil {
			return err
		}
		l.Sealed = true
		if err := t.PutLayer(l); err != nil {
			return err
		}
		if err := t.PutLayer(&meta.Layer{ID: in.Next, Root: root.ID, Parent: in.Sealed, Created: in.Cp.Created}); err != nil {
			return err
		}
		cp := in.Cp
		if cp.Seq, err = t.NextCheckpointSeq(); err != nil {
			return err
		}
		if err := t.PutCheckpoint(&cp); err != nil {
			return err
		}
		if err := t.Record(in.Request, in.Answer, cp.Created); err != nil {
			return err
		}
		// Sealing the only child of a layer no checkpoint names makes
		// that layer squashable.
		squash = l.Parent != 0 && !t.Referenced(l.Parent)
		newRoot = *root
		newRoot.Active, newRoot.Head, newRoot.Mounted = in.Next, cp.ID, in.Stack
		if err := t.PutRoot(&newRoot); err != nil {
			return err
		}
		if in.Auto {
			deleted, err := retain(t, root.ID, true, s.cfg.AutoCheckpoints, in.Except)
			if err != nil || !deleted {
				return err
			}
			squash = true
			return t.Sweep()
		}
		if in.Retention == 0 {
			if countAll(t, root.ID) > checkpointCap { // the new one counted
				return ErrCheckpointLimit.With("limit", checkpointCap)
			}
			return nil
		}
		// Retention: the oldest go in the same commit, so a crash never
		// leaves more than asked for, nor more than the cap.
		keep := min(in.Retention, max(checkpointCap-t.CountOf(root.ID, true), 1))
		deleted, err := retain(t, root.ID, false, keep, "")
		if err != nil || !deleted {
			return err
		}
		squash = true
		return t.Sweep()
	})
	if err != nil {
		return nil, false, err
	}
	return &newRoot, squash, nil
}
