package layers

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"strata/holders"
	"strata/internal/fault"
	"strata/internal/fstree"
	"strata/internal/testenv"
	"strata/layers/meta"
	"strata/pathpolicy"
)

// checkpointsOf returns the ids of the checkpoints of the directory at
// path, oldest first.
func checkpointsOf(t *testing.T, h *harness, path string) []string {
	t.Helper()
	var out []string
	for _, c := range mustList(t, h) {
		if c.Path == path {
			out = append(out, c.ID)
		}
	}
	return out
}

// assertClean fails when the store's Check finds a problem or a layer dir
// is an orphan.
func (h *harness) assertClean() {
	h.t.Helper()
	rep, err := h.store.Check(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	if len(rep.Problems) > 0 {
		h.t.Fatalf("store check: %v", rep.Problems)
	}
	h.assertNoOrphans()
}

// TestClone: a clone shows its checkpoint, both directories then live
// their own lives (changes, captures, restores), the clone's first
// checkpoint has the source checkpoint as parent, and deleting every
// checkpoint of the source, compaction, squash and a restart leave the
// clone intact.
func TestClone(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		src := h.mkdir("src", func(d string) { richTree(t, d) })
		cp1 := h.capture(src, "one")
		atCP1 := fstree.MustSnapshot(t, src)
		write(t, src+"/a.txt", "changed in the source")
		os.RemoveAll(src + "/sub")
		cp2 := h.capture(src, "two")

		dst := filepath.Join(h.work, "clone")
		if err := h.store.Clone(ctx, cp1.ID, dst); err != nil {
			t.Fatalf("Clone: %v", err)
		}
		assertTree(t, dst, atCP1)
		if n := len(checkpointsOf(t, h, dst)); n != 0 {
			t.Fatalf("a new clone has %d checkpoints", n)
		}

		// Both change; each captures and restores on its own.
		write(t, dst+"/clone-only", "c")
		write(t, dst+"/sub/deep/b.txt", "edited in the clone")
		write(t, src+"/src-only", "s")
		c1 := h.capture(dst, "clone one")
		if c1.ParentID != cp1.ID {
			t.Fatalf("the clone's first checkpoint has parent %q, want the source checkpoint %s", c1.ParentID, cp1.ID)
		}
		atC1 := fstree.MustSnapshot(t, dst)
		s3 := h.capture(src, "three")
		atS3 := fstree.MustSnapshot(t, src)
		write(t, dst+"/unsaved", "x")
		h.restore(c1.ID)
		assertTree(t, dst, atC1)
		h.restore(cp2.ID)
		if _, err := os.Stat(src + "/src-only"); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("restore of the source's checkpoint two shows a later file: %v", err)
		}
		h.restore(s3.ID)
		assertTree(t, src, atS3)
		assertTree(t, dst, atC1)

		// Every checkpoint of the source goes; the source restores its
		// live state away too. The clone keeps everything.
		for _, id := range checkpointsOf(t, h, src) {
			if err := h.store.Delete(ctx, id); err != nil {
				t.Fatalf("Delete(%s): %v", id, err)
			}
		}
		if err := h.store.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		assertTree(t, dst, atC1)
		assertTree(t, src, atS3)
		write(t, dst+"/more", "m")
		c2 := h.capture(dst, "clone two")
		atC2 := fstree.MustSnapshot(t, dst)
		h.restore(c1.ID)
		assertTree(t, dst, atC1)
		h.assertClean()

		h.reopen()
		assertTree(t, dst, atC1)
		assertTree(t, src, atS3)
		h.restore(c2.ID)
		assertTree(t, dst, atC2)
		h.assertClean()
	})
}

