package hostproxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"strata/hostproxy"
)

// TestHostileBodies sends bodies built to hurt a parser: deep nesting
// within the size limit, and bodies far over it, with and without a
// Content-Length. Each gets a JSend 4xx and never reaches the guest.
func TestHostileBodies(t *testing.T) {
	s := startStack(t, nil)
	deep := func(open, close string, n int) string {
		return `{"path":` + strings.Repeat(open, n) + `1` + strings.Repeat(close, n) + `}`
	}
	cases := []struct {
		name, body string
		chunked    bool
		status     int
		code       string
	}{
		{"deep arrays", deep("[", "]", 8000), false, 400, "invalid_field"},
		{"deep objects", deep(`{"a":`, "}", 2500), false, 400, "invalid_field"},
		{"deeper than the decoder allows", `{"path":` + strings.Repeat("[", 16000), false, 400, "invalid_json"},
		{"one MiB", `{"path":"/workspace/project","name":"` + strings.Repeat("x", 1<<20) + `"}`, false, 413, "body_too_large"},
		{"one MiB chunked", `{"path":"/workspace/project","name":"` + strings.Repeat("x", 1<<20) + `"}`, true, 413, "body_too_large"},
		{"many keys over the limit", "{" + strings.Repeat(`"path":"/a",`, 1500) + `"path":"/b"}`, false, 413, "body_too_large"},
		// Duplicate keys: a body that says two things is not read as either.
		{"many duplicate keys", "{" + strings.Repeat(`"path":"/a",`, 1300) + `"path":"/b"}`, false, 400, "invalid_json"},
		// Invalid UTF-8 was read with U+FFFD in place of the bad bytes (issue 6, defect 7).
		{"invalid UTF-8", "{\"path\":\"/workspace/\xff\xfe\"}", false, 400, "invalid_json"},
		{"invalid UTF-8 in a name", "{\"path\":\"/workspace/project\",\"name\":\"a\xc0\xafb\"}", false, 400, "invalid_json"},
		{"lone surrogate escape", `{"path":"/workspace/project","name":"\udc00"}`, false, 400, "invalid_json"},
		// Field names of any other case were taken for the field (issue 6, defect 7).
		{"field name in upper case", `{"PATH":"/workspace/project"}`, false, 400, "unknown_field"},
		{"one field in two cases", `{"path":"/workspace/project","Path":"/etc"}`, false, 400, "unknown_field"},
		{"bidi override in a name", `{"path":"/workspace/project","name":"\u202Egpj.exe"}`, false, 400, "invalid_field"},
		{"line separator in a path", `{"path":"/workspace/a\u2028b"}`, false, 400, "invalid_field"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := s.guests["sb-a1"].Requests()
			r := request{method: "POST", path: cpsA1, key: keyA, body: tc.body}
			if tc.chunked {
				r.header = map[string]string{"Transfer-Encoding": "chunked"}
			}
			rep := s.do(r)
			code := checkJSend(t, rep)
			if rep.status != tc.status || code != tc.code {
				t.Errorf("got %d %q, want %d %q: %.300s", rep.status, code, tc.status, tc.code, rep.body)
			}
			if tc.status != 200 && s.guests["sb-a1"].Requests() != before {
				t.Errorf("a refused body reached the guest")
			}
		})
	}
}

