package layers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fstree"
)

// savedCheckpoint is a checkpoint and the live tree it was taken of.
type savedCheckpoint struct {
	id   string
	tree fstree.Tree
}

// checkAll compares the live directory with live, then restores every
// checkpoint and compares it with the tree it was taken of. The live
// directory ends on the last of cps.
func (h *harness) checkAll(stage, dir string, live fstree.Tree, cps []savedCheckpoint) {
	h.t.Helper()
	if d := fstree.Diff(live, fstree.MustSnapshot(h.t, dir)); len(d) > 0 {
		h.t.Fatalf("%s: the live directory differs:\n%s", stage, strings.Join(d, "\n"))
	}
	for i, cp := range cps {
		h.restore(cp.id)
		if d := fstree.Diff(cp.tree, fstree.MustSnapshot(h.t, dir)); len(d) > 0 {
			h.t.Fatalf("%s: checkpoint %d restored wrong:\n%s", stage, i, strings.Join(d, "\n"))
		}
	}
}

// TestDirectoryRenameDepths renames directories that earlier checkpoints
// hold, at depths 1, 2 and 5, within a parent and across parents, with a
// capture after each; every checkpoint restores exactly, after
// compaction, after squashing and after a restart. With redirect_dir=off
// each of these renames failed with EXDEV.
func TestDirectoryRenameDepths(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { deepTree(t, d) })
		ctx := context.Background()
		cps := []savedCheckpoint{{h.capture(dir, "base").ID, fstree.MustSnapshot(t, dir)}}
		renames := []struct{ name, from, to string }{
			{"depth 5 within its parent", "a1/a2/a3/a4/a5", "a1/a2/a3/a4/r5"},
			{"depth 2 within its parent", "a1/a2", "a1/r2"},
			{"depth 1", "a1", "r1"},
			{"depth 5 across parents", "b1/b2/b3/b4/b5", "c1/c2/c3/c4/b5"},
			{"depth 2 across parents, holding a renamed one", "r1/r2", "c1/c2/c3/c4/b5/r2"},
			{"depth 1 down to depth 5", "b1", "c1/c2/c3/c4/b1"},
			{"depth 5 up to depth 1, renamed before", "c1/c2/c3/c4/b5", "b5"},
		}
		for _, r := range renames {
			if err := os.Rename(filepath.Join(dir, r.from), filepath.Join(dir, r.to)); err != nil {
				t.Fatalf("%s: rename %s -> %s: %v", r.name, r.from, r.to, err)
			}
			write(t, filepath.Join(dir, r.to, "after"), r.name)
			cps = append(cps, savedCheckpoint{h.capture(dir, r.name).ID, fstree.MustSnapshot(t, dir)})
		}
		live := cps[len(cps)-1].tree
		h.checkAll("captured", dir, live, cps)
		if err := h.store.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		h.checkAll("compacted", dir, cps[len(cps)-1].tree, cps)
		h.reopen()
		h.checkAll("after a restart", dir, cps[len(cps)-1].tree, cps)
		// Every other checkpoint deleted: their layers are squashed into
		// their children, redirects and all.
		var kept []savedCheckpoint
		for i, cp := range cps {
			if i%2 == 1 && i != len(cps)-1 {
				if err := h.store.Delete(ctx, cp.id); err != nil {
					t.Fatal(err)
				}
				continue
			}
			kept = append(kept, cp)
		}
		if err := h.store.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		h.checkAll("squashed", dir, kept[len(kept)-1].tree, kept)
		h.reopen()
		h.checkAll("squashed, after a restart", dir, kept[len(kept)-1].tree, kept)
		h.assertNoOrphans()
	})
}

