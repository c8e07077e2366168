package hostproxy

import (
	"encoding/json"
	"testing"

	"strata/internal/api"
	"strata/sandbox"
)

// TestAccessSetting pins item 2 of issue 30: the channel key carries the
// scopes of its sandbox's access setting, read from the record at each
// call, so that a change takes effect at the next call for the key the
// guest already holds; "none" hands the guest no key and refuses every
// call from inside (401); and a revoke of the token no longer brings back
// a channel key that "none" took away (it did: a revoke handed the guest
// its channel key again).
func TestAccessSetting(t *testing.T) {
	h := newAuthzHarness(t)
	h.machine("sb-vm", "")
	key := h.s.reg.ChannelKey("sb-vm")
	inside := func(method, path, key, body string) (int, map[string]any) {
		t.Helper()
		return h.do(call{method: method, path: "/v1/sandboxes/sb-vm" + path, key: key, via: "sb-vm", body: body})
	}
	access := func(body string) map[string]any {
		t.Helper()
		status, data := h.do(call{method: "PUT", path: "/v1/sandboxes/sb-vm/access", key: testKey, body: body})
		if status != 200 {
			t.Fatalf("PUT access %s: %d %v", body, status, data)
		}
		return data
	}
	shown := func() string {
		t.Helper()
		status, data := h.do(call{method: "GET", path: "/v1/sandboxes/sb-vm", key: testKey})
		b, _ := json.Marshal(data["access"])
		if status != 200 {
			t.Fatalf("GET: %d %v", status, data)
		}
		return string(b)
	}
	guestKey := func() api.Credentials {
		t.Helper()
		return h.guest.Credentials()
	}

	if got := shown(); got != `{"scopes":["checkpoints","snapshots"]}` {
		t.Errorf("the default access shown as %s", got)
	}
	if status, _ := inside("GET", "/checkpoints", key, ""); status != 200 {
		t.Errorf("default access: checkpoints: %d", status)
	}
	if status, data := inside("POST", "/sessions", key, `{"cmd":["sh"]}`); status != 403 || data["scope"] != "exec" {
		t.Errorf("default access: a session: %d %v, want 403 naming exec", status, data)
	}

	// A change takes effect at the next call, for the same key.
	if data := access(`{"scopes":["files","exec"]}`); data["access"] == nil {
		t.Errorf("PUT access answers %v, without the setting", data)
	}
	if got := shown(); got != `{"scopes":["exec","files"]}` {
		t.Errorf("access shown as %s", got)
	}
	if status, data := inside("POST", "/sessions", key, `{"cmd":["sh"]}`); status != 201 {
		t.Errorf("access exec: a session: %d %v", status, data)
	}
	if status, data := inside("GET", "/checkpoints", key, ""); status != 403 || data["scope"] != "checkpoints" {
		t.Errorf("access exec: checkpoints: %d %v, want 403 naming checkpoints", status, data)
	}
	if c := guestKey(); c.ChannelKey != key {
		t.Errorf("the guest has %+v, want its channel key", c)
	}

	// none: the guest's key is taken away, and every call from inside
	// is 401, the account key's too.
	access(`"none"`)
	if got := shown(); got != `"none"` {
		t.Errorf("access shown as %s", got)
	}
	if c := guestKey(); c.ChannelKey != "" || c.Token != "" || c.TokenSHA256 != "" {
		t.Errorf("after access none the guest has %+v, want no key", c)
	}
	for _, k := range []string{key, testKey, ""} {
		if status, data := inside("GET", "/checkpoints", k, ""); status != 401 || data["code"] != "unauthorized" {
			t.Errorf("access none, key %.8q: %d %v, want 401", k, status, data)
		}
	}
	if status, _ := h.do(call{method: "GET", path: "/v1/health", via: "sb-vm"}); status != 200 {
		t.Errorf("access none: health (no key needed): %d", status)
	}

	// A token issued, then revoked, while access is none never reaches
	// the guest, and the revoke does not hand it its channel key again.
	tok := h.token("sb-vm", api.ScopeCheckpoints)
	if c := guestKey(); c.Token != "" || c.ChannelKey != "" {
		t.Errorf("a token issued while access is none reached the guest: %+v", c)
	}
	if status, _ := inside("GET", "/checkpoints", tok, ""); status != 401 {
		t.Errorf("access none: the token from inside: %d, want 401", status)
	}
	if status, _ := h.do(call{method: "GET", path: "/v1/sandboxes/sb-vm/checkpoints", key: tok}); status != 200 {
		t.Errorf("access none: the token from the network: %d, want 200", status)
	}
	if status, data := h.do(call{method: "DELETE", path: "/v1/sandboxes/sb-vm/access-token", key: testKey}); status != 200 {
		t.Fatalf("revoke: %d %v", status, data)
	}
	if c := guestKey(); c.ChannelKey != "" || c.Token != "" {
		t.Errorf("a revoke while access is none brought back a key: %+v", c)
	}

	// Scopes again: the guest gets its channel key back.
	access(`{"scopes":["checkpoints"]}`)
	if c := guestKey(); c.ChannelKey != key {
		t.Errorf("after access checkpoints the guest has %+v", c)
	}
	if status, _ := inside("GET", "/checkpoints", key, ""); status != 200 {
		t.Errorf("access checkpoints: %d", status)
	}

	// A sandbox that is not running gets its credentials at its next
	// boot, as its record has them then.
	if _, err := h.s.reg.Update(t.Context(), "sb-vm", func(r *Sandbox) error { r.State = sandbox.Stopped; return nil }); err != nil {
		t.Fatal(err)
	}
	access(`"none"`)
	if c := guestKey(); c.ChannelKey != key {
		t.Errorf("a stopped sandbox's guest was handed %+v", c)
	}
	rec, _ := h.s.reg.Sandbox(t.Context(), "sb-vm")
	if err := h.s.booted(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	if c := guestKey(); c.ChannelKey != "" {
		t.Errorf("booted with access none, the guest has %+v", c)
	}
}

// TestTakeAccess: a sandbox taken from the pool or the forks made ahead
// gets the access setting, env and labels of the create or fork that
// takes it (package sandbox's Take copies the account, name and time
// only).
func TestTakeAccess(t *testing.T) {
	h := newAuthzHarness(t)
	pooled := Sandbox{ID: "sb-pooled", Guest: guestAddress("sb-pooled"), State: sandbox.Running, Machine: &sandbox.Machine{}, Pooled: true}
	if err := h.s.reg.Insert(t.Context(), pooled); err != nil {
		t.Fatal(err)
	}
	want := Sandbox{Access: "none", Env: map[string]string{"CI": "1"}, Labels: map[string]string{"owner": "docs"}}
	taken, err := h.s.reg.Take(withTaken(t.Context(), want), "sb-pooled", func(r *Sandbox) error {
		r.Pooled, r.Account = false, "acct-a"
		return nil
	})
	if err != nil || taken.Access != "none" || taken.Env["CI"] != "1" || taken.Labels["owner"] != "docs" {
		t.Fatalf("taken: %+v, %v; want access none, its env and labels", taken, err)
	}
	if rec, _ := h.s.reg.Sandbox(t.Context(), "sb-pooled"); rec.Access != "none" || rec.Labels["owner"] != "docs" {
		t.Errorf("recorded access %q, labels %v", rec.Access, rec.Labels)
	}
	// An Update (a lifecycle change) leaves them alone.
	if rec, _ := h.s.reg.Update(withTaken(t.Context(), Sandbox{}), "sb-pooled", func(*Sandbox) error { return nil }); rec.Access != "none" || rec.Env["CI"] != "1" {
		t.Errorf("an update changed the access to %q, the env to %v", rec.Access, rec.Env)
	}
}
