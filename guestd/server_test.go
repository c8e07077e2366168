package guestd

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"strata/internal/httpx"
)

// storelessServer is a guestd without a store: enough for the edge and the
// routes that never reach one.
func storelessServer(t *testing.T, logs *bytes.Buffer) *Server {
	s := &Server{
		log:             slog.New(slog.NewTextHandler(logs, nil)),
		reg:             prometheus.NewRegistry(),
		credentialsPath: filepath.Join(t.TempDir(), "credentials.env"),
	}
	s.handler = s.routes()
	return s
}

// TestEdge pins guestd's HTTP edge, which is internal/httpx as in
// hostproxy: the request id hostproxy sends is kept (a bad one is
// replaced), unknown routes and wrong methods are JSend 404 and 405 (with
// Allow), and each request has one log line with the keys both daemons
// write, an unknown route as "unmatched" (it was "/", the catch-all's
// pattern, before the edge was shared).
func TestEdge(t *testing.T) {
	const fromHost = "0123456789abcdef01234567"
	cases := []struct {
		name, method, path, body, sentID string
		status                           int
		code, allow, route               string
	}{
		{name: "unknown route", method: "GET", path: "/v1/nope", status: 404, code: "not_found", route: "unmatched"},
		{name: "root", method: "GET", path: "/", status: 404, code: "not_found", route: "unmatched"},
		{name: "wrong method", method: "PUT", path: "/v1/checkpoints", status: 405, code: "method_not_allowed", allow: "GET, POST", route: "/v1/checkpoints"},
		{name: "wrong method on restore", method: "GET", path: "/v1/checkpoints/cp-1/restore", status: 405, code: "method_not_allowed", allow: "POST", route: "/v1/checkpoints/{id}/restore"},
		{name: "wrong method on metrics", method: "POST", path: "/metrics", status: 405, code: "method_not_allowed", allow: "GET", route: "/metrics"},
		{name: "metrics", method: "GET", path: "/metrics", status: 200, route: "/metrics"},
		{name: "invalid body, id from the host", method: "PUT", path: "/v1/credentials", body: `{"api_url":"ftp://x","sandbox_id":"sb"}`, sentID: fromHost,
			status: 400, code: "invalid_field", route: "/v1/credentials"},
		{name: "id that is not one word", method: "GET", path: "/v1/nope", sentID: "a b", status: 404, code: "not_found", route: "unmatched"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logs := &bytes.Buffer{}
			s := storelessServer(t, logs)
			r := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			if tc.body != "" {
				r.Header.Set("Content-Type", "application/json")
			}
			if tc.sentID != "" {
				r.Header.Set(httpx.HeaderRequestID, tc.sentID)
			}
			w := httptest.NewRecorder()
			s.Handler().ServeHTTP(w, r)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			body := w.Body.String()
			if tc.code != "" && (!strings.Contains(body, `"status":"fail"`) || !strings.Contains(body, `"code":"`+tc.code+`"`)) {
				t.Errorf("body %s, want a JSend fail with code %s", w.Body, tc.code)
			}
			if got := w.Header().Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
			id := w.Header().Get(httpx.HeaderRequestID)
			if tc.sentID == fromHost && id != fromHost {
				t.Errorf("request id %q, want the host's %q", id, fromHost)
			}
			if !regexp.MustCompile(`^[0-9a-f]{24}$`).MatchString(id) {
				t.Errorf("request id %q", id)
			}
			want := `(?m)^time=\S+ level=INFO msg=request request_id=` + id + ` method=` + tc.method +
				` route=` + regexp.QuoteMeta(tc.route) + ` status=` + strconv.Itoa(tc.status) + ` duration_ms=[0-9.]+`
			if tc.code != "" {
				want += ` code=` + tc.code
			}
			want += `$`
			if !regexp.MustCompile(want).MatchString(logs.String()) {
				t.Errorf("log\n%s\nwant a line matching\n%s", logs, want)
			}
		})
	}
}
