package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestVMLoamPage runs loam's "Checkpoints" page (../shared/seeds/000_…)
// with createos for loam's CLI (loam → createos sandbox, checkpoint →
// snapshot, $LOAM_* → $CREATEOS_*) and its curl lines with the account key
// as Authorization: Bearer, on a sandbox created as `createos sandbox
// create scratch` and named so everywhere after: a snapshot created by
// the sandbox's name, a disk-only one by curl, get, delete, a restore (the
// http.server running again, state.txt back to v1), `fork scratch v1
// scratch-copy` with the server running in the fork, and a fork of a
// snapshot's ref alone. Then names and ids are never confused: a name
// like an id is refused, and after a delete the name is free for a new
// sandbox while the old id is 404.
func TestVMLoamPage(t *testing.T) {
	s := startVMStack(t, "120s")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	// createos runs one command line: its stdout, or the test fails.
	createos := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(bins, "createos"), args...)
		cmd.Env = append(os.Environ(), "CREATEOS_API_URL="+s.url, "CREATEOS_API_KEY="+s.key,
			"CREATEOS_SANDBOX_ID=", "CREATEOS_CREDENTIALS="+filepath.Join(t.TempDir(), "none.env"))
		cmd.Stdin = nil // </dev/null, as the page's lines
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("createos %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out.String(), errb.String())
		}
		return out.String()
	}
	// curl is one call with the key as Authorization: Bearer, as loam's
	// curl lines send it.
	curl := func(method, path, body string) reply {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, _ := http.NewRequestWithContext(ctx, method, s.url+path, rd)
		req.Header.Set("Authorization", "Bearer "+s.key)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		r := reply{Status: resp.StatusCode, Header: resp.Header, Raw: raw}
		if err := json.Unmarshal(raw, &r.Body); err != nil {
			t.Fatalf("%s %s: not JSON (%d): %s", method, path, resp.StatusCode, raw)
		}
		return r
	}

	// $ loam sandbox create scratch
	createos("sandbox", "create", "scratch")
	id := s.call(s.key, "GET", "/v1/sandboxes/scratch", "").data()["id"].(string)
	// The page's sandbox: a site served by python3's http.server, and
	// state.txt, at v1 (started apart, in a session of its own, so that
	// it outlives the call).
	s.sh("scratch", `mkdir -p /home/loam/site && echo v1 > /home/loam/state.txt && echo hello > /home/loam/site/index.html && `+
		`setsid python3 -m http.server 8080 --directory /home/loam/site </dev/null >/dev/null 2>&1 &`)
	// (http[.]server: a pattern that the shell's own command line, which
	// holds it, does not match.)
	s.sh("scratch", `for i in $(seq 600); do pgrep -f 'http[.]server' >/dev/null && exit 0; sleep 0.1; done; exit 1`)

	// $ loam checkpoint create scratch --comment 'site up, state v1'
	out := createos("sandbox", "snapshot", "create", "scratch", "--comment", "site up, state v1")
	if !regexp.MustCompile(`(?m)^v1 +memory .*site up, state v1$`).MatchString(out) || !regexp.MustCompile(`(?m)^ref: sn-[a-z0-9]{24}$`).MatchString(out) {
		t.Fatalf("snapshot create printed:\n%s", out)
	}
	ref := regexp.MustCompile(`sn-[a-z0-9]{24}`).FindString(out)

	// $ curl … -H "Authorization: Bearer $LOAM_TOKEN" …/v1/sandboxes/scratch/checkpoints -d '{"comment":"disk only","memory":false}'
	r := curl("POST", "/v1/sandboxes/scratch/snapshots", `{"comment":"disk only","memory":false}`)
	if d := r.data(); r.Status != 200 || d["id"] != "v2" || d["sandbox"] != id || d["memory"] != false || d["comment"] != "disk only" {
		t.Fatalf("a disk-only snapshot by curl: %d %s", r.Status, r.Raw)
	}
	// $ loam checkpoint ls scratch
	out = createos("sandbox", "snapshot", "list", "scratch")
	if !regexp.MustCompile(`(?m)^v1 +memory `).MatchString(out) || !regexp.MustCompile(`(?m)^v2 +disk `).MatchString(out) {
		t.Fatalf("snapshot list:\n%s", out)
	}
	// $ curl … …/v1/sandboxes/scratch/checkpoints/v1
	if r := curl("GET", "/v1/sandboxes/scratch/snapshots/v1", ""); r.Status != 200 || r.data()["id"] != "v1" || r.data()["ref"] != ref || r.data()["comment"] != "site up, state v1" {
		t.Fatalf("get v1: %d %s", r.Status, r.Raw)
	}
	// $ curl … -X DELETE …/v1/sandboxes/scratch/checkpoints/v2
	if r := curl("DELETE", "/v1/sandboxes/scratch/snapshots/v2", ""); r.Status != 200 {
		t.Fatalf("delete v2: %d %s", r.Status, r.Raw)
	}
	if r := curl("GET", "/v1/sandboxes/scratch/snapshots/v2", ""); r.Status != 404 || r.data()["code"] != "snapshot_not_found" {
		t.Fatalf("v2 after its delete: %d %s", r.Status, r.Raw)
	}

	// $ loam run scratch -- sh -c 'echo v2 > /home/loam/state.txt; pkill -f http.server' </dev/null
	// (http[.]server, so that pkill does not match the shell it runs in)
	createos("sandbox", "exec", "scratch", "--", "sh", "-c", "echo v2 > /home/loam/state.txt; pkill -f 'http[.]server'")
	if out := createos("sandbox", "exec", "scratch", "--", "cat", "/home/loam/state.txt"); out != "v2\n" {
		t.Fatalf("before the restore: %q", out)
	}
	// $ loam checkpoint restore scratch v1
	createos("sandbox", "snapshot", "restore", "scratch", "v1")
	// $ loam run scratch -- sh -c 'cat /home/loam/state.txt; pgrep -a python3' </dev/null
	out = createos("sandbox", "exec", "scratch", "--", "sh", "-c", "cat /home/loam/state.txt; pgrep -a python3")
	if !strings.HasPrefix(out, "v1\n") || !strings.Contains(out, "python3 -m http.server 8080 --directory /home/loam/site") {
		t.Fatalf("after the restore:\n%s", out)
	}

	// $ loam fork scratch v1 scratch-copy
	out = createos("sandbox", "fork", "scratch", "v1", "scratch-copy")
	if !regexp.MustCompile(`(?m)^sb-[a-z0-9]+ +scratch-copy +running `).MatchString(out) {
		t.Fatalf("fork printed:\n%s", out)
	}
	// $ loam run scratch-copy -- pgrep -a python3 </dev/null
	if out := createos("sandbox", "exec", "scratch-copy", "--", "pgrep", "-a", "python3"); !strings.Contains(out, "http.server 8080") {
		t.Fatalf("the fork's processes: %q", out)
	}
	copyID := s.call(s.key, "GET", "/v1/sandboxes/scratch-copy", "").data()["id"].(string)

	// A ref alone forks: no sandbox named.
	out = createos("sandbox", "fork", "-", ref, "scratch-3", "--label", "owner=docs")
	if !strings.Contains(out, "scratch-3") {
		t.Fatalf("fork of a ref:\n%s", out)
	}
	if out := createos("sandbox", "list", "--label", "owner=docs"); !strings.Contains(out, "scratch-3") || strings.Contains(out, "scratch-copy") {
		t.Fatalf("list --label owner=docs:\n%s", out)
	}

	// Names and ids are never confused.
	if r := s.call(s.key, "POST", "/v1/sandboxes", `{"name":"sb-scratch"}`); r.Status != 400 || r.data()["code"] != "invalid_field" {
		t.Fatalf("a name like an id: %d %s", r.Status, r.Raw)
	}
	if r := s.call(s.key, "POST", "/v1/sandboxes", `{"name":"scratch"}`); r.Status != 409 || r.data()["code"] != "name_taken" {
		t.Fatalf("a name taken: %d %s", r.Status, r.Raw)
	}
	createos("sandbox", "rm", "scratch-copy")
	if r := s.call(s.key, "GET", "/v1/sandboxes/"+copyID, ""); r.Status != 404 {
		t.Fatalf("the deleted sandbox's id: %d %s", r.Status, r.Raw)
	}
	fresh := s.create(s.key, `{"name":"scratch-copy"}`)
	if fresh == copyID {
		t.Fatal("a new sandbox got the old id")
	}
	if got := s.call(s.key, "GET", "/v1/sandboxes/scratch-copy", "").data()["id"]; got != fresh {
		t.Fatalf("scratch-copy is %v, want the new %s", got, fresh)
	}
	if r := s.call(s.key, "GET", "/v1/sandboxes/"+copyID, ""); r.Status != 404 {
		t.Fatalf("the old id after the name was taken again: %d %s", r.Status, r.Raw)
	}
	// Another account's name is unknown, and its own name is its own.
	if r := s.call(s.keyB(), "GET", "/v1/sandboxes/scratch", ""); r.Status != 404 || r.data()["code"] != "sandbox_not_found" {
		t.Fatalf("another account's name: %d %s", r.Status, r.Raw)
	}
}
