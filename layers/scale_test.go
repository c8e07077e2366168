package layers

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"strata/internal/fstree"
	"strata/layers/meta"
)

// mutate applies one random change to dir, of every kind a user makes:
// new, rewritten, deleted and renamed files, new, removed and renamed
// directories, modes, xattrs, symlinks. exdev says the store mounts with
// redirect_dir=off, where renaming a directory that a lower layer holds
// fails with EXDEV.
func mutate(t *testing.T, rng *rand.Rand, dir string, step int, exdev bool) {
	t.Helper()
	pick := func(pattern string) string {
		var all []string
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && p != dir && strings.Contains(filepath.Base(p), pattern) {
				all = append(all, p)
			}
			return nil
		})
		if len(all) == 0 {
			return ""
		}
		return all[rng.IntN(len(all))]
	}
	switch rng.IntN(9) {
	case 0, 1:
		sub := []string{"", "d1", "d2", "d1/e"}[rng.IntN(4)]
		write(t, filepath.Join(dir, sub, fmt.Sprintf("f%d", step)), fmt.Sprintf("content %d", step))
	case 2:
		if f := pick("f"); f != "" {
			if fi, err := os.Lstat(f); err == nil && fi.Mode().IsRegular() {
				os.WriteFile(f, []byte(fmt.Sprintf("rewritten at %d", step)), 0o644)
			}
		}
	case 3:
		if f := pick("f"); f != "" {
			os.RemoveAll(f)
		}
	case 4:
		if d := pick("d"); d != "" && rng.IntN(3) == 0 {
			os.RemoveAll(d)
		} else {
			os.MkdirAll(filepath.Join(dir, fmt.Sprintf("d%d", rng.IntN(3)), "e"), 0o755)
		}
	case 5:
		if d := pick("d"); d != "" {
			// A directory rename. With redirect_dir=off overlayfs refuses
			// to rename a directory that a lower layer has (EXDEV), and mv
			// copies it instead: do as mv does.
			dst := filepath.Join(dir, fmt.Sprintf("d%d", 10+step))
			err := os.Rename(d, dst)
			if err != nil && (!exdev || !errors.Is(err, unix.EXDEV)) {
				t.Fatalf("rename %s: %v", d, err)
			}
			if err != nil {
				if out, err := exec.Command("cp", "-a", d, dst).CombinedOutput(); err != nil {
					t.Fatalf("cp -a: %v %s", err, out)
				}
				os.RemoveAll(d)
			}
		}
	case 6:
		if f := pick(""); f != "" {
			if fi, err := os.Lstat(f); err == nil && fi.Mode()&os.ModeSymlink == 0 {
				os.Chmod(f, os.FileMode(0o600+rng.IntN(0o177)))
			}
		}
	case 7:
		if f := pick("f"); f != "" {
			unix.Lsetxattr(f, "user.step", []byte(fmt.Sprint(step)), 0)
		}
	case 8:
		os.Symlink(fmt.Sprintf("target-%d", step), filepath.Join(dir, fmt.Sprintf("l%d", step)))
	}
}