// TestCloneSquashAcrossRoots: a source layer whose only remaining child
// is the clone's sealed layer is squashed into it (the source restored
// away from it and lost its checkpoint); the clone's checkpoints follow
// the merged layer, and the clone's content is intact, after a restart
// too.
func TestCloneSquashAcrossRoots(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	ctx := context.Background()
	src := h.mkdir("src", func(d string) { write(t, d+"/f", "base") })
	cp0 := h.capture(src, "base")
	write(t, src+"/f", "one")
	write(t, src+"/g", "g1")
	cp1 := h.capture(src, "one")
	dst := filepath.Join(h.work, "clone")
	if err := h.store.Clone(ctx, cp1.ID, dst); err != nil {
		t.Fatal(err)
	}
	write(t, dst+"/f", "clone")
	c1 := h.capture(dst, "c1")
	atC1 := fstree.MustSnapshot(t, dst)
	write(t, dst+"/h", "later")
	h.capture(dst, "c2")
	layerOf := func(id string) uint64 {
		cp, _, err := h.store.lookup(id)
		if err != nil {
			t.Fatal(err)
		}
		return cp.Layer
	}
	before := layerOf(c1.ID)
	// The source leaves cp1's layer and drops every checkpoint: that
	// layer keeps one child, the clone's sealed c1 layer.
	h.restore(cp0.ID)
	for _, id := range checkpointsOf(t, h, src) {
		if err := h.store.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.store.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if layerOf(c1.ID) == before {
		t.Fatalf("the clone's checkpoint is still on layer %d: nothing was squashed", before)
	}
	h.restore(c1.ID)
	assertTree(t, dst, atC1)
	if got := readString(t, src+"/f"); got != "base" {
		t.Fatalf("source f = %q", got)
	}
	h.assertClean()
	h.reopen()
	assertTree(t, dst, atC1)
	h.assertClean()
}

// TestClonePathRules: a clone's path must not exist, its parent must, and
// the path rules apply.
func TestClonePathRules(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	ctx := context.Background()
	src := h.mkdir("src", func(d string) { write(t, d+"/f", "1") })
	cp := h.capture(src, "one")
	h.mkdir("exists", nil)
	write(t, h.work+"/file", "x")
	if err := os.Symlink(h.work, h.work+"/link"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nowhere", h.work+"/dangling"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, path, code string }{
		{"existing directory", h.work + "/exists", pathpolicy.CodePathExists},
		{"existing file", h.work + "/file", pathpolicy.CodePathExists},
		{"dangling symlink", h.work + "/dangling", pathpolicy.CodePathExists},
		{"the source itself", src, pathpolicy.CodePathExists},
		{"inside the source", src + "/new", pathpolicy.CodePathNested},
		{"parent missing", h.work + "/no/clone", pathpolicy.CodePathNotFound},
		{"parent a file", h.work + "/file/clone", pathpolicy.CodePathNotDirectory},
		{"symlink in parent", h.work + "/link/clone", pathpolicy.CodePathSymlink},
		{"system tree", "/usr/clone", pathpolicy.CodePathProtected},
		{"store", h.dir + "/clone", pathpolicy.CodePathProtected},
		{"relative", "clone", pathpolicy.CodePathNotAbsolute},
		{"unclean", h.work + "/a/../clone", pathpolicy.CodePathNotClean},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantCode(t, h.store.Clone(ctx, cp.ID, c.path), c.code)
		})
	}
	// Another filesystem than the store's: path_mount.
	other := t.TempDir()
	if err := unix.Mount("tmpfs", other, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(other, unix.MNT_DETACH)
	wantCode(t, h.store.Clone(ctx, cp.ID, other+"/clone"), pathpolicy.CodePathMount)
	wantCode(t, h.store.Clone(ctx, "cp_nope", h.work+"/clone"), ErrCheckpointNotFound.Code)
	// A directory nested in the clone cannot be enrolled afterwards.
	if err := h.store.Clone(ctx, cp.ID, h.work+"/clone"); err != nil {
		t.Fatal(err)
	}
	_, err := h.store.Capture(ctx, h.work+"/clone/f", "x")
	if fe := fault.As(err); fe == nil || fe.Kind != fault.Unprocessable {
		t.Fatalf("capture inside a clone: %v, want a path rule", err)
	}
	h.assertClean()
}

// Crash tests: a child process (this test binary, see TestMain) opens the
// store and runs one operation with a failpoint armed; the failpoint
// kills it as a power cut would; the test reopens the store and checks
// that it is before or after.

