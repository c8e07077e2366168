package hostproxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"strata/hostproxy"
	"strata/hostproxy/hostproxytest"
	"strata/internal/api"
)

const filesA1 = "/v1/sandboxes/sb-a1/files/workspace/page.html"

// TestFileAnswersTypes pins issue 30's files answers whose Content-Type
// the guest chose (HTML served on the API's origin): a file is
// application/octet-stream whatever the guest says, a tree x-tar only
// when asked for, a listing JSON, and every answer nosniff; a refusal is
// relayed only as one of guestd's.
func TestFileAnswersTypes(t *testing.T) {
	html := map[string]string{"Content-Type": "text/html; charset=utf-8"}
	cases := []struct {
		name   string
		method string
		accept string
		answer hostproxytest.Fault
		status int
		typ    string // Content-Type; "" for a JSend fail or error
		code   string
	}{
		{"file said to be HTML", "GET", "", hostproxytest.Fault{Status: 200, Body: "<script>alert(1)</script>", Header: html}, 200, "application/octet-stream", ""},
		{"file said to be nothing", "GET", "", hostproxytest.Fault{Status: 200, Body: "x", Header: map[string]string{"Content-Type": ""}}, 200, "application/octet-stream", ""},
		{"range of a file", "GET", "", hostproxytest.Fault{Status: 206, Body: "x", Header: html}, 206, "application/octet-stream", ""},
		{"head of a file", "HEAD", "", hostproxytest.Fault{Status: 200, Header: html}, 200, "application/octet-stream", ""},
		{"tree asked for", "GET", "application/x-tar", hostproxytest.Fault{Status: 200, Body: "tar", Header: map[string]string{"Content-Type": "application/x-tar"}}, 200, "application/x-tar", ""},
		{"tree not asked for", "GET", "", hostproxytest.Fault{Status: 200, Body: "tar", Header: map[string]string{"Content-Type": "application/x-tar"}}, 200, "application/octet-stream", ""},
		{"listing", "GET", "", hostproxytest.Fault{Status: 200, Body: `{"status":"success","data":{"path":"/workspace/page.html","entries":[]}}`}, 200, "application/json", ""},
		{"guestd's refusal", "GET", "", hostproxytest.Fail(404, "file_not_found", "no file", map[string]any{"path": "/workspace/page.html"}), 404, "", "file_not_found"},
		{"a refusal of the edge's", "GET", "", hostproxytest.Fail(401, "unauthorized", "log in", nil), 502, "", "guest_error"},
		{"sandbox_not_found", "GET", "", hostproxytest.Fail(404, "sandbox_not_found", "gone", nil), 502, "", "guest_error"},
		{"a refusal of a HEAD of the edge's status", "HEAD", "", hostproxytest.Fault{Status: 401}, 502, "", ""},
		{"a refusal of a HEAD of guestd's status", "HEAD", "", hostproxytest.Fault{Status: 404}, 404, "", ""},
		{"a redirect", "GET", "", hostproxytest.Fault{Status: 302, Header: map[string]string{"Location": "https://evil.example/"}}, 502, "", "guest_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startStack(t, nil)
			s.guests["sb-a1"].SetRoute(tc.method, "/v1/files/workspace/page.html", tc.answer)
			r := request{method: tc.method, path: filesA1, key: keyA}
			if tc.accept != "" {
				r.header = map[string]string{"Accept": tc.accept}
			}
			rep := s.do(r)
			if rep.status != tc.status {
				t.Fatalf("status %d, want %d: %.300s", rep.status, tc.status, rep.body)
			}
			if got := rep.header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options %q", got)
			}
			if tc.typ != "" {
				if got := rep.header.Get("Content-Type"); got != tc.typ {
					t.Errorf("Content-Type %q, want %q", got, tc.typ)
				}
				return
			}
			if tc.method == "HEAD" {
				return
			}
			if code := checkJSend(t, rep); code != tc.code && !(tc.status >= 500 && strings.Contains(string(rep.body), tc.code)) {
				t.Errorf("code %q, want %q: %s", code, tc.code, rep.body)
			}
			if strings.Contains(string(rep.body), "evil") || strings.Contains(string(rep.body), "log in") {
				t.Errorf("the guest's text is relayed: %s", rep.body)
			}
		})
	}
}

