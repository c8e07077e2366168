package hostproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"strata/hostproxy/hostproxytest"
	"strata/internal/api"
	"strata/sandbox"
)

const testKey = "sk_test_internal_0123456789abcdef"

// vmTest is a hostproxy without a vms configuration whose registry
// holds a microVM sandbox record, sb-vm, whose vm:// guest is a
// FakeGuest: enough to drive the credentials of a microVM sandbox (the
// manager's part, booting, is calling booted).
type vmTest struct {
	t      *testing.T
	s      *Server
	guest  *hostproxytest.FakeGuest
	dials  atomic.Int32
	record Sandbox
}

func newVMTest(t *testing.T) *vmTest {
	t.Helper()
	v := &vmTest{t: t, guest: hostproxytest.StartFakeGuest(t, "sb-vm")}
	var d net.Dialer
	dialers := DefaultDialers()
	dialers[sandbox.GuestScheme] = func(ctx context.Context, id string) (net.Conn, error) {
		v.dials.Add(1)
		if id != "sb-vm" {
			return nil, &net.OpError{Op: "dial", Net: sandbox.GuestScheme, Err: fmt.Errorf("no sandbox %s", id)}
		}
		return d.DialContext(ctx, "unix", v.guest.Socket)
	}
	s, err := New(t.Context(), Options{
		Config: Config{
			DataDir:   t.TempDir(),
			Accounts:  []AccountConfig{{ID: "acct-a", Keys: []KeyConfig{{ID: "key-a", SHA256: hashSecret(testKey)}}}},
			RateLimit: RateLimit{PerSecond: 1e6, Burst: 1e6},
			Timeouts:  Timeouts{GuestRequest: Duration(time.Second)},
		},
		Logger:  slog.New(slog.DiscardHandler),
		Dialers: dialers,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	v.s = s
	v.record = Sandbox{ID: "sb-vm", Account: "acct-a", Guest: guestAddress("sb-vm"), State: sandbox.Creating, Machine: &sandbox.Machine{}}
	if err := s.reg.Insert(t.Context(), v.record); err != nil {
		t.Fatal(err)
	}
	return v
}

// do sends a request with the account key and returns status and data.
func (v *vmTest) do(method, path string) (int, json.RawMessage) {
	v.t.Helper()
	r := httptest.NewRequest(method, path, nil)
	r.Header.Set("X-Api-Key", testKey)
	w := httptest.NewRecorder()
	v.s.Handler().ServeHTTP(w, r)
	var env struct{ Data json.RawMessage }
	json.Unmarshal(w.Body.Bytes(), &env)
	return w.Code, env.Data
}

// token issues (or rotates) sb-vm's token and returns it.
func (v *vmTest) token(path string) string {
	v.t.Helper()
	status, data := v.do("POST", "/v1/sandboxes/sb-vm"+path)
	var tok struct{ Token string }
	if json.Unmarshal(data, &tok); status != 200 || tok.Token == "" {
		v.t.Fatalf("POST %s: %d %s", path, status, data)
	}
	return tok.Token
}

func (v *vmTest) revoke() {
	v.t.Helper()
	if status, data := v.do("DELETE", "/v1/sandboxes/sb-vm/access-token"); status != 200 {
		v.t.Fatalf("revoke: %d %s", status, data)
	}
}

func (v *vmTest) setState(st sandbox.State) {
	v.t.Helper()
	if _, err := v.s.reg.Update(v.t.Context(), "sb-vm", func(r *Sandbox) error { r.State = st; return nil }); err != nil {
		v.t.Fatal(err)
	}
}

func (v *vmTest) boot() {
	v.t.Helper()
	if err := v.s.booted(v.t.Context(), v.record); err != nil {
		v.t.Fatalf("booted: %v", err)
	}
}

// want checks what the guest was last handed.
func (v *vmTest) want(step string, token, sha string) {
	v.t.Helper()
	want := api.Credentials{APIURL: api.GuestAPIURL, SandboxID: "sb-vm", Token: token, TokenSHA256: sha, ChannelKey: v.s.reg.ChannelKey("sb-vm")}
	if got := v.guest.Credentials(); got != want {
		v.t.Errorf("%s: the guest has %+v, want %+v", step, got, want)
	}
}

// TestOwedTokens pins how a microVM sandbox's guest gets its access
// token. It was handed over only while the sandbox ran, and a boot
// relied on the guest's own copy: a token issued while the sandbox was
// creating (the normal create-then-issue) never reached the guest, and
// one rotated or revoked while it was stopped stayed in the guest. Now a
// token the guest cannot take is owed to it, in memory: booted hands it
// over, else the hash of the current token, else nothing; a revoke clears
// what is owed; and a request that finds the sandbox running hands over
// what is still owed (a rotate while paused, a delivery that failed).
func TestOwedTokens(t *testing.T) {
	v := newVMTest(t)

	t1 := v.token("/access-token")
	if n := v.dials.Load(); n != 0 {
		t.Fatalf("issuing while creating dialled the guest %d times", n)
	}
	v.boot()
	v.want("first boot after an issue while creating", t1, "")

	v.boot()
	v.want("boot with nothing owed", "", hashSecret(t1))

	v.setState(sandbox.Stopped)
	dials := v.dials.Load()
	t2 := v.token("/access-token/rotate")
	if v.dials.Load() != dials {
		t.Error("rotating while stopped dialled the guest")
	}
	v.boot()
	v.want("boot after a rotate while stopped", t2, "")

	v.token("/access-token/rotate")
	v.revoke()
	v.boot()
	v.want("boot after a rotate and a revoke while stopped", "", "")

	t4 := v.token("/access-token")
	v.s.owed.forget(guestAddress("sb-vm")) // hostproxy restarted: the plaintext is gone
	v.boot()
	v.want("boot after a restart of hostproxy", "", hashSecret(t4))

	v.setState(sandbox.Paused)
	t5 := v.token("/access-token/rotate")
	v.want("rotate while paused", "", hashSecret(t4))
	v.setState(sandbox.Running)
	if status, _ := v.do("GET", "/v1/sandboxes/sb-vm"); status != 200 {
		t.Fatalf("GET: %d", status)
	}
	v.waitToken(t5)

	t6 := v.token("/access-token/rotate")
	v.want("rotate while running", t6, "")

	v.guest.SetDelay(2 * time.Second) // longer than the guest request timeout
	t7 := v.token("/access-token/rotate")
	v.want("rotate while running, not taken", t6, "")
	if !v.s.owed.has(guestAddress("sb-vm")) {
		t.Error("a token the guest did not take is not owed")
	}
	v.guest.SetDelay(0)
	v.do("GET", "/v1/sandboxes/sb-vm")
	v.waitToken(t7)

	v.revoke()
	v.want("revoke while running", "", "")
	if v.s.owed.has(guestAddress("sb-vm")) {
		t.Error("something is owed after a revoke")
	}
}

// waitToken waits for the guest to be handed token in the background.
func (v *vmTest) waitToken(token string) {
	v.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for v.guest.Credentials().Token != token {
		if time.Now().After(deadline) {
			v.t.Fatalf("the guest has %+v, want the token %s", v.guest.Credentials(), token)
		}
		time.Sleep(10 * time.Millisecond)
	}
	v.want("owed token delivered", token, "")
}

// TestOwedGiveBack pins that a failed delivery owes its token again,
// unless something newer was owed or cleared in the meantime.
func TestOwedGiveBack(t *testing.T) {
	var o owedTokens
	e := o.entry("vm://a")
	o.set("vm://a", "t1")
	tok, _, gen := e.take()
	if tok != "t1" || o.has("vm://a") {
		t.Fatalf("take: %q, still owed %v", tok, o.has("vm://a"))
	}
	e.giveBack(tok, gen)
	if tok, _, _ := e.take(); tok != "t1" {
		t.Errorf("given back: %q, want t1", tok)
	}

	o.set("vm://a", "t1")
	tok, _, gen = e.take()
	o.set("vm://a", "t2") // a rotate during the failed delivery
	e.giveBack(tok, gen)
	if tok, _, _ := e.take(); tok != "t2" {
		t.Errorf("after a rotate: %q owed, want t2", tok)
	}

	o.set("vm://a", "t1")
	tok, _, gen = e.take()
	o.set("vm://a", "") // a revoke during the failed delivery
	e.giveBack(tok, gen)
	if o.has("vm://a") {
		t.Error("a revoked token is owed again")
	}
}

// TestChannelServer pins what serveGuest serves a guest: the API but not
// /metrics (host-wide activity; it was served: now 403, whatever the
// key), and at most maxGuestConns
// connections at once (there was no limit: a guest opening streams
// without end cost hostproxy memory without end).
func TestChannelServer(t *testing.T) {
	v := newVMTest(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		v.s.serveGuest("sb-vm", ln)
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	client := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := client.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := get("/metrics"); status != 401 || !strings.Contains(body, `"code":"unauthorized"`) {
		t.Errorf("/metrics through the channel without a key: %d %s", status, body)
	}
	mr, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/metrics", nil)
	mr.Header.Set("X-Api-Key", testKey)
	if resp, err := client.Do(mr); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), `"code":"forbidden"`) {
			t.Errorf("/metrics through the channel with the account key: %d %s", resp.StatusCode, b)
		}
	}
	if status, _ := get("/v1/health"); status != 200 {
		t.Errorf("/v1/health through the channel: %d", status)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/metrics", nil)
	r.Header.Set("X-Api-Key", testKey)
	v.s.Handler().ServeHTTP(w, r)
	if w.Code != 200 {
		t.Errorf("/metrics from the network with the account key: %d", w.Code)
	}
	client.CloseIdleConnections()

	// maxGuestConns connections that send nothing hold every place; one
	// more is not served until one of them goes.
	var held []net.Conn
	for range maxGuestConns {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	extra, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if _, err := io.WriteString(extra, "GET /v1/health HTTP/1.1\r\nHost: guest\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(extra)
	extra.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if line, err := rd.ReadString('\n'); err == nil {
		t.Fatalf("connection %d served while %d were open: %q", maxGuestConns+1, maxGuestConns, line)
	}
	held[0].Close()
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Errorf("once a place is free: %q, %v", line, err)
	}
}

// serveChannel serves the API as sandbox id's channel does, on a loopback
// port, and returns its base URL.
func (v *vmTest) serveChannel(id string) string {
	v.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		v.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		v.s.serveGuest(id, ln)
	}()
	v.t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// TestChannelKey pins the key that lets processes inside a microVM call
// the API with no set-up (before it, createos inside answered
// unauthorized until someone issued an access token): every boot hands the
// guest its sandbox's channel key, which acts as the sandbox's token
// through that sandbox's channel and nowhere else.
func TestChannelKey(t *testing.T) {
	v := newVMTest(t)
	other := Sandbox{ID: "sb-other", Account: "acct-a", Guest: guestAddress("sb-other"), State: sandbox.Running, Machine: &sandbox.Machine{}}
	ahead := Sandbox{ID: "sb-ahead", Guest: guestAddress("sb-ahead"), State: sandbox.Running, Machine: &sandbox.Machine{}, Ahead: &sandbox.From{Sandbox: "sb-vm", Snapshot: "sn-1"}}
	for _, r := range []Sandbox{other, ahead} {
		if err := v.s.reg.Insert(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	v.setState(sandbox.Running)
	key := v.s.reg.ChannelKey("sb-vm")
	if !strings.HasPrefix(key, ChannelKeyPrefix) || len(key) != len(ChannelKeyPrefix)+43 {
		t.Fatalf("channel key %q", key)
	}
	if key == v.s.reg.ChannelKey("sb-other") {
		t.Fatal("two sandboxes have one channel key")
	}
	v.boot()
	if got := v.guest.Credentials(); got.ChannelKey != key || got.Token != "" {
		t.Fatalf("after a boot the guest has %+v, want its channel key and no token", got)
	}

	client := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	call := func(base, method, path, key string) (int, string) {
		t.Helper()
		r, err := http.NewRequest(method, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("X-Api-Key", key)
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	vm, otherChannel, aheadChannel := v.serveChannel("sb-vm"), v.serveChannel("sb-other"), v.serveChannel("sb-ahead")
	network := httptest.NewServer(v.s.Handler())
	t.Cleanup(network.Close)
	wrong := key[:len(key)-1] + "A"
	if strings.HasSuffix(key, "A") {
		wrong = key[:len(key)-1] + "B"
	}
	for _, c := range []struct {
		what, base, method, path, key string
		status                        int
		code                          string
	}{
		{"its checkpoints through its channel", vm, "GET", "/v1/sandboxes/sb-vm/checkpoints", key, 200, ""},
		{"its own lifecycle, as a token", vm, "POST", "/v1/sandboxes/sb-vm/stop", key, 403, "forbidden"},
		{"its access token, as a token", vm, "POST", "/v1/sandboxes/sb-vm/access-token", key, 403, "forbidden"},
		{"another sandbox through its channel", vm, "GET", "/v1/sandboxes/sb-other/checkpoints", key, 403, "forbidden"},
		{"from the network", network.URL, "GET", "/v1/sandboxes/sb-vm/checkpoints", key, 401, "unauthorized"},
		{"through another sandbox's channel", otherChannel, "GET", "/v1/sandboxes/sb-other/checkpoints", key, 401, "unauthorized"},
		{"a key one character off", vm, "GET", "/v1/sandboxes/sb-vm/checkpoints", wrong, 401, "unauthorized"},
		{"a fork made ahead's own, before any account takes it", aheadChannel, "GET", "/v1/sandboxes/sb-ahead/checkpoints", v.s.reg.ChannelKey("sb-ahead"), 401, "unauthorized"},
	} {
		status, body := call(c.base, c.method, c.path, c.key)
		if status != c.status || c.code != "" && !strings.Contains(body, `"code":"`+c.code+`"`) {
			t.Errorf("%s: %d %s, want %d %s", c.what, status, body, c.status, c.code)
		}
	}

	// An access token, once issued, is what the guest gets; once revoked,
	// the channel key again.
	tok := v.token("/access-token")
	if got := v.guest.Credentials(); got.Token != tok {
		t.Errorf("after an issue the guest has %+v", got)
	}
	v.revoke()
	if got := v.guest.Credentials(); got.Token != "" || got.ChannelKey != key {
		t.Errorf("after a revoke the guest has %+v", got)
	}
}

// TestChannelSecret pins that a registry keeps its channel keys across
// reopens (a guest keeps its key across hostproxy's restarts), and that
// two registries have different ones.
func TestChannelSecret(t *testing.T) {
	dir := t.TempDir()
	open := func(dir string) *Registry {
		t.Helper()
		r, err := OpenRegistry(t.Context(), dir)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := open(dir)
	first := r.ChannelKey("sb-a")
	r.Close()
	r = open(dir)
	again := r.ChannelKey("sb-a")
	r.Close()
	if first != again {
		t.Errorf("a reopened registry changed sb-a's channel key: %q, then %q", first, again)
	}
	r = open(t.TempDir())
	defer r.Close()
	if r.ChannelKey("sb-a") == first {
		t.Error("two registries made one channel key for sb-a")
	}
}
