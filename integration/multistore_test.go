package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"strata/internal/fstree"
)

// TestSecondFilesystem: a directory on another allowed mount (here a
// tmpfs) gets its own store at that mount's root, because enrollment is a
// rename; the list merges both stores, and restarts and cold boots bring
// both back.
func TestSecondFilesystem(t *testing.T) {
	g := newGuest(t)
	base := t.TempDir()
	cleanupMounts(t, base)
	fs2 := filepath.Join(base, "fs2")
	os.MkdirAll(fs2, 0o755)
	if err := syscall.Mount("tmpfs", fs2, "tmpfs", 0, "size=256m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(fs2, syscall.MNT_DETACH) })
	flags := []string{"-allow-mount=/", "-allow-mount=" + fs2}
	g.start(flags...)
	onMain, onTmpfs := filepath.Join(base, "main"), filepath.Join(fs2, "proj")
	writeFile(t, onMain+"/f", "main")
	writeFile(t, onTmpfs+"/f", "tmpfs")
	a := g.create(onMain, "main")
	b := g.create(onTmpfs, "tmpfs")
	if _, err := os.Stat(filepath.Join(fs2, ".strata", "meta.db")); err != nil {
		t.Fatalf("no store on the second filesystem: %v\n%s", err, g.log)
	}
	if got := ids(g.list()); !slices.Equal(got, []string{a["id"].(string), b["id"].(string)}) {
		t.Fatalf("list %v", got)
	}
	// The other store is protected like the main one.
	r, _ := g.do("POST", "/v1/checkpoints", "application/json", `{"path":"`+filepath.Join(fs2, ".strata")+`"}`)
	if r.code() != "path_protected" {
		t.Fatalf("enrolling the second store: %s", r.Raw)
	}
	// So are its ancestors, which would also be parents of its roots.
	r, _ = g.do("POST", "/v1/checkpoints", "application/json", `{"path":"`+base+`"}`)
	if r.code() != "path_protected" {
		t.Fatalf("enrolling a parent of both: %s", r.Raw)
	}
	writeFile(t, onTmpfs+"/f", "changed")
	g.must("POST", "/v1/checkpoints/"+b["id"].(string)+"/restore", "")
	if got, _ := os.ReadFile(onTmpfs + "/f"); string(got) != "tmpfs" {
		t.Fatalf("restore on tmpfs: %q", got)
	}
	writeFile(t, onTmpfs+"/g", "unsaved")
	snapMain, snapTmpfs := fstree.MustSnapshot(t, onMain), fstree.MustSnapshot(t, onTmpfs)
	g.stop()
	for _, d := range []string{onMain, onTmpfs} {
		if err := syscall.Unmount(d, 0); err != nil {
			t.Fatal(err)
		}
	}
	g.start(flags...)
	for d, want := range map[string]fstree.Tree{onMain: snapMain, onTmpfs: snapTmpfs} {
		if diff := fstree.Diff(want, fstree.MustSnapshot(t, d)); len(diff) > 0 {
			t.Fatalf("%s after restart:\n%s", d, strings.Join(diff, "\n"))
		}
	}
	// Two, and the automatic one the restore over "changed" made.
	if n := len(g.list()); n != 3 {
		t.Fatalf("%d checkpoints after restart, want 3", n)
	}
	g.must("DELETE", "/v1/checkpoints/"+b["id"].(string), "")
	g.stop()
}

// TestBeyondAcrossStores: issue 8's routes go to the store that holds
// what they name: changes and files of a checkpoint of the second
// filesystem's store, a clone on its filesystem (and not on another:
// 422 path_mount), then a capture of the clone and a release of the
// source, which the second store serves.
func TestBeyondAcrossStores(t *testing.T) {
	g := newGuest(t)
	base := t.TempDir()
	cleanupMounts(t, base)
	fs2 := filepath.Join(base, "fs2")
	os.MkdirAll(fs2, 0o755)
	if err := syscall.Mount("tmpfs", fs2, "tmpfs", 0, "size=256m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(fs2, syscall.MNT_DETACH) })
	g.start("-allow-mount=/", "-allow-mount="+fs2)
	onTmpfs := filepath.Join(fs2, "proj")
	writeFile(t, onTmpfs+"/f", "one")
	a := g.create(onTmpfs, "a")["id"].(string)
	writeFile(t, onTmpfs+"/f", "two")
	b := g.create(onTmpfs, "b")["id"].(string)

	r := g.must("GET", "/v1/checkpoints/"+b+"/changes", "")
	if !strings.Contains(string(r.Raw), `"path":"f","change":"modified"`) {
		t.Fatalf("changes on the second store: %s", r.Raw)
	}
	r = g.must("GET", "/v1/checkpoints/"+a+"/files/f", "")
	if !strings.Contains(string(r.Raw), `"content":"b25l"`) {
		t.Fatalf("file from the second store: %s", r.Raw)
	}
	r, _ = g.do("POST", "/v1/checkpoints/"+a+"/clone", "application/json", `{"path":"`+filepath.Join(base, "clone-elsewhere")+`"}`)
	if r.Status != 422 || r.code() != "path_mount" {
		t.Fatalf("clone onto another filesystem: %d %s", r.Status, r.Raw)
	}
	clone := filepath.Join(fs2, "clone")
	g.must("POST", "/v1/checkpoints/"+a+"/clone", `{"path":"`+clone+`"}`)
	if got, _ := os.ReadFile(clone + "/f"); string(got) != "one" {
		t.Fatalf("clone's f: %q", got)
	}
	c := g.create(clone, "c")
	if c["parent_id"] != a {
		t.Fatalf("clone's first capture: %v, want parent %s", c, a)
	}
	r = g.must("POST", "/v1/directories/release", `{"path":"`+onTmpfs+`"}`)
	if !strings.Contains(string(r.Raw), a) || !strings.Contains(string(r.Raw), b) {
		t.Fatalf("release: %s", r.Raw)
	}
	if got := ids(g.list()); !slices.Equal(got, []string{c["id"].(string)}) {
		t.Fatalf("list after the release: %v", got)
	}
	g.stop()
}
