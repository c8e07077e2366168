package policy

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"strata/internal/fault"
)

// lines splits a fuzz string into rules; "" is no rule.
func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// FuzzParse checks that Parse never panics, refuses only with
// invalid_field naming one of its fields, and that an accepted setting's
// canonical form parses to the same policy, whose names are canonical.
func FuzzParse(f *testing.F) {
	f.Add("list", "pypi.org\n*.github.com\n10.1.0.0/16\n2001:db8::1", "gist.github.com")
	f.Add("all", "", "evil.com\n203.0.113.0/24")
	f.Add("none", "", "")
	f.Add("", "", "EVIL.com.")
	f.Add("list", "bücher.de\n*.BÜCHER.de.", "::ffff:1.2.3.4\n10.1.2.3/16")
	f.Add("list", "*\n*.\n.\n..\n1.2.3\nfe80::1%eth0", "a:b")
	f.Fuzz(func(t *testing.T, egress, allow, deny string) {
		p, err := Parse(Spec{Egress: egress, Allow: lines(allow), Deny: lines(deny)})
		if err != nil {
			fe := fault.As(err)
			if fe == nil || fe.Kind != fault.Invalid || fe.Code != CodeInvalidField {
				t.Fatalf("Parse: %v (%T), want invalid_field", err, err)
			}
			if f := fe.Fields["field"]; f != "network.egress" && f != "network.allow" && f != "network.deny" {
				t.Fatalf("Parse: field %v", f)
			}
			return
		}
		spec := p.Spec()
		back, err := Parse(spec)
		if err != nil || !reflect.DeepEqual(back, p) {
			t.Fatalf("Parse(%+v) = %+v, %v; want %+v", spec, back, err, p)
		}
		if !reflect.DeepEqual(back.Spec(), spec) {
			t.Fatalf("canonical form %+v becomes %+v", spec, back.Spec())
		}
		for _, rules := range [][]Rule{p.Allow, p.Deny} {
			if len(rules) > MaxRules {
				t.Fatalf("%d rules", len(rules))
			}
			for i, r := range rules {
				if slices.Contains(rules[:i], r) {
					t.Fatalf("duplicate rule %s", r)
				}
				if r.Prefix.IsValid() {
					if r.Name != "" || r.Wildcard || r.Prefix != r.Prefix.Masked() || r.Prefix.Addr().Is4In6() {
						t.Fatalf("CIDR rule %+v", r)
					}
					continue
				}
				n := r.Name
				if n == "" || len(n) > MaxName || n != strings.ToLower(n) || strings.HasSuffix(n, ".") ||
					!isASCII(n) || strings.ContainsAny(n, "*_ :/%") {
					t.Fatalf("name rule %+v", r)
				}
				// a rule's name is a name the sandbox can meet
				if got, ok := normalName(n); !ok || got != n {
					t.Fatalf("name rule %q normalises to %q, %v", n, got, ok)
				}
			}
		}
	})
}

// modelName is the reference normalisation: lower case, one trailing dot
// dropped.
func modelName(s string) string { return strings.TrimSuffix(strings.ToLower(s), ".") }

// modelMatch is the reference name match, by labels.
func modelMatch(r Rule, name string) bool {
	if r.Prefix.IsValid() || r.Name == "" {
		return false
	}
	nl, rl := strings.Split(name, "."), strings.Split(r.Name, ".")
	if !r.Wildcard {
		return slices.Equal(nl, rl)
	}
	return len(nl) > len(rl) && slices.Equal(nl[len(nl)-len(rl):], rl)
}

func anyName(rules []Rule, name string) bool {
	return slices.ContainsFunc(rules, func(r Rule) bool { return modelMatch(r, name) })
}

func anyAddr(rules []Rule, a netip.Addr) bool {
	return slices.ContainsFunc(rules, func(r Rule) bool { return r.Prefix.IsValid() && r.Prefix.Contains(a) })
}

// fuzzRules reads the rules of lines that parse, at most MaxRules.
func fuzzRules(s string) []Rule {
	var rules []Rule
	for _, l := range lines(s) {
		if r, err := ParseRule(l); err == nil && len(rules) < MaxRules {
			rules = append(rules, r)
		}
	}
	return rules
}