// TestSlowClients holds connections open with half-sent headers and
// half-sent bodies: the server drops them after its timeouts, and serves
// other clients meanwhile.
func TestSlowClients(t *testing.T) {
	s := startStack(t, func(c *hostproxy.Config) {
		// Long enough that a normal client blocked behind the slow
		// ones would show, short beside the client's own deadline.
		c.Timeouts.ReadHeader = hostproxy.Duration(3 * time.Second)
		c.Timeouts.Read = hostproxy.Duration(4 * time.Second)
	})
	addr := strings.TrimPrefix(s.url, "http://")
	slow := []struct {
		name, send string
	}{
		{"half header", "GET /v1/sandboxes/sb-a1/checkpoints HTTP/1.1\r\nHost: x\r\nX-Api-Key: " + keyA},
		{"half body", "POST /v1/sandboxes/sb-a1/checkpoints HTTP/1.1\r\nHost: x\r\nX-Api-Key: " + keyA +
			"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"path\":"},
	}
	var wg sync.WaitGroup
	for _, tc := range slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			start := time.Now()
			if _, err := io.WriteString(conn, tc.send); err != nil {
				t.Error(err)
				return
			}
			_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			elapsed := time.Since(start)
			if elapsed > 12*time.Second {
				t.Errorf("%s: connection held for %v", tc.name, elapsed)
			}
			if err == nil {
				// A timed-out body may still be answered: then it is JSend.
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				checkJSend(t, reply{status: resp.StatusCode, header: resp.Header, body: b})
				if resp.StatusCode != 400 && resp.StatusCode != 408 {
					t.Errorf("%s: answered %d %s", tc.name, resp.StatusCode, b)
				}
			}
		}()
	}
	// Others are served while the slow ones hang.
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	rep := s.do(request{method: "GET", path: cpsA1, key: keyA})
	if rep.status != 200 || time.Since(start) > 2*time.Second {
		t.Errorf("a normal client got %d after %v", rep.status, time.Since(start))
	}
	wg.Wait()
}

// TestUnreachableGuestIsFastAndIsolated: a guest that does not exist
// answers 503 within about the dial timeout; a guest that hangs answers 503
// at the request timeout; neither slows other sandboxes.
func TestUnreachableGuestIsFastAndIsolated(t *testing.T) {
	s := startStack(t, func(c *hostproxy.Config) {
		c.Timeouts.GuestRequest = hostproxy.Duration(6 * time.Second)
		// A listener that never accepts: the kernel completes the
		// handshake, then nobody ever answers.
		c.Sandboxes = append(c.Sandboxes, hostproxy.SandboxConfig{ID: "sb-blackhole", Account: "acct-a", Guest: "tcp://" + blackhole(t)})
	})
	s.guests["sb-a2"].SetDelay(30 * time.Second)

	var wg sync.WaitGroup
	// Bounds of kind, not of speed: a dead guest fails well before the
	// request timeout, a hanging one at it and not much after.
	slow := map[string]time.Duration{"sb-dead": 4 * time.Second, "sb-a2": 12 * time.Second, "sb-blackhole": 12 * time.Second}
	for sb, limit := range slow {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				rep := s.do(request{method: "GET", path: "/v1/sandboxes/" + sb + "/checkpoints", key: keyA})
				checkJSend(t, rep)
				if rep.status != 503 {
					t.Errorf("%s: %d %s", sb, rep.status, rep.body)
				}
				if d := time.Since(start); d > limit {
					t.Errorf("%s: 503 after %v, want under %v", sb, d, limit)
				}
			}()
		}
	}
	time.Sleep(50 * time.Millisecond)
	for range 10 {
		start := time.Now()
		rep := s.do(request{method: "GET", path: cpsA1, key: keyA})
		// Well under the 6 s that the stuck guests hold their callers.
		if rep.status != 200 || time.Since(start) > 3*time.Second {
			t.Errorf("healthy sandbox: %d after %v", rep.status, time.Since(start))
		}
	}
	wg.Wait()
}

