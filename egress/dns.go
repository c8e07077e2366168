package egress

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

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
				if a := n.answer(q, udpSize(q)); a != nil {
					pc.WriteTo(a, from)
				}
			}()
		}
	}()
	return nil
}

// udpSize is the largest answer the asker of q takes over UDP.
func udpSize(q []byte) int {
	m := new(dns.Msg)
	if m.Unpack(q) == nil {
		if o := m.IsEdns0(); o != nil && o.UDPSize() > dns.MinMsgSize {
			return int(min(o.UDPSize(), 4096))
		}
	}
	return dns.MinMsgSize
}

// answer is the answer to the question q, packed; nil when q is not a
// question worth one.
func (n *Net) answer(q []byte, size int) []byte {
	m := new(dns.Msg)
	if err := m.Unpack(q); err != nil || m.Response {
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
	name := strings.TrimSuffix(strings.ToLower(m.Question[0].Name), ".")
	p := n.Policy()
	if !p.Name(name) {
		n.refuse(reasonDNS)
		return reply(dns.RcodeNameError)
	}
	ctx, cancel := context.WithTimeout(n.ctx, dnsTimeout)
	defer cancel()
	resp, err := n.exchange(ctx, m)
	if err != nil {
		return reply(dns.RcodeServerFailure)
	}
	resp.Id = m.Id
	resp.Truncate(size)
	b, err := resp.Pack()
	if err != nil {
		return reply(dns.RcodeServerFailure)
	}
	return b
}

// exchange asks the host's resolver q, over UDP and again over TCP when
// the answer was truncated.
func (n *Net) exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
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