// TestDirectoryRenamesRandom is the property: random trees and random
// changes (treeEditor: directory renames at every depth, of renamed
// directories, into and out of directories from other checkpoints,
// deletes, re-creates, type changes), captured in batches, with restores
// of older checkpoints, deletes, compaction, squashing and restarts in
// between; every checkpoint restores to the tree it was taken of, and the
// live directory stays what it was, at every stage.
func TestDirectoryRenamesRandom(t *testing.T) {
	seed := testSeed(t)
	batches := 40
	if testing.Short() {
		batches = 8
	}
	forEachMounter(t, func(t *testing.T, h *harness) {
		rng := rand.New(rand.NewPCG(seed, 0))
		ed := &treeEditor{rng: rng, exdev: !h.store.mounter.Options().RedirectDir}
		ctx := context.Background()
		dir := h.mkdir("project", func(d string) { deepTree(t, d) })
		cps := []savedCheckpoint{{h.capture(dir, "base").ID, fstree.MustSnapshot(t, dir)}}
		live := cps[0].tree
		var log []string
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d: %s\nlast changes:\n  %s", seed, fmt.Sprintf(format, args...), strings.Join(log[max(0, len(log)-30):], "\n  "))
		}
		for b := range batches {
			for range 1 + rng.IntN(6) {
				desc, err := ed.edit(dir)
				log = append(log, fmt.Sprintf("batch %d: %s", b, desc))
				if err != nil {
					fail("%s: %v", desc, err)
				}
			}
			cp, err := h.store.Capture(ctx, dir, "")
			if err != nil {
				fail("capture: %v", err)
			}
			live = fstree.MustSnapshot(t, dir)
			cps = append(cps, savedCheckpoint{cp.ID, live})
			switch rng.IntN(6) {
			case 0:
				log = append(log, fmt.Sprintf("batch %d: settle", b))
				if err := h.store.Settle(ctx); err != nil {
					fail("settle: %v", err)
				}
			case 1:
				// Changes go on from an older checkpoint: later renames move
				// directories that other checkpoints' layers hold.
				i := rng.IntN(len(cps))
				log = append(log, fmt.Sprintf("batch %d: restore checkpoint %d", b, i))
				h.restore(cps[i].id)
				live = cps[i].tree
				if d := fstree.Diff(live, fstree.MustSnapshot(t, dir)); len(d) > 0 {
					fail("checkpoint %d restored wrong:\n%s", i, strings.Join(d, "\n"))
				}
			case 2:
				if len(cps) > 2 {
					i := rng.IntN(len(cps) - 1)
					log = append(log, fmt.Sprintf("batch %d: delete checkpoint %d", b, i))
					if err := h.store.Delete(ctx, cps[i].id); err != nil {
						fail("delete: %v", err)
					}
					cps = append(cps[:i], cps[i+1:]...)
				}
			case 3:
				log = append(log, fmt.Sprintf("batch %d: restart", b))
				h.reopen()
			}
		}
		h.checkAll("captured", dir, live, cps)
		live = cps[len(cps)-1].tree
		if err := h.store.Settle(ctx); err != nil {
			fail("settle: %v", err)
		}
		h.checkAll("settled", dir, live, cps)
		var kept []savedCheckpoint
		for i, cp := range cps {
			if i != len(cps)-1 && rng.IntN(2) == 0 {
				if err := h.store.Delete(ctx, cp.id); err != nil {
					fail("delete: %v", err)
				}
				continue
			}
			kept = append(kept, cp)
		}
		if err := h.store.Settle(ctx); err != nil {
			fail("settle: %v", err)
		}
		h.checkAll("squashed", dir, live, kept)
		h.reopen()
		h.checkAll("after a restart", dir, live, kept)
		h.assertNoOrphans()
		t.Logf("%d changes in %d batches, %d checkpoints kept of %d", len(log), batches, len(kept), len(cps))
	})
}

// TestDirectoryRenameWithoutRedirectDir pins the fallback for a kernel
// that refuses redirect_dir=on: the store mounts with redirect_dir=off,
// and renaming a directory that a checkpoint holds fails with EXDEV and
// changes nothing, while a directory made since the last capture still
// renames.
func TestDirectoryRenameWithoutRedirectDir(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		h.cfg.NoRedirectDir = true
		h.reopen()
		if h.store.mounter.Options().RedirectDir {
			t.Fatal("NoRedirectDir: the store still mounts with redirect_dir=on")
		}
		dir := h.mkdir("project", func(d string) { write(t, d+"/a/b/f", "f") })
		h.capture(dir, "1")
		before := fstree.MustSnapshot(t, dir)
		for _, r := range [][2]string{{"a", "a2"}, {"a/b", "a/b2"}, {"a/b", "b"}} {
			err := os.Rename(filepath.Join(dir, r[0]), filepath.Join(dir, r[1]))
			if !errors.Is(err, unix.EXDEV) {
				t.Fatalf("rename %s -> %s with redirect_dir=off: %v, want EXDEV", r[0], r[1], err)
			}
		}
		assertTree(t, dir, before)
		write(t, dir+"/new/f", "new")
		if err := os.Rename(dir+"/new", dir+"/a/new2"); err != nil {
			t.Fatalf("rename of a directory made since the capture: %v", err)
		}
		// The choice is the store's, made when it opens; a mount keeps the
		// options it was made with until the next capture or restore.
		h.cfg.NoRedirectDir = false
		h.reopen()
		h.capture(dir, "2")
		if err := os.Rename(dir+"/a", dir+"/a2"); err != nil {
			t.Fatalf("rename after reopening with redirect_dir=on and a capture: %v", err)
		}
	})
}
