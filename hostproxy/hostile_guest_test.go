package hostproxy_test

import (
	"strings"
	"testing"

	"strata/hostproxy/hostproxytest"
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
			if got := rep.header.Get("X-Content-Type-Options"); got != "nosniff" && tc.status < 500 {
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
