package layers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"strata/internal/fstree"
	"strata/layers/overlay"
)

// TestCaptureStackOutlivesTheWorker pins a race CI met in
// TestDirectoryRenamesRandom ("capture: mount project: no such file or
// directory"): a capture reads the stack it will mount (prepare) and
// mounts it before any record names it; the background worker squashed a
// deleted checkpoint's layer in between, dropped a span of that stack,
// and collected its dir before the capture pinned it. Here the worker's
// whole run (squash, compaction, collection) happens inside the
// capture's prepare step, for every checkpoint that can be deleted: the
// capture still mounts, the directory holds what it held, every
// checkpoint restores to its content, and nothing is orphaned.
func TestCaptureStackOutlivesTheWorker(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		const n = 6
		ctx := context.Background()
		for del := range n - 1 {
			dir := h.mkdir(fmt.Sprintf("project%d", del), nil)
			var cps []Checkpoint
			var trees []fstree.Tree
			for i := range n {
				write(t, fmt.Sprintf("%s/f%d", dir, i), fmt.Sprint(i))
				write(t, dir+"/same", fmt.Sprint("version ", i))
				trees = append(trees, fstree.MustSnapshot(t, dir))
				cps = append(cps, h.capture(dir, ""))
			}
			if err := h.store.Settle(ctx); err != nil {
				t.Fatal(err)
			}
			// The delete's kick is held back: the worker runs inside the
			// next capture instead.
			h.store.cfg.NoCompaction = true
			if err := h.store.Delete(ctx, cps[del].ID); err != nil {
				t.Fatal(err)
			}
			r, err := h.store.rootByPath(dir)
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			h.store.cfg.StepHook = func(op, step string, d time.Duration, err error) {
				if op != opCapture || step != stepPrepare || err != nil || ran {
					return
				}
				ran = true
				h.store.compactMu.Lock()
				defer h.store.compactMu.Unlock()
				if err := h.store.maintain(ctx, r.ID, true); err != nil {
					t.Error(err)
				}
			}
			write(t, dir+"/after", "after")
			want := fstree.MustSnapshot(t, dir)
			h.capture(dir, "")
			h.store.cfg.StepHook = nil
			h.store.cfg.NoCompaction = false
			if !ran {
				t.Fatal("the hook did not run")
			}
			assertTree(t, dir, want)
			for i, cp := range cps {
				if i == del {
					continue
				}
				h.restore(cp.ID)
				assertTree(t, dir, trees[i])
			}
			if err := h.store.Settle(ctx); err != nil {
				t.Fatal(err)
			}
			h.assertNoOrphans()
		}
	})
}

// TestIntentKeepsItsDirs: a capture's intent names a new upper and a
// stack that no record names yet (its capture stopped between the swap
// and the commit, and the root's next operation finishes it by mounting
// that stack). Collection keeps those dirs while the intent exists, and
// frees them once it is gone.
func TestIntentKeepsItsDirs(t *testing.T) {
	h := newHarness(t, false)
	s := h.store
	next, lower := s.newLayerID(), s.newLayerID()
	for _, id := range []uint64{next, lower} {
		if err := s.makeLayerDir(id, true, -1); err != nil {
			t.Fatal(err)
		}
	}
	in := &captureIntent{Root: 1, Next: next, Stack: overlay.Stack{Upper: next, Lowers: []uint64{lower}}}
	if err := s.writeIntent(in); err != nil {
		t.Fatal(err)
	}
	s.unpin(next, lower)
	s.collect(context.Background())
	if got := h.layerDirs(); !slices.Contains(got, next) || !slices.Contains(got, lower) {
		t.Fatalf("layer dirs %v after a collection: the intent's %d and %d are gone", got, next, lower)
	}
	s.removeIntent(next)
	s.collect(context.Background())
	if got := h.layerDirs(); slices.Contains(got, next) || slices.Contains(got, lower) {
		t.Fatalf("layer dirs %v after the intent went: %d and %d are still there", got, next, lower)
	}
}
