package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"strata/egress/policy"
)

// The guest's network: the guest's address and its prefix, the gateway
// (the stack's own address, where every packet goes) and the DNS server
// the guest is told to use. Every sandbox has the same: each has a
// network of its own.
var (
	GuestAddr  = netip.MustParseAddr("10.0.2.15")
	GuestBits  = 24
	Gateway    = netip.MustParseAddr("10.0.2.2")
	DNSAddr    = netip.MustParseAddr("10.0.2.3")
	gatewayMAC = tcpip.LinkAddress("\x52\x55\x0a\x00\x02\x02")
	guestNet   = netip.PrefixFrom(GuestAddr, GuestBits).Masked()
)

// Config is what a deployment sets for every sandbox's network.
type Config struct {
	// Site is the deployment's part of every decision: its private
	// ranges a sandbox may reach anyway, and the host's own addresses.
	Site policy.Site
	// Resolver is the DNS server the host asks for sandboxes' names,
	// host:port.
	Resolver string
	// MaxConns is the most TCP connections a sandbox has open or being
	// dialled at a time (DefaultMaxConns when 0).
	MaxConns int
	// BytesPerSecond bounds a sandbox's bytes in and out together, over
	// all its connections; 0 is no bound.
	BytesPerSecond int
	// ConnsPerSecond bounds the connections a sandbox opens per second
	// (DefaultConnsPerSecond when 0; twice that at once): each closed
	// connection holds a port of the host's for a while (TIME_WAIT).
	ConnsPerSecond int
	// Shared, when set, bounds what all the sandboxes of the host hold
	// together.
	Shared *Shared
	// DialTimeout bounds a dial (DefaultDialTimeout when 0).
	DialTimeout time.Duration
	// Refused, when set, is told the reason of every refusal, and
	// Carried every count of bytes carried, out (from the guest) or in
	// (metrics).
	Refused func(policy.Reason)
	Carried func(out bool, n int)
	// Dial dials from the host (a net.Dialer's when nil): tests see
	// every address dialled through it.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// The defaults of Config.
const (
	DefaultMaxConns       = 256
	DefaultConnsPerSecond = 200
	DefaultDialTimeout    = 10 * time.Second
)

// Shared is what the networks of one host share: a bound on their
// connections together, so that many sandboxes cannot take all of
// hostproxy's descriptors, and the site as it is now (SetSite: the
// host's addresses change).
type Shared struct {
	conns chan struct{}
	site  atomic.Pointer[policy.Site]
}

// NewShared bounds the connections of all the networks given it to max.
func NewShared(max int) *Shared { return &Shared{conns: make(chan struct{}, max)} }

// SetSite replaces the site of every network given s, in place of their
// Config.Site, for what they decide after it.
func (s *Shared) SetSite(site policy.Site) { s.site.Store(&site) }

// site is the site decisions are made with: the Shared one when set.
func (n *Net) site() policy.Site {
	if sh := n.cfg.Shared; sh != nil {
		if s := sh.site.Load(); s != nil {
			return *s
		}
	}
	return n.cfg.Site
}

const (
	nicID = 1
	// maxPending is the most TCP handshakes the stack holds waiting for
	// a decision.
	maxPending = 64
	// bufferBytes bounds each connection's send and receive buffers in
	// the stack.
	bufferBytes = 128 << 10
	// dnsInFlight is the most DNS questions forwarded at a time.
	dnsInFlight = 32
)

// Usage counts a sandbox's traffic since its Net started.
type Usage struct {
	// BytesOut is what the guest sent through its connections, BytesIn
	// what came back to it.
	BytesOut uint64 `json:"bytes_out"`
	BytesIn  uint64 `json:"bytes_in"`
	// Connections are the TCP connections allowed and dialled; Refused
	// the connections and DNS questions refused by the policy or a bound.
	Connections uint64 `json:"connections"`
	Refused     uint64 `json:"refused"`
}

// Net is one sandbox's network: a stack on the host end of its NIC.
type Net struct {
	cfg    Config
	policy atomic.Pointer[policy.Policy]
	conns  chan struct{} // a token per connection open or being dialled
	limit  *rate.Limiter // bytes per second; nil: no bound
	rate   *rate.Limiter // new connections per second
	stack  *stack.Stack
	ep     *channel.Endpoint
	link   net.Conn
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{}
	err    error

	out, in, connections, refused atomic.Uint64
	once                          sync.Once
	// seen are the addresses the DNS server gave the guest for allowed
	// names, and when (answered): at most maxSeen.
	seenMu sync.Mutex
	seen   map[netip.Addr]time.Time
	mu     sync.Mutex
	open   map[net.Conn]struct{} // both sides of every open connection
	// active counts the goroutines of connections, added under mu while
	// open is not nil.
	active sync.WaitGroup
}

// Start runs a sandbox's network on link, the host end of its NIC, under
// p until Close or until link ends.
func Start(link net.Conn, p policy.Policy, cfg Config) (*Net, error) {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.ConnsPerSecond <= 0 {
		cfg.ConnsPerSecond = DefaultConnsPerSecond
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Net{
		cfg: cfg, conns: make(chan struct{}, cfg.MaxConns), link: link,
		ctx: ctx, cancel: cancel, done: make(chan struct{}),
		open: map[net.Conn]struct{}{},
	}
	n.rate = rate.NewLimiter(rate.Limit(cfg.ConnsPerSecond), 2*cfg.ConnsPerSecond)
	n.seen = map[netip.Addr]time.Time{}
	if cfg.BytesPerSecond > 0 {
		n.limit = rate.NewLimiter(rate.Limit(cfg.BytesPerSecond), max(cfg.BytesPerSecond, 64<<10))
	}
	n.policy.Store(&p)
	if err := n.makeStack(); err != nil {
		cancel()
		return nil, err
	}
	if err := n.serveDNS(); err != nil {
		n.stack.Close()
		cancel()
		return nil, err
	}
	errs := make(chan error, 2)
	n.wg.Add(2)
	go func() {
		defer n.wg.Done()
		errs <- readFrames(link, n.ep)
	}()
	go func() {
		defer n.wg.Done()
		errs <- writeFrames(ctx, link, n.ep)
	}()
	go func() {
		n.err = <-errs
		n.shutdown()
		close(n.done)
	}()
	return n, nil
}

func (n *Net) makeStack() error {
	n.stack = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	sack := tcpip.TCPSACKEnabled(true)
	n.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	// A closed connection's endpoint lingers 5 s, not a minute: a guest
	// that opens and closes connections in a loop holds fewer.
	tw := tcpip.TCPTimeWaitTimeoutOption(5 * time.Second)
	n.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &tw)
	n.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &tcpip.TCPReceiveBufferSizeRangeOption{Min: 4096, Default: 64 << 10, Max: bufferBytes})
	n.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &tcpip.TCPSendBufferSizeRangeOption{Min: 4096, Default: 64 << 10, Max: bufferBytes})
	n.ep = channel.New(512, MTU, gatewayMAC)
	if err := n.stack.CreateNIC(nicID, ethernet.New(n.ep)); err != nil {
		return errors.New("egress: create NIC: " + err.String())
	}
	for _, a := range []netip.Addr{Gateway, DNSAddr} {
		pa := tcpip.ProtocolAddress{
			Protocol:          ipv4.ProtocolNumber,
			AddressWithPrefix: tcpip.AddrFrom4(a.As4()).WithPrefix(),
		}
		pa.AddressWithPrefix.PrefixLen = GuestBits
		if err := n.stack.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return errors.New("egress: address: " + err.String())
		}
	}
	// Promiscuous and spoofing: the stack takes packets to any address
	// (the forwarder below decides them) and answers from it.
	n.stack.SetPromiscuousMode(nicID, true)
	n.stack.SetSpoofing(nicID, true)
	n.stack.SetRouteTable([]tcpip.Route{{Destination: mustSubnet("0.0.0.0/0"), NIC: nicID}})
	fwd := tcp.NewForwarder(n.stack, 0, maxPending, n.handleTCP)
	n.stack.SetTransportProtocolHandler(tcp.ProtocolNumber, fwd.HandlePacket)
	return nil
}

