package layers

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
	"strata/internal/testenv"
	"strata/layers/meta"
)

// bruteEntry is what the brute-force comparison knows of one path.
type bruteEntry struct {
	typ            string
	mode, uid, gid uint32
	size           int64
	mtime          unix.Timespec
	target         string
	digest         [32]byte
}

// bruteTree is a plain walk of a directory ("." is the root).
type bruteTree map[string]bruteEntry

func bruteSnapshot(t *testing.T, dir string) bruteTree {
	t.Helper()
	out := bruteTree{}
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		e := bruteEntry{typ: entryType(&st), mode: st.Mode, uid: st.Uid, gid: st.Gid, size: st.Size, mtime: st.Mtim}
		switch e.typ {
		case TypeFile:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			e.digest = sha256.Sum256(b)
		case TypeSymlink:
			if e.target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		out[filepath.ToSlash(rel)] = e
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return out
}

// bruteChanges is Changes' definition applied to two whole trees (older
// nil: nothing before, the root not listed). Directory sizes are left out
// (a layer's directory and a mount's differ); changeKey compares the rest.
func bruteChanges(older, newer bruteTree) []string {
	var out []string
	add := func(p, change string, e bruteEntry) {
		size := e.size
		if e.typ == TypeDir {
			size = 0
		}
		out = append(out, fmt.Sprintf("%s %s %s %d", p, change, e.typ, size))
	}
	for p, n := range newer {
		o, ok := older[p]
		switch {
		case !ok && older == nil && p == ".":
		case !ok:
			add(p, ChangeAdded, n)
		case o.typ != n.typ:
			add(p, ChangeModified, n)
		case n.typ == TypeDir:
			if o.mode != n.mode || o.uid != n.uid || o.gid != n.gid {
				add(p, ChangeModified, n)
			}
		case o != n:
			add(p, ChangeModified, n)
		}
	}
	for p, o := range older {
		if _, ok := newer[p]; !ok {
			add(p, ChangeDeleted, o)
		}
	}
	slices.Sort(out)
	return out
}

// changeKeys renders Changes' answer as bruteChanges does.
func changeKeys(cs []Change) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		size := c.Size
		if c.Type == TypeDir {
			size = 0
		}
		out = append(out, fmt.Sprintf("%s %s %s %d", c.Path, c.Change, c.Type, size))
	}
	slices.Sort(out)
	return out
}

