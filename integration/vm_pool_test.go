package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestVMPool: with vms.pool 1 hostproxy boots a sandbox of no account
// ahead. A create of the default resources is answered running at once,
// under the pooled sandbox's id, named as asked (its guest's hostname),
// and the sandbox works; no other account sees it, nor anyone the pooled
// one; the pool boots its next sandbox; a create of other resources boots
// as before. (Issue 18, item 5: a create took a whole boot, about 5 s.)
func TestVMPool(t *testing.T) {
	s := startVMStackWith(t, "60s", map[string]any{"pool": 1})
	s.waitMetric("strata_hostproxy_pool_ready", 1, 4*time.Minute)
	for _, account := range []string{"acct-a", "acct-b"} {
		if ids := s.sandboxes(account); len(ids) != 0 {
			t.Fatalf("an account sees the pooled sandbox: %v", ids)
		}
	}

	r := s.call(s.key, "POST", "/v1/sandboxes", `{"name":"pooled-web"}`)
	if r.Status != http.StatusAccepted || r.data()["state"] != "running" || r.data()["name"] != "pooled-web" {
		t.Fatalf("create with a pooled sandbox ready: %d %s; want 202 running", r.Status, r.Raw)
	}
	id := r.data()["id"].(string)
	if got := s.call(s.key, "GET", "/v1/sandboxes/"+id, "").data(); got["state"] != "running" || got["memory_mib"] != float64(512) {
		t.Fatalf("the taken sandbox: %v", got)
	}
	if out := strings.TrimSpace(s.sh(id, "hostname; echo ok > /tmp/f && cat /tmp/f")); out != "pooled-web\nok" {
		t.Fatalf("in the taken sandbox: %q", out)
	}
	if ids := s.sandboxes("acct-a"); len(ids) != 1 || ids[0] != id {
		t.Fatalf("account A's sandboxes: %v, want [%s]", ids, id)
	}
	if ids := s.sandboxes("acct-b"); len(ids) != 0 {
		t.Fatalf("account B sees %v", ids)
	}
	if r := s.call(s.keyB(), "GET", "/v1/sandboxes/"+id, ""); r.Status != http.StatusNotFound {
		t.Fatalf("account B reads A's taken sandbox: %d %s", r.Status, r.Raw)
	}

	// The pool boots its next one.
	s.waitMetric("strata_hostproxy_pool_ready", 1, 4*time.Minute)

	// Other resources: a boot, as before.
	r = s.call(s.key, "POST", "/v1/sandboxes", `{"memory_mib":384}`)
	if r.Status != http.StatusAccepted || r.data()["state"] != "creating" {
		t.Fatalf("create of other resources: %d %s; want 202 creating", r.Status, r.Raw)
	}
	other := r.data()["id"].(string)
	s.waitState(s.key, other, "running", 4*time.Minute)
	if out := strings.TrimSpace(s.sh(other, "echo ok")); out != "ok" {
		t.Fatalf("in the booted sandbox: %q", out)
	}
}