// TestManyCheckpoints captures n checkpoints of one directory, each after
// a random change, keeps them all, and restores every one: the content is
// exact, and no mount stack is deeper than the compaction bound.
func TestManyCheckpoints(t *testing.T) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("STRATA_TEST_MANY")); err == nil {
		n = v
	}
	forEachMounter(t, func(t *testing.T, h *harness) {
		if h.legacy {
			n = min(n, 150) // the same code but the mount call; keep CI time down
		}
		rng := rand.New(rand.NewPCG(1, uint64(n)))
		dir := h.mkdir("project", func(d string) {
			for i := 0; i < 50; i++ {
				write(t, filepath.Join(d, fmt.Sprintf("d%d/base%d", i%3, i)), fmt.Sprint(i))
			}
		})
		ctx := context.Background()
		type saved struct {
			id   string
			tree fstree.Tree
		}
		var cps []saved
		maxDepth := 0
		for i := 0; i < n; i++ {
			cp := h.capture(dir, "")
			tr, err := fstree.Snapshot(dir)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			cps = append(cps, saved{cp.ID, tr})
			// The worker normally keeps up; settle so the bound is exact.
			if err := h.store.Settle(ctx); err != nil {
				t.Fatal(err)
			}
			mutate(t, rng, dir, i, !h.store.mounter.Options().RedirectDir)
			r := h.rootOf(dir)
			maxDepth = max(maxDepth, len(r.Mounted.Lowers))
		}
		bound := depthBound(n)
		if maxDepth > bound {
			t.Fatalf("live stack reached %d lower layers over %d checkpoints, bound %d", maxDepth, n, bound)
		}
		t.Logf("%d checkpoints: deepest live stack %d lower layers (bound %d)", n, maxDepth, bound)
		// Every one of them, newest first.
		for i := len(cps) - 1; i >= 0; i-- {
			h.restore(cps[i].id)
			if d := fstree.Diff(cps[i].tree, fstree.MustSnapshot(t, dir)); len(d) > 0 {
				t.Fatalf("checkpoint %d of %d restored wrong:\n%s", i, n, strings.Join(d, "\n"))
			}
			if depth := len(h.rootOf(dir).Mounted.Lowers); depth > bound {
				t.Fatalf("restoring checkpoint %d mounts %d lower layers, bound %d", i, depth, bound)
			}
		}
		list, err := h.store.List(ctx)
		if err != nil || len(list) != n {
			t.Fatalf("List: %d checkpoints, %v", len(list), err)
		}
		h.assertNoOrphans()

		// Delete two thirds at random: squashing merges what only the
		// deleted ones needed, and every survivor restores exactly.
		layersBefore := h.layerRecords()
		start := time.Now()
		var kept []saved
		for _, c := range cps {
			if rng.IntN(3) == 0 {
				kept = append(kept, c)
				continue
			}
			if err := h.store.Delete(ctx, c.id); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("deletes took %v", time.Since(start))
		if err := h.store.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("settled after %v", time.Since(start))
		t.Logf("deleted %d of %d checkpoints: layers %d -> %d", n-len(kept), n, layersBefore, h.layerRecords())
		if h.layerRecords() > len(kept)+2 {
			t.Fatalf("%d layers for %d checkpoints: unreferenced layers pile up", h.layerRecords(), len(kept))
		}
		for i := len(kept) - 1; i >= 0; i -= max(1, len(kept)/40) {
			h.restore(kept[i].id)
			if d := fstree.Diff(kept[i].tree, fstree.MustSnapshot(t, dir)); len(d) > 0 {
				t.Fatalf("surviving checkpoint %d restored wrong after squashing:\n%s", i, strings.Join(d, "\n"))
			}
		}
		h.assertNoOrphans()
	})
}

// depthBound is the documented bound on lower layers for n checkpoints on
// one chain: the binary counter's log2(n)+1 segments, plus the base.
func depthBound(n int) int { return bits.Len(uint(n)) + 2 }

func (h *harness) rootOf(path string) *meta.Root {
	h.t.Helper()
	var r *meta.Root
	if err := h.store.db.View(func(btx *bolt.Tx) (err error) {
		r, err = meta.Tx{Tx: btx}.RootByPath(path)
		return err
	}); err != nil || r == nil {
		h.t.Fatalf("root %s: %v", path, err)
	}
	return r
}

// TestSquashInsideSpan pins a bug: squashing a pair of layers strictly
// inside a span left the span's count one too high, every span built on
// it came out stale, and compaction retried forever (Settle never
// returned). The span must now cover exactly its layers, and each
// checkpoint still restores.
func TestSquashInsideSpan(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "0") })
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var ids []string
		var trees []fstree.Tree
		for i := 1; i <= 6; i++ {
			ids = append(ids, h.capture(dir, "").ID)
			trees = append(trees, fstree.MustSnapshot(t, dir))
			if err := h.store.Settle(ctx); err != nil {
				t.Fatal(err)
			}
			write(t, dir+"/f", strconv.Itoa(i))
		}
		if err := h.store.Delete(ctx, ids[2]); err != nil {
			t.Fatal(err)
		}
		if err := h.store.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		h.capture(dir, "")
		if err := h.store.Settle(ctx); err != nil {
			t.Fatalf("compaction did not settle after a squash inside a span: %v", err)
		}
		if err := h.store.db.View(func(btx *bolt.Tx) error {
			t2 := meta.Tx{Tx: btx}
			sps, err := t2.Spans()
			for _, sp := range sps {
				cur, n := sp.Top, 1
				for ; cur != sp.Bottom; n++ {
					l, err := t2.Layer(cur)
					if err != nil {
						return err
					}
					cur = l.Parent
				}
				if n != sp.Count {
					t.Errorf("span %d says %d layers, covers %d", sp.ID, sp.Count, n)
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if i == 2 {
				continue
			}
			h.restore(id)
			if d := fstree.Diff(trees[i], fstree.MustSnapshot(t, dir)); len(d) > 0 {
				t.Fatalf("checkpoint %d: %s", i, strings.Join(d, "\n"))
			}
		}
		h.assertNoOrphans()
	})
}