// fuzzAddr makes an address of b: 16 bytes or more an IPv6 address,
// fewer an IPv4 address (zero-padded).
func fuzzAddr(b []byte) netip.Addr {
	if len(b) >= 16 {
		return netip.AddrFrom16([16]byte(b[:16]))
	}
	var v4 [4]byte
	copy(v4[:], b)
	return netip.AddrFrom4(v4)
}

var fuzzSite = Site{
	AllowPrivate: prefixes("10.99.0.0/16", "fd00:99::/32", "::ffff:192.168.7.0/120"),
	HostAddrs:    prefixes("198.51.99.7/32", "2a01:4f8::7/128", "10.99.0.1/32"),
}

// FuzzDecide checks Decide's invariants on any policy, destination and
// name: nothing the gate refuses is allowed; none allows nothing; a deny
// match never allows; list allows a name only when an allow rule matches
// it, and a connection without one only when an allow CIDR matches its
// destination; with a name, Decide agrees with Name; a 4-in-6
// destination is decided as its IPv4 one; and it is deterministic.
func FuzzDecide(f *testing.F) {
	f.Add(uint8(List), "pypi.org\n*.github.com\n140.82.112.0/20", "gist.github.com\n140.82.121.0/24", []byte{140, 82, 114, 4}, uint16(443), "api.github.com")
	f.Add(uint8(List), "pypi.org", "", []byte{140, 82, 114, 4}, uint16(22), "")
	f.Add(uint8(All), "", "evil.com\n93.184.0.0/16", []byte{93, 184, 216, 34}, uint16(80), "EVIL.com.")
	f.Add(uint8(All), "", "", []byte{127, 0, 0, 1}, uint16(80), "example.com")
	f.Add(uint8(All), "", "", []byte{10, 99, 1, 1}, uint16(80), "10.99.1.1")
	f.Add(uint8(None), "", "", []byte{1, 1, 1, 1}, uint16(80), "")
	f.Add(uint8(List), "*.github.com", "", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 140, 82, 114, 4}, uint16(443), "[::ffff:140.82.114.4]")
	f.Add(uint8(3), "x.com", "", []byte{1, 1, 1, 1}, uint16(443), "x.com")
	f.Fuzz(func(t *testing.T, mode uint8, allow, deny string, addr []byte, port uint16, name string) {
		p := Policy{Mode: Mode(mode % 4), Allow: fuzzRules(allow), Deny: fuzzRules(deny)}
		a := fuzzAddr(addr)
		c := Conn{Dst: netip.AddrPortFrom(a, port), Name: name}
		d := p.Decide(c, fuzzSite)
		if d != p.Decide(c, fuzzSite) {
			t.Fatal("Decide is not deterministic")
		}
		if !slices.Contains(Reasons, d.Reason) || d.Allow != (d.Reason == ReasonAllowed) {
			t.Fatalf("decision %+v", d)
		}
		if a.Is4() {
			mapped := c
			mapped.Dst = netip.AddrPortFrom(netip.AddrFrom16(a.As16()), port)
			if md := p.Decide(mapped, fuzzSite); md != d {
				t.Fatalf("Decide(%s) = %+v, Decide(%s) = %+v", c.Dst, d, mapped.Dst, md)
			}
		}
		u := a.Unmap()
		n, literal := modelName(name), false
		lit := strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
		if la, err := netip.ParseAddr(lit); err == nil && la.Zone() == "" {
			literal = true
		}
		if !d.Allow {
			// With a name, an address the policy lets out is refused only
			// for the name, as Name refuses it.
			if Gate(u, fuzzSite) && (p.Mode == All || p.Mode == List) && !anyAddr(p.Deny, u) &&
				name != "" && !literal && p.Name(name) {
				t.Fatalf("Decide(%s, %q) = %+v, but Name allows it", c.Dst, name, d)
			}
			return
		}
		switch {
		case !Gate(u, fuzzSite):
			t.Fatalf("allowed %s, which the gate refuses", c.Dst)
		case p.Mode != All && p.Mode != List:
			t.Fatalf("mode %v allowed %s", p.Mode, c.Dst)
		case anyAddr(p.Deny, u):
			t.Fatalf("allowed %s, which a deny CIDR matches", c.Dst)
		case name != "" && !literal && anyName(p.Deny, n):
			t.Fatalf("allowed %q, which a deny rule matches", name)
		case name != "" && !literal && !p.Name(name):
			t.Fatalf("allowed %q, which Name refuses", name)
		case p.Mode == List && (name == "" || literal) && !anyAddr(p.Allow, u):
			t.Fatalf("list allowed %s without a name, which no allow CIDR matches", c.Dst)
		case p.Mode == List && name != "" && !literal && !anyName(p.Allow, n):
			t.Fatalf("list allowed %q, which no allow rule matches", name)
		}
	})
}

