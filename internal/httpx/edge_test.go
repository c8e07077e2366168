package httpx_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"strata/internal/fault"
	"strata/internal/httpx"
	"strata/internal/servertiming"
)

// logBuffer collects JSON log lines (the handlers in these tests run on
// the test's goroutine).
type logBuffer struct{ b bytes.Buffer }

func (l *logBuffer) Write(p []byte) (int, error) { return l.b.Write(p) }

// lines returns each line as its keys in order and its values.
func (l *logBuffer) lines(t *testing.T) []logLine {
	t.Helper()
	var out []logLine
	for _, s := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if s == "" {
			continue
		}
		out = append(out, parseLine(t, s))
	}
	return out
}

type logLine struct {
	keys   []string
	values map[string]any
}

func parseLine(t *testing.T, s string) logLine {
	t.Helper()
	ln := logLine{values: map[string]any{}}
	if err := json.Unmarshal([]byte(s), &ln.values); err != nil {
		t.Fatalf("log line %q: %v", s, err)
	}
	d := json.NewDecoder(strings.NewReader(s))
	d.Token() // {
	for d.More() {
		k, _ := d.Token()
		ln.keys = append(ln.keys, k.(string))
		var skip json.RawMessage
		if err := d.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return ln
}

// only returns the one line whose msg is msg.
func only(t *testing.T, lines []logLine, msg string) logLine {
	t.Helper()
	var found []logLine
	for _, l := range lines {
		if l.values["msg"] == msg {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %q lines in %v, want 1", len(found), msg, lines)
	}
	return found[0]
}

func edge(accept bool) (*httpx.Edge, *logBuffer) {
	logs := &logBuffer{}
	return &httpx.Edge{Log: slog.New(slog.NewJSONHandler(logs, nil)), AcceptRequestID: accept}, logs
}

var hexID = regexp.MustCompile(`^[0-9a-f]{24}$`)

// TestRequestID pins which X-Request-Id a caller may choose: one header, 1
// to 64 characters of A-Z a-z 0-9 - _ . :, and only on an edge that
// accepts them (guestd's). Any other request gets a new id. The id is on
// the response, in the context and in the log line, the same everywhere.
func TestRequestID(t *testing.T) {
	long := strings.Repeat("a", httpx.MaxRequestIDLen)
	cases := []struct {
		name   string
		accept bool
		sent   []string
		kept   bool
	}{
		{"none sent", true, nil, false},
		{"hex from hostproxy", true, []string{"0123456789abcdef01234567"}, true},
		{"uuid", true, []string{"3f1c2a9e-8b7d-4c6e-9f00-1a2b3c4d5e6f"}, true},
		{"service and id", true, []string{"ci:build_42.7"}, true},
		{"64 characters", true, []string{long}, true},
		{"65 characters", true, []string{long + "a"}, false},
		{"empty", true, []string{""}, false},
		{"space", true, []string{"a b"}, false},
		{"log key injection", true, []string{`x status=200`}, false},
		{"quote", true, []string{`a"b`}, false},
		{"newline", true, []string{"a\nmsg=forged"}, false},
		{"non-ASCII", true, []string{"idé"}, false},
		{"slash", true, []string{"a/b"}, false},
		{"sent twice", true, []string{"one", "two"}, false},
		{"public edge ignores a sane one", false, []string{"0123456789abcdef01234567"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, logs := edge(tc.accept)
			var inCtx string
			h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				inCtx = httpx.RequestID(r.Context())
				if got := w.Header().Get(httpx.HeaderRequestID); got != inCtx {
					t.Errorf("header %q before the handler writes, context %q", got, inCtx)
				}
				httpx.Respond(w, r, "ok", nil)
			}))
			r := httptest.NewRequest("GET", "/x", nil)
			for _, v := range tc.sent {
				r.Header.Add(httpx.HeaderRequestID, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			got := w.Header().Get(httpx.HeaderRequestID)
			if tc.kept {
				if got != tc.sent[0] {
					t.Errorf("id %q, want the caller's %q", got, tc.sent[0])
				}
			} else if !hexID.MatchString(got) {
				t.Errorf("id %q, want a new one of 24 hex digits", got)
			}
			if inCtx != got {
				t.Errorf("context id %q, response %q", inCtx, got)
			}
			if l := only(t, logs.lines(t), "request"); l.values["request_id"] != got {
				t.Errorf("logged id %v, response %q", l.values["request_id"], got)
			}
		})
	}
	e, _ := edge(false)
	ids := map[string]bool{}
	for range 100 {
		w := httptest.NewRecorder()
		e.Handler(http.NotFoundHandler()).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		ids[w.Header().Get(httpx.HeaderRequestID)] = true
	}
	if len(ids) != 100 {
		t.Errorf("%d distinct ids in 100 requests", len(ids))
	}
}

// FuzzRequestID: whatever a caller sends, the id a request gets is one
// ValidRequestID accepts, and a caller's is kept exactly when it is valid.
func FuzzRequestID(f *testing.F) {
	for _, s := range []string{"", "abc", "a b", "ü", strings.Repeat("x", 65), "a=b", "a\tb", "0123456789abcdef01234567"} {
		f.Add(s)
	}
	e, _ := edge(true)
	e.Log = slog.New(slog.DiscardHandler)
	h := e.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	f.Fuzz(func(t *testing.T, sent string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header[httpx.HeaderRequestID] = []string{sent}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		got := w.Header().Get(httpx.HeaderRequestID)
		if !httpx.ValidRequestID(got) {
			t.Fatalf("request got id %q", got)
		}
		if (got == sent) != httpx.ValidRequestID(sent) {
			t.Fatalf("sent %q, got %q", sent, got)
		}
		for _, c := range got {
			if c > 0x7e || c <= ' ' || strings.ContainsRune(`"'=\/`, c) {
				t.Fatalf("id %q has %q", got, c)
			}
		}
	})
}

// errSecret is a cause whose text must never reach a client.
var errSecret = errors.New("open /var/lib/strata/store/meta.db: permission denied")

// TestWriteError pins the response of each fault kind: its status, and the
// JSend shape that status calls for: fail with code, message and fields
// for a 4xx; error with the stable code in data for a classified 5xx; a bare
// "internal error" for an internal one, whatever its cause says. Every 5xx
// logs its cause with the request id; no response carries the cause.
func TestWriteError(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		status int
		body   string
	}{
		{"invalid", fault.New(fault.Invalid, "invalid_json", "the body is not JSON").With("field", "path"), 400,
			`{"status":"fail","data":{"code":"invalid_json","message":"the body is not JSON","field":"path"}}`},
		{"unauthorized", fault.New(fault.Unauthorized, "unauthorized", "a key is required"), 401,
			`{"status":"fail","data":{"code":"unauthorized","message":"a key is required"}}`},
		{"forbidden", fault.New(fault.Forbidden, "forbidden", "not yours"), 403,
			`{"status":"fail","data":{"code":"forbidden","message":"not yours"}}`},
		{"not found", httpx.ErrNoRoute, 404,
			`{"status":"fail","data":{"code":"not_found","message":"no such route"}}`},
		{"method not allowed", httpx.ErrMethodNotAllowed, 405,
			`{"status":"fail","data":{"code":"method_not_allowed","message":"this method is not allowed on this route"}}`},
		{"conflict, cause kept out", fault.New(fault.Conflict, "operation_in_progress", "busy").Wrap(errSecret), 409,
			`{"status":"fail","data":{"code":"operation_in_progress","message":"busy"}}`},
		{"too large", fault.New(fault.TooLarge, "body_too_large", "too big").With("limit", 16384), 413,
			`{"status":"fail","data":{"code":"body_too_large","message":"too big","limit":16384}}`},
		{"unsupported media", fault.New(fault.UnsupportedMedia, "unsupported_media_type", "send JSON"), 415,
			`{"status":"fail","data":{"code":"unsupported_media_type","message":"send JSON"}}`},
		{"unprocessable, wrapped with %w", fmt.Errorf("create: %w", fault.New(fault.Unprocessable, "path_protected", "protected").With("path", "/etc")), 422,
			`{"status":"fail","data":{"code":"path_protected","message":"protected","path":"/etc"}}`},
		{"too many requests", fault.New(fault.TooManyRequests, "rate_limited", "slow down").With("retry_after", 1), 429,
			`{"status":"fail","data":{"code":"rate_limited","message":"slow down","retry_after":1}}`},
		{"unavailable", fault.New(fault.Unavailable, "guest_unavailable", "the guest cannot be reached").Wrap(errSecret), 503,
			`{"status":"error","message":"the guest cannot be reached","code":503,"data":{"code":"guest_unavailable"}}`},
		{"insufficient storage", fault.New(fault.InsufficientStorage, "insufficient_storage", "no space").Wrap(errSecret), 507,
			`{"status":"error","message":"no space","code":507,"data":{"code":"insufficient_storage"}}`},
		{"internal kind", fault.New(fault.Internal, "store_broken", "the store at /var/lib/strata is broken").Wrap(errSecret), 500,
			`{"status":"error","message":"internal error","code":500}`},
		{"unclassified", errSecret, 500,
			`{"status":"error","message":"internal error","code":500}`},
		{"unclassified wrapping", fmt.Errorf("seal: %w", errSecret), 500,
			`{"status":"error","message":"internal error","code":500}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, logs := edge(false)
			h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				httpx.Respond(w, r, nil, tc.err)
			}))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/checkpoints", nil))
			if w.Code != tc.status {
				t.Errorf("status %d, want %d", w.Code, tc.status)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			assertJSON(t, w.Body.Bytes(), tc.body)
			for _, leak := range []string{"permission denied", "/var/lib", "meta.db", "store_broken"} {
				if strings.Contains(w.Body.String(), leak) {
					t.Errorf("body %s shows %q", w.Body, leak)
				}
			}
			id := w.Header().Get(httpx.HeaderRequestID)
			lines := logs.lines(t)
			if tc.status >= 500 {
				l := only(t, lines, "request failed")
				if l.values["level"] != "ERROR" || l.values["request_id"] != id || !strings.Contains(fmt.Sprint(l.values["err"]), "permission denied") {
					t.Errorf("5xx logged as %v, want ERROR with request id %s and the cause", l.values, id)
				}
			} else {
				for _, l := range lines {
					if l.values["msg"] == "request failed" {
						t.Errorf("a %d logged an error: %v", tc.status, l.values)
					}
				}
			}
			if l := only(t, lines, "request"); l.values["status"] != float64(tc.status) {
				t.Errorf("logged status %v, want %d", l.values["status"], tc.status)
			}
		})
	}
}

func assertJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("body %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("body %s\nwant %s", bytes.TrimSpace(got), want)
	}
}

// TestAccessLog pins the keys of the one line per request that both
// daemons write: request_id, method, route, status, duration_ms, then what
// the daemon added, then code when the request failed with a classified
// error. route is a pattern or "unmatched", never the path asked for.
func TestAccessLog(t *testing.T) {
	base := []string{"time", "level", "msg", "request_id", "method", "route", "status", "duration_ms"}
	cases := []struct {
		name    string
		method  string
		path    string
		handler func(mux *http.ServeMux) http.Handler
		route   string
		status  int
		extra   []string
	}{
		{name: "ServeMux pattern", method: "GET", path: "/v1/checkpoints/cp-1/restore", route: "/v1/checkpoints/{id}/restore", status: 200,
			handler: func(mux *http.ServeMux) http.Handler { return mux }},
		{name: "no route", method: "GET", path: "/nope", route: "unmatched", status: 404, extra: []string{"code"},
			handler: func(*http.ServeMux) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { httpx.WriteError(w, r, httpx.ErrNoRoute) })
			}},
		{name: "catch-all pattern answering no route", method: "GET", path: "/v1/nope", route: "unmatched", status: 404, extra: []string{"code"},
			handler: func(mux *http.ServeMux) http.Handler {
				mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { httpx.WriteError(w, r, httpx.ErrNoRoute) })
				return mux
			}},
		{name: "router's route answering no route", method: "GET", path: "/v1/sandboxes/x/nope", route: "unmatched", status: 404, extra: []string{"code"},
			handler: func(*http.ServeMux) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					httpx.SetRoute(r.Context(), "/*")
					httpx.WriteError(w, r, httpx.ErrNoRoute)
				})
			}},
		{name: "route set by another router, attributes in order", method: "DELETE", path: "/v1/sandboxes/sb-1/checkpoints/cp-1",
			route: "/v1/sandboxes/:id/checkpoints/:checkpoint", status: 200,
			extra: []string{"remote", "credential", "account", "sandbox"},
			handler: func(*http.ServeMux) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					httpx.SetRoute(r.Context(), "/v1/sandboxes/:id/checkpoints/:checkpoint")
					httpx.Annotate(r.Context(), slog.String("remote", "192.0.2.1"))
					httpx.Annotate(r.Context(), slog.String("credential", "key-a"), slog.String("account", "acct-a"), slog.String("sandbox", "sb-1"))
					httpx.Respond(w, r, struct{}{}, nil)
				})
			}},
		{name: "classified error adds its code last", method: "POST", path: "/v1/sandboxes/sb-1/checkpoints",
			route: "/v1/sandboxes/:id/checkpoints", status: 409, extra: []string{"credential", "code"},
			handler: func(*http.ServeMux) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					httpx.WriteError(w, r, fault.New(fault.Conflict, "sandbox_not_running", "the sandbox is not running"))
					httpx.SetRoute(r.Context(), "/v1/sandboxes/:id/checkpoints")
					httpx.Annotate(r.Context(), slog.String("credential", "key-a"))
				})
			}},
		{name: "internal error has no code", method: "GET", path: "/v1/health", route: "unmatched", status: 500,
			handler: func(*http.ServeMux) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { httpx.WriteError(w, r, errSecret) })
			}},
		{name: "panic is a bare 500", method: "GET", path: "/boom", route: "/boom", status: 500,
			handler: func(*http.ServeMux) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					httpx.SetRoute(r.Context(), "/boom")
					panic("the handler broke")
				})
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("/v1/checkpoints/{id}/restore", func(w http.ResponseWriter, r *http.Request) { httpx.Respond(w, r, "ok", nil) })
			e, logs := edge(true)
			var observed []httpx.Summary
			e.Observe = func(s httpx.Summary) { observed = append(observed, s) }
			w := httptest.NewRecorder()
			r := httptest.NewRequest(tc.method, tc.path, nil)
			r.Header.Set(httpx.HeaderRequestID, "req-1")
			e.Handler(tc.handler(mux)).ServeHTTP(w, r)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			l := only(t, logs.lines(t), "request")
			if want := append(append([]string{}, base...), tc.extra...); !reflect.DeepEqual(l.keys, want) {
				t.Errorf("keys %v\nwant %v", l.keys, want)
			}
			want := map[string]any{"level": "INFO", "request_id": "req-1", "method": tc.method, "route": tc.route, "status": float64(tc.status)}
			for k, v := range want {
				if l.values[k] != v {
					t.Errorf("%s=%v, want %v", k, l.values[k], v)
				}
			}
			if d, ok := l.values["duration_ms"].(float64); !ok || d < 0 {
				t.Errorf("duration_ms=%v", l.values["duration_ms"])
			}
			if len(observed) != 1 || observed[0].Route != tc.route || observed[0].Status != tc.status || observed[0].Method != tc.method {
				t.Errorf("observed %+v", observed)
			}
			if strings.Contains(w.Body.String(), "broke") {
				t.Errorf("body %s shows the panic", w.Body)
			}
		})
	}
}

// TestErrorAfterResponse: an error once the response has started is
// logged with the request id, and nothing is appended to the body.
func TestErrorAfterResponse(t *testing.T) {
	e, logs := edge(false)
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpx.Respond(w, r, "partial", nil)
		httpx.WriteError(w, r, errSecret)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	assertJSON(t, w.Body.Bytes(), `{"status":"success","data":"partial"}`)
	lines := logs.lines(t)
	l := only(t, lines, "error after the response was sent")
	if l.values["request_id"] != w.Header().Get(httpx.HeaderRequestID) {
		t.Errorf("logged %v", l.values)
	}
	if l := only(t, lines, "request"); l.values["status"] != float64(200) {
		t.Errorf("logged status %v, want the 200 that was sent", l.values["status"])
	}
}

// TestAbortHandler: http.ErrAbortHandler still aborts the connection (net/http
// handles it), after the request is logged.
func TestAbortHandler(t *testing.T) {
	e, logs := edge(false)
	h := e.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	defer func() {
		if p := recover(); p != http.ErrAbortHandler {
			t.Errorf("recovered %v, want http.ErrAbortHandler", p)
		}
		only(t, logs.lines(t), "request")
	}()
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
}

// TestOutsideEdge: the helpers work, quietly, on a request no Edge wraps.
func TestOutsideEdge(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	httpx.SetRoute(r.Context(), "/x")
	httpx.Annotate(r.Context(), slog.String("k", "v"))
	if id := httpx.RequestID(r.Context()); id != "" {
		t.Errorf("RequestID %q outside an edge", id)
	}
	w := httptest.NewRecorder()
	httpx.WriteError(w, r, errSecret)
	if w.Code != 500 {
		t.Errorf("status %d", w.Code)
	}
	assertJSON(t, w.Body.Bytes(), `{"status":"error","message":"internal error","code":500}`)
}

// TestServerTiming: every answer, success or error, carries the edge's
// total first and then the metrics added below it, in order.
func TestServerTiming(t *testing.T) {
	e := &httpx.Edge{Log: slog.New(slog.NewTextHandler(&logBuffer{}, nil))}
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		status  int
		metrics []string
	}{
		{"success", func(w http.ResponseWriter, r *http.Request) {
			servertiming.Add(r.Context(), "capture.prepare", 2*time.Millisecond)
			servertiming.Add(r.Context(), "capture.freeze", 30*time.Microsecond)
			httpx.Respond(w, r, map[string]string{"a": "b"}, nil)
		}, 200, []string{"total", "capture.prepare", "capture.freeze"}},
		{"error", func(w http.ResponseWriter, r *http.Request) {
			servertiming.Add(r.Context(), "step", time.Millisecond)
			httpx.WriteError(w, r, fault.New(fault.Invalid, "bad", "bad"))
		}, 400, []string{"total", "step"}},
		{"bare write", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("x")) }, 200, []string{"total"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			e.Handler(tc.handler).ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil))
			if rec.Code != tc.status {
				t.Fatalf("status %d", rec.Code)
			}
			var names []string
			for _, m := range servertiming.Parse(rec.Header().Get(servertiming.Header)) {
				names = append(names, m.Name)
			}
			if !reflect.DeepEqual(names, tc.metrics) {
				t.Fatalf("Server-Timing %q: metrics %v, want %v", rec.Header().Get(servertiming.Header), names, tc.metrics)
			}
		})
	}
}
