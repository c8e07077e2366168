package layers

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fstree"
	"strata/internal/testenv"
)

// assertPlain fails unless dir is a plain directory: no mount on it, no
// immutable flag, writable.
func assertPlain(t *testing.T, dir string) {
	t.Helper()
	table := mustMounts(t)
	if st := stackAt(table, dir); len(st) > 0 {
		t.Fatalf("%s is still a mount point (%s)", dir, st[0].FSType)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		t.Fatal(err)
	}
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	unix.Close(fd)
	if err != nil || flags&0x10 != 0 {
		t.Fatalf("%s: flags %#x (%v): still immutable", dir, flags, err)
	}
	probe := filepath.Join(dir, ".strata-write-probe")
	if err := os.WriteFile(probe, []byte("w"), 0o600); err != nil {
		t.Fatalf("%s is not writable: %v", dir, err)
	}
	if err := os.Remove(probe); err != nil {
		t.Fatal(err)
	}
}

// assertNoReleaseLeftovers fails when release/ in the store holds anything.
func (h *harness) assertNoReleaseLeftovers() {
	h.t.Helper()
	ents, err := os.ReadDir(filepath.Join(h.dir, releaseDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		h.t.Fatal(err)
	}
	if len(ents) > 0 {
		h.t.Fatalf("%d leftovers in %s/", len(ents), releaseDir)
	}
}

// TestRelease: a directory with three checkpoints and a clone of one of
// them is released: it is plain (no mount, no flag, writable),
// byte-identical to its live state before (unsaved changes included),
// its checkpoints are gone and were named, and the clone is intact, also
// after a restart. The plain directory can be enrolled again.
func TestRelease(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		dir := h.mkdir("project", func(d string) { richTree(t, d) })
		cp1 := h.capture(dir, "one")
		write(t, dir+"/a.txt", "two")
		os.RemoveAll(dir + "/sub/deep")
		cp2 := h.capture(dir, "two")
		write(t, dir+"/new/file", "three")
		cp3 := h.capture(dir, "three")
		dst := filepath.Join(h.work, "clone")
		if err := h.store.Clone(ctx, cp2.ID, dst); err != nil {
			t.Fatal(err)
		}
		write(t, dst+"/clone-only", "c")
		c1 := h.capture(dst, "c1")
		atC1 := fstree.MustSnapshot(t, dst)
		write(t, dir+"/unsaved", "kept by the release")
		os.Chmod(dir+"/big.bin", 0o640)
		live := fstree.MustSnapshot(t, dir)

		ids, err := h.store.Release(ctx, dir)
		if err != nil {
			t.Fatalf("Release: %v", err)
		}
		if want := []string{cp1.ID, cp2.ID, cp3.ID}; !slices.Equal(ids, want) {
			t.Fatalf("deleted %v, want %v", ids, want)
		}
		assertTree(t, dir, live)
		assertPlain(t, dir)
		if n := len(checkpointsOf(t, h, dir)); n != 0 {
			t.Fatalf("%d checkpoints of the released directory remain", n)
		}
		roots, err := h.store.Roots()
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(roots, dir) {
			t.Fatal("the released directory is still a managed root")
		}
		wantCode(t, func() error { _, err := h.store.Release(ctx, dir); return err }(), ErrNotManaged.Code)
		assertTree(t, dst, atC1)
		h.restore(c1.ID)
		assertTree(t, dst, atC1)
		h.assertClean()
		h.assertNoReleaseLeftovers()

		h.reopen()
		assertTree(t, dir, live)
		assertPlain(t, dir)
		assertTree(t, dst, atC1)
		h.assertClean()
		write(t, dst+"/after", "a")
		h.capture(dst, "c2")
		h.assertClean()
		// Back under management, from its plain state.
		again := h.capture(dir, "again")
		if again.ParentID != "" {
			t.Fatalf("a re-enrolled directory's first checkpoint has parent %q", again.ParentID)
		}
		assertTree(t, dir, live)
		h.assertClean()
	})
}

