package guestd

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"strata/internal/httpx"
	"strata/layers"
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

// TestBeyondRoutesValidate pins the checks issue 8's routes make before
// they reach a store: a malformed checkpoint id is checkpoint_not_found,
// a bad against, entry path or body is a 400 naming the field, and the
// methods are fixed. Real stores answer the rest (integration tests).
func TestBeyondRoutesValidate(t *testing.T) {
	const cp = "/v1/checkpoints/cp_AAAAAAAAAAAAAAAAAAAAAA"
	cases := []struct {
		name, method, path, body string
		status                   int
		code, field, allow       string
	}{
		{name: "changes of a malformed id", method: "GET", path: "/v1/checkpoints/cp-1/changes", status: 404, code: "checkpoint_not_found"},
		{name: "changes against nothing", method: "GET", path: cp + "/changes?against=", status: 400, code: "invalid_field", field: "against"},
		{name: "changes against a bad id", method: "GET", path: cp + "/changes?against=cp_1", status: 400, code: "invalid_field", field: "against"},
		{name: "changes with another query", method: "GET", path: cp + "/changes?limit=1", status: 400, code: "query_not_allowed"},
		{name: "changes with a body", method: "GET", path: cp + "/changes", body: `{}`, status: 400, code: "body_not_allowed"},
		{name: "changes by POST", method: "POST", path: cp + "/changes", status: 405, code: "method_not_allowed", allow: "GET"},
		{name: "file with a hidden rune", method: "GET", path: cp + "/files/a%E2%80%AEb", status: 400, code: "invalid_field", field: "path"},
		{name: "file with a query", method: "GET", path: cp + "/files/a?x=1", status: 400, code: "query_not_allowed"},
		{name: "file of a malformed id", method: "GET", path: "/v1/checkpoints/nope/files/a", status: 404, code: "checkpoint_not_found"},
		{name: "files by DELETE", method: "DELETE", path: cp + "/files/a", status: 405, code: "method_not_allowed", allow: "GET"},
		{name: "root listing by DELETE", method: "DELETE", path: cp + "/files", status: 405, code: "method_not_allowed", allow: "GET"},
		{name: "restore-paths without paths", method: "POST", path: cp + "/restore-paths", body: `{}`, status: 400, code: "invalid_field", field: "paths"},
		{name: "restore-paths absolute", method: "POST", path: cp + "/restore-paths", body: `{"paths":["/etc"]}`, status: 400, code: "invalid_field", field: "paths"},
		{name: "restore-paths escaping", method: "POST", path: cp + "/restore-paths", body: `{"paths":["a/../../b"]}`, status: 400, code: "invalid_field", field: "paths"},
		{name: "restore-paths unknown field", method: "POST", path: cp + "/restore-paths", body: `{"paths":["a"],"all":true}`, status: 400, code: "unknown_field", field: "all"},
		{name: "restore-paths without a body", method: "POST", path: cp + "/restore-paths", status: 400, code: "invalid_json"},
		{name: "restore-paths by GET", method: "GET", path: cp + "/restore-paths", status: 405, code: "method_not_allowed", allow: "POST"},
		{name: "clone without path", method: "POST", path: cp + "/clone", body: `{}`, status: 400, code: "invalid_field", field: "path"},
		{name: "clone of a malformed id", method: "POST", path: "/v1/checkpoints/x/clone", body: `{"path":"/w/copy"}`, status: 404, code: "checkpoint_not_found"},
		{name: "clone with a query", method: "POST", path: cp + "/clone?x=1", body: `{"path":"/w/copy"}`, status: 400, code: "query_not_allowed"},
		{name: "release without path", method: "POST", path: "/v1/directories/release", body: `{"path":""}`, status: 400, code: "invalid_field", field: "path"},
		{name: "release by GET", method: "GET", path: "/v1/directories/release", status: 405, code: "method_not_allowed", allow: "POST"},
		{name: "create with a bad retention", method: "POST", path: "/v1/checkpoints", body: `{"path":"/w","retention":{"mode":"delete_oldest","max_count":0}}`,
			status: 400, code: "invalid_field", field: "retention.max_count"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := storelessServer(t, &bytes.Buffer{})
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			r := httptest.NewRequest(tc.method, tc.path, body)
			if tc.body != "" {
				r.Header.Set("Content-Type", "application/json")
			}
			w := httptest.NewRecorder()
			s.Handler().ServeHTTP(w, r)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			var env struct {
				Data struct {
					Code  string `json:"code"`
					Field string `json:"field"`
				} `json:"data"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil {
				t.Fatalf("not JSON: %s", w.Body)
			}
			if env.Data.Code != tc.code || env.Data.Field != tc.field {
				t.Errorf("code %q field %q, want %q %q: %s", env.Data.Code, env.Data.Field, tc.code, tc.field, w.Body)
			}
			if got := w.Header().Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
		})
	}
}

// TestEntryToAPI pins the files route's shape: mode as four octal
// digits, mtime in UTC with nanoseconds, and the field of the entry's
// type present even when empty.
func TestEntryToAPI(t *testing.T) {
	mtime := time.Date(2026, 12, 1, 10, 0, 0, 5, time.FixedZone("x", 3600))
	for _, tc := range []struct {
		name string
		in   layers.Entry
		want string
	}{
		{"empty file", layers.Entry{Path: "a", Type: "file", Mode: 0o644, MTime: mtime},
			`{"path":"a","type":"file","mode":"0644","size":0,"mtime":"2026-12-01T09:00:00.000000005Z","content":""}`},
		{"file", layers.Entry{Path: "a", Type: "file", Mode: 0o4755, Size: 3, MTime: mtime, Content: []byte("hi\n")},
			`{"path":"a","type":"file","mode":"4755","size":3,"mtime":"2026-12-01T09:00:00.000000005Z","content":"aGkK"}`},
		{"symlink", layers.Entry{Path: "l", Type: "symlink", Mode: 0o777, Size: 3, MTime: mtime, Target: "../x"},
			`{"path":"l","type":"symlink","mode":"0777","size":3,"mtime":"2026-12-01T09:00:00.000000005Z","target":"../x"}`},
		{"empty dir", layers.Entry{Path: "", Type: "dir", Mode: 0o755, Size: 4096, MTime: mtime},
			`{"path":"","type":"dir","mode":"0755","size":4096,"mtime":"2026-12-01T09:00:00.000000005Z","entries":[]}`},
		{"dir", layers.Entry{Path: "d", Type: "dir", Mode: 0o1777, MTime: mtime, Entries: []layers.DirEntry{{Name: "a", Type: "file"}, {Name: "b", Type: "dir"}}},
			`{"path":"d","type":"dir","mode":"1777","size":0,"mtime":"2026-12-01T09:00:00.000000005Z","entries":[{"name":"a","type":"file"},{"name":"b","type":"dir"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(entryToAPI(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}
