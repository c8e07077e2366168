package egress

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"strata/egress/policy"
)

// reasonTooMany is the refusal of a connection past Config.MaxConns,
// Config.ConnsPerSecond or the host's Shared bound; reasonUnreachable of
// one whose dial failed (the guest sees it refused, as it would the
// upstream's own refusal).
const (
	reasonTooMany     policy.Reason = "too_many_connections"
	reasonUnreachable policy.Reason = "unreachable"
)

// nameWait is how long a connection allowed by its address waits for
// the first byte of what might carry a denied name (a policy that denies
// names): a protocol whose server speaks first (SSH, SMTP) starts that
// much later, and is then carried without a name. Once a byte came, the
// name must come whole within SniffTimeout, or the connection is refused.
const nameWait = time.Second

// handleTCP decides one connection the guest opens (a SYN the stack
// holds) and carries it when allowed. It runs in a goroutine of its own,
// at most maxPending at a time until they complete the handshake.
func (n *Net) handleTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	dst := netip.AddrPortFrom(netip.AddrFrom4(id.LocalAddress.As4()), id.LocalPort)
	release, ok := n.admit()
	if !ok {
		n.refuse(reasonTooMany)
		r.Complete(true)
		return
	}
	defer release()
	if guestNet.Contains(dst.Addr()) {
		// The guest's own network: the DNS server over TCP (answers
		// too long for UDP), else nothing, whatever allow_private says.
		if dst == netip.AddrPortFrom(DNSAddr, 53) {
			n.serveDNSConn(r)
			return
		}
		n.refuse(policy.ReasonPrivateAddress)
		r.Complete(true)
		return
	}
	p := n.Policy()
	d := p.Decide(policy.Conn{Dst: dst}, n.site())
	byAddr := d.Allow
	if byAddr && !deniesNames(p) {
		up, err := n.dial(dst)
		if err != nil {
			n.refuse(reasonUnreachable)
			r.Complete(true)
			return
		}
		guest, _, err := accept(r)
		if err != nil {
			up.Close()
			return
		}
		n.connections.Add(1)
		n.splice(guest, up, nil)
		return
	}
	// Under list, a destination that no allow CIDR matches is worth
	// reading for a name only when this network's DNS server gave it for
	// an allowed name: anything else (raw TCP to an address the guest
	// found itself, a SYN flood) is refused at once.
	if !byAddr && (d.Reason != policy.ReasonNoName || !n.answered(dst.Addr())) {
		n.refuse(d.Reason)
		r.Complete(true)
		return
	}
	// The decision needs the connection's name: take the connection, and
	// read what it sends first. One allowed by its address needs it only
	// to find a denied name, and waits for a first byte briefly.
	guest, ep, err := accept(r)
	if err != nil {
		return
	}
	if !n.track(guest) {
		return
	}
	defer n.untrack(guest)
	first := SniffTimeout
	if byAddr {
		first = nameWait
	}
	guest.SetReadDeadline(time.Now().Add(first))
	one := make([]byte, 1)
	k, err := guest.Read(one)
	var name string
	var head []byte
	switch {
	case k == 0 && byAddr && timeout(err):
		// Nothing sent: carried without a name.
	case k == 0:
		n.refuse(policy.ReasonNoName)
		ep.Abort()
		return
	default:
		guest.SetReadDeadline(time.Now().Add(SniffTimeout))
		name, head, err = Sniff(io.MultiReader(bytes.NewReader(one[:k]), guest))
		if err != nil {
			// Cut short, or too slow to name itself: no decision
			// can be made on it.
			n.refuse(policy.ReasonNoName)
			ep.Abort()
			return
		}
	}
	guest.SetReadDeadline(time.Time{})
	// The policy may have changed meanwhile: decided again, whole.
	p = n.Policy()
	var up net.Conn
	if d := p.Decide(policy.Conn{Dst: dst}, n.site()); d.Allow {
		// Allowed by its address: only a deny rule can refuse it now.
		deny := policy.Policy{Mode: policy.All, Deny: p.Deny}
		if d := deny.Decide(policy.Conn{Dst: dst, Name: name}, n.site()); !d.Allow {
			n.refuse(d.Reason)
			ep.Abort()
			return
		}
		up, err = n.dial(dst)
	} else {
		if d := p.Decide(policy.Conn{Dst: dst, Name: name}, n.site()); !d.Allow {
			n.refuse(d.Reason)
			ep.Abort()
			return
		}
		if host, byName := dialName(p, name); byName {
			up, err = n.dialName(p, host, dst.Port())
		} else {
			up, err = n.dial(dst)
		}
	}
	if err != nil {
		n.refuse(reasonUnreachable)
		ep.Abort()
		return
	}
	n.connections.Add(1)
	n.splice(guest, up, head)
}

