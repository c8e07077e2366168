package hostproxy_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"strata/hostproxy"
)

var tokenPattern = regexp.MustCompile(`^sbt_[A-Za-z0-9_-]{43}$`)

// TestAccessTokens walks a token's life across two sandboxes of account A
// and one of account B: issue, use, scope, rotate, revoke.
func TestAccessTokens(t *testing.T) {
	s := startStack(t, nil)
	status := func(r request) (int, string) {
		t.Helper()
		rep := s.do(r)
		return rep.status, checkJSend(t, rep)
	}
	expect := func(what string, r request, wantStatus int, wantCode string) {
		t.Helper()
		if st, code := status(r); st != wantStatus || code != wantCode {
			t.Errorf("%s: got %d %q, want %d %q", what, st, code, wantStatus, wantCode)
		}
	}

	var issued struct{ Token, Hint, CreatedAt string }
	s.mustData(request{method: "POST", path: "/v1/sandboxes/sb-a1/access-token", key: keyA}, &issued)
	tokA1 := issued.Token
	if !tokenPattern.MatchString(tokA1) || issued.Hint != tokA1[len(tokA1)-4:] {
		t.Fatalf("token %q hint %q: want sbt_ and 43 base64url characters, hint = last 4", tokA1, issued.Hint)
	}
	tokB1 := s.issueToken(keyB, "sb-b1")

	// The token works on its own sandbox's four operations.
	cp := s.create(tokA1, "sb-a1", "/workspace/project", "by token")
	expect("list with token", request{method: "GET", path: "/v1/sandboxes/sb-a1/checkpoints", key: tokA1}, 200, "")
	expect("restore with token", request{method: "POST", path: "/v1/sandboxes/sb-a1/checkpoints/" + cp.ID + "/restore", key: tokA1}, 200, "")

	// Nowhere else: another sandbox of the same account, another account's
	// sandbox, a sandbox that does not exist: all 403, so a token learns
	// nothing about other sandboxes.
	for _, sb := range []string{"sb-a2", "sb-b1", "sb-nope"} {
		expect("token A1 on "+sb, request{method: "GET", path: "/v1/sandboxes/" + sb + "/checkpoints", key: tokA1}, 403, "forbidden")
		expect("token A1 creating on "+sb, request{method: "POST", path: "/v1/sandboxes/" + sb + "/checkpoints", key: tokA1, body: `{"path":"/workspace/project"}`}, 403, "forbidden")
	}
	expect("token B1 on sb-a1", request{method: "GET", path: "/v1/sandboxes/sb-a1/checkpoints", key: tokB1}, 403, "forbidden")
	// Never on management routes, its own sandbox included.
	for _, r := range []request{
		{method: "GET", path: "/v1/sandboxes/sb-a1/access-token"},
		{method: "POST", path: "/v1/sandboxes/sb-a1/access-token"},
		{method: "POST", path: "/v1/sandboxes/sb-a1/access-token/rotate"},
		{method: "DELETE", path: "/v1/sandboxes/sb-a1/access-token"},
		{method: "POST", path: "/v1/sandboxes/sb-a2/access-token"},
	} {
		r.key = tokA1
		expect("token on "+r.method+" "+r.path, r, 403, "forbidden")
	}
	// Accounts are apart: key A cannot see B's sandbox or its token.
	expect("key A on sb-b1", request{method: "GET", path: "/v1/sandboxes/sb-b1/checkpoints", key: keyA}, 404, "sandbox_not_found")
	expect("key A on sb-b1 token", request{method: "GET", path: "/v1/sandboxes/sb-b1/access-token", key: keyA}, 404, "sandbox_not_found")
	expect("key B on sb-b1", request{method: "GET", path: "/v1/sandboxes/sb-b1/checkpoints", key: keyB}, 200, "")

	// Show never returns the token.
	rep := s.do(request{method: "GET", path: "/v1/sandboxes/sb-a1/access-token", key: keyA})
	if rep.status != 200 || strings.Contains(string(rep.body), tokA1) || !strings.Contains(string(rep.body), `"hint":"`+issued.Hint+`"`) {
		t.Errorf("show: %d %s", rep.status, rep.body)
	}
	expect("issue twice", request{method: "POST", path: "/v1/sandboxes/sb-a1/access-token", key: keyA}, 409, "token_exists")

	// Rotate: the new token works at once, the old one fails at once.
	var rotated struct{ Token string }
	s.mustData(request{method: "POST", path: "/v1/sandboxes/sb-a1/access-token/rotate", key: keyA}, &rotated)
	if rotated.Token == tokA1 || !tokenPattern.MatchString(rotated.Token) {
		t.Fatalf("rotated token %q", rotated.Token)
	}
	expect("old token after rotate", request{method: "GET", path: "/v1/sandboxes/sb-a1/checkpoints", key: tokA1}, 401, "unauthorized")
	expect("new token after rotate", request{method: "GET", path: "/v1/sandboxes/sb-a1/checkpoints", key: rotated.Token}, 200, "")
	// The guest holds the current token for the processes inside it.
	if c := s.guests["sb-a1"].Credentials(); c.Token != rotated.Token || c.SandboxID != "sb-a1" || !strings.HasPrefix(c.APIURL, "http://") {
		t.Fatalf("credentials handed to the guest after rotate: %+v", c)
	}
	expect("B's token unaffected", request{method: "GET", path: "/v1/sandboxes/sb-b1/checkpoints", key: tokB1}, 200, "")

	// Revoke, twice: idempotent; then rotate has nothing to rotate.
	expect("revoke", request{method: "DELETE", path: "/v1/sandboxes/sb-a1/access-token", key: keyA}, 200, "")
	expect("revoke again", request{method: "DELETE", path: "/v1/sandboxes/sb-a1/access-token", key: keyA}, 200, "")
	expect("revoked token", request{method: "GET", path: "/v1/sandboxes/sb-a1/checkpoints", key: rotated.Token}, 401, "unauthorized")
	if c := s.guests["sb-a1"].Credentials(); c.Token != "" || c.SandboxID != "sb-a1" {
		t.Fatalf("credentials handed to the guest after revoke: %+v", c)
	}
	expect("rotate after revoke", request{method: "POST", path: "/v1/sandboxes/sb-a1/access-token/rotate", key: keyA}, 404, "token_not_found")
	// A paused sandbox's token can still be managed, but its checkpoints wait.
	if err := s.srv.Registry().SetSandboxState(context.Background(), "sb-a2", hostproxy.StatePaused); err != nil {
		t.Fatal(err)
	}
	tokA2 := s.issueToken(keyA, "sb-a2")
	expect("token on paused sandbox", request{method: "GET", path: "/v1/sandboxes/sb-a2/checkpoints", key: tokA2}, 409, "sandbox_not_running")
}