// runTestOp is the child's side: STRATA_TEST_OP is "clone" or "release",
// STRATA_TEST_STORE the store dir, STRATA_TEST_ARGS the operation's
// arguments (tab-separated). It returns the exit code.
func runTestOp() int {
	ctx := context.Background()
	s, err := Open(ctx, Config{Dir: os.Getenv("STRATA_TEST_STORE"), Scanner: holders.NewScanner("/proc"), NoCompaction: true})
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 2
	}
	args := strings.Split(os.Getenv("STRATA_TEST_ARGS"), "\t")
	switch os.Getenv("STRATA_TEST_OP") {
	case "clone":
		err = s.Clone(ctx, args[0], args[1])
	case "release":
		_, err = s.Release(ctx, args[0])
	}
	s.Close()
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	return 0
}

// crashOp runs op in a child process with the failpoint fp armed (""
// for none), the harness's store closed meanwhile; killed reports that
// the failpoint killed it.
func (h *harness) crashOp(fp, op string, args ...string) (killed bool) {
	h.t.Helper()
	h.store.Close()
	h.store = nil
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "STRATA_TEST_OP="+op, "STRATA_TEST_STORE="+h.dir,
		"STRATA_TEST_ARGS="+strings.Join(args, "\t"), "STRATA_FAILPOINTS="+fp)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(interface{ Signaled() bool }); ok && ws.Signaled() {
			killed = true
		}
	}
	if !killed && err != nil {
		h.t.Fatalf("%s in a child: %v\n%s", op, err, out)
	}
	h.open()
	return killed
}

// cloneSteps are the failpoints of a clone, in order.
var cloneSteps = []string{stepValidatePath, stepSpaceCheck, stepPrepare, stepIntent, stepPlace, stepImmutable, stepMount, stepCommit}

// TestCloneCrashAtEveryStep: a crash after any step of a clone leaves,
// once the store is reopened, either no clone (nothing at the path, no
// record) or the whole clone (mounted, its content the checkpoint's), and
// a store without orphans either way.
func TestCloneCrashAtEveryStep(t *testing.T) {
	testenv.RequiresRootMounts(t)
	for _, step := range cloneSteps {
		t.Run(step, func(t *testing.T) {
			h := newHarness(t, false)
			src := h.mkdir("src", func(d string) { richTree(t, d) })
			cp := h.capture(src, "one")
			want := fstree.MustSnapshot(t, src)
			dst := filepath.Join(h.work, "clone")
			if !h.crashOp(opClone+"."+step, "clone", cp.ID, dst) {
				t.Fatalf("the failpoint %s.%s was not hit", opClone, step)
			}
			roots, err := h.store.Roots()
			if err != nil {
				t.Fatal(err)
			}
			cloned := len(roots) == 2
			if cloned {
				assertTree(t, dst, want)
				write(t, dst+"/after", "a")
				c := h.capture(dst, "after")
				if c.ParentID != cp.ID {
					t.Fatalf("first checkpoint of a recovered clone has parent %q", c.ParentID)
				}
			} else if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("an undone clone left something at its path: %v", err)
			}
			t.Logf("crash after %s: clone %v", step, cloned)
			if step == stepMount || step == stepCommit || step == stepImmutable || step == stepPlace {
				if !cloned {
					t.Fatalf("a crash after %s must be finished", step)
				}
			}
			h.assertClean()
			// Either way a clone can be made (again).
			if !cloned {
				if err := h.store.Clone(context.Background(), cp.ID, dst); err != nil {
					t.Fatal(err)
				}
				assertTree(t, dst, want)
			}
		})
	}
}

// TestCloneConcurrentWithDelete: a clone and a delete of its checkpoint
// racing end with the clone made (its content intact) or refused with
// checkpoint_not_found, never a broken clone.
func TestCloneConcurrentWithDelete(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	ctx := context.Background()
	src := h.mkdir("src", func(d string) { write(t, d+"/f", "1") })
	for i := range 5 {
		cp := h.capture(src, "c")
		want := fstree.MustSnapshot(t, src)
		dst := filepath.Join(h.work, "clone"+itoa(i))
		done := make(chan error, 1)
		go func() { done <- h.store.Delete(ctx, cp.ID) }()
		err := h.store.Clone(ctx, cp.ID, dst)
		if derr := <-done; derr != nil {
			t.Fatal(derr)
		}
		switch {
		case err == nil:
			assertTree(t, dst, want)
		case fault.CodeOf(err) == ErrCheckpointNotFound.Code:
		default:
			t.Fatalf("clone racing a delete: %v", err)
		}
		write(t, src+"/f", "v"+itoa(i))
		time.Sleep(time.Millisecond)
	}
	h.assertClean()
}