func mustSubnet(s string) tcpip.Subnet {
	p := netip.MustParsePrefix(s)
	sn, err := tcpip.NewSubnet(tcpip.AddrFrom4(p.Addr().As4()), tcpip.MaskFromBytes(net.CIDRMask(p.Bits(), 32)))
	if err != nil {
		panic(err)
	}
	return sn
}

// SetPolicy replaces the policy, for what is decided after it.
func (n *Net) SetPolicy(p policy.Policy) { n.policy.Store(&p) }

// Policy is the policy in force.
func (n *Net) Policy() policy.Policy { return *n.policy.Load() }

// Usage is the traffic so far.
func (n *Net) Usage() Usage {
	return Usage{BytesOut: n.out.Load(), BytesIn: n.in.Load(), Connections: n.connections.Load(), Refused: n.refused.Load()}
}

// Done is closed once the Net has stopped: Close, or its link ended.
func (n *Net) Done() <-chan struct{} { return n.done }

// Err is why the Net stopped, once Done is closed: its link's error (a
// frame too long, the QEMU gone), or nil for a Close.
func (n *Net) Err() error {
	<-n.done
	if errors.Is(n.err, context.Canceled) || errors.Is(n.err, net.ErrClosed) {
		return nil
	}
	return n.err
}

// maxSeen bounds the addresses answered remembers; seenFor is how long.
const (
	maxSeen = 4096
	seenFor = 30 * time.Minute
)