// timeout tells whether err is a read's deadline passing.
func timeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// admit takes a place for one more connection: within Config.MaxConns,
// Config.ConnsPerSecond and the host's Shared bound; release gives the
// places back.
func (n *Net) admit() (release func(), ok bool) {
	if n.rate != nil && !n.rate.Allow() {
		return nil, false
	}
	select {
	case n.conns <- struct{}{}:
	default:
		return nil, false
	}
	if sh := n.cfg.Shared; sh != nil {
		select {
		case sh.conns <- struct{}{}:
		default:
			<-n.conns
			return nil, false
		}
		return func() { <-sh.conns; <-n.conns }, true
	}
	return func() { <-n.conns }, true
}

// deniesNames tells whether p has deny rules of names, which a decision
// by address alone cannot apply.
func deniesNames(p policy.Policy) bool {
	for _, r := range p.Deny {
		if r.Name != "" {
			return true
		}
	}
	return false
}

// dialName says whether a connection allowed with name must be dialled by
// the name (under list, a name that is not an address literal) and the
// name to resolve.
func dialName(p policy.Policy, name string) (string, bool) {
	if p.Mode != policy.List || name == "" {
		return "", false
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return "", false
	}
	return name, true
}

// accept completes the guest's handshake.
func accept(r *tcp.ForwarderRequest) (net.Conn, tcpip.Endpoint, error) {
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		return nil, nil, errors.New(terr.String())
	}
	r.Complete(false)
	ep.SocketOptions().SetKeepAlive(true)
	return gonet.NewTCPConn(&wq, ep), ep, nil
}

// dial dials dst from the host, if the gate lets it.
func (n *Net) dial(dst netip.AddrPort) (net.Conn, error) {
	if !policy.Gate(dst.Addr(), n.site()) {
		return nil, errors.New("egress: gated address")
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.DialTimeout)
	defer cancel()
	return n.cfg.Dial(ctx, "tcp4", dst.String())
}

// dialName resolves host with the host's resolver and dials the first of
// its addresses that p allows for the name (the gate, and the deny CIDRs:
// an allowed name must not open a denied range) and that answers, at
// port.
func (n *Net) dialName(p policy.Policy, host string, port uint16) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.DialTimeout)
	defer cancel()
	addrs, err := n.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	err = errors.New("egress: " + host + " has no address a sandbox may reach")
	for _, a := range addrs {
		if !p.Decide(policy.Conn{Dst: netip.AddrPortFrom(a, port), Name: host}, n.site()).Allow {
			continue
		}
		c, derr := n.cfg.Dial(ctx, "tcp4", net.JoinHostPort(a.String(), strconv.Itoa(int(port))))
		if derr == nil {
			return c, nil
		}
		err = derr
	}
	return nil, err
}

// lookup asks the resolver for host's IPv4 addresses.
func (n *Net) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(host), dns.TypeA)
	resp, err := n.exchange(ctx, q)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				addrs = append(addrs, ip)
			}
		}
	}
	return addrs, nil
}

// splice carries a connection both ways, head first to up, until both
// directions end; it counts bytes and bounds their rate.
func (n *Net) splice(guest, up net.Conn, head []byte) {
	if !n.track(guest, up) {
		return
	}
	defer n.untrack(guest, up)
	if len(head) > 0 {
		if err := n.wait(len(head)); err != nil {
			return
		}
		n.carried(true, len(head))
		if _, err := up.Write(head); err != nil {
			return
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.copy(guest, up, false)
	}()
	n.copy(up, guest, true)
	<-done
}

// carried counts k bytes, out or in.
func (n *Net) carried(out bool, k int) {
	if out {
		n.out.Add(uint64(k))
	} else {
		n.in.Add(uint64(k))
	}
	if n.cfg.Carried != nil {
		n.cfg.Carried(out, k)
	}
}

// copy copies src to dst, counting its bytes out or in, and closes dst's
// write side at src's end (a half close goes through); on an error both
// are closed.
func (n *Net) copy(dst, src net.Conn, out bool) {
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			// Counted as read, before the write: once the other side
			// has the bytes, Usage has them.
			n.carried(out, k)
			if werr := n.wait(k); werr != nil {
				err = werr
			} else if _, werr := dst.Write(buf[:k]); werr != nil {
				err = werr
			}
		}
		if err == io.EOF {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
				return
			}
		}
		if err != nil {
			dst.Close()
			src.Close()
			return
		}
	}
}

// wait takes k bytes from the rate bound.
func (n *Net) wait(k int) error {
	if n.limit == nil {
		return nil
	}
	for k > 0 {
		c := min(k, n.limit.Burst())
		if err := n.limit.WaitN(n.ctx, c); err != nil {
			return err
		}
		k -= c
	}
	return nil
}
