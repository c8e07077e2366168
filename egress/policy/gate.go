package policy

import "net/netip"

// Site is what the deployment adds to every sandbox's policy.
type Site struct {
	// AllowPrivate are ranges a sandbox may reach although Gate would
	// refuse them (vms.egress.allow_private): the deployment's own
	// services, test hosts. They override the special ranges and the
	// host's own addresses.
	AllowPrivate []netip.Prefix
	// HostAddrs are the host's own addresses, which no sandbox reaches
	// unless AllowPrivate lists them.
	HostAddrs []netip.Prefix
}

// special are the ranges no sandbox reaches unless the site allows them:
// IANA's special-purpose registries, less what is globally reachable, and
// multicast, class E and the limited broadcast. IPv6 outside 2000::/3 is
// refused as well (see Gate); its entries here say why.
var special = prefixes(
	// IPv4
	"0.0.0.0/8",       // "this network"
	"10.0.0.0/8",      // private (RFC 1918)
	"100.64.0.0/10",   // shared address space, CGNAT (RFC 6598)
	"127.0.0.0/8",     // loopback
	"169.254.0.0/16",  // link-local, cloud metadata
	"172.16.0.0/12",   // private (RFC 1918)
	"192.0.0.0/24",    // IETF protocol assignments
	"192.0.2.0/24",    // documentation (TEST-NET-1)
	"192.88.99.0/24",  // 6to4 relay anycast (deprecated)
	"192.168.0.0/16",  // private (RFC 1918)
	"198.18.0.0/15",   // benchmarking
	"198.51.100.0/24", // documentation (TEST-NET-2)
	"203.0.113.0/24",  // documentation (TEST-NET-3)
	"224.0.0.0/4",     // multicast
	"240.0.0.0/4",     // reserved, and 255.255.255.255
	// IPv6 (::ffff:0:0/96 is decided as IPv4: Gate unmaps first)
	"::/128",         // unspecified
	"::1/128",        // loopback
	"64:ff9b::/96",   // NAT64, which would wrap any IPv4 address
	"64:ff9b:1::/48", // local-use NAT64
	"100::/64",       // discard-only
	"2001::/23",      // IETF protocol assignments, Teredo (2001::/32)
	"2001:db8::/32",  // documentation
	"2002::/16",      // 6to4, which would wrap any IPv4 address
	"3fff::/20",      // documentation (RFC 9637)
	"fc00::/7",       // unique local (ULA)
	"fe80::/10",      // link-local
	"fec0::/10",      // site-local (deprecated)
	"ff00::/8",       // multicast
)

// globalUnicast is the only IPv6 range IANA allocates for global unicast.
var globalUnicast = netip.MustParsePrefix("2000::/3")

// Gate tells whether a sandbox may ever dial a: not when it is invalid or
// has a zone; else, a 4-in-6 address decided as its IPv4 address, yes
// when site.AllowPrivate contains it, and no when it is in a special range,
// is IPv6 outside 2000::/3, or is in site.HostAddrs.
func Gate(a netip.Addr, site Site) bool {
	if !a.IsValid() || a.Zone() != "" {
		return false
	}
	a = a.Unmap()
	if contains(site.AllowPrivate, a) {
		return true
	}
	if a.Is6() && !globalUnicast.Contains(a) {
		return false
	}
	return !contains(special, a) && !contains(site.HostAddrs, a)
}

// contains tells whether any of ps contains a, an unmapped address. A
// 4-in-6 prefix of the site's (::ffff:10.0.0.0/104) is read as its IPv4
// prefix, since addresses are unmapped before they are matched.
func contains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func prefixes(ss ...string) []netip.Prefix {
	ps := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		ps[i] = netip.MustParsePrefix(s)
	}
	return ps
}
