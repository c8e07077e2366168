package hostproxy_test

import (
	"io"
	"net/http"
	"testing"

	"strata/hostproxy"
)

// TestFailedLoginLimitHoldsCorrectKey pins the last item of defect 9 of
// issue 6: the limiter of failed authentications per client address was
// consulted only when a key was wrong, so the one correct guess of a
// guesser from a limited address was answered at full speed (and told it
// was right). Once the address is limited, a correct key gets 429 too,
// without a word about the key, and without reaching the guest.
func TestFailedLoginLimitHoldsCorrectKey(t *testing.T) {
	// Two failures allowed, then one more every 100 s: far longer than
	// the test, so nothing refills while it runs.
	s := startStack(t, func(c *hostproxy.Config) { c.RateLimit = hostproxy.RateLimit{PerSecond: 0.01, Burst: 2} })
	list := func(key string) request { return request{method: "GET", path: cpsA1, key: key} }
	const wrong = "sk_wrong_key_wrong_key_wrong_key"

	steps := []struct {
		name   string
		req    request
		status int
		code   string
	}{
		{"correct key before any failure", list(keyA), 200, ""},
		{"first wrong key", list(wrong), 401, "unauthorized"},
		{"second wrong key", list(wrong), 401, "unauthorized"},
		{"third wrong key: the address is limited", list(wrong), 429, "rate_limited"},
		{"correct key from the limited address", list(keyA), 429, "rate_limited"},
		{"no key from the limited address", list(""), 429, "rate_limited"},
		{"routes without a key are not limited", request{method: "GET", path: "/v1/health"}, 200, ""},
	}
	for _, st := range steps {
		before := s.guests["sb-a1"].Requests()
		rep := s.do(st.req)
		code := checkJSend(t, rep)
		if rep.status != st.status || code != st.code {
			t.Fatalf("%s: %d %q, want %d %q: %s", st.name, rep.status, code, st.status, st.code, rep.body)
		}
		if rep.status == 429 {
			if rep.header.Get("Retry-After") == "" {
				t.Errorf("%s: 429 without Retry-After", st.name)
			}
			if s.guests["sb-a1"].Requests() != before {
				t.Errorf("%s: a limited request reached the guest", st.name)
			}
		}
	}
}

// TestTwoAPIKeys pins defect 7 of issue 6: with two X-Api-Key headers the
// first was used, so a proxy that reads the last could authorize one
// credential while hostproxy acted as another. Two are 401, whatever they
// hold, in whichever order and spelling.
func TestTwoAPIKeys(t *testing.T) {
	s := startStack(t, nil)
	tokA1 := s.issueToken(keyA, "sb-a1")
	cases := []struct {
		name   string
		header http.Header
		status int
	}{
		{"one key", http.Header{"X-Api-Key": {keyA}}, 200},
		{"the same key twice", http.Header{"X-Api-Key": {keyA, keyA}}, 401},
		{"valid then wrong", http.Header{"X-Api-Key": {keyA, "sk_wrong_key_wrong_key_wrong_key"}}, 401},
		{"wrong then valid", http.Header{"X-Api-Key": {"sk_wrong_key_wrong_key_wrong_key", keyA}}, 401},
		{"token then account key", http.Header{"X-Api-Key": {tokA1, keyA}}, 401},
		{"valid then empty", http.Header{"X-Api-Key": {keyA, ""}}, 401},
		{"two spellings of the name", http.Header{"X-Api-Key": {keyA}, "x-api-key": {keyA}}, 401},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest("GET", s.url+cpsA1, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header = tc.header
			resp, err := s.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			rep := reply{status: resp.StatusCode, header: resp.Header, body: body}
			code := checkJSend(t, rep)
			if rep.status != tc.status {
				t.Fatalf("%d %s, want %d", rep.status, body, tc.status)
			}
			if tc.status == 401 && code != "unauthorized" {
				t.Errorf("code %q, want unauthorized", code)
			}
		})
	}
}
