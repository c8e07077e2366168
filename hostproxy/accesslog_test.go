package hostproxy_test

import (
	"regexp"
	"strings"
	"testing"
)

// TestAccessLogLine pins hostproxy's line per request: the keys every
// strata daemon writes (internal/httpx), then the client address, the
// principal, the sandbox and the error code, as docs/api.md lists them. A
// client's own X-Request-Id is not taken at the public edge: the id is
// hostproxy's, and the one the guest sees.
func TestAccessLogLine(t *testing.T) {
	s := startStack(t, nil)
	const route = "/v1/sandboxes/:id/checkpoints"
	cases := []struct {
		name  string
		req   request
		route string
		rest  string // after duration_ms
	}{
		{"account key", request{method: "GET", path: cpsA1, key: keyA}, route,
			`status=200 duration_ms=[0-9.]+ remote=127\.0\.0\.1 credential=key-a account=acct-a sandbox=sb-a1$`},
		{"no key", request{method: "GET", path: cpsA1}, route,
			`status=401 duration_ms=[0-9.]+ remote=127\.0\.0\.1 sandbox=sb-a1 code=unauthorized$`},
		{"unknown route", request{method: "GET", path: "/v1/nope"}, "unmatched",
			`status=404 duration_ms=[0-9.]+ remote=127\.0\.0\.1 code=not_found$`},
		// echo matches no route for a wrong method, so it names no sandbox.
		{"wrong method", request{method: "PUT", path: cpsA1, key: keyA}, route,
			`status=405 duration_ms=[0-9.]+ remote=127\.0\.0\.1 code=method_not_allowed$`},
		{"guest down", request{method: "GET", path: "/v1/sandboxes/sb-dead/checkpoints", key: keyA}, route,
			`status=503 duration_ms=[0-9.]+ remote=127\.0\.0\.1 credential=key-a account=acct-a sandbox=sb-dead code=guest_unavailable$`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.header = map[string]string{"X-Request-Id": "client-chosen-id"}
			rep := s.do(tc.req)
			id := rep.header.Get("X-Request-Id")
			if !regexp.MustCompile(`^[0-9a-f]{24}$`).MatchString(id) {
				t.Fatalf("request id %q, want hostproxy's own 24 hex digits, not the client's", id)
			}
			line := logLine(t, s, "msg=request request_id="+id+" ")
			want := `^time=\S+ level=INFO msg=request request_id=` + id + ` method=` + tc.req.method +
				` route=` + regexp.QuoteMeta(tc.route) + ` ` + tc.rest
			if !regexp.MustCompile(want).MatchString(line) {
				t.Errorf("log line\n%s\nwant\n%s", line, want)
			}
			if rep.status >= 500 {
				logLine(t, s, "level=ERROR msg=\"request failed\" request_id="+id+" ")
			}
		})
	}
	s.do(request{method: "GET", path: cpsA1, key: keyA, header: map[string]string{"X-Request-Id": "client-chosen-id"}})
	if got := s.guests["sb-a1"].LastHeader().Get("X-Request-Id"); got == "client-chosen-id" || got == "" {
		t.Errorf("guest saw request id %q, want hostproxy's", got)
	}
}

// logLine returns the one line of the stack's log that contains sub.
func logLine(t *testing.T, s *stack, sub string) string {
	t.Helper()
	var found []string
	for _, l := range strings.Split(s.logs.String(), "\n") {
		if strings.Contains(l, sub) {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d log lines with %q in\n%s", len(found), sub, s.logs.String())
	}
	return found[0]
}