// TestCaptureResolvesAPendingClone: a root left cloning while guestd runs
// (its commit failed after the mount) is finished by the next capture of
// its path, not captured half made.
func TestCaptureResolvesAPendingClone(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	ctx := context.Background()
	src := h.mkdir("src", func(d string) { write(t, d+"/f", "1") })
	cp := h.capture(src, "one")
	dst := filepath.Join(h.work, "clone")
	if err := h.store.Clone(ctx, cp.ID, dst); err != nil {
		t.Fatal(err)
	}
	if err := h.store.update(func(tx meta.Tx) error {
		r, err := tx.RootByPath(dst)
		if err != nil {
			return err
		}
		r.State, r.Move = meta.RootCloning, &meta.MoveIntent{Stage: "tmp/clone-gone", StageIno: r.Ino}
		return tx.PutRoot(r)
	}); err != nil {
		t.Fatal(err)
	}
	write(t, dst+"/g", "2")
	c := h.capture(dst, "c")
	if c.ParentID != cp.ID {
		t.Fatalf("parent %q, want %s", c.ParentID, cp.ID)
	}
	h.assertClean()
}

// TestCloneUnderCompaction: with enough checkpoints on both sides that
// compaction builds spans over the shared layers, every checkpoint of the
// clone restores to what it was, after the source's checkpoints are
// deleted (squash), after the source is released, and after a restart.
func TestCloneUnderCompaction(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	ctx := context.Background()
	src := h.mkdir("src", func(d string) { write(t, d+"/common", "0") })
	var srcCPs []Checkpoint
	for i := range 8 {
		write(t, src+"/common", "src "+itoa(i))
		write(t, src+"/s"+itoa(i), itoa(i))
		if i%3 == 2 {
			os.Remove(src + "/s" + itoa(i-1))
		}
		srcCPs = append(srcCPs, h.capture(src, "s"))
	}
	dst := filepath.Join(h.work, "clone")
	if err := h.store.Clone(ctx, srcCPs[5].ID, dst); err != nil {
		t.Fatal(err)
	}
	type saved struct {
		id   string
		tree fstree.Tree
	}
	var cps []saved
	for i := range 8 {
		write(t, dst+"/common", "clone "+itoa(i))
		write(t, dst+"/c"+itoa(i), itoa(i))
		if i%2 == 1 {
			os.Remove(dst + "/s" + itoa(i))
		}
		c := h.capture(dst, "c")
		cps = append(cps, saved{c.ID, fstree.MustSnapshot(t, dst)})
		// The source goes on too.
		write(t, src+"/common", "src later "+itoa(i))
		h.capture(src, "s")
	}
	checkAll := func(stage string) {
		t.Helper()
		if err := h.store.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range cps {
			h.restore(c.id)
			if d := fstree.Diff(c.tree, fstree.MustSnapshot(t, dst)); len(d) > 0 {
				t.Fatalf("%s: clone checkpoint %s differs:\n%s", stage, c.id, strings.Join(d, "\n"))
			}
		}
		h.assertClean()
	}
	checkAll("compacted")
	var spans int
	h.store.view(func(tx meta.Tx) error {
		sps, err := tx.Spans()
		spans = len(sps)
		return err
	})
	if spans == 0 {
		t.Fatal("no span was built: the test does not exercise compaction")
	}
	for _, id := range checkpointsOf(t, h, src) {
		if err := h.store.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	checkAll("source checkpoints deleted")
	if _, err := h.store.Release(ctx, src); err != nil {
		t.Fatal(err)
	}
	checkAll("source released")
	h.reopen()
	checkAll("reopened")
}
