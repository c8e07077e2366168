package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSandboxEndToEnd drives one microVM sandbox through the public API
// only: create, exec, the seed document's checkpoint flow inside the VM,
// a call from inside the sandbox through its channel, stop and a cold
// boot that finds every checkpoint and the live content again, delete.
func TestSandboxEndToEnd(t *testing.T) {
	s := startVMStack(t, "60s")
	t0 := time.Now()
	id := s.create(s.key, `{"name":"e2e"}`)
	t.Logf("create to running: %v", time.Since(t0))

	rec := s.must(200, "GET", "/v1/sandboxes/"+id, "").data()
	if rec["name"] != "e2e" || rec["memory_mib"] != 512.0 || rec["vcpus"] != 1.0 || rec["disk_gib"] != 4.0 || rec["created_at"] == "" {
		t.Fatalf("record: %v", rec)
	}
	if out := s.sh(id, "cat /etc/os-release"); !strings.Contains(out, "Debian") {
		t.Fatalf("os-release: %q", out)
	}
	if res := s.exec(id, "python3", "-c", "import sys; print(6*7); sys.exit(3)"); res.ExitCode != 3 || res.Stdout != "42\n" {
		t.Fatalf("python3: %+v", res)
	}
	if out := s.sh(id, "git --version && stat -f -c %T / && findmnt -no FSTYPE /"); !strings.Contains(out, "git version") || !strings.Contains(out, "xfs") {
		t.Fatalf("git and xfs: %q", out)
	}
	s.checkConfined(id)
	// guestd listens on no TCP port but the API forwarder's (127.0.0.1:7777,
	// 0100007F:1E61, state 0A), and its own socket is root's alone.
	if out := s.sh(id, `awk '$4 == "0A" {print $2}' /proc/net/tcp /proc/net/tcp6; stat -c '%a %U' /run/strata/guestd.sock`); out != "0100007F:1E61\n600 root\n" {
		t.Fatalf("listeners in the guest: %q", out)
	}
	if r := s.call(s.key, "POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":["/no/such/program"]}`); r.Status != 422 || r.code() != "exec_failed" {
		t.Fatalf("exec of a missing program: %d %s", r.Status, r.Raw)
	}

	// The seed's flow, with the files changed through exec.
	cp := "/v1/sandboxes/" + id + "/checkpoints"
	s.sh(id, "mkdir -p /workspace/project && echo 'package main' > /workspace/project/main.go")
	a := s.must(200, "POST", cp, `{"path":"/workspace/project","name":"before-update"}`).data()
	s.sh(id, "echo broken > /workspace/project/main.go && echo new > /workspace/project/extra")
	b := s.must(200, "POST", cp, `{"path":"/workspace/project","name":"broken"}`).data()
	if b["parent_id"] != a["id"] {
		t.Fatalf("parent of the second checkpoint: %v, want %v", b["parent_id"], a["id"])
	}
	s.must(200, "POST", cp+"/"+a["id"].(string)+"/restore", "")
	if out := s.sh(id, "cat /workspace/project/main.go; ls /workspace/project"); out != "package main\nmain.go\n" {
		t.Fatalf("after restore: %q", out)
	}
	list := s.must(200, "GET", cp, "").Body["data"].([]any)
	if len(list) != 2 {
		t.Fatalf("list: %v", list)
	}
	s.must(200, "DELETE", cp+"/"+b["id"].(string), "")
	s.sh(id, "echo unsaved > /workspace/project/notes")

	// From inside: the in-guest API address reaches hostproxy through the
	// channel, with no guest network. With no access token issued, the
	// guest's key is its channel key, which acts on this sandbox.
	if out := s.sh(id, `. /run/strata/credentials.env && echo "${CREATEOS_API_KEY%%_*}"`); out != "sbc\n" {
		t.Fatalf("the guest's key before any token: %q", out)
	}
	// createos is on the guest's PATH and needs no set-up: the sandbox,
	// the address and the key come from the credentials file.
	made := s.sh(id, `cd / && env -u CREATEOS_API_URL -u CREATEOS_API_KEY -u CREATEOS_SANDBOX_ID createos sandbox checkpoint create --path /workspace/project --name inside -o json`)
	var insideCp struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(made), &insideCp); err != nil || insideCp.ID == "" || insideCp.Name != "inside" {
		t.Fatalf("createos checkpoint create from inside: %v %q", err, made)
	}
	if out := s.sh(id, `createos sandbox checkpoint list`); !strings.Contains(out, insideCp.ID) || !strings.Contains(out, a["id"].(string)) {
		t.Fatalf("createos checkpoint list from inside: %q", out)
	}
	s.sh(id, "echo more > /workspace/project/more")
	if out := s.sh(id, `createos sandbox checkpoint diff `+insideCp.ID+` --live`); !strings.Contains(out, "more") {
		t.Fatalf("createos checkpoint diff --live from inside: %q", out)
	}
	s.sh(id, `createos sandbox checkpoint restore `+insideCp.ID+` && createos sandbox checkpoint delete `+insideCp.ID)
	// The record shows the default access, which has no exec: a session
	// from inside is refused, naming the scope it needs.
	if got := s.must(200, "GET", "/v1/sandboxes/"+id, "").data()["access"]; fmt.Sprint(got) != "map[scopes:[checkpoints snapshots]]" {
		t.Fatalf("the default access: %v", got)
	}
	if out := s.sh(id, `createos sandbox exec $CREATEOS_SANDBOX_ID -- true 2>&1; echo "exit $?"`); !strings.Contains(out, "forbidden") || !strings.Contains(out, "exec") || !strings.HasSuffix(out, "exit 1\n") {
		t.Fatalf("createos sandbox exec from inside without the exec scope: %q", out)
	}
	// With exec in the sandbox's access, the same key may, at the next
	// call: a session from inside, through the channel both ways.
	// Its two streams are kept apart (their order between each other is
	// not a stream's to keep).
	s.must(200, "PUT", "/v1/sandboxes/"+id+"/access", `{"scopes":["checkpoints","snapshots","exec"]}`)
	if out := s.sh(id, `createos sandbox exec $CREATEOS_SANDBOX_ID -- sh -c 'echo inside; echo err >&2' >/tmp/out 2>/tmp/err; cat /tmp/out /tmp/err`); out != "inside\nerr\n" {
		t.Fatalf("createos sandbox exec from inside: %q", out)
	}
	// Access none: the guest's key is taken away, and a call from inside
	// with the key it had is 401; then back to the default.
	key := strings.TrimSpace(s.sh(id, `. /run/strata/credentials.env && echo "$CREATEOS_API_KEY"`))
	s.must(200, "PUT", "/v1/sandboxes/"+id+"/access", `"none"`)
	if out := s.sh(id, `grep -c CREATEOS_API_KEY /run/strata/credentials.env || true`); strings.TrimSpace(out) != "0" {
		t.Fatalf("with access none the guest still has a key: %q", out)
	}
	if out := s.sh(id, `. /run/strata/credentials.env; curl -s -o /dev/null -w '%{http_code}' -H "X-Api-Key: `+key+`" "$CREATEOS_API_URL/v1/sandboxes/$CREATEOS_SANDBOX_ID/checkpoints" || true`); out != "401" {
		t.Fatalf("with access none, the old key from inside: %q", out)
	}
	s.must(200, "PUT", "/v1/sandboxes/"+id+"/access", `{"scopes":["checkpoints","snapshots"]}`)
	if out := s.sh(id, `. /run/strata/credentials.env && echo "${CREATEOS_API_KEY%%_*}"`); out != "sbc\n" {
		t.Fatalf("the guest's key after access was given back: %q", out)
	}
	// Once a token is issued, the guest has it, and it acts on this
	// sandbox from inside too.
	tok := s.must(200, "POST", "/v1/sandboxes/"+id+"/access-token", "").data()["token"].(string)
	inside := s.sh(id, `. /run/strata/credentials.env && test "$CREATEOS_API_KEY" = `+tok+` && curl -sS -H "X-Api-Key: $CREATEOS_API_KEY" "$CREATEOS_API_URL/v1/sandboxes/$CREATEOS_SANDBOX_ID/checkpoints"`)
	if !strings.Contains(inside, a["id"].(string)) {
		t.Fatalf("list from inside: %q", inside)
	}
	if out := s.sh(id, "ls /workspace/project; readlink /usr/local/bin/createos"); out != "main.go\nnotes\n/run/strata/bin/createos\n" {
		t.Fatalf("after createos restored and deleted its checkpoint: %q", out)
	}
	// The restore kept the unsaved file as an automatic checkpoint.
	for _, c := range s.must(200, "GET", cp, "").Body["data"].([]any) {
		if c := c.(map[string]any); c["auto"] == true {
			s.must(200, "DELETE", cp+"/"+c["id"].(string), "")
		}
	}
	// One NIC besides lo, as strata-init set it up: the host's stack at
	// its other end (docs/design.md, "Networks").
	if out := s.sh(id, `ip -o -4 addr show | grep -v ' lo ' | awk '{print $2, $4}'; ip route show default`); out != "eth0 10.0.2.15/24\ndefault via 10.0.2.2 dev eth0 \n" {
		t.Fatalf("the guest's network interfaces: %q", out)
	}

	// Stop (clean) and start (cold boot): checkpoints and content back.
	r := s.must(200, "POST", "/v1/sandboxes/"+id+"/stop", "")
	if r.data()["state"] != "stopped" {
		t.Fatalf("stop: %s", r.Raw)
	}
	if c := s.console(id); !strings.Contains(c, "strata-init: rebooting") || strings.Contains(c, "did not stop within") || strings.Contains(c, "remount / read-only:") {
		t.Fatalf("the stop was not clean; console:\n%s", tail([]byte(c), 2000))
	}
	if r := s.call(s.key, "POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":["true"]}`); r.Status != 409 || r.code() != "sandbox_not_running" {
		t.Fatalf("exec on a stopped sandbox: %d %s", r.Status, r.Raw)
	}
	if r := s.call(s.key, "GET", cp, ""); r.Status != 409 || r.code() != "sandbox_not_running" {
		t.Fatalf("list on a stopped sandbox: %d %s", r.Status, r.Raw)
	}
	t0 = time.Now()
	if r := s.call(s.key, "POST", "/v1/sandboxes/"+id+"/start", ""); r.Status != http.StatusAccepted {
		t.Fatalf("start: %d %s", r.Status, r.Raw)
	}
	s.waitState(s.key, id, "running", 4*time.Minute)
	t.Logf("cold boot: %v", time.Since(t0))
	// After a clean stop the root's log is clean: XFS replays nothing.
	if out := s.sh(id, "dmesg | grep -c 'Starting recovery' || true"); strings.TrimSpace(out) != "0" {
		t.Fatalf("XFS replayed its log at the cold boot after a clean stop: %q", out)
	}
	if got := s.must(200, "GET", cp, "").Body["data"].([]any); len(got) != 1 || got[0].(map[string]any)["id"] != a["id"] {
		t.Fatalf("list after the cold boot: %v", got)
	}
	if out := s.sh(id, "cat /workspace/project/main.go /workspace/project/notes"); out != "package main\nunsaved\n" {
		t.Fatalf("content after the cold boot: %q", out)
	}
	if out := s.sh(id, ". /run/strata/credentials.env && echo $CREATEOS_API_KEY"); strings.TrimSpace(out) != tok {
		t.Fatalf("the token after the cold boot: %q", out)
	}

	// Pause and resume.
	if r := s.call(s.key, "POST", "/v1/sandboxes/"+id+"/pause", ""); r.Status != http.StatusAccepted && r.Status != 200 {
		t.Fatalf("pause: %d %s", r.Status, r.Raw)
	}
	s.waitState(s.key, id, "paused", time.Minute)
	if r := s.call(s.key, "POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":["true"]}`); r.Status != 409 {
		t.Fatalf("exec on a paused sandbox: %d %s", r.Status, r.Raw)
	}
	if r := s.call(s.key, "POST", "/v1/sandboxes/"+id+"/pause", ""); r.Status != 200 || r.data()["state"] != "paused" {
		t.Fatalf("pause again: %d %s", r.Status, r.Raw)
	}
	s.call(s.key, "POST", "/v1/sandboxes/"+id+"/resume", "")
	s.waitState(s.key, id, "running", time.Minute)
	s.sh(id, "true")

	// Delete: the VM, its disk and its records are gone.
	dir := filepath.Join(s.machines, id)
	if layers, _ := filepath.Glob(filepath.Join(s.machines, "store", "*.qcow2")); len(layers) == 0 {
		t.Fatal("no disk layer in the store before the delete")
	}
	if r := s.must(200, "DELETE", "/v1/sandboxes/"+id, ""); r.data()["state"] != "destroyed" {
		t.Fatalf("delete: %s", r.Raw)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the sandbox's directory after delete: %v", err)
	}
	if left, _ := os.ReadDir(filepath.Join(s.machines, "store")); len(left) != 0 {
		t.Fatalf("the store after the only sandbox's delete holds %d files", len(left))
	}
	if r := s.call(s.key, "GET", "/v1/sandboxes/"+id, ""); r.Status != 404 || r.code() != "sandbox_not_found" {
		t.Fatalf("get after delete: %d %s", r.Status, r.Raw)
	}
}

// TestTwoSandboxes: two sandboxes of one account see neither each other's
// checkpoints, files nor token; a call from inside one cannot act on the
// other with any key; a wedged guest answers 503 guest_timeout in time
// while the other answers; hostproxy restarts under both; a killed QEMU
// ends in error and start recovers it.
func TestTwoSandboxes(t *testing.T) {
	s := startVMStack(t, "5s")
	a := s.create(s.key, `{"name":"alpha"}`)
	// beta with an Idempotency-Key: the retry answers with the same
	// sandbox and makes no other.
	idem := map[string]string{"Idempotency-Key": "create-beta-1"}
	first := s.callWith(s.key, "POST", "/v1/sandboxes", `{"name":"beta","memory_mib":256}`, idem)
	retry := s.callWith(s.key, "POST", "/v1/sandboxes", `{"name":"beta","memory_mib":256}`, idem)
	if first.Status != 202 || retry.Status != 202 || retry.data()["id"] != first.data()["id"] {
		t.Fatalf("create and its retry: %d %s / %d %s", first.Status, first.Raw, retry.Status, retry.Raw)
	}
	if r := s.callWith(s.key, "POST", "/v1/sandboxes", `{"name":"beta","memory_mib":512}`, idem); r.Status != 422 || r.code() != "idempotency_key_reused" {
		t.Fatalf("the key with another request: %d %s", r.Status, r.Raw)
	}
	b := first.data()["id"].(string)
	s.waitState(s.key, b, "running", 4*time.Minute)
	if n := len(s.sandboxes("acct-a")); n != 2 {
		t.Fatalf("%d sandboxes after a create and its retry, want 2", n)
	}
	if r := s.call(s.key, "POST", "/v1/sandboxes", `{"name":"alpha"}`); r.Status != 409 || r.code() != "name_taken" {
		t.Fatalf("a second alpha: %d %s", r.Status, r.Raw)
	}

	s.sh(a, "mkdir -p /workspace/a && echo secret-a > /workspace/a/f")
	s.must(200, "POST", "/v1/sandboxes/"+a+"/checkpoints", `{"path":"/workspace/a"}`)
	if got := s.must(200, "GET", "/v1/sandboxes/"+b+"/checkpoints", "").Body["data"].([]any); len(got) != 0 {
		t.Fatalf("b sees checkpoints: %v", got)
	}
	if res := s.exec(b, "cat", "/workspace/a/f"); res.ExitCode == 0 {
		t.Fatalf("b reads a's file: %+v", res)
	}
	tokA := s.must(200, "POST", "/v1/sandboxes/"+a+"/access-token", "").data()["token"].(string)
	s.must(200, "POST", "/v1/sandboxes/"+b+"/access-token", "")
	if out := s.sh(b, ". /run/strata/credentials.env; echo $CREATEOS_API_KEY"); strings.Contains(out, tokA) {
		t.Fatal("b holds a's token")
	}
	// From inside a: a's token on b, and even the account key on b, are
	// refused; the account key on a is fine.
	for _, key := range []string{tokA, s.key} {
		line := fmt.Sprintf(`curl -sS -o /dev/null -w '%%{http_code}' -H 'X-Api-Key: %s' "$CREATEOS_API_URL/v1/sandboxes/%s/checkpoints"`, key, b)
		if out := s.sh(a, ". /run/strata/credentials.env; "+line); out != "403" {
			t.Fatalf("from inside a, on b: %q, want 403", out)
		}
	}
	line := fmt.Sprintf(`curl -sS -o /dev/null -w '%%{http_code}' -H 'X-Api-Key: %s' "$CREATEOS_API_URL/v1/sandboxes"`, s.key)
	if out := s.sh(a, ". /run/strata/credentials.env; "+line); out != "403" {
		t.Fatalf("from inside a, the account's list: %q, want 403", out)
	}
	if r := s.call(tokA, "GET", "/v1/sandboxes/"+b+"/checkpoints", ""); r.Status != 403 {
		t.Fatalf("a's token on b: %d %s", r.Status, r.Raw)
	}

	// A wedged guest: 503 guest_timeout within the request timeout, and
	// the other sandbox answers meanwhile.
	pidA := s.qemuPid(a)
	syscall.Kill(pidA, syscall.SIGSTOP)
	done := make(chan reply, 1)
	t0 := time.Now()
	go func() { done <- s.call(s.key, "GET", "/v1/sandboxes/"+a+"/checkpoints", "") }()
	var waited time.Duration
	select {
	case r := <-done:
		t.Fatalf("a wedged guest answered at once: %d %s", r.Status, r.Raw)
	case <-time.After(time.Second):
	}
	// b is not queued behind a: it answers while a's call still waits.
	tb := time.Now()
	s.must(200, "GET", "/v1/sandboxes/"+b+"/checkpoints", "")
	select {
	case r := <-done:
		t.Fatalf("b answered after %v, only once a's call had ended (%d %s)", time.Since(tb), r.Status, r.Raw)
	default:
	}
	r := <-done
	waited = time.Since(t0)
	syscall.Kill(pidA, syscall.SIGCONT)
	// The request timeout is 5 s; the answer may come after it on a busy
	// machine, but not as late as a second timeout would.
	if r.Status != 503 || r.code() != "guest_timeout" || waited < 5*time.Second || waited > 20*time.Second {
		t.Fatalf("wedged guest: %d %s after %v, want 503 guest_timeout after 5 s", r.Status, r.Raw, waited)
	}
	if r.Header.Get("X-Request-Id") == "" {
		t.Fatal("no request id on the 503")
	}
	s.sh(a, "true")

	// hostproxy restarted: both keep running (the same QEMU, the guest
	// not rebooted) and answer.
	pids := map[string]int{a: s.qemuPid(a), b: s.qemuPid(b)}
	uptime := map[string]float64{}
	for _, id := range []string{a, b} {
		var up float64
		fmt.Sscan(s.sh(id, "cat /proc/uptime"), &up)
		uptime[id] = up
	}
	s.stop()
	s.start()
	for _, id := range []string{a, b} {
		if st := s.must(200, "GET", "/v1/sandboxes/"+id, "").data()["state"]; st != "running" {
			t.Fatalf("%s after the restart: %v", id, st)
		}
		var up float64
		fmt.Sscan(s.sh(id, "cat /proc/uptime"), &up)
		if s.qemuPid(id) != pids[id] || up < uptime[id] {
			t.Fatalf("%s after the restart: QEMU %d (was %d), uptime %v (was %v)", id, s.qemuPid(id), pids[id], up, uptime[id])
		}
	}
	if out := s.sh(a, "cat /workspace/a/f"); out != "secret-a\n" {
		t.Fatalf("a after the restart: %q", out)
	}

	// A killed QEMU: error, and start boots it again from its disk.
	syscall.Kill(s.qemuPid(b), syscall.SIGKILL)
	rec := s.waitState(s.key, b, "error", time.Minute)
	if rec["error"] == "" {
		t.Fatalf("error without a sentence: %v", rec)
	}
	s.call(s.key, "POST", "/v1/sandboxes/"+b+"/start", "")
	s.waitState(s.key, b, "running", 4*time.Minute)
	s.sh(b, "true")
}
