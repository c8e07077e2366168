package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"strata/internal/fstree"
)

// TestCloneAndReleaseThroughTheAPI: the clone and release routes answer
// as docs/api.md says (the clone's answer, its path codes, the release's
// deleted ids, 404 for a path that is no managed directory), the clone
// survives the release of its source and a restart, and the released
// directory is plain and can be managed again.
func TestCloneAndReleaseThroughTheAPI(t *testing.T) {
	g := newGuest(t)
	base := t.TempDir()
	cleanupMounts(t, base)
	g.start()
	dir := filepath.Join(base, "project")
	writeFile(t, dir+"/a", "A")
	a := g.create(dir, "A")["id"].(string)
	writeFile(t, dir+"/a", "B")
	b := g.create(dir, "B")["id"].(string)

	clone := filepath.Join(base, "clone")
	r := g.must("POST", "/v1/checkpoints/"+a+"/clone", fmt.Sprintf(`{"path":%q}`, clone))
	if d := r.data(); d["path"] != clone || d["from_checkpoint_id"] != a {
		t.Fatalf("clone answer %s", r.Raw)
	}
	if got, _ := os.ReadFile(clone + "/a"); string(got) != "A" {
		t.Fatalf("clone shows a=%q", got)
	}
	for _, c := range []struct{ path, code string }{
		{clone, "path_exists"},
		{dir + "/inside", "path_nested"},
		{base + "/no/such", "path_not_found"},
		{"/usr/clone", "path_protected"},
	} {
		r, err := g.do("POST", "/v1/checkpoints/"+a+"/clone", "application/json", fmt.Sprintf(`{"path":%q}`, c.path))
		if err != nil {
			t.Fatal(err)
		}
		if d := r.data(); r.Status != 422 || d["code"] != c.code {
			t.Fatalf("clone to %s: %d %s, want 422 %s", c.path, r.Status, r.Raw, c.code)
		}
	}
	writeFile(t, clone+"/c", "clone")
	c1 := g.create(clone, "c1")
	if c1["parent_id"] != a {
		t.Fatalf("the clone's first checkpoint: %v, want parent_id %s", c1, a)
	}
	atClone := fstree.MustSnapshot(t, clone)

	writeFile(t, dir+"/unsaved", "u")
	live := fstree.MustSnapshot(t, dir)
	r = g.must("POST", "/v1/directories/release", fmt.Sprintf(`{"path":%q}`, dir))
	var deleted []string
	for _, id := range r.data()["deleted_checkpoint_ids"].([]any) {
		deleted = append(deleted, id.(string))
	}
	if d := r.data(); d["path"] != dir || !slices.Equal(deleted, []string{a, b}) {
		t.Fatalf("release answer %s, want ids %v", r.Raw, []string{a, b})
	}
	if d := fstree.Diff(live, fstree.MustSnapshot(t, dir)); len(d) > 0 {
		t.Fatalf("released directory differs from its live state: %v", d)
	}
	if err := os.WriteFile(dir+"/plain", []byte("w"), 0o644); err != nil {
		t.Fatalf("released directory not writable: %v", err)
	}
	os.Remove(dir + "/plain")
	r, err := g.do("POST", "/v1/directories/release", "application/json", fmt.Sprintf(`{"path":%q}`, dir))
	if err != nil {
		t.Fatal(err)
	}
	if d := r.data(); r.Status != 404 || d["code"] != "directory_not_managed" {
		t.Fatalf("second release: %d %s", r.Status, r.Raw)
	}
	for _, cp := range g.list() {
		if cp["path"] == dir {
			t.Fatalf("a checkpoint of the released directory is listed: %v", cp)
		}
	}
	g.stop()
	g.start()
	if d := fstree.Diff(atClone, fstree.MustSnapshot(t, clone)); len(d) > 0 {
		t.Fatalf("clone after the release of its source and a restart: %v", d)
	}
	g.must("POST", "/v1/checkpoints/"+c1["id"].(string)+"/restore", "")
	again := g.create(dir, "again")
	if again["parent_id"] != nil && again["parent_id"] != "" {
		t.Fatalf("re-managed directory's first checkpoint: %v", again)
	}
}