// get is GET path with account A's key, by a client that allocates
// little of its own (s.do checks the answer against openapi.json), for
// tests that measure what hostproxy allocates in the same process.
func (s *stack) get(path string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest("GET", s.url+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", keyA)
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	io.Copy(&b, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b.String()
}

// sessionRecord is a record as guestd writes it.
const sessionRecord = `{"id":"se-0123456789abcdef","cmd":["sh"],"tty":false,"detachable":false,"state":"running","attached":0,"created_at":"2026-11-05T10:00:00Z","output_bytes":0}`

// TestGuestAnswersNotAmplified pins issue 30's amplified guest answers: a
// guest answering a session list with 15 MiB of {} grew hostproxy to 8.6
// GiB over four calls (each answered with 886 MB), a fail of 16 MiB of
// tiny fields took 560 MiB. Four calls of each: what hostproxy allocates
// is at most twice the guest's answer, 16 KiB a record and 1 MiB a call
// (a list of api.MaxSessionsListed records is refused before any is
// decoded), what it holds at
// once within GuestHeapBound, and nothing is held after. (Allocated is
// what the process allocated, the fake guest's writes included; held is
// the live heap sampled after collections.)
func TestGuestAnswersNotAmplified(t *testing.T) {
	var fields strings.Builder
	fields.WriteString(`{"status":"fail","data":{"code":"session_limit","message":"m"`)
	for i := 0; fields.Len() < 16<<20-64; i++ {
		fmt.Fprintf(&fields, `,"%x":0`, i)
	}
	fields.WriteString("}}")
	list := func(n int, rec string) string {
		return `{"status":"success","data":{"sessions":[` + strings.TrimSuffix(strings.Repeat(rec+",", n), ",") + `]}}`
	}
	cases := []struct {
		name   string
		path   string // guestd's
		answer hostproxytest.Fault
		status int
	}{
		{"16 MiB list of empty sessions", "/v1/sessions", hostproxytest.Fault{Status: 200, Body: list((16<<20-64)/3, `{}`)}, 502},
		{"16 MiB fail of tiny fields", "/v1/sessions", hostproxytest.Fault{Status: 409, Body: fields.String()}, 502},
		{"the longest list", "/v1/sessions", hostproxytest.Fault{Status: 200, Body: list(api.MaxSessionsListed, sessionRecord)}, 200},
		{"a 16 MiB record", "/v1/sessions/se-0123456789abcdef", hostproxytest.Fault{Status: 200, Body: `{"status":"success","data":{"cmd":[` + strings.Repeat(`"",`, (16<<20)/3-64) + `""]}}`}, 502},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startStack(t, func(c *hostproxy.Config) { c.Timeouts.GuestRequest = hostproxy.Duration(20 * time.Second) })
			tc.answer.Header = map[string]string{"Content-Length": strconv.Itoa(len(tc.answer.Body))}
			s.guests["sb-a1"].SetRoute("GET", tc.path, tc.answer)
			path := "/v1/sandboxes/sb-a1" + strings.TrimPrefix(tc.path, "/v1")
			const calls = 4
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			stop := hostproxy.HeapWatch()
			for range calls {
				status, body := s.get(path)
				if status != tc.status {
					t.Fatalf("status %d, want %d: %.300s", status, tc.status, body)
				}
				if tc.status == 200 && (!json.Valid([]byte(body)) || strings.Count(body, `"sandbox":"sb-a1"`) != api.MaxSessionsListed) {
					t.Fatalf("records without their sandbox: %.300s", body)
				}
			}
			peak := stop()
			runtime.GC()
			runtime.ReadMemStats(&after)
			allocated := int64(after.TotalAlloc - before.TotalAlloc)
			held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			t.Logf("answer %d bytes; %d calls allocated %d MiB, held at most %d MiB, %d KiB after", len(tc.answer.Body), calls, allocated>>20, peak>>20, held>>10)
			// The answer read (twice its length at most, in pieces
			// when it has no Content-Length), each record decoded once
			// (checked; it is written as it came), and the call itself.
			records := int64(api.MaxSessionsListed)
			if limit := int64(calls) * (2*int64(len(tc.answer.Body)) + records*16<<10 + 1<<20); allocated > limit {
				t.Errorf("allocated %d bytes over %d calls, bound %d", allocated, calls, limit)
			}
			if peak > hostproxy.GuestHeapBound {
				t.Errorf("held %d bytes at once, bound %d", peak, hostproxy.GuestHeapBound)
			}
			if held > 4<<20 {
				t.Errorf("still held %d bytes after the calls", held)
			}
		})
	}
}
