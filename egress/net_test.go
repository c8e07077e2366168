package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"strata/egress/policy"
	"strata/guestinit"
)

// world is what a test's sandbox can reach: an HTTP and an HTTPS server
// on loopback, a DNS server naming them, and a dialer that reaches them
// alone and records every address dialled.
type world struct {
	http, https *httptest.Server
	banner      net.Listener // a server that speaks first, as SSH does
	resolver    string
	hits        sync.Map // Host header → count
	mu          sync.Mutex
	dialled     []string
}

func newWorld(t *testing.T) *world {
	w := &world{}
	h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		v, _ := w.hits.LoadOrStore(r.Host, new(int))
		w.mu.Lock()
		*v.(*int)++
		w.mu.Unlock()
		fmt.Fprintf(rw, "hello %s", r.Host)
	})
	w.http = httptest.NewServer(h)
	w.https = httptest.NewTLSServer(h)
	t.Cleanup(w.http.Close)
	t.Cleanup(w.https.Close)
	var err error
	if w.banner, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.banner.Close() })
	go func() {
		for {
			c, err := w.banner.Accept()
			if err != nil {
				return
			}
			fmt.Fprint(c, "SSH-2.0-test\r\n")
			c.Close()
		}
	}()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(rw dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg)
		r.SetReply(q)
		name := strings.ToLower(q.Question[0].Name)
		addr := testHost
		switch name {
		case "alt.test.":
			addr = otherHost
		case "rebind.test.":
			addr = "127.0.0.1"
		}
		if !strings.HasSuffix(name, ".test.") {
			r.Rcode = dns.RcodeNameError
		} else if q.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(name + " 60 IN A " + addr)
			r.Answer = append(r.Answer, rr)
		}
		rw.WriteMsg(r)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	w.resolver = pc.LocalAddr().String()
	return w
}

// testHost stands for the test's hosts: an address of a documentation
// range, which the tests' site allows and their dialer takes to the
// servers on loopback (a guest's stack sends nothing to loopback).
// otherHost is allowed by the site too, and reaches nothing.
const (
	testHost  = "198.51.100.7"
	otherHost = "198.51.100.9"
)

func (w *world) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	w.mu.Lock()
	w.dialled = append(w.dialled, addr)
	w.mu.Unlock()
	port, ok := strings.CutPrefix(addr, testHost+":")
	if !ok {
		return nil, fmt.Errorf("test: %s is outside the test's world", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, "127.0.0.1:"+port)
}

// dials are the addresses dialled so far.
func (w *world) dials() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.dialled)
}

func (w *world) port(s *httptest.Server) uint16 {
	return netip.MustParseAddrPort(s.Listener.Addr().String()).Port()
}

// guest is the other end of a Net: a stack as the guest's kernel would
// be, at GuestAddr behind Gateway.
type guest struct {
	s *stack.Stack
}

func newGuest(t *testing.T, link net.Conn) *guest {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	ep := channel.New(512, MTU, tcpip.LinkAddress("\x52\x54\x00\x12\x34\x56"))
	if err := s.CreateNIC(1, ethernet.New(ep)); err != nil {
		t.Fatal(err)
	}
	pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: tcpip.AddrFrom4(GuestAddr.As4()).WithPrefix()}
	pa.AddressWithPrefix.PrefixLen = GuestBits
	if err := s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	s.SetRouteTable([]tcpip.Route{
		{Destination: pa.AddressWithPrefix.Subnet(), NIC: 1},
		{Destination: mustSubnet("0.0.0.0/0"), Gateway: tcpip.AddrFrom4(Gateway.As4()), NIC: 1},
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); readFrames(link, ep) }()
	go func() { defer wg.Done(); writeFrames(ctx, link, ep) }()
	t.Cleanup(func() {
		cancel()
		link.Close()
		ep.Close()
		s.Close()
		wg.Wait()
		s.Wait()
	})
	return &guest{s: s}
}

func (g *guest) dial(t *testing.T, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ap := netip.MustParseAddrPort(addr)
	return gonet.DialContextTCP(ctx, g.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(ap.Addr().As4()), Port: ap.Port()}, ipv4.ProtocolNumber)
}

