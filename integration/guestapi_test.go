package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestGuestAPI drives guestd's local API through the real binary: the
// seed document's lineage, the shapes of the responses, and every error
// code guestd can answer with.
func TestGuestAPI(t *testing.T) {
	g := newGuest(t)
	base := t.TempDir()
	cleanupMounts(t, base)
	g.start()
	dir := filepath.Join(base, "project")
	writeFile(t, dir+"/f", "A")

	a := g.create(dir, "A")
	idRe := regexp.MustCompile(`^cp_[A-Za-z0-9_-]{22}$`)
	timeRe := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$`)
	if !idRe.MatchString(a["id"].(string)) || !timeRe.MatchString(a["created_at"].(string)) {
		t.Fatalf("create data %v: bad id or created_at", a)
	}
	if _, ok := a["parent_id"]; ok || a["path"] != dir || a["name"] != "A" {
		t.Fatalf("first capture data %v", a)
	}
	writeFile(t, dir+"/f", "B")
	b := g.create(dir, "B")
	writeFile(t, dir+"/f", "C")
	c := g.create(dir, "C")
	r := g.must("POST", "/v1/checkpoints/"+b["id"].(string)+"/restore", "").data()
	if r["checkpoint_id"] != b["id"] || r["path"] != dir {
		t.Fatalf("restore data %v", r)
	}
	if got, _ := os.ReadFile(dir + "/f"); string(got) != "B" {
		t.Fatalf("after restoring B: %q", got)
	}
	d := g.create(dir, "D")
	if d["parent_id"] != b["id"] || c["parent_id"] != b["id"] || b["parent_id"] != a["id"] {
		t.Fatalf("lineage: B->%v C->%v D->%v", b["parent_id"], c["parent_id"], d["parent_id"])
	}
	del := g.must("DELETE", "/v1/checkpoints/"+b["id"].(string), "")
	if string(del.Raw) != `{"data":{},"status":"success"}`+"\n" {
		t.Fatalf("delete body %s", del.Raw)
	}
	g.must("POST", "/v1/checkpoints/"+c["id"].(string)+"/restore", "")
	if got, _ := os.ReadFile(dir + "/f"); string(got) != "C" {
		t.Fatalf("C after deleting B: %q", got)
	}
	list := g.list()
	if got := strings.Join(ids(list), ","); got != strings.Join([]string{a["id"].(string), c["id"].(string), d["id"].(string)}, ",") {
		t.Fatalf("list %v", got)
	}

	other := filepath.Join(base, "other")
	os.MkdirAll(other+"/sub", 0o755)
	os.Symlink(other, base+"/link")
	os.WriteFile(base+"/file", nil, 0o644)
	unmanaged := filepath.Join(base, "plain")
	os.MkdirAll(unmanaged, 0o755)
	writeFile(t, unmanaged+"/h1", "h")
	os.Link(unmanaged+"/h1", unmanaged+"/h2")
	sock := filepath.Join(base, "sockdir")
	os.MkdirAll(sock, 0o755)
	syscall.Mkfifo(sock+"/fifo", 0o644)
	mnt := filepath.Join(base, "mnt")
	os.MkdirAll(mnt+"/inner", 0o755)
	if err := syscall.Mount("tmpfs", mnt+"/inner", "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	busy := filepath.Join(base, "busy")
	os.MkdirAll(busy, 0o755)

	cid := c["id"].(string)
	missing := "cp_AAAAAAAAAAAAAAAAAAAAAA"
	tests := []struct {
		name, method, path, ctype, body string
		status                          int
		code                            string
	}{
		{"unknown route", "GET", "/v1/nope", "", "", 404, "not_found"},
		{"wrong method", "PUT", "/v1/checkpoints", "", "", 405, "method_not_allowed"},
		{"wrong method on restore", "GET", "/v1/checkpoints/" + cid + "/restore", "", "", 405, "method_not_allowed"},
		{"query on list", "GET", "/v1/checkpoints?limit=1", "", "", 400, "query_not_allowed"},
		{"query on create", "POST", "/v1/checkpoints?x", "application/json", `{"path":"/x"}`, 400, "query_not_allowed"},
		{"empty query", "DELETE", "/v1/checkpoints/" + cid + "?", "", "", 400, "query_not_allowed"},
		{"not json", "POST", "/v1/checkpoints", "application/json", `path=/x`, 400, "invalid_json"},
		{"array", "POST", "/v1/checkpoints", "application/json", `[{"path":"/x"}]`, 400, "invalid_json"},
		{"trailing", "POST", "/v1/checkpoints", "application/json", `{"path":"/x"} {}`, 400, "invalid_json"},
		{"unknown field", "POST", "/v1/checkpoints", "application/json", `{"path":"/x","parent_id":"cp_x"}`, 400, "unknown_field"},
		{"path wrong type", "POST", "/v1/checkpoints", "application/json", `{"path":7}`, 400, "invalid_field"},
		{"no path", "POST", "/v1/checkpoints", "application/json", `{"name":"x"}`, 400, "invalid_field"},
		{"empty path", "POST", "/v1/checkpoints", "application/json", `{"path":""}`, 400, "invalid_field"},
		{"long name", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q,"name":%q}`, dir, strings.Repeat("n", 129)), 400, "invalid_field"},
		{"control in name", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q,"name":"a\u0007b"}`, dir), 400, "invalid_field"},
		{"body on restore", "POST", "/v1/checkpoints/" + cid + "/restore", "application/json", `{}`, 400, "body_not_allowed"},
		{"body on delete", "DELETE", "/v1/checkpoints/" + cid, "application/json", `{}`, 400, "body_not_allowed"},
		{"too large", "POST", "/v1/checkpoints", "application/json", `{"path":"` + strings.Repeat("a", 17<<10) + `"}`, 413, "body_too_large"},
		{"not json media", "POST", "/v1/checkpoints", "text/plain", `{"path":"/x"}`, 415, "unsupported_media_type"},
		{"unknown checkpoint restore", "POST", "/v1/checkpoints/" + missing + "/restore", "", "", 404, "checkpoint_not_found"},
		{"unknown checkpoint delete", "DELETE", "/v1/checkpoints/" + missing, "", "", 404, "checkpoint_not_found"},
		{"malformed checkpoint id", "DELETE", "/v1/checkpoints/B", "", "", 404, "checkpoint_not_found"},
		{"relative", "POST", "/v1/checkpoints", "application/json", `{"path":"work/x"}`, 422, "path_not_absolute"},
		{"unclean", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, other+"/../other"), 422, "path_not_clean"},
		{"missing", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, base+"/nothing"), 422, "path_not_found"},
		{"file", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, base+"/file"), 422, "path_not_directory"},
		{"protected", "POST", "/v1/checkpoints", "application/json", `{"path":"/usr/share"}`, 422, "path_protected"},
		{"ancestor of protected", "POST", "/v1/checkpoints", "application/json", `{"path":"/var/lib"}`, 422, "path_protected"},
		{"whole tmp", "POST", "/v1/checkpoints", "application/json", `{"path":"/tmp"}`, 422, "path_protected"},
		{"the store", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, g.store+"/layers"), 422, "path_protected"},
		{"symlink", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, base+"/link/sub"), 422, "path_symlink"},
		{"proc", "POST", "/v1/checkpoints", "application/json", `{"path":"/proc/sys"}`, 422, "path_protected"},
		{"nested below", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, dir+"/sub"), 422, "path_nested"},
		{"mount point", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, mnt+"/inner"), 422, "path_mount"},
		{"contains a mount", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, mnt), 422, "path_mount"},
		{"nested above", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, base), 422, "path_nested"},
		{"hardlinks", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, unmanaged), 422, "path_hardlink"},
		{"fifo", "POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, sock), 422, "path_special_file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := g.do(tc.method, tc.path, tc.ctype, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != tc.status || r.code() != tc.code || r.Body["status"] != "fail" {
				t.Fatalf("%s %s: %d %s, want %d %s", tc.method, tc.path, r.Status, r.Raw, tc.status, tc.code)
			}
			if msg, _ := r.data()["message"].(string); msg == "" {
				t.Fatalf("no message in %s", r.Raw)
			}
		})
	}

	// A directory in use: 409 with the holder.
	sleeper := startIn(t, busy)
	r2, _ := g.do("POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, busy))
	if r2.Status != 409 || r2.code() != "directory_busy" || !strings.Contains(string(r2.Raw), fmt.Sprintf(`"pid":%d`, sleeper)) {
		t.Fatalf("busy: %d %s", r2.Status, r2.Raw)
	}
	g.stop()
}

// startIn starts `sleep` with its working directory in dir.
func startIn(t *testing.T, dir string) int {
	t.Helper()
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(); p.Wait() })
	time.Sleep(10 * time.Millisecond)
	return p.Pid
}
