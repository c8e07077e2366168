package layers

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fstree"
)

// TestExportEqualsRestore: with the daemon's store closed, Export of each
// checkpoint writes a plain directory equal to what a restore of it gives
// (types, content, modes, owners, times, xattrs, symlinks), and of a
// directory's live state, its live content; while the store is open,
// Export refuses and says why; an existing destination is refused and
// nothing is left behind.
func TestExportEqualsRestore(t *testing.T) {
	seed := testSeed(t)
	forEachMounter(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(seed, 2))
		ed := &treeEditor{rng: rng, exdev: !h.store.mounter.Options().RedirectDir}
		dir := h.mkdir("project", func(d string) { deepTree(t, d) })
		must(t, unix.Lsetxattr(dir+"/top", "user.k", []byte("v"), 0))
		must(t, os.Chown(dir+"/top", 1234, 5678))
		cps := []savedCheckpoint{{h.capture(dir, "base").ID, fstree.MustSnapshot(t, dir)}}
		for b := range 6 {
			for range 1 + rng.IntN(5) {
				if desc, err := ed.edit(dir); err != nil {
					t.Fatalf("seed %d: batch %d: %s: %v", seed, b, desc, err)
				}
			}
			cps = append(cps, savedCheckpoint{h.capture(dir, "").ID, fstree.MustSnapshot(t, dir)})
			if b == 3 {
				if err := h.store.Settle(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		write(t, dir+"/unsaved", "unsaved")
		live := fstree.MustSnapshot(t, dir)
		out := filepath.Join(filepath.Dir(h.work), "exports")
		must(t, os.Mkdir(out, 0o755))
		err := Export(ctx, ExportRequest{Store: h.dir, ID: cps[0].id, To: out + "/held"})
		if err == nil || !strings.Contains(err.Error(), "stop it first") {
			t.Fatalf("Export with the store open: %v, want a refusal that says to stop guestd", err)
		}
		h.store.Close()
		h.store = nil
		for i, cp := range cps {
			to := filepath.Join(out, fmt.Sprint(i))
			if err := Export(ctx, ExportRequest{Store: h.dir, ID: cp.id, To: to}); err != nil {
				t.Fatalf("Export of checkpoint %d: %v", i, err)
			}
			if d := fstree.Diff(cp.tree, fstree.MustSnapshot(t, to)); len(d) > 0 {
				t.Fatalf("seed %d: export of checkpoint %d differs:\n%s", seed, i, strings.Join(d, "\n"))
			}
		}
		if err := Export(ctx, ExportRequest{Store: h.dir, Path: dir, To: out + "/live"}); err != nil {
			t.Fatalf("Export of the live state: %v", err)
		}
		if d := fstree.Diff(live, fstree.MustSnapshot(t, out+"/live")); len(d) > 0 {
			t.Fatalf("export of the live state differs:\n%s", strings.Join(d, "\n"))
		}
		if err := Export(ctx, ExportRequest{Store: h.dir, ID: cps[0].id, To: out + "/live"}); err == nil {
			t.Fatal("Export onto an existing directory succeeded")
		}
		if err := Export(ctx, ExportRequest{Store: h.dir, ID: "cp_nope", To: out + "/nope"}); err == nil {
			t.Fatal("Export of an unknown checkpoint succeeded")
		}
		if err := Export(ctx, ExportRequest{Store: h.dir, ID: cps[0].id, To: out + "/no/parent"}); err == nil {
			t.Fatal("Export under a missing parent succeeded")
		}
		ents, err := os.ReadDir(out)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != len(cps)+1 {
			t.Fatalf("exports dir holds %d entries, want %d (a temporary left behind?)", len(ents), len(cps)+1)
		}
		// And what a restore gives, literally.
		h.open()
		for i, cp := range cps {
			h.restore(cp.id)
			if d := fstree.Diff(fstree.MustSnapshot(t, dir), fstree.MustSnapshot(t, filepath.Join(out, fmt.Sprint(i)))); len(d) > 0 {
				t.Fatalf("export of checkpoint %d differs from its restore:\n%s", i, strings.Join(d, "\n"))
			}
		}
	})
}