// saw notes addresses the DNS server gave the guest for an allowed name.
func (n *Net) saw(addrs []netip.Addr) {
	now := time.Now()
	n.seenMu.Lock()
	defer n.seenMu.Unlock()
	for _, a := range addrs {
		if len(n.seen) >= maxSeen {
			// Full: the stale ones go, then any, to three quarters.
			for old, at := range n.seen {
				if now.Sub(at) > seenFor || len(n.seen) > maxSeen*3/4 {
					delete(n.seen, old)
				}
			}
		}
		n.seen[a.Unmap()] = now
	}
}

// answered tells whether the DNS server gave the guest a, for an allowed
// name, within seenFor.
func (n *Net) answered(a netip.Addr) bool {
	n.seenMu.Lock()
	defer n.seenMu.Unlock()
	at, ok := n.seen[a.Unmap()]
	return ok && time.Since(at) < seenFor
}

// Close stops the network: its link, its connections, its stack.
func (n *Net) Close() error {
	n.shutdown()
	<-n.done
	return nil
}

func (n *Net) shutdown() { n.once.Do(n.stop) }

func (n *Net) stop() {
	n.cancel()
	n.link.Close()
	n.mu.Lock()
	for c := range n.open {
		c.Close()
	}
	n.open = nil
	n.mu.Unlock()
	n.active.Wait()
	n.ep.Close()
	n.stack.Close()
	n.wg.Wait()
	n.stack.Wait()
}

// track registers conns to be closed by Close, and one goroutine more
// of a connection (untrack ends it); false when closed already, and then
// it closes them.
func (n *Net) track(conns ...net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.open == nil {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		n.open[c] = struct{}{}
	}
	n.active.Add(1)
	return true
}

// untrack closes conns and ends the goroutine track counted.
func (n *Net) untrack(conns ...net.Conn) {
	n.mu.Lock()
	for _, c := range conns {
		c.Close()
		delete(n.open, c)
	}
	n.mu.Unlock()
	n.active.Done()
}

func (n *Net) refuse(r policy.Reason) {
	n.refused.Add(1)
	if n.cfg.Refused != nil {
		n.cfg.Refused(r)
	}
}
