package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"strata/internal/servertiming"
)

// stack is guestd and hostproxy as processes, with the local sandbox.
type stack struct {
	t     *testing.T
	g     *guest
	url   string
	key   string
	proxy *exec.Cmd
	plog  *bytes.Buffer
}

func startStack(t *testing.T) *stack {
	g := newGuest(t)
	g.start()
	addr := listenAddr(t)
	s := &stack{t: t, g: g, url: "http://" + addr, key: "sk_integration_test_key_0123456789", plog: &bytes.Buffer{}}
	s.proxy = exec.Command(filepath.Join(bins, "hostproxy"), "--listen", addr, "--data", t.TempDir(),
		"--key-env", "CREATEOS_API_KEY", "--sandbox", "sb-local=unix://"+g.sock)
	s.proxy.Env = append(os.Environ(), "CREATEOS_API_KEY="+s.key)
	s.proxy.Stdout, s.proxy.Stderr = s.plog, s.plog
	if err := s.proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.proxy.Process.Signal(syscall.SIGTERM)
		s.proxy.Wait()
	})
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if i > 3000 { // 30 s
			t.Fatalf("hostproxy did not listen\n%s", s.plog)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

// curl runs the curl command line of the seed document with the base
// URL, key and ids substituted, and returns the decoded JSON.
func (s *stack) curl(args ...string) map[string]any {
	s.t.Helper()
	for i, a := range args {
		a = strings.ReplaceAll(a, "https://api.sb.createos.sh", s.url)
		a = strings.ReplaceAll(a, "$CREATEOS_API_KEY", s.key)
		args[i] = a
	}
	out, err := exec.Command("curl", append([]string{"-sS"}, args...)...).Output()
	if err != nil {
		s.t.Fatalf("curl %v: %v", args, err)
	}
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		s.t.Fatalf("curl %v: not JSON: %s", args, out)
	}
	return v
}

// createos runs the CLI with the environment a sandbox would give it.
func (s *stack) createos(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(bins, "createos"), args...)
	cmd.Env = append(os.Environ(), "CREATEOS_API_URL="+s.url, "CREATEOS_API_KEY="+s.key, "CREATEOS_SANDBOX_ID=sb-local")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestSeedExamples replays the curl examples of the CreateOS checkpoint
