package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"strata/egress/policy"
)

// dnsTimeout bounds one question to the host's resolver.
const dnsTimeout = 5 * time.Second

// reasonDNS is the refusal of a DNS question about a name the policy
// refuses.
const reasonDNS policy.Reason = "dns_refused"

// serveDNS answers the guest's DNS questions on DNSAddr:53 (UDP).
func (n *Net) serveDNS() error {
	pc, err := gonet.DialUDP(n.stack, &tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(DNSAddr.As4()), Port: 53}, nil, ipv4.ProtocolNumber)
	if err != nil {
		return err
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		<-n.ctx.Done()
		pc.Close()
	}()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		sem := make(chan struct{}, dnsInFlight)
		buf := make([]byte, 65536)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := append([]byte(nil), buf[:k]...)
			select {
			case sem <- struct{}{}:
			default:
				continue // as many in flight as allowed: dropped, the guest asks again
			}
			if !n.track() {
				return
			}
			go func() {
				defer n.untrack()
				defer func() { <-sem }()
				m := new(dns.Msg)
				if m.Unpack(q) != nil {
					return
				}
				if a := n.answer(m, udpSize(m)); a != nil {
					pc.WriteTo(a, from)
				}
			}()
		}
	}()
	return nil
}

// udpSize is the largest answer the asker of m takes over UDP.
func udpSize(m *dns.Msg) int {
	if o := m.IsEdns0(); o != nil && o.UDPSize() > dns.MinMsgSize {
		return int(min(o.UDPSize(), 4096))
	}
	return dns.MinMsgSize
}

// answer is the answer to the question m, packed; nil when m is not a
// question worth one. Only class IN is asked on; a single-label name or
// one under .local (which a host's resolver may ask its LAN about:
// LLMNR, mDNS) is NXDOMAIN, and so is a reverse lookup of an address
// the gate refuses (it would tell the host's private names). The
// question goes out with an id of its own, and the answer loses every
// address the gate refuses; the addresses left are noted (saw) for
// the connections that need a name.
func (n *Net) answer(m *dns.Msg, size int) []byte {
	if m.Response {
		return nil
	}
	reply := func(rcode int) []byte {
		r := new(dns.Msg)
		r.SetRcode(m, rcode)
		b, _ := r.Pack()
		return b
	}
	if m.Opcode != dns.OpcodeQuery || len(m.Question) != 1 {
		return reply(dns.RcodeNotImplemented)
	}
	question := m.Question[0]
	if question.Qclass != dns.ClassINET {
		return reply(dns.RcodeRefused)
	}
	name := strings.TrimSuffix(strings.ToLower(question.Name), ".")
	p := n.Policy()
	if !p.Name(name) || !strings.Contains(name, ".") || name == "local" || strings.HasSuffix(name, ".local") || !n.reverseAllowed(name) {
		n.refuse(reasonDNS)
		return reply(dns.RcodeNameError)
	}
	ctx, cancel := context.WithTimeout(n.ctx, dnsTimeout)
	defer cancel()
	out := m.Copy()
	out.Id = dns.Id()
	resp, err := n.exchange(ctx, out)
	if err != nil {
		return reply(dns.RcodeServerFailure)
	}
	resp.Id = m.Id
	var seen []netip.Addr
	kept := resp.Answer[:0]
	for _, rr := range resp.Answer {
		var a netip.Addr
		switch rr := rr.(type) {
		case *dns.A:
			a, _ = netip.AddrFromSlice(rr.A.To4())
		case *dns.AAAA:
			a, _ = netip.AddrFromSlice(rr.AAAA)
		default:
			kept = append(kept, rr)
			continue
		}
		if policy.Gate(a, n.site()) {
			kept = append(kept, rr)
			seen = append(seen, a)
		}
	}
	resp.Answer = kept
	n.saw(seen)
	resp.Truncate(size)
	b, err := resp.Pack()
	if err != nil {
		return reply(dns.RcodeServerFailure)
	}
	return b
}

// reverseAllowed tells whether name, when it is a reverse lookup of an
// IPv4 address (in-addr.arpa), is of one the gate lets through; IPv6
// reverse lookups are refused (the guest has no IPv6); any other name is
// allowed here.
func (n *Net) reverseAllowed(name string) bool {
	if strings.HasSuffix(name, ".ip6.arpa") || name == "ip6.arpa" {
		return false
	}
	rest, ok := strings.CutSuffix(name, ".in-addr.arpa")
	if !ok {
		return name != "in-addr.arpa"
	}
	labels := strings.Split(rest, ".")
	if len(labels) != 4 {
		return false
	}
	var b [4]byte
	for i, l := range labels {
		v, err := strconv.ParseUint(l, 10, 8)
		if err != nil {
			return false
		}
		b[3-i] = byte(v)
	}
	return policy.Gate(netip.AddrFrom4(b), n.site())
}

// serveDNSConn answers DNS over TCP on DNSAddr:53, for answers too long
// for UDP: questions one after another, each within dnsTimeout, until the
// guest closes the connection. The caller took its place among the
// connections (admit).
func (n *Net) serveDNSConn(r *tcp.ForwarderRequest) {
	guest, _, err := accept(r)
	if err != nil {
		return
	}
	if !n.track(guest) {
		return
	}
	defer n.untrack(guest)
	c := &dns.Conn{Conn: guest}
	for {
		guest.SetDeadline(time.Now().Add(dnsTimeout))
		q, err := c.ReadMsg()
		if err != nil {
			return
		}
		a := n.answer(q, dns.MaxMsgSize)
		if a == nil {
			return
		}
		if _, err := c.Write(a); err != nil {
			return
		}
	}
}

// exchange asks the host's resolver q, over UDP and again over TCP when
// the answer was truncated.
func (n *Net) exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
	if n.cfg.Resolver == "" {
		return nil, errors.New("egress: no resolver")
	}
	c := &dns.Client{Net: "udp", Timeout: dnsTimeout}
	resp, _, err := c.ExchangeContext(ctx, q, n.cfg.Resolver)
	if err == nil && resp.Truncated {
		c.Net = "tcp"
		resp, _, err = c.ExchangeContext(ctx, q, n.cfg.Resolver)
	}
	if err != nil {
		return nil, err
	}
	if resp == nil {
		return nil, errors.New("egress: no answer")
	}
	return resp, nil
}

// HostResolver is the host's own resolver: the first nameserver of
// /etc/resolv.conf, host:port.
func HostResolver() (string, error) {
	cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil {
		return "", err
	}
	if len(cc.Servers) == 0 {
		return "", errors.New("egress: /etc/resolv.conf names no nameserver")
	}
	return net.JoinHostPort(cc.Servers[0], cc.Port), nil
}
