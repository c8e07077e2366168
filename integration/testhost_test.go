package integration

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// testHost is a host for network tests, in a network namespace the test
// makes: a veth pair from the host's namespace (Side, a host address) to
// it (Addr), an HTTP server there (files and a git repository served the
// dumb way, every request's Host counted) and a DNS server naming every
// *.test name Addr. Nothing of it outlives the test.
type testHost struct {
	Addr, Side string // the test host's address, and the host's end
	Port       int    // the HTTP server's
	ns         string
	mu         sync.Mutex
	hosts      map[string]int // HTTP requests by Host
	dnsAsked   atomic.Int64
	// open and peak count the HTTP server's connections open now and
	// at most.
	open, peak atomic.Int64
}

func newTestHost(t *testing.T) *testHost {
	t.Helper()
	n := 1 + rand.IntN(250)
	h := &testHost{
		Addr: fmt.Sprintf("10.213.%d.2", n), Side: fmt.Sprintf("10.213.%d.1", n),
		Port: 8000 + rand.IntN(1000), ns: fmt.Sprintf("strata-t%d-%d", os.Getpid(), n),
		hosts: map[string]int{},
	}
	// Named by the test binary's pid too: two runs at once, or one
	// killed before its clean-up, never collide.
	veth := fmt.Sprintf("s%d-%d", os.Getpid()%10000000, n)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", h.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", h.ns).Run() })
	run("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
	t.Cleanup(func() { exec.Command("ip", "link", "del", veth).Run() })
	run("addr", "add", h.Side+"/24", "dev", veth)
	run("link", "set", veth, "up")
	run("-n", h.ns, "addr", "add", h.Addr+"/24", "dev", "eth0")
	run("-n", h.ns, "link", "set", "eth0", "up")
	run("-n", h.ns, "link", "set", "lo", "up")

	// A git repository to clone over HTTP.
	root := t.TempDir()
	repo := filepath.Join(root, "work")
	for _, args := range [][]string{
		{"init", "-q", "-b", "main", repo},
		{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "first"},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	os.WriteFile(filepath.Join(repo, "README"), []byte("cloned from the test host\n"), 0o644)
	for _, args := range [][]string{
		{"-C", repo, "add", "README"},
		{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "readme"},
		{"clone", "-q", "--bare", repo, filepath.Join(root, "srv", "repo.git")},
		{"-C", filepath.Join(root, "srv", "repo.git"), "update-server-info"},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	files := http.FileServer(http.Dir(filepath.Join(root, "srv")))
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello from the test host")
	})
	mux.Handle("/", files)
	var ln net.Listener
	var pc net.PacketConn
	h.inNS(t, func() (err error) {
		if ln, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", h.Addr, h.Port)); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", h.Addr+":53")
		return err
	})
	srv := &http.Server{ConnState: func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			n := h.open.Add(1)
			for p := h.peak.Load(); n > p && !h.peak.CompareAndSwap(p, n); p = h.peak.Load() {
			}
		case http.StateClosed, http.StateHijacked:
			h.open.Add(-1)
		}
	}, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.hosts[r.Host]++
		h.mu.Unlock()
		mux.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	d := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		h.dnsAsked.Add(1)
		r := new(dns.Msg)
		r.SetReply(q)
		name := strings.ToLower(q.Question[0].Name)
		switch {
		case !strings.HasSuffix(name, ".test."):
			r.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			rr, _ := dns.NewRR(name + " 5 IN A " + h.Addr)
			r.Answer = append(r.Answer, rr)
		}
		w.WriteMsg(r)
	})}
	go d.ActivateAndServe()
	t.Cleanup(func() { d.Shutdown() })
	return h
}

// inNS runs fn on a thread in the test host's namespace: sockets made
// there stay there.
func (h *testHost) inNS(t *testing.T, fn func() error) {
	t.Helper()
	target, err := os.Open("/run/netns/" + h.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	errs := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread, in another namespace, ends with
		// the goroutine.
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errs <- err
			return
		}
		errs <- fn()
	}()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// asked is how many HTTP requests came with host.
func (h *testHost) asked(host string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hosts[host]
}