// TestRegistryPersists restarts hostproxy on the same data directory:
// tokens survive; a sandbox dropped from the configuration takes its token
// with it; a key dropped from the configuration stops working.
func TestRegistryPersists(t *testing.T) {
	s := startStack(t, nil)
	cfg := s.cfg
	tokA1 := s.issueToken(keyA, "sb-a1")
	tokA2 := s.issueToken(keyA, "sb-a2")
	s.stop()

	// Same configuration: both tokens still work.
	s.start(cfg)
	for sb, tok := range map[string]string{"sb-a1": tokA1, "sb-a2": tokA2} {
		if rep := s.do(request{method: "GET", path: "/v1/sandboxes/" + sb + "/checkpoints", key: tok}); rep.status != 200 {
			t.Fatalf("token of %s after restart: %d %s", sb, rep.status, rep.body)
		}
	}
	s.stop()

	// sb-a2 and account B's key gone from the configuration.
	var kept []hostproxy.SandboxConfig
	for _, sb := range cfg.Sandboxes {
		if sb.ID != "sb-a2" {
			kept = append(kept, sb)
		}
	}
	cfg.Sandboxes = kept
	cfg.Accounts[1].Keys = nil
	s.start(cfg)
	if rep := s.do(request{method: "GET", path: "/v1/sandboxes/sb-a2/checkpoints", key: tokA2}); rep.status != http.StatusUnauthorized {
		t.Errorf("token of a removed sandbox: %d %s", rep.status, rep.body)
	}
	if rep := s.do(request{method: "GET", path: "/v1/sandboxes/sb-b1/checkpoints", key: keyB}); rep.status != http.StatusUnauthorized {
		t.Errorf("removed key: %d %s", rep.status, rep.body)
	}
	if rep := s.do(request{method: "GET", path: "/v1/sandboxes/sb-a1/checkpoints", key: tokA1}); rep.status != 200 {
		t.Errorf("token of a kept sandbox: %d %s", rep.status, rep.body)
	}
}