// get sends an HTTP GET with host to addr and returns the body.
func (g *guest) get(t *testing.T, addr, host string) (string, error) {
	c, err := g.dial(t, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// lookup asks the Net's DNS server for name's A records.
func (g *guest) lookup(t *testing.T, name string) (int, []string) {
	pc, err := gonet.DialUDP(g.s, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(DNSAddr.As4()), Port: 53}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, _ := q.Pack()
	for try := 0; try < 5; try++ {
		pc.Write(b)
		pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4096)
		k, err := pc.Read(buf)
		if err != nil {
			continue
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:k]); err != nil {
			t.Fatal(err)
		}
		var addrs []string
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				addrs = append(addrs, a.A.String())
			}
		}
		return r.Rcode, addrs
	}
	t.Fatalf("no DNS answer about %s", name)
	return 0, nil
}

func start(t *testing.T, w *world, p policy.Policy, cfg Config) (*Net, *guest) {
	host, guestEnd := socketpair(t)
	cfg.Resolver = w.resolver
	cfg.Dial = w.dial
	cfg.Site = policy.Site{AllowPrivate: []netip.Prefix{netip.MustParsePrefix(testHost + "/32"), netip.MustParsePrefix(otherHost + "/32")}}
	n, err := Start(host, p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, newGuest(t, guestEnd)
}

func socketpair(t *testing.T) (net.Conn, net.Conn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

func mustPolicy(t *testing.T, s policy.Spec) policy.Policy {
	p, err := policy.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// refused checks that err is a refusal (a reset or ECONNREFUSED), not a
// time-out.
func refused(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: allowed, want refused", what)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("%s: %v, want a refusal, not a time-out", what, err)
	}
}

func TestAll(t *testing.T) {
	w := newWorld(t)
	n, g := start(t, w, policy.Default(), Config{})
	httpAddr := fmt.Sprintf("%s:%d", testHost, w.port(w.http))
	body, err := g.get(t, httpAddr, "anything.test")
	if err != nil || body != "hello anything.test" {
		t.Fatalf("GET through all: %q, %v", body, err)
	}
	if rc, addrs := g.lookup(t, "allowed.test"); rc != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != testHost {
		t.Fatalf("lookup: rcode %d, %v", rc, addrs)
	}
	// An address of the same range that the site does not allow: never.
	_, err = g.get(t, fmt.Sprintf("198.51.100.8:%d", w.port(w.http)), "x.test")
	refused(t, "198.51.100.8", err)
	_, err = g.get(t, fmt.Sprintf("10.0.2.2:%d", w.port(w.http)), "x.test")
	refused(t, "the gateway", err)
	u := n.Usage()
	if u.Connections != 1 || u.Refused != 2 || u.BytesOut == 0 || u.BytesIn == 0 {
		t.Fatalf("usage %+v: want 1 connection, 2 refused, bytes both ways", u)
	}
	for _, a := range w.dials() {
		if a != httpAddr {
			t.Fatalf("dialled %s: want only %s", a, httpAddr)
		}
	}
	// A live change applies to the next connection.
	n.SetPolicy(mustPolicy(t, policy.Spec{Egress: "none"}))
	_, err = g.get(t, httpAddr, "anything.test")
	refused(t, "after the change to none", err)
	if rc, _ := g.lookup(t, "allowed.test"); rc != dns.RcodeNameError {
		t.Fatalf("lookup under none: rcode %d, want NXDOMAIN", rc)
	}
}

func TestList(t *testing.T) {
	w := newWorld(t)
	_, g := start(t, w, mustPolicy(t, policy.Spec{Egress: "list", Allow: []string{"allowed.test", "*.wild.test", "alt.test", "rebind.test"}, Deny: []string{"no.wild.test"}}), Config{})
	// An address no allow CIDR matches is read for a name only when the
	// DNS server gave it for an allowed name: alt.test's, otherHost. A
	// connection allowed by its name is dialled at the name's own
	// addresses (testHost), never at the guest's destination.
	public := otherHost
	raw, err := g.dial(t, fmt.Sprintf("%s:%d", public, w.port(w.http)))
	refused(t, "an address the DNS server never gave", err)
	_ = raw
	if rc, addrs := g.lookup(t, "alt.test"); rc != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != public {
		t.Fatalf("alt.test: rcode %d, %v", rc, addrs)
	}
	// A name that resolves to the host's loopback: the guest is not told
	// the address, and a connection by the name is not dialled.
	if rc, addrs := g.lookup(t, "rebind.test"); rc != dns.RcodeSuccess || len(addrs) != 0 {
		t.Fatalf("rebind.test: rcode %d, %v: want its loopback address dropped", rc, addrs)
	}
	httpTo := fmt.Sprintf("%s:%d", public, w.port(w.http))
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{"allowed.test", true},
		{"a.b.wild.test", true},
		{"no.wild.test", false},
		{"other.test", false},
		{"rebind.test", false},
		{public, false},
	} {
		body, err := g.get(t, httpTo, tc.host)
		if tc.ok && (err != nil || body != "hello "+tc.host) {
			t.Errorf("GET Host %s: %q, %v; want it answered", tc.host, body, err)
		}
		if !tc.ok {
			refused(t, "Host "+tc.host, err)
		}
	}
	for _, a := range w.dials() {
		if strings.HasPrefix(a, public) || strings.HasPrefix(a, "127.") {
			t.Fatalf("dialled %s: want the allowed names' addresses alone", a)
		}
	}
	// TLS by its SNI, the certificate being the upstream's.
	tlsTo := fmt.Sprintf("%s:%d", public, w.port(w.https))
	for _, tc := range []struct {
		sni string
		ok  bool
	}{{"allowed.test", true}, {"other.test", false}, {"", false}} {
		c, err := g.dial(t, tlsTo)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		tc2 := tls.Client(c, &tls.Config{ServerName: tc.sni, InsecureSkipVerify: true})
		err = tc2.Handshake()
		c.Close()
		if tc.ok && err != nil {
			t.Errorf("TLS with SNI %q: %v", tc.sni, err)
		}
		if !tc.ok {
			refused(t, "TLS with SNI "+tc.sni, err)
		}
	}
	// Raw bytes carry no name.
	c, err := g.dial(t, httpTo)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	c.Write([]byte("\x00\x01 no name here\r\n\r\n"))
	_, err = c.Read(make([]byte, 1))
	c.Close()
	refused(t, "raw bytes", err)
	if rc, addrs := g.lookup(t, "allowed.test"); rc != dns.RcodeSuccess || len(addrs) != 1 {
		t.Fatalf("lookup of an allowed name: rcode %d, %v", rc, addrs)
	}
	if rc, _ := g.lookup(t, "other.test"); rc != dns.RcodeNameError {
		t.Fatalf("lookup of another name: rcode %d, want NXDOMAIN", rc)
	}
}

// TestDenyNames: a policy that denies names reads each connection's name,
// even one its address allows: a denied name is refused, another passes,
// and a connection that sends nothing (its server speaks first) is
// carried after nameWait, without one. Under list, a connection its
// CIDR allows passes whatever name it carries, unless a deny rule has it.
func TestDenyNames(t *testing.T) {
	w := newWorld(t)
	for _, spec := range []policy.Spec{
		{Egress: "all", Deny: []string{"bad.test"}},
		{Egress: "list", Allow: []string{testHost + "/32", "named.test"}, Deny: []string{"bad.test"}},
	} {
		t.Run(spec.Egress, func(t *testing.T) {
			_, g := start(t, w, mustPolicy(t, spec), Config{})
			to := fmt.Sprintf("%s:%d", testHost, w.port(w.http))
			if body, err := g.get(t, to, "good.test"); err != nil || body != "hello good.test" {
				t.Fatalf("a name no rule denies: %q, %v", body, err)
			}
			_, err := g.get(t, to, "bad.test")
			refused(t, "a denied name", err)
			c, err := g.dial(t, fmt.Sprintf("%s:%d", testHost, netip.MustParseAddrPort(w.banner.Addr().String()).Port()))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || line != "SSH-2.0-test\r\n" {
				t.Fatalf("a server that speaks first: %q, %v", line, err)
			}
		})
	}
}

// TestDenyCIDRByName: a deny CIDR holds for the addresses of an allowed
// name, which the host dials: an allowed name does not open a denied
// range.
func TestDenyCIDRByName(t *testing.T) {
	w := newWorld(t)
	_, g := start(t, w, mustPolicy(t, policy.Spec{Egress: "list", Allow: []string{"*.test"}, Deny: []string{testHost + "/32"}}), Config{})
	if rc, addrs := g.lookup(t, "alt.test"); rc != dns.RcodeSuccess || len(addrs) != 1 {
		t.Fatalf("alt.test: rcode %d, %v", rc, addrs)
	}
	_, err := g.get(t, fmt.Sprintf("%s:%d", otherHost, w.port(w.http)), "allowed.test")
	refused(t, "an allowed name whose address a deny CIDR has", err)
	if d := w.dials(); len(d) != 0 {
		t.Fatalf("dialled %v", d)
	}
}

func TestMaxConns(t *testing.T) {
	w := newWorld(t)
	n, g := start(t, w, policy.Default(), Config{MaxConns: 2})
	addr := fmt.Sprintf("%s:%d", testHost, w.port(w.http))
	var held []net.Conn
	for range 2 {
		c, err := g.dial(t, addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	_, err := g.dial(t, addr)
	refused(t, "a third connection", err)
	for _, c := range held {
		c.Close()
	}
	// Closed connections give their places back.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := g.get(t, addr, "x.test"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection after the held ones closed: %+v", n.Usage())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSameNetwork: the guest's side (guestinit, in strata-init) and the
// host's have the same addresses.
func TestSameNetwork(t *testing.T) {
	g := guestinit.GuestNet
	if g.Addr.Addr() != GuestAddr || g.Addr.Bits() != GuestBits || g.Gateway != Gateway || g.DNS != DNSAddr {
		t.Fatalf("guestinit's network %+v; egress has %v/%d via %v, DNS %v", g, GuestAddr, GuestBits, Gateway, DNSAddr)
	}
}

// TestDNS: over TCP too; a single-label name, one under .local and a
// reverse lookup of a private address are NXDOMAIN under every policy
// (a host's resolver would ask its LAN, or tell its private names).
func TestDNS(t *testing.T) {
	w := newWorld(t)
	_, g := start(t, w, policy.Default(), Config{})
	for _, name := range []string{"printer", "nas.local", "1.0.168.192.in-addr.arpa", "1.0.0.127.in-addr.arpa"} {
		if rc, _ := g.lookup(t, name); rc != dns.RcodeNameError {
			t.Errorf("%s: rcode %d, want NXDOMAIN", name, rc)
		}
	}
	c, err := g.dial(t, DNSAddr.String()+":53")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	conn := &dns.Conn{Conn: c}
	q := new(dns.Msg)
	q.SetQuestion("web.test.", dns.TypeA)
	if err := conn.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	r, err := conn.ReadMsg()
	if err != nil || r.Id != q.Id || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != testHost {
		t.Fatalf("DNS over TCP: %v, %v", r, err)
	}
}

// TestFrameTooLong: a frame longer than MaxFrame ends the network, with
// an error that says so.
func TestFrameTooLong(t *testing.T) {
	w := newWorld(t)
	host, guestEnd := socketpair(t)
	n, err := Start(host, policy.Default(), Config{Resolver: w.resolver, Dial: w.dial})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	defer guestEnd.Close()
	guestEnd.Write([]byte{0, 0, 0x10, 0})
	select {
	case <-n.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("a frame of 4096 bytes did not end the network")
	}
	if err := n.Err(); err == nil || !strings.Contains(err.Error(), "4096 bytes") {
		t.Fatalf("Err: %v", err)
	}
}

// TestSharedSite: a site set on Shared replaces every network's own, for
// what is decided after it (hostproxy reads the host's addresses again).
func TestSharedSite(t *testing.T) {
	w := newWorld(t)
	sh := NewShared(16)
	n, g := start(t, w, policy.Default(), Config{Shared: sh})
	to := fmt.Sprintf("%s:%d", testHost, w.port(w.http))
	if body, err := g.get(t, to, "x.test"); err != nil || body != "hello x.test" {
		t.Fatalf("before: %q, %v", body, err)
	}
	// A site that no longer allows the test host's address (and holds it
	// as one of the host's own).
	sh.SetSite(policy.Site{HostAddrs: []netip.Prefix{netip.MustParsePrefix(testHost + "/32")}})
	_, err := g.get(t, to, "x.test")
	refused(t, "a host address after SetSite", err)
	if n.site().AllowPrivate != nil {
		t.Fatalf("the network's site: %+v", n.site())
	}
}
