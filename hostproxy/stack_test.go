package hostproxy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"strata/hostproxy"
	"strata/hostproxy/hostproxytest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// Credentials of the test stack. Account A owns sb-a1, sb-a2 and the
// sandboxes in odd states; account B owns sb-b1.
const (
	keyA = "sk_test_account_a_0123456789abcdef"
	keyB = "sk_test_account_b_0123456789abcdef"
)

// fixedNow is the clock of token creation times in tests.
var fixedNow = time.Date(2026, 11, 5, 9, 0, 0, 0, time.UTC)

type stack struct {
	t      *testing.T
	cfg    hostproxy.Config
	url    string
	srv    *hostproxy.Server
	guests map[string]*hostproxytest.FakeGuest
	logs   *syncBuffer
	client *http.Client
	cancel context.CancelFunc
	done   chan error
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// baseConfig is the registry of every test stack; guest addresses of the
// running sandboxes are filled in by startStack.
func baseConfig(dataDir string) hostproxy.Config {
	return hostproxy.Config{
		DataDir: dataDir,
		Accounts: []hostproxy.AccountConfig{
			{ID: "acct-a", Keys: []hostproxy.KeyConfig{{ID: "key-a", SHA256: sha(keyA)}}},
			{ID: "acct-b", Keys: []hostproxy.KeyConfig{{ID: "key-b", SHA256: sha(keyB)}}},
		},
		Sandboxes: []hostproxy.SandboxConfig{
			{ID: "sb-a1", Account: "acct-a"},
			{ID: "sb-a2", Account: "acct-a"},
			{ID: "sb-b1", Account: "acct-b"},
			{ID: "sb-paused", Account: "acct-a", Guest: "unix:///nonexistent/paused.sock", State: hostproxy.StatePaused},
			{ID: "sb-stopped", Account: "acct-a", Guest: "unix:///nonexistent/stopped.sock", State: hostproxy.StateStopped},
			{ID: "sb-dead", Account: "acct-a", Guest: "unix:///nonexistent/dead.sock"},
		},
		RateLimit: hostproxy.RateLimit{PerSecond: 1000, Burst: 1000},
		Timeouts: hostproxy.Timeouts{
			GuestRequest: hostproxy.Duration(2 * time.Second),
			Shutdown:     hostproxy.Duration(5 * time.Second),
		},
	}
}

// startStack starts a fake guest for each of sb-a1, sb-a2 and sb-b1 and a
// hostproxy on 127.0.0.1:0 with its state in t.TempDir(). edit may change
// the configuration first. Everything stops when the test ends.
func startStack(t *testing.T, edit func(*hostproxy.Config)) *stack {
	t.Helper()
	s := &stack{t: t, guests: map[string]*hostproxytest.FakeGuest{}, logs: &syncBuffer{}}
	cfg := baseConfig(t.TempDir())
	for i, sb := range cfg.Sandboxes {
		if sb.Guest == "" {
			g := hostproxytest.StartFakeGuest(t, sb.ID)
			s.guests[sb.ID] = g
			cfg.Sandboxes[i].Guest = g.Addr
		}
	}
	if edit != nil {
		edit(&cfg)
	}
	s.start(cfg)
	return s
}

func (s *stack) start(cfg hostproxy.Config) {
	t := s.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := hostproxy.New(ctx, hostproxy.Options{
		Config: cfg,
		Logger: slog.New(slog.NewTextHandler(s.logs, nil)),
		Now:    func() time.Time { return fixedNow },
		Rand:   rand.NewChaCha8([32]byte{'s', 't', 'r', 'a', 't', 'a'}),
	})
	if err != nil {
		cancel()
		t.Fatalf("hostproxy.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s.cfg, s.srv, s.cancel, s.done = cfg, srv, cancel, make(chan error, 1)
	s.url = "http://" + ln.Addr().String()
	s.client = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{}}
	go func() { s.done <- srv.Serve(ctx, ln) }()
	t.Cleanup(s.stop)
}

// stop shuts the server down and waits for it; it may be called twice.
func (s *stack) stop() {
	if s.cancel == nil {
		return
	}
	// Idle client connections first: the server's graceful shutdown waits
	// for a connection that never sent a request until it is 5 s old.
	s.client.CloseIdleConnections()
	s.cancel()
	if err := <-s.done; err != nil {
		s.t.Errorf("Serve: %v", err)
	}
	if err := s.srv.Close(); err != nil {
		s.t.Errorf("Close: %v", err)
	}
	s.cancel = nil
	if s.t.Failed() {
		s.t.Logf("hostproxy logs:\n%s", s.logs.String())
	}
}

// request is one API call of a test.
type request struct {
	method, path, key, body string
	header                  map[string]string
	// more holds headers sent with every value, after header: a header
	// named twice, or an empty one.
	more http.Header
}

// reply is a response, read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (s *stack) do(r request) reply {
	s.t.Helper()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req, err := http.NewRequest(r.method, s.url+r.path, body)
	if err != nil {
		s.t.Fatal(err)
	}
	if r.key != "" {
		req.Header.Set("X-Api-Key", r.key)
	}
	if r.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.header {
		if k == "Transfer-Encoding" {
			req.ContentLength = -1
			req.TransferEncoding = []string{v}
			continue
		}
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	for k, vs := range r.more {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	rep := reply{status: resp.StatusCode, header: resp.Header, body: b}
	// Every exchange of the tests holds to openapi.json.
	checkOpenAPI(s.t, req, []byte(r.body), rep)
	return rep
}

// mustData calls r, requires a JSend success and decodes its data into v.
func (s *stack) mustData(r request, v any) {
	s.t.Helper()
	rep := s.do(r)
	if rep.status != http.StatusOK {
		s.t.Fatalf("%s %s: status %d: %s", r.method, r.path, rep.status, rep.body)
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(rep.body, &env); err != nil || env.Status != "success" {
		s.t.Fatalf("%s %s: not a JSend success: %s", r.method, r.path, rep.body)
	}
	if v != nil {
		if err := json.Unmarshal(env.Data, v); err != nil {
			s.t.Fatalf("%s %s: data: %v", r.method, r.path, err)
		}
	}
}

// checkJSend asserts what every response of the API must be: JSON, with a
// request id, in the JSend shape its status calls for. It returns the fail
// code, or "" for a success or an error.
func checkJSend(t *testing.T, rep reply) string {
	t.Helper()
	if ct := rep.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if rep.header.Get("X-Request-Id") == "" {
		t.Errorf("no X-Request-Id header")
	}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(rep.body, &env); err != nil {
		t.Fatalf("body is not JSON: %v: %q", err, rep.body)
	}
	var status string
	_ = json.Unmarshal(env["status"], &status)
	switch {
	case rep.status == 200:
		if status != "success" || env["data"] == nil || len(env) != 2 {
			t.Errorf("200 with body %s, want {status:success,data}", rep.body)
		}
	case rep.status >= 400 && rep.status < 500:
		var data struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if status != "fail" || len(env) != 2 || json.Unmarshal(env["data"], &data) != nil || data.Code == "" || data.Message == "" {
			t.Errorf("%d with body %s, want {status:fail,data:{code,message}}", rep.status, rep.body)
		}
		return data.Code
	case rep.status >= 500:
		var code int
		var msg string
		_ = json.Unmarshal(env["code"], &code)
		_ = json.Unmarshal(env["message"], &msg)
		if status != "error" || code != rep.status || msg == "" || len(env) < 3 || len(env) > 4 {
			t.Errorf("%d with body %s, want {status:error,message,code:%d}", rep.status, rep.body, rep.status)
		}
		// An optional data names the stable code of a classified error.
		if raw, ok := env["data"]; ok {
			var data struct{ Code string }
			if json.Unmarshal(raw, &data) != nil || data.Code == "" {
				t.Errorf("%d with data %s, want {code}", rep.status, raw)
			}
			return data.Code
		}
	default:
		t.Errorf("unexpected status %d", rep.status)
	}
	return ""
}

// checkGolden compares the status and body of rep with
// testdata/golden/name.json; -update rewrites the file.
func checkGolden(t *testing.T, name string, rep reply) {
	t.Helper()
	var body any
	if err := json.Unmarshal(rep.body, &body); err != nil {
		t.Fatalf("body is not JSON: %q", rep.body)
	}
	got, err := json.MarshalIndent(map[string]any{"status": rep.status, "body": body}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	file := filepath.Join("testdata", "golden", name+".json")
	if *update {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("response differs from %s:\n got: %s\nwant: %s", file, got, want)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// checkpoint is a checkpoint record as the API returns it.
type checkpoint struct {
	ID        string `json:"id"`
	Path      string `json:"path"`
	Name      string `json:"name"`
	CreatedAt string `json:"created_at"`
	ParentID  string `json:"parent_id"`
}

func (s *stack) create(key, sandbox, path, name string) checkpoint {
	s.t.Helper()
	body, _ := json.Marshal(map[string]string{"path": path, "name": name})
	var cp checkpoint
	s.mustData(request{method: "POST", path: "/v1/sandboxes/" + sandbox + "/checkpoints", key: key, body: string(body)}, &cp)
	return cp
}

func (s *stack) issueToken(key, sandbox string) string {
	s.t.Helper()
	var tok struct{ Token string }
	s.mustData(request{method: "POST", path: "/v1/sandboxes/" + sandbox + "/access-token", key: key}, &tok)
	return tok.Token
}
