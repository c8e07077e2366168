package layers

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"strata/internal/fstree"
	"strata/layers/meta"
	"strata/pathpolicy"
)

// withPaths is live with each of rels (and its subtree) as cp has it, and
// the parents cp has that live lacks: what restoring rels must give.
func withPaths(live, cp fstree.Tree, rels []string) fstree.Tree {
	out := fstree.Tree{}
	under := func(k, rel string) bool { return k == rel || strings.HasPrefix(k, rel+"/") }
	for k, e := range live {
		keep := true
		for _, rel := range rels {
			if under(k, rel) {
				keep = false
			}
		}
		if keep {
			out[k] = e
		}
	}
	for k, e := range cp {
		for _, rel := range rels {
			if under(k, rel) || (strings.HasPrefix(rel, k+"/") && out[k] == fstree.Entry{}) {
				out[k] = e
			}
		}
	}
	return out
}

// TestRestorePaths: a file, a directory, a path the checkpoint lacks, a
// path under a directory the live one lacks, and a type change become
// what the checkpoint has; everything else stays as it was, unsaved
// changes included.
func TestRestorePaths(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("proj", func(d string) {
			richTree(t, d)
			write(t, d+"/docs/readme", "read me")
			write(t, d+"/keep/k", "k")
		})
		cp := h.capture(dir, "one")
		cpTree := fstree.MustSnapshot(t, dir)
		write(t, dir+"/a.txt", "edited")
		write(t, dir+"/keep/k", "unsaved and not restored")
		write(t, dir+"/only-live/x", "x")
		if err := os.RemoveAll(dir + "/sub"); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(dir + "/docs"); err != nil {
			t.Fatal(err)
		}
		write(t, dir+"/docs", "now a file")
		rels := []string{"a.txt", "sub/deep", "only-live", "docs", "never", "sub/deep/b.txt"}
		want := withPaths(fstree.MustSnapshot(t, dir), cpTree, []string{"a.txt", "sub/deep", "only-live", "docs"})
		res, err := h.store.RestorePaths(context.Background(), cp.ID, rels)
		if err != nil {
			t.Fatal(err)
		}
		if res.ID != cp.ID || res.Path != dir {
			t.Fatalf("answer %+v", res)
		}
		assertTree(t, dir, want)
		if b, _ := os.ReadFile(dir + "/keep/k"); string(b) != "unsaved and not restored" {
			t.Fatalf("an unnamed path changed: %q", b)
		}
		h.reopen()
		assertTree(t, dir, want)
		// The result is captured like any other change.
		cp2 := h.capture(dir, "two")
		h.restore(cp.ID)
		h.restore(cp2.ID)
		assertTree(t, dir, want)
	})
}

// TestRestorePathsRefused: bad paths and a live parent that is not a
// directory are refused before anything changes.
func TestRestorePathsRefused(t *testing.T) {
	h := newHarness(t, false)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/a/b", "b"); write(t, d+"/c", "c") })
	cp := h.capture(dir, "one")
	if err := os.RemoveAll(dir + "/a"); err != nil {
		t.Fatal(err)
	}
	write(t, dir+"/a", "a file now")
	write(t, dir+"/c", "edited")
	before := fstree.MustSnapshot(t, dir)
	for _, tc := range []struct {
		paths []string
		code  string
	}{
		{nil, "invalid_field"},
		{[]string{""}, "invalid_field"},
		{[]string{"."}, "invalid_field"},
		{[]string{"/c"}, "invalid_field"},
		{[]string{"../c"}, "invalid_field"},
		{[]string{"a//b"}, "invalid_field"},
		{[]string{"a/"}, "invalid_field"},
		{[]string{"c", "a/b"}, pathpolicy.CodePathNotDirectory},
	} {
		_, err := h.store.RestorePaths(context.Background(), cp.ID, tc.paths)
		wantCode(t, err, tc.code)
	}
	many := make([]string, MaxRestorePaths+1)
	for i := range many {
		many[i] = "c"
	}
	_, err := h.store.RestorePaths(context.Background(), cp.ID, many)
	wantCode(t, err, "invalid_field")
	_, err = h.store.RestorePaths(context.Background(), "cp_AAAAAAAAAAAAAAAAAAAAAA", []string{"c"})
	wantCode(t, err, ErrCheckpointNotFound.Code)
	assertTree(t, dir, before)
	// A symlinked parent is refused too.
	if err := os.Remove(dir + "/a"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", dir+"/a"); err != nil {
		t.Fatal(err)
	}
	_, err = h.store.RestorePaths(context.Background(), cp.ID, []string{"a/b"})
	wantCode(t, err, pathpolicy.CodePathSymlink)
	if _, err := os.Stat("/etc/b"); !os.IsNotExist(err) {
		t.Fatal("a restore of paths wrote through a symlink")
	}
}