// TestReleaseTheCloneSource: releasing a clone's source (and then the
// clone) leaves the other intact and frees every layer in the end.
func TestReleaseTheCloneSource(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	ctx := context.Background()
	src := h.mkdir("src", func(d string) { richTree(t, d) })
	cp := h.capture(src, "one")
	dst := filepath.Join(h.work, "clone")
	if err := h.store.Clone(ctx, cp.ID, dst); err != nil {
		t.Fatal(err)
	}
	write(t, dst+"/f", "clone")
	h.capture(dst, "c1")
	atClone := fstree.MustSnapshot(t, dst)
	if _, err := h.store.Release(ctx, src); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dst, atClone)
	h.assertClean()
	h.reopen()
	assertTree(t, dst, atClone)
	if _, err := h.store.Release(ctx, dst); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dst, atClone)
	assertPlain(t, dst)
	h.assertClean()
	if n := h.layerRecords(); n != 0 {
		t.Fatalf("%d layer records after releasing everything", n)
	}
	if dirs := h.layerDirs(); len(dirs) != 0 {
		t.Fatalf("layer dirs %v after releasing everything", dirs)
	}
}

// TestReleaseBusy: a release follows restore's busy rules, and a refused
// one leaves the directory managed and writable.
func TestReleaseBusy(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	ctx := context.Background()
	dir := h.mkdir("project", func(d string) { write(t, d+"/f", "1") })
	h.capture(dir, "one")
	f, err := os.OpenFile(dir+"/f", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.store.Release(ctx, dir)
	f.Close()
	wantCode(t, err, "directory_busy")
	write(t, dir+"/g", "still managed and writable")
	if n := len(checkpointsOf(t, h, dir)); n != 1 {
		t.Fatalf("%d checkpoints after a refused release", n)
	}
	h.assertClean()
	h.assertNoReleaseLeftovers()
	wantCode(t, func() error { _, err := h.store.Release(ctx, h.work+"/nothing"); return err }(), ErrNotManaged.Code)
}

// releaseSteps are the failpoints of a release, in order.
var releaseSteps = []string{stepMountCheck, stepValidateMounts, stepBusyCheck, stepSpaceCheck, stepFreeze, stepMaterialize,
	stepIntent, stepUnmount, stepImmutable, stepExchange, stepCommit, stepCollect}

// TestReleaseCrashAtEveryStep: a crash after any step of a release
// leaves, once the store is reopened, the directory managed as before
// (its checkpoints, its live content, mounted and writable) or plain with
// everything (its checkpoints gone), the clone intact, and no orphan.
func TestReleaseCrashAtEveryStep(t *testing.T) {
	testenv.RequiresRootMounts(t)
	for _, step := range releaseSteps {
		t.Run(step, func(t *testing.T) {
			h := newHarness(t, false)
			dir := h.mkdir("project", func(d string) { richTree(t, d) })
			h.capture(dir, "one")
			write(t, dir+"/a.txt", "two")
			cp2 := h.capture(dir, "two")
			dst := filepath.Join(h.work, "clone")
			if err := h.store.Clone(context.Background(), cp2.ID, dst); err != nil {
				t.Fatal(err)
			}
			atClone := fstree.MustSnapshot(t, dst)
			write(t, dir+"/unsaved", "u")
			live := fstree.MustSnapshot(t, dir)
			if !h.crashOp(opRelease+"."+step, "release", dir) {
				t.Fatalf("the failpoint %s.%s was not hit", opRelease, step)
			}
			roots, err := h.store.Roots()
			if err != nil {
				t.Fatal(err)
			}
			managed := slices.Contains(roots, dir)
			t.Logf("crash after %s: managed %v", step, managed)
			assertTree(t, dir, live)
			assertTree(t, dst, atClone)
			if managed {
				if i := slices.Index(releaseSteps, step); i >= slices.Index(releaseSteps, stepExchange) {
					t.Fatalf("a crash after %s must be finished", step)
				}
				if n := len(checkpointsOf(t, h, dir)); n != 2 {
					t.Fatalf("%d checkpoints after an undone release", n)
				}
				write(t, dir+"/more", "m")
				h.capture(dir, "after")
			} else {
				assertPlain(t, dir)
				if n := len(checkpointsOf(t, h, dir)); n != 0 {
					t.Fatalf("%d checkpoints after a finished release", n)
				}
			}
			h.assertClean()
			h.assertNoReleaseLeftovers()
		})
	}
}