// blackhole returns the address of a TCP listener that never accepts,
// standing in for a guest daemon that is wedged.
func blackhole(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// TestConcurrentClients runs many clients on several sandboxes at once,
// mixing successes and failures: every answer is JSend with the expected
// status, and no goroutine outlives the server.
func TestConcurrentClients(t *testing.T) {
	before := runtime.NumGoroutine()
	s := startStack(t, nil)
	const clients, rounds = 32, 24
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[int]int{}
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := []string{"sb-a1", "sb-a2", "sb-b1"}[c%3]
			key := keyA
			if sb == "sb-b1" {
				key = keyB
			}
			base := "/v1/sandboxes/" + sb + "/checkpoints"
			dir := fmt.Sprintf("/workspace/c%d", c)
			for i := range rounds {
				var r request
				want := 200
				switch i % 6 {
				case 0, 3:
					r = request{method: "POST", path: base, key: key, body: fmt.Sprintf(`{"path":%q,"name":"round %d"}`, dir, i)}
				case 1:
					r = request{method: "GET", path: base, key: key}
				case 2:
					r = request{method: "POST", path: base, key: key, body: `{"path":"/workspace/x","bogus":1}`}
					want = 400
				case 4:
					r = request{method: "GET", path: "/v1/sandboxes/sb-dead/checkpoints", key: keyA}
					want = 503
				case 5:
					r = request{method: "GET", path: base, key: "sk_wrong_key_wrong_key_wrong"}
					want = 401
				}
				rep := s.do(r)
				checkJSend(t, rep)
				if rep.status != want {
					t.Errorf("client %d round %d: %d, want %d: %s", c, i, rep.status, want, rep.body)
				}
				mu.Lock()
				seen[rep.status]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if seen[200] == 0 || seen[400] == 0 || seen[401] == 0 || seen[503] == 0 {
		t.Errorf("statuses seen: %v", seen)
	}
	// Each sandbox's guest kept every capture of its clients.
	total := 0
	for _, g := range s.guests {
		total += len(g.Checkpoints())
	}
	if want := clients * rounds / 3; total != want {
		t.Errorf("%d checkpoints captured, want %d", total, want)
	}
	s.stop()
	for _, g := range s.guests {
		g.Stop()
	}
	checkNoLeak(t, before)
}

// checkNoLeak waits up to ten seconds for the goroutine count to fall back
// to before, then dumps the goroutines still running.
func checkNoLeak(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Errorf("%d goroutines before, %d after:\n%s", before, n, b.String())
	}
}

// TestGracefulShutdown cancels the server while a request waits on a slow
// guest: the request is answered, new connections are refused.
func TestGracefulShutdown(t *testing.T) {
	s := startStack(t, nil)
	s.guests["sb-a1"].SetDelay(400 * time.Millisecond)
	before := s.guests["sb-a1"].Requests()
	done := make(chan reply, 1)
	go func() { done <- s.do(request{method: "GET", path: cpsA1, key: keyA}) }()
	// Cancelled once the request is in flight (it reached the guest).
	for deadline := time.Now().Add(10 * time.Second); s.guests["sb-a1"].Requests() == before; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request never reached the guest")
		}
	}
	s.cancel()
	select {
	case rep := <-done:
		if rep.status != 200 {
			t.Errorf("request in flight got %d %s", rep.status, rep.body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("request in flight not answered")
	}
	if err := <-s.done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	s.done <- nil // for stop
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(s.url, "http://"), time.Second); err == nil {
		t.Errorf("still accepting connections after shutdown")
	}
}

// TestRequestIDReachesGuest: the X-Request-Id of a response is the one the
// guest saw, so one id follows a request through both daemons' logs.
func TestRequestIDReachesGuest(t *testing.T) {
	s := startStack(t, nil)
	rep := s.do(request{method: "GET", path: cpsA1, key: keyA})
	id := rep.header.Get("X-Request-Id")
	if id == "" || s.guests["sb-a1"].LastHeader().Get("X-Request-Id") != id {
		t.Errorf("response id %q, guest saw %q", id, s.guests["sb-a1"].LastHeader().Get("X-Request-Id"))
	}
	if rep2 := s.do(request{method: "GET", path: cpsA1, key: keyA}); rep2.header.Get("X-Request-Id") == id {
		t.Errorf("two requests share id %q", id)
	}
}