// TestRestorePathsLeftovers: what an interrupted restore of paths leaves
// (its hidden names, a parent it made) is cleared at the next start, and
// the paths are each before or after.
func TestRestorePathsLeftovers(t *testing.T) {
	h := newHarness(t, false)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/f", "old"); write(t, d+"/n/m/g", "g") })
	cp := h.capture(dir, "one")
	write(t, dir+"/f", "new")
	if err := os.RemoveAll(dir + "/n"); err != nil {
		t.Fatal(err)
	}
	before := fstree.MustSnapshot(t, dir)
	// What a crash after the intent and part of the staging leaves.
	root, err := h.store.rootByPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	stage := stagePrefix + "crashed"
	write(t, filepath.Join(dir, stage), "half a new f")
	if err := os.Mkdir(dir+"/n", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := h.store.setPathsIntent(root.ID, pathsIntent([]string{stage, "n/m/" + stagePrefix + "never"}, []string{"n", "n/m"})); err != nil {
		t.Fatal(err)
	}
	// An export of the live state meanwhile drops them as recovery does.
	h.store.Close()
	out := filepath.Join(t.TempDir(), "export")
	if err := Export(context.Background(), ExportRequest{Store: h.dir, Path: dir, To: out}); err != nil {
		t.Fatal(err)
	}
	assertTree(t, out, before)
	h.open()
	assertTree(t, dir, before)
	// The next one works, and leaves no hidden name.
	if _, err := h.store.RestorePaths(context.Background(), cp.ID, []string{"f", "n/m"}); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), stagePrefix) {
			t.Fatalf("hidden name left: %s", e.Name())
		}
	}
	if b, _ := os.ReadFile(dir + "/n/m/g"); string(b) != "g" {
		t.Fatalf("n/m/g = %q", b)
	}
}

func pathsIntent(staged, made []string) *meta.PathsIntent {
	return &meta.PathsIntent{Staged: staged, Made: made}
}

// TestRestorePathsKeepsUnsaved: with automatic checkpoints on, the
// unsaved changes a restore of paths replaces are kept first, and
// restoring that checkpoint brings them back.
func TestRestorePathsKeepsUnsaved(t *testing.T) {
	h := newHarness(t, false)
	h.reopenWithAutos(DefaultAutoCheckpoints)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/f", "saved"); write(t, d+"/g", "g") })
	cp := h.capture(dir, "one")
	write(t, dir+"/f", "unsaved work")
	unsaved := fstree.MustSnapshot(t, dir)
	res, err := h.store.RestorePaths(context.Background(), cp.ID, []string{"f"})
	if err != nil || res.SafetyCheckpointID == "" {
		t.Fatalf("restore of a path over unsaved changes: %+v, %v; want a safety checkpoint", res, err)
	}
	if b, _ := os.ReadFile(dir + "/f"); string(b) != "saved" {
		t.Fatalf("f = %q", b)
	}
	as := autos(mustList(t, h))
	if len(as) != 1 || as[0].ID != res.SafetyCheckpointID || as[0].Name != "before restoring paths of "+cp.ID {
		t.Fatalf("automatic checkpoints %+v", as)
	}
	// Nothing unsaved (the restored path captured): none.
	h.capture(dir, "two")
	res, err = h.store.RestorePaths(context.Background(), cp.ID, []string{"f"})
	if err != nil || res.SafetyCheckpointID != "" {
		t.Fatalf("restore of a path with nothing unsaved: %+v, %v", res, err)
	}
	h.restore(as[0].ID)
	assertTree(t, dir, unsaved)
}