// document against the real guestd and hostproxy, then its lineage
// example (A, B, C, restore B, D), then drives the same through createos.
func TestSeedExamples(t *testing.T) {
	s := startStack(t)
	base := t.TempDir()
	cleanupMounts(t, base)
	project := filepath.Join(base, "workspace/project")
	writeFile(t, project+"/main.go", "package main")
	sandbox := "https://api.sb.createos.sh/v1/sandboxes/sb-local"

	// POST /v1/sandboxes/{id}/checkpoints
	created := s.curl("-X", "POST", sandbox+"/checkpoints",
		"-H", "X-Api-Key: $CREATEOS_API_KEY",
		"-H", "Content-Type: application/json",
		"-d", fmt.Sprintf(`{"path":%q,"name":"before-update"}`, project))
	data, _ := created["data"].(map[string]any)
	if created["status"] != "success" || data["name"] != "before-update" || data["path"] != project {
		t.Fatalf("create: %v\n%s", created, s.plog)
	}
	checkpointID := data["id"].(string)

	// GET /v1/sandboxes/{id}/checkpoints
	listed := s.curl(sandbox+"/checkpoints", "-H", "X-Api-Key: $CREATEOS_API_KEY")
	if arr, _ := listed["data"].([]any); len(arr) != 1 || arr[0].(map[string]any)["id"] != checkpointID {
		t.Fatalf("list: %v", listed)
	}

	// POST …/restore
	writeFile(t, project+"/main.go", "broken")
	restored := s.curl("-X", "POST", sandbox+"/checkpoints/"+checkpointID+"/restore", "-H", "X-Api-Key: $CREATEOS_API_KEY")
	if d, _ := restored["data"].(map[string]any); d["checkpoint_id"] != checkpointID || d["path"] != project {
		t.Fatalf("restore: %v", restored)
	}
	if b, _ := os.ReadFile(project + "/main.go"); string(b) != "package main" {
		t.Fatalf("restored content %q", b)
	}

	// DELETE
	deleted := s.curl("-X", "DELETE", sandbox+"/checkpoints/"+checkpointID, "-H", "X-Api-Key: $CREATEOS_API_KEY")
	if deleted["status"] != "success" || fmt.Sprint(deleted["data"]) != "map[]" {
		t.Fatalf("delete: %v", deleted)
	}
	if b, _ := os.ReadFile(project + "/main.go"); string(b) != "package main" {
		t.Fatalf("delete changed the live directory: %q", b)
	}

	// The lineage example, through the CLI.
	capture := func(name string) map[string]any {
		out, err := s.createos("sandbox", "checkpoint", "create", "--path", project, "--name", name, "-o", "json")
		if err != nil {
			t.Fatalf("createos create %s: %v\n%s", name, err, out)
		}
		var cp map[string]any
		if err := json.Unmarshal([]byte(out), &cp); err != nil {
			t.Fatalf("createos -o json: %v: %s", err, out)
		}
		return cp
	}
	writeFile(t, project+"/v", "A")
	a := capture("A")
	writeFile(t, project+"/v", "B")
	b := capture("B")
	writeFile(t, project+"/v", "C")
	c := capture("C")
	if out, err := s.createos("sandbox", "checkpoint", "restore", "sb-local", b["id"].(string)); err != nil {
		t.Fatalf("restore B: %v\n%s", err, out)
	}
	if v, _ := os.ReadFile(project + "/v"); string(v) != "B" {
		t.Fatalf("after restoring B: %q", v)
	}
	// tree knows where the directory stands right after the restore.
	out, err := s.createos("sandbox", "checkpoint", "tree", "-o", "json")
	var lineages []struct {
		Path   string `json:"path"`
		LiveID string `json:"live_id"`
	}
	if err != nil || json.Unmarshal([]byte(out), &lineages) != nil || len(lineages) != 1 || lineages[0].LiveID != b["id"] {
		t.Fatalf("tree after restoring B: %v %s", err, out)
	}
	writeFile(t, project+"/v", "D")
	d := capture("D")
	if d["parent_id"] != b["id"] || c["parent_id"] != b["id"] || b["parent_id"] != a["id"] {
		t.Fatalf("lineage: A=%v B=%v C=%v D=%v", a, b, c, d)
	}
	out, err = s.createos("sandbox", "checkpoint", "list", "-o", "json")
	if err != nil {
		t.Fatal(err, out)
	}
	var all []map[string]any
	if err := json.Unmarshal([]byte(out), &all); err != nil || len(all) != 5 {
		t.Fatalf("list -o json: %v %s", err, out)
	}
	// The seed's restore over a broken main.go kept it as an automatic
	// checkpoint; the four of the lineage are the client's.
	if safe := all[0]; safe["auto"] != true || safe["name"] != "before restoring "+checkpointID || restored["data"].(map[string]any)["safety_checkpoint_id"] != safe["id"] {
		t.Fatalf("automatic checkpoint of the seed's restore: %v (restore answered %v)", safe, restored)
	}
	for _, cp := range all[1:] {
		if cp["auto"] != false {
			t.Fatalf("a client's checkpoint listed as automatic: %v", cp)
		}
	}
	tree, err := s.createos("sandbox", "checkpoint", "tree")
	if err != nil || !strings.Contains(tree, "D") || !strings.Contains(tree, "live") {
		t.Fatalf("tree: %v\n%s", err, tree)
	}
	// C is still restorable after B is deleted.
	if out, err := s.createos("sandbox", "checkpoint", "delete", "sb-local", b["id"].(string)); err != nil {
		t.Fatal(err, out)
	}
	if out, err := s.createos("sandbox", "checkpoint", "restore", "sb-local", c["id"].(string)); err != nil {
		t.Fatal(err, out)
	}
	if v, _ := os.ReadFile(project + "/v"); string(v) != "C" {
		t.Fatalf("C after deleting B: %q", v)
	}
	// A failed call prints the server's code and exits non-zero.
	out, err = s.createos("sandbox", "checkpoint", "restore", "sb-local", b["id"].(string))
	if err == nil || !strings.Contains(out, "checkpoint_not_found") {
		t.Fatalf("restore of a deleted checkpoint: %v %s", err, out)
	}
	out, err = s.createos("sandbox", "checkpoint", "create", "--path", "/etc")
	if err == nil || !strings.Contains(out, "path_protected") {
		t.Fatalf("create /etc: %v %s", err, out)
	}

	// A sandbox access token reaches the guest's credentials file, and a
	// process inside needs nothing else: createos finds the address, the
	// sandbox and the token there.
	issued := s.curl("-X", "POST", sandbox+"/access-token", "-H", "X-Api-Key: $CREATEOS_API_KEY")
	token, _ := issued["data"].(map[string]any)["token"].(string)
	if token == "" {
		t.Fatalf("issue token: %v", issued)
	}
	if fi, err := os.Stat(s.g.credentials()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v %v", fi, err)
	}
	inside := exec.Command(filepath.Join(bins, "createos"), "sandbox", "checkpoint", "list", "-o", "json")
	inside.Env = []string{"CREATEOS_CREDENTIALS=" + s.g.credentials()}
	if out, err := inside.CombinedOutput(); err != nil || !strings.Contains(string(out), c["id"].(string)) {
		t.Fatalf("createos inside the sandbox with only the credentials file: %v %s", err, out)
	}
	creds, _ := os.ReadFile(s.g.credentials())
	if !strings.Contains(string(creds), token) || !strings.Contains(string(creds), "sb-local") {
		t.Fatalf("credentials file: %s", creds)
	}
	s.curl("-X", "DELETE", sandbox+"/access-token", "-H", "X-Api-Key: $CREATEOS_API_KEY")
	if creds, _ := os.ReadFile(s.g.credentials()); strings.Contains(string(creds), token) {
		t.Fatalf("revoked token still in the credentials file")
	}
	// This guestd runs on the host, as root (as make run-local's): a
	// token of its sandbox never gets exec or files, and the default
	// token cannot open a session or a file.
	for _, scope := range []string{"exec", "files"} {
		refused := s.curl("-X", "POST", sandbox+"/access-token", "-H", "Authorization: Bearer $CREATEOS_API_KEY",
			"-H", "Content-Type: application/json", "-d", `{"scopes":["`+scope+`"]}`)
		if data, _ := refused["data"].(map[string]any); refused["status"] != "fail" || data["code"] != "invalid_field" {
			t.Fatalf("a token with %s on the host's guestd: %v", scope, refused)
		}
	}
	plain := s.curl("-X", "POST", sandbox+"/access-token", "-H", "X-Api-Key: $CREATEOS_API_KEY")
	tok, _ := plain["data"].(map[string]any)["token"].(string)
	for _, c := range []struct{ path, scope string }{{"/files/etc/hostname", "files"}, {"/sessions", "exec"}} {
		got := s.curl(sandbox+c.path, "-H", "X-Api-Key: "+tok)
		if data, _ := got["data"].(map[string]any); data["code"] != "forbidden" || data["scope"] != c.scope {
			t.Fatalf("the default token on %s: %v", c.path, got)
		}
	}
	s.curl("-X", "DELETE", sandbox+"/access-token", "-H", "X-Api-Key: $CREATEOS_API_KEY")
}

