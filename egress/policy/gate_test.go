package policy

import (
	"net/netip"
	"testing"
)

// specialSpec is the gate's contract as the brief writes it, kept apart
// from the package's own table so that a slip in one shows in the other.
var specialSpec = []string{
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
	"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
	"::/128", "::1/128", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23",
	"2001:db8::/32", "2002::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
}

// last is the highest address of p.
func last(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func TestGateSpecial(t *testing.T) {
	for _, s := range specialSpec {
		p := netip.MustParsePrefix(s)
		for _, a := range []netip.Addr{p.Addr(), last(p)} {
			if Gate(a, Site{}) {
				t.Errorf("Gate(%s) in %s = true", a, s)
			}
			if a.Is4() && Gate(netip.AddrFrom16(a.As16()), Site{}) {
				t.Errorf("Gate(%s) mapped, in %s = true", a, s)
			}
			// allow_private overrides every special range
			if !Gate(a, Site{AllowPrivate: []netip.Prefix{p}}) {
				t.Errorf("Gate(%s) with allow_private %s = false", a, s)
			}
		}
	}
}

func TestGate(t *testing.T) {
	site := Site{
		AllowPrivate: []netip.Prefix{
			netip.MustParsePrefix("10.99.0.0/16"),
			netip.MustParsePrefix("::ffff:192.168.7.0/120"), // read as 192.168.7.0/24
			netip.MustParsePrefix("fd00:99::/32"),
			netip.MustParsePrefix("8.8.8.8/32"), // already public: no effect
		},
		HostAddrs: []netip.Prefix{
			netip.MustParsePrefix("198.51.99.7/32"),
			netip.MustParsePrefix("::ffff:198.51.99.8/128"),
			netip.MustParsePrefix("2a01:4f8::7/128"),
			netip.MustParsePrefix("10.99.0.1/32"), // allow_private wins
		},
	}
	tests := []struct {
		addr string
		want bool
	}{
		{"1.1.1.1", true},
		{"8.8.8.8", true},
		{"9.255.255.255", true},
		{"11.0.0.0", true},
		{"100.63.255.255", true},
		{"100.128.0.0", true},
		{"172.15.255.255", true},
		{"172.32.0.0", true},
		{"192.0.1.0", true},
		{"192.169.0.0", true},
		{"198.17.255.255", true},
		{"198.20.0.0", true},
		{"223.255.255.255", true},
		{"255.255.255.255", false},
		{"0.0.0.0", false},
		{"::ffff:1.1.1.1", true},
		{"::ffff:127.0.0.1", false},
		{"::ffff:169.254.169.254", false},
		{"2606:4700::1111", true},
		{"2a00:1450:4001::1", true},
		{"2001:200::1", true}, // just past 2001::/23
		{"2001:1ff::1", false},
		{"2001:0:4136:e378::1", false}, // Teredo
		{"2002:7f00:1::1", false},      // 6to4 of 127.0.0.1
		{"64:ff9b::a00:1", false},      // NAT64 of 10.0.0.1
		{"3fff::1", false},             // documentation (RFC 9637)
		{"::a00:1", false},             // IPv4-compatible (deprecated), outside 2000::/3
		{"::ffff:0:a00:1", false},      // IPv4-translated, outside 2000::/3
		{"4000::1", false},             // unassigned
		{"5f00::1", false},             // SRv6 SIDs
		{"fe80::1", false},
		{"fe80::1%eth0", false},
		{"2606:4700::1111%eth0", false},
		{"10.99.3.4", true},
		{"::ffff:10.99.3.4", true},
		{"10.98.0.1", false},
		{"192.168.7.9", true},
		{"192.168.8.9", false},
		{"fd00:99::1", true},
		{"fd00:98::1", false},
		{"198.51.99.7", false},
		{"::ffff:198.51.99.7", false},
		{"198.51.99.8", false},
		{"198.51.99.9", true},
		{"2a01:4f8::7", false},
		{"2a01:4f8::8", true},
		{"10.99.0.1", true},
	}
	for _, tt := range tests {
		if got := Gate(netip.MustParseAddr(tt.addr), site); got != tt.want {
			t.Errorf("Gate(%s) = %v, want %v", tt.addr, got, tt.want)
		}
	}
	if Gate(netip.Addr{}, Site{AllowPrivate: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}) {
		t.Error("Gate(invalid address) = true")
	}
	if Gate(netip.MustParseAddr("fe80::1%eth0"), Site{AllowPrivate: []netip.Prefix{netip.MustParsePrefix("fe80::/10")}}) {
		t.Error("Gate(zoned address in allow_private) = true")
	}
}

// TestSpecialTable pins the package's table to the brief's: every range
// of the brief is in it, and it adds only 3fff::/20.
func TestSpecialTable(t *testing.T) {
	want := prefixes(append(specialSpec, "3fff::/20")...)
	if len(special) != len(want) {
		t.Fatalf("special has %d ranges, want %d", len(special), len(want))
	}
	for _, p := range want {
		found := false
		for _, q := range special {
			found = found || p == q
		}
		if !found {
			t.Errorf("special lacks %s", p)
		}
	}
}
