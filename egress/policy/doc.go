// Package policy decides where a sandbox's network traffic may go: the
// network setting of API.md ("Network") as a pure function of its
// inputs. It does no I/O: no DNS, no sockets, no clock.
//
// # The setting
//
// Parse reads the API's network setting (Spec: egress "all", "none" or
// "list", with allow and deny lists of rules) into a Policy, and
// Policy.Spec writes it back in its canonical form, which Parse reads to
// the same Policy. A rule is one of
//
//   - a host name, "pypi.org": exactly that name;
//   - a wildcard, "*.github.com": any name below github.com at any depth,
//     not github.com itself;
//   - a CIDR, "10.1.0.0/16" or "2001:db8::/32"; a bare address is its /32
//     or /128.
//
// Names are lower case A-labels (a Unicode name is converted with IDNA),
// one trailing dot dropped, at most 253 bytes, labels of 1 to 63 letters,
// digits and inner hyphens, and a last label that is not all digits.
// A CIDR's host bits must be zero. Each list holds at most 256 rules;
// duplicates are dropped. `list` allows only what allow names, and deny
// wins over allow. With `all`, deny still applies (names and CIDRs);
// allow with `all` is refused as meaningless, and so is either list with
// `none`. A missing egress is "all", the API's default. Every broken rule
// is 400 invalid_field naming the field (network.egress, network.allow,
// network.deny) and, for a rule, its index.
//
// # The decisions
//
// Gate says whether an address may ever be dialled on this deployment:
// never loopback, link-local, private, CGNAT, ULA, multicast, reserved,
// documentation, NAT64 or 6to4 ranges, IPv6 outside global unicast, nor
// the host's own addresses, unless the operator's allow_private lists the
// address. A 4-in-6 address is decided as its IPv4 address; an address
// with a zone is refused.
//
// Policy.Name says whether the sandbox may resolve (and reach) a name:
// the DNS server answers NXDOMAIN when it may not. Policy.Decide decides
// one TCP connection from its destination and the name it carries (HTTP
// Host, TLS SNI), with a stable reason. The gate applies first, whatever
// the name. A connection without a name (raw TCP, TLS without SNI) or
// whose name is an address literal is decided by its address: under
// `list` it must match an allow CIDR. Under `all`, a deny name stops the
// connections and DNS queries that carry the name; raw TCP to the name's
// addresses passes unless a deny CIDR covers them.
//
// # What it does not do
//
// It reads no packets: the caller finds the name in the ClientHello or the
// HTTP head and gives it without a port. It resolves nothing: under
// `list`, a connection allowed by its name must be dialled only to
// addresses the host resolved itself for that name (and Gate passed),
// never to the destination the guest chose, or any allowed name would open
// every address.
//
// # Races
//
// A decision is a time-of-check answer. A name can resolve to a gated
// address after it was allowed (DNS rebinding): the caller runs Gate on
// the exact address it dials, at the dial. A policy replaced by PUT
// …/network applies to the connections decided after it; connections
// already open keep the decision they had.
//
// # Why by hand
//
// No library decides this policy: proxies and firewalls (Envoy's RBAC,
// nftables sets, squid ACLs) each cover a part, in their own syntax, and
// none is a Go function that can be fuzzed against its invariants. The
// rules are few and exact, and this package is all of them.
package policy