// TestMetrics scrapes /metrics after a few requests, with the account
// key: item 6 of issue 30 pins that they are an account key's alone (they
// were served to anyone who reached the listener: every account's
// activity).
func TestMetrics(t *testing.T) {
	s := startStack(t, nil)
	s.do(request{method: "GET", path: cpsA1, key: keyA})
	s.do(request{method: "GET", path: cpsA1, key: keyA})
	s.do(request{method: "GET", path: "/nope"})
	s.do(request{method: "GET", path: "/v1/sandboxes/sb-dead/checkpoints", key: keyA})
	// Made-up methods must not each create series.
	for i := range 3 {
		s.do(request{method: fmt.Sprintf("X%d", i), path: "/nope"})
	}
	// Host-wide activity: an account key's alone (issue 30, item 6).
	for _, c := range []struct {
		r    request
		want int
	}{
		{request{method: "GET", path: "/metrics"}, 401},
		{request{method: "GET", path: "/metrics", key: s.issueToken(keyA, "sb-a1")}, 403},
	} {
		if rep := s.do(c.r); rep.status != c.want {
			t.Errorf("/metrics with key %q: %d, want %d", c.r.key, rep.status, c.want)
		}
	}
	req, _ := http.NewRequest("GET", s.url+"/metrics", nil)
	req.Header.Set("X-Api-Key", keyA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics with the account key: %d %s", resp.StatusCode, b)
	}
	for _, want := range []string{
		`strata_hostproxy_requests_total{method="GET",route="/v1/sandboxes/:id/checkpoints",status="200"} 2`,
		`strata_hostproxy_requests_total{method="GET",route="unmatched",status="404"} 1`,
		`strata_hostproxy_requests_total{method="GET",route="/v1/sandboxes/:id/checkpoints",status="503"} 1`,
		`strata_hostproxy_request_duration_seconds_count{method="GET",route="/v1/sandboxes/:id/checkpoints",status="200"} 2`,
		`strata_hostproxy_guest_request_duration_seconds_count{operation="list",outcome="ok"} 2`,
		`strata_hostproxy_guest_request_duration_seconds_count{operation="list",outcome="error"} 1`,
		`go_goroutines`,
		`strata_hostproxy_requests_total{method="OTHER",route="unmatched",status="404"} 3`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(string(b), `method="X0"`) {
		t.Errorf("/metrics has a series per made-up method")
	}
}

// TestRefusesToStart: configurations that cannot serve fail in New, with
// a message that says what to fix.
func TestRefusesToStart(t *testing.T) {
	locked := t.TempDir()
	first, err := hostproxy.New(context.Background(), hostproxy.Options{Config: baseConfigWithGuests(locked)})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	cases := []struct {
		name string
		edit func(*hostproxy.Config)
		want string
	}{
		{"no key", func(c *hostproxy.Config) {
			for i := range c.Accounts {
				c.Accounts[i].Keys = nil
			}
		}, "no account API key"},
		{"empty key variable", func(c *hostproxy.Config) {
			c.Accounts[0].Keys = []hostproxy.KeyConfig{{ID: "k", Env: "STRATA_TEST_UNSET_VARIABLE"}}
		}, "STRATA_TEST_UNSET_VARIABLE is empty"},
		{"bad hash", func(c *hostproxy.Config) { c.Accounts[0].Keys[0].SHA256 = "abc" }, "64 hex digits"},
		{"unknown scheme", func(c *hostproxy.Config) { c.Sandboxes[0].Guest = "vsock://3:1024" }, `no transport for scheme "vsock"`},
		{"relative socket", func(c *hostproxy.Config) { c.Sandboxes[0].Guest = "unix://run/g.sock" }, "must be absolute"},
		{"unknown account", func(c *hostproxy.Config) { c.Sandboxes[0].Account = "acct-z" }, `"acct-z" is not an account`},
		{"bad state", func(c *hostproxy.Config) { c.Sandboxes[0].State = "sleeping" }, "want running, paused or stopped"},
		{"duplicate sandbox", func(c *hostproxy.Config) { c.Sandboxes[1].ID = c.Sandboxes[0].ID }, "listed twice"},
		{"shared guest", func(c *hostproxy.Config) {
			// sb-b1 (account B) on sb-a1's guest would list and restore A's checkpoints.
			c.Sandboxes[2].Guest = strings.Replace(c.Sandboxes[0].Guest, "/nonexistent/", "/nonexistent//", 1)
		}, "same guest address"},
		{"no data dir", func(c *hostproxy.Config) { c.DataDir = "" }, "no data directory"},
		{"data dir in use", func(c *hostproxy.Config) { c.DataDir = locked }, "locked by another process"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfigWithGuests(t.TempDir())
			tc.edit(&cfg)
			start := time.Now()
			srv, err := hostproxy.New(context.Background(), hostproxy.Options{Config: cfg, Getenv: func(string) string { return "" }})
			if err == nil {
				srv.Close()
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if time.Since(start) > 3*time.Second {
				t.Errorf("took %v to fail", time.Since(start))
			}
		})
	}
}

func baseConfigWithGuests(dir string) hostproxy.Config {
	c := baseConfig(dir)
	for i := range c.Sandboxes {
		if c.Sandboxes[i].Guest == "" {
			c.Sandboxes[i].Guest = "unix:///nonexistent/" + c.Sandboxes[i].ID + ".sock"
		}
	}
	return c
}