// TestRestorePathsSharedParents: two paths under one parent the live
// directory lacks: the parent is made once and both are restored.
func TestRestorePathsSharedParents(t *testing.T) {
	h := newHarness(t, false)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/a/b/c", "c"); write(t, d+"/a/b/d", "d"); write(t, d+"/keep", "k") })
	cp := h.capture(dir, "one")
	want := fstree.MustSnapshot(t, dir)
	if err := os.RemoveAll(dir + "/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.RestorePaths(context.Background(), cp.ID, []string{"a/b/c", "a/b/d"}); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dir, want)
}

// TestRestorePathsRefusedKeepsNothing: with automatic checkpoints on, a
// restore of paths refused by the path checks makes no automatic
// checkpoint (the checks run before the safety capture).
func TestRestorePathsRefusedKeepsNothing(t *testing.T) {
	h := newHarness(t, false)
	h.reopenWithAutos(DefaultAutoCheckpoints)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/a/b", "b") })
	cp := h.capture(dir, "one")
	if err := os.RemoveAll(dir + "/a"); err != nil {
		t.Fatal(err)
	}
	write(t, dir+"/a", "a file now")
	_, err := h.store.RestorePaths(context.Background(), cp.ID, []string{"a/b"})
	wantCode(t, err, pathpolicy.CodePathNotDirectory)
	if as := autos(mustList(t, h)); len(as) != 0 {
		t.Fatalf("a refused restore of paths made automatic checkpoints: %+v", as)
	}
}

// TestRestorePathsFileParentInCheckpoint: a path under what the checkpoint
// has as a file is absent from it: restoring it removes the live one.
func TestRestorePathsFileParentInCheckpoint(t *testing.T) {
	h := newHarness(t, false)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/config", "a file") })
	cp := h.capture(dir, "one")
	if err := os.Remove(dir + "/config"); err != nil {
		t.Fatal(err)
	}
	write(t, dir+"/config/app.yml", "x")
	if _, err := h.store.RestorePaths(context.Background(), cp.ID, []string{"config/app.yml"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir + "/config/app.yml"); !os.IsNotExist(err) {
		t.Fatalf("config/app.yml is still there: %v", err)
	}
}

// TestRestorePathsParentSwappedForSymlink: a parent the plan makes, which
// a process puts a symlink at before it is made, fails the operation; the
// symlink's target is never changed and the undo leaves no hidden name.
func TestRestorePathsParentSwappedForSymlink(t *testing.T) {
	h := newHarness(t, false)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/n/f", "f") })
	cp := h.capture(dir, "one")
	if err := os.RemoveAll(dir + "/n"); err != nil {
		t.Fatal(err)
	}
	src, _, root, err := h.store.checkpointTree(cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	live, err := h.store.liveTree(root)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	p, err := planPath(src, live, dir, "n/f")
	if err != nil || p == nil || len(p.make) != 1 {
		t.Fatalf("plan %+v, %v: want n made", p, err)
	}
	target := filepath.Join(t.TempDir(), "target")
	write(t, target, "not the sandbox's")
	if err := os.Chmod(target, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, dir+"/n"); err != nil {
		t.Fatal(err)
	}
	if err := stagePath(context.Background(), src, live, p, map[string]bool{}); err == nil {
		t.Fatal("staging under a parent swapped for a symlink succeeded")
	}
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the symlink's target changed: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(target); string(b) != "not the sandbox's" {
		t.Fatalf("the symlink's target was written: %q", b)
	}
}
