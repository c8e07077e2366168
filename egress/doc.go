// Package egress carries one sandbox's network traffic out through the
// host, under the sandbox's policy (package policy).
//
// The guest has one NIC (virtio-net). Its only backend is a stream
// socket in the machine's control directory (QEMU's -netdev stream,
// frames with a 4-byte big-endian length before each); Net is the other
// end: a TCP/IP stack in this process (gVisor's netstack), on a network of
// its own with the guest at GuestAddr, the gateway at Gateway and the DNS
// server at DNSAddr. Nothing the guest sends reaches the host's kernel as
// a packet: the stack terminates the guest's TCP connections and Net dials
// new ones from the host, each decided by the policy first.
//
// What it does:
//   - a TCP connection the guest opens to any address is decided by its
//     destination (policy.Decide). One that the policy cannot decide
//     without a name is accepted, and its first bytes read for the name
//     it carries: the SNI of a TLS ClientHello or the Host of an HTTP
//     request (Sniff), for at most SniffTimeout and SniffBytes. Under
//     list, that is only a destination this network's DNS server gave
//     the guest for an allowed name (answered); any other is refused at
//     once. Under a policy that denies names, a connection its address
//     allows waits nameWait for a first byte, and is carried without a
//     name when none comes. After the read the policy in force decides
//     again, whole. A connection allowed by its name under list is
//     dialled at the addresses the host resolves for that name that the
//     policy allows for it, never at the destination the guest chose;
//     every dial passes policy.Gate again on the exact address. The
//     guest's own network is never dialled: TCP to DNSAddr:53 is the DNS
//     server, the rest is refused. A refused connection is reset at once
//     (the guest sees ECONNREFUSED, or a reset after its first bytes),
//     never left to time out;
//   - DNS on DNSAddr:53, over UDP and TCP: a question about a name the
//     policy refuses (policy.Name), a single-label name, one under
//     .local, or a reverse lookup of an address the gate refuses is
//     answered NXDOMAIN; any other is forwarded to the host's resolver
//     (Config.Resolver) with an id of its own, and its answer relayed
//     without the addresses the gate refuses. UDP to anything else and
//     IPv6 are not carried; an ICMP echo is answered by the stack itself,
//     whatever its destination (a ping says nothing of reachability);
//   - SetPolicy replaces the policy for the connections and questions
//     decided after it; open connections keep theirs;
//   - Usage counts bytes out (guest to the world) and in, connections
//     carried, and refusals.
//
// Bounds (a guest is hostile): frames are at most MaxFrame bytes, else
// the link is dropped (Err says why); at most Config.MaxConns
// connections are open or being dialled at a time, at most
// Config.ConnsPerSecond are opened per second, and at most Shared's bound
// on the whole host (more are reset); at most maxPending handshakes wait
// in the stack; a closed connection's endpoint lingers 5 s; at most
// dnsInFlight questions are forwarded at a time (more are dropped, as a
// loaded resolver would); each TCP connection's buffers are bounded by
// the stack's buffer sizes (bufferBytes); bytes per second through all
// of a sandbox's connections are at most Config.BytesPerSecond when set;
// the addresses remembered for names are at most maxSeen.
//
// What it does not do: carry UDP other than DNS; listen for connections
// into the guest (ports are carried over the channel); touch the host's
// firewall or routes. The host dials from its own network namespace, as
// any process of hostproxy's would: policy.Gate is what keeps the host's
// own addresses and private networks out of reach.
//
// Why a TCP/IP stack in the host process: QEMU's user networking (slirp)
// and passt dial from QEMU's (or passt's) own process, which in strata
// runs in an empty network namespace, and neither decides by name; a tap
// device with nftables needs the host's network configured per sandbox
// and sees no names. gVisor's netstack is a well-kept Go TCP/IP stack
// (used by gVisor, Tailscale and gvisor-tap-vsock) that hands each new
// connection to a function, which is where the policy is applied.
package egress