// FuzzName checks Name against the reference match: what it allows, no
// deny rule matches and, under list, an allow rule does.
func FuzzName(f *testing.F) {
	f.Add(uint8(List), "pypi.org\n*.github.com", "gist.github.com", "API.github.com.")
	f.Add(uint8(All), "", "*.evil.com", "a.evil.com")
	f.Fuzz(func(t *testing.T, mode uint8, allow, deny, name string) {
		p := Policy{Mode: Mode(mode % 4), Allow: fuzzRules(allow), Deny: fuzzRules(deny)}
		if !p.Name(name) {
			return
		}
		n := modelName(name)
		switch {
		case p.Mode != All && p.Mode != List:
			t.Fatalf("mode %v allowed %q", p.Mode, name)
		case anyName(p.Deny, n):
			t.Fatalf("allowed %q, which a deny rule matches", name)
		case p.Mode == List && !anyName(p.Allow, n):
			t.Fatalf("list allowed %q, which no allow rule matches", name)
		case n == "" || len(n) > MaxName || !isASCII(n):
			t.Fatalf("allowed %q, which is no name", name)
		}
	})
}

// FuzzGate checks the gate against the brief's table: a 4-in-6 address is
// decided as its IPv4 one; an address in a special range, or IPv6 outside
// 2000::/3, is refused; a range in allow_private opens it, and the same
// range among the host's addresses closes it.
func FuzzGate(f *testing.F) {
	f.Add([]byte{127, 0, 0, 1}, uint8(32))
	f.Add([]byte{10, 99, 3, 4}, uint8(8))
	f.Add([]byte{1, 1, 1, 1}, uint8(24))
	f.Add([]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint8(64))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 9}, uint8(120))
	spec := prefixes(specialSpec...)
	f.Fuzz(func(t *testing.T, b []byte, bits uint8) {
		a := fuzzAddr(b)
		u := a.Unmap()
		for _, s := range []Site{{}, fuzzSite} {
			if Gate(a, s) != Gate(u, s) {
				t.Fatalf("Gate(%s) != Gate(%s)", a, u)
			}
			if u.Is4() && Gate(netip.AddrFrom16(u.As16()), s) != Gate(u, s) {
				t.Fatalf("Gate of mapped %s differs", u)
			}
		}
		if Gate(u, Site{}) {
			for _, p := range spec {
				if p.Contains(u) {
					t.Fatalf("Gate(%s) = true, in %s", u, p)
				}
			}
			if u.Is6() && !netip.MustParsePrefix("2000::/3").Contains(u) {
				t.Fatalf("Gate(%s) = true, outside 2000::/3", u)
			}
		}
		p, err := u.Prefix(int(bits) % (u.BitLen() + 1))
		if err != nil {
			t.Fatal(err)
		}
		if !Gate(a, Site{AllowPrivate: []netip.Prefix{p}, HostAddrs: []netip.Prefix{p}}) {
			t.Fatalf("Gate(%s) with allow_private %s = false", a, p)
		}
		if Gate(a, Site{HostAddrs: []netip.Prefix{p}}) {
			t.Fatalf("Gate(%s) with host address %s = true", a, p)
		}
		if a.Is6() && Gate(a.WithZone("eth0"), Site{AllowPrivate: []netip.Prefix{p}}) {
			t.Fatalf("Gate(%s%%eth0) = true", a)
		}
	})
}