// TestServerTimingThroughTheStack: a capture through hostproxy answers
// with where its time went: hostproxy's total, the channel, guestd's total
// and each step of the capture in guestd, nested as they run.
func TestServerTimingThroughTheStack(t *testing.T) {
	s := startStack(t)
	base := t.TempDir()
	cleanupMounts(t, base)
	project := filepath.Join(base, "project")
	writeFile(t, project+"/a", "a")
	for i := range 2 { // the enrollment, then a capture
		writeFile(t, project+"/b", fmt.Sprint(i))
		req, _ := http.NewRequest("POST", s.url+"/v1/sandboxes/sb-local/checkpoints", strings.NewReader(fmt.Sprintf(`{"path":%q}`, project)))
		req.Header.Set("X-Api-Key", s.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("capture: %d\n%s", resp.StatusCode, s.plog)
		}
		h := resp.Header.Get(servertiming.Header)
		got := map[string]time.Duration{}
		var steps time.Duration
		for _, m := range servertiming.Parse(h) {
			got[m.Name] = m.Dur
			if strings.HasPrefix(m.Name, "guest.capture.") || strings.HasPrefix(m.Name, "guest.enroll.") {
				steps += m.Dur
			}
		}
		want := []string{"total", "channel", "guest.total", "guest.enroll.commit"}
		if i > 0 {
			want = []string{"total", "channel", "guest.total", "guest.capture.prepare", "guest.capture.freeze", "guest.capture.mount.swap", "guest.capture.seal", "guest.capture.commit"}
		}
		for _, name := range want {
			if _, ok := got[name]; !ok {
				t.Fatalf("capture %d: Server-Timing %q lacks %s", i, h, name)
			}
		}
		if got["channel"]+got["guest.total"] > got["total"] || steps > got["guest.total"] {
			t.Fatalf("capture %d: the parts exceed their whole: %q", i, h)
		}
	}
}