// diffLines says how two sorted lists differ.
func diffLines(want, got []string) string {
	var b strings.Builder
	for _, w := range want {
		if !slices.Contains(got, w) {
			fmt.Fprintf(&b, "  missing: %s\n", w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			fmt.Fprintf(&b, "  extra:   %s\n", g)
		}
	}
	return b.String()
}

// parentState is the older state of a checkpoint's changes against its
// parent: the saved tree of the checkpoint that names its layer's parent,
// or else that layer's chain materialized; nil (and base) when the layer
// is the base of its chain.
func (h *harness) parentState(id string, saved map[string]bruteTree) (older bruteTree, base, enrollment bool) {
	h.t.Helper()
	var parent uint64
	var named string
	var cpParent string
	err := h.store.view(func(t meta.Tx) error {
		cp, err := mustCheckpoint(t, id)
		if err != nil {
			return err
		}
		cpParent = cp.Parent
		l, err := t.Layer(cp.Layer)
		if err != nil {
			return err
		}
		parent = l.Parent
		cs, err := t.Checkpoints()
		for _, c := range cs {
			if c.Layer == parent && saved[c.ID] != nil {
				named = c.ID
			}
		}
		return err
	})
	if err != nil {
		h.t.Fatal(err)
	}
	switch {
	case parent == 0:
		return nil, true, cpParent == ""
	case named != "":
		return saved[named], false, false
	}
	unpin, err := h.store.viewPinned(func(t meta.Tx) ([]uint64, error) { return segDirs(t, parent) })
	if err != nil {
		h.t.Fatal(err)
	}
	var ids []uint64
	h.store.view(func(t meta.Tx) (err error) { ids, err = segDirs(t, parent); return err })
	lt, err := h.store.layerTreeOf(ids, unpin)
	if err != nil {
		h.t.Fatal(err)
	}
	defer lt.Close()
	return bruteSnapshot(h.t, materializeTo(h.t, lt)), false, false
}

// TestChangesRandom is the property of Changes: for random trees and
// random edits (adds, rewrites, deletes, renames of files and directories
// at every depth, type changes, deep deletions, directories deleted and
// made again, which become opaque), the changes of every checkpoint
// against its parent, against the live directory and against another
// checkpoint equal a brute-force comparison of the two whole trees, after
// each capture, after compaction and squash, and after a restart.
func TestChangesRandom(t *testing.T) {
	seed := testSeed(t)
	batches := 24
	if testing.Short() {
		batches = 6
	}
	forEachMounter(t, func(t *testing.T, h *harness) {
		rng := rand.New(rand.NewPCG(seed, 1))
		ed := &treeEditor{rng: rng, exdev: !h.store.mounter.Options().RedirectDir}
		ctx := context.Background()
		dir := h.mkdir("project", func(d string) { deepTree(t, d) })
		saved := map[string]bruteTree{}
		var ids []string
		first := h.capture(dir, "base").ID
		head := first
		saved[first], ids = bruteSnapshot(t, dir), []string{first}
		var log []string
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d: %s\nlast changes:\n  %s", seed, fmt.Sprintf(format, args...), strings.Join(log[max(0, len(log)-30):], "\n  "))
		}
		checkParent := func(stage, id string) {
			t.Helper()
			older, base, enrollment := h.parentState(id, saved)
			got, err := h.store.Changes(ctx, id, "")
			if err != nil {
				fail("%s: Changes(%s): %v", stage, id, err)
			}
			var want []string
			if !enrollment {
				want = bruteChanges(older, saved[id])
			}
			if !base && older == nil {
				fail("%s: no parent state", stage)
			}
			if g := changeKeys(got); !slices.Equal(g, want) {
				fail("%s: changes of %s against its parent differ from the brute force:\n%s", stage, id, diffLines(want, g))
			}
		}
		checkOther := func(stage, id, other string) {
			t.Helper()
			got, err := h.store.Changes(ctx, id, other)
			if err != nil {
				fail("%s: Changes(%s, %s): %v", stage, id, other, err)
			}
			if want, g := bruteChanges(saved[other], saved[id]), changeKeys(got); !slices.Equal(g, want) {
				fail("%s: changes of %s against %s differ from the brute force:\n%s", stage, id, other, diffLines(want, g))
			}
		}
		checkLive := func(stage, id string) {
			t.Helper()
			got, err := h.store.Changes(ctx, id, AgainstLive)
			if err != nil {
				fail("%s: Changes(%s, live): %v", stage, id, err)
			}
			if want, g := bruteChanges(saved[id], bruteSnapshot(t, dir)), changeKeys(got); !slices.Equal(g, want) {
				fail("%s: changes of %s against the live directory differ from the brute force:\n%s", stage, id, diffLines(want, g))
			}
		}
		checkAll := func(stage string) {
			t.Helper()
			for _, id := range ids {
				checkParent(stage, id)
				checkLive(stage, id)
				checkOther(stage, id, ids[rng.IntN(len(ids))])
			}
		}
		for b := range batches {
			for range 1 + rng.IntN(6) {
				desc, err := ed.edit(dir)
				log = append(log, fmt.Sprintf("batch %d: %s", b, desc))
				if err != nil {
					fail("%s: %v", desc, err)
				}
			}
			// Unsaved changes first, for the comparison with the live
			// directory: with the checkpoint it goes on from (its upper
			// layer alone is walked) and with any other.
			if saved[head] != nil {
				checkLive(fmt.Sprintf("batch %d, unsaved, against the head", b), head)
			}
			checkLive(fmt.Sprintf("batch %d, unsaved", b), ids[rng.IntN(len(ids))])
			cp, err := h.store.Capture(ctx, dir, "")
			if err != nil {
				fail("capture: %v", err)
			}
			saved[cp.ID] = bruteSnapshot(t, dir)
			ids = append(ids, cp.ID)
			head = cp.ID
			stage := fmt.Sprintf("batch %d", b)
			checkParent(stage, cp.ID)
			checkOther(stage, cp.ID, ids[rng.IntN(len(ids))])
			switch rng.IntN(6) {
			case 0:
				log = append(log, fmt.Sprintf("batch %d: settle", b))
				if err := h.store.Settle(ctx); err != nil {
					fail("settle: %v", err)
				}
			case 1:
				i := rng.IntN(len(ids))
				log = append(log, fmt.Sprintf("batch %d: restore checkpoint %d", b, i))
				h.restore(ids[i])
				head = ids[i]
			case 2:
				if len(ids) > 2 {
					i := rng.IntN(len(ids) - 1)
					log = append(log, fmt.Sprintf("batch %d: delete checkpoint %d", b, i))
					if err := h.store.Delete(ctx, ids[i]); err != nil {
						fail("delete: %v", err)
					}
					delete(saved, ids[i])
					ids = slices.Delete(ids, i, i+1)
				}
			}
		}
		checkAll("captured")
		if err := h.store.Settle(ctx); err != nil {
			fail("settle: %v", err)
		}
		checkAll("settled")
		for i := 0; i < len(ids)-1; {
			if rng.IntN(2) == 0 {
				if err := h.store.Delete(ctx, ids[i]); err != nil {
					fail("delete: %v", err)
				}
				delete(saved, ids[i])
				ids = slices.Delete(ids, i, i+1)
				continue
			}
			i++
		}
		if err := h.store.Settle(ctx); err != nil {
			fail("settle: %v", err)
		}
		checkAll("squashed")
		h.reopen()
		checkAll("after a restart")
		t.Logf("%d changes in %d batches, %d checkpoints kept", len(log), batches, len(ids))
	})
}

// TestChangesErrors: an unknown checkpoint on either side is not found;
// a checkpoint of another directory is 422 checkpoint_other_directory.
func TestChangesErrors(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	ctx := context.Background()
	a := h.capture(h.mkdir("a", func(d string) { write(t, d+"/f", "a") }), "a")
	b := h.capture(h.mkdir("b", func(d string) { write(t, d+"/f", "b") }), "b")
	for _, c := range []struct {
		name, id, against, code string
	}{
		{"unknown checkpoint", "cp_nope", "", ErrCheckpointNotFound.Code},
		{"unknown checkpoint against live", "cp_nope", AgainstLive, ErrCheckpointNotFound.Code},
		{"unknown other checkpoint", a.ID, "cp_nope", ErrCheckpointNotFound.Code},
		{"another directory's checkpoint", a.ID, b.ID, ErrCheckpointOtherDirectory.Code},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := h.store.Changes(ctx, c.id, c.against)
			if fault.CodeOf(err) != c.code {
				t.Fatalf("Changes(%s, %s) = %v, want %s", c.id, c.against, err, c.code)
			}
		})
	}
	// The enrollment checkpoint changed nothing against its parent.
	cs, err := h.store.Changes(ctx, a.ID, "")
	if err != nil || cs == nil || len(cs) != 0 {
		t.Fatalf("changes of an enrollment checkpoint = %v, %v; want an empty list", cs, err)
	}
}
