// Package channel is the host↔guest channel of a microVM: one byte stream
// per machine (a virtio-serial port, whose host end is a unix socket that
// QEMU serves), carrying many independent streams through a yamux session.
//
// The host end dials the socket and runs the yamux client; the guest end
// opens the port device and runs the yamux server. Either end opens
// streams: the host's carry calls to guestd's local API (HTTP), the
// guest's carry calls from processes in the sandbox to the public API,
// which the host serves as coming from that sandbox.
//
// What it does:
//   - Host keeps a session up for as long as it is open: when the stream
//     breaks (the guest rebooted, QEMU restored a snapshot, the guest end
//     reset after a protocol error), it dials again and starts a new
//     session; Open waits for one up to its context;
//   - Guest opens the port by its name (/sys/class/virtio-ports/*/name; no
//     udev is needed), and reopens it whenever it reads EOF, which is what
//     the port gives while no host end is connected; while none is, it
//     keeps the port open and sleeps until the kernel's SIGIO says a
//     host end connected (Port.AwaitHost: each open, close and read is a
//     message to QEMU, and a guest whose hostproxy is stopped must cost
//     the host nothing);
//   - both ends are net.Listeners of the streams the other end opens.
//
// What it does not do: it does not speak HTTP, authenticate, or time
// requests out (a stream is a net.Conn: callers set deadlines).
// yamux's keep-alives are off: a paused guest must not have its session
// closed under it. The host's own heartbeat (HostConfig.Heartbeat) pings
// the guest one ping at a time, five times less often while no stream
// has been opened for ten heartbeats (each ping wakes a guest that may
// be idle, which under TCG costs its QEMU host CPU); a ping unanswered while the guest's CPUs
// run (HostConfig.Stalled asks; a look that fails or is slow counts as
// stopped a few rounds in a row at most) resets the session, for a guestd that was
// killed and started again waits for a handshake that a live session
// never sends. A dead QEMU is seen by its process ending.
//
// The guest is untrusted. On the host end a guard (guard.go) reads every
// frame the guest sends before yamux does: at most one inbound ping is
// with yamux at a time (the rest are dropped), a stream the host closes is
// forgotten by yamux at once, and bytes that are not yamux frames end the
// session. What one guest can make the host's end hold is then fixed: one
// session, its guard's 64 KiB read-ahead, at most 16 streams waiting to be
// accepted, and a 256 KiB window on each stream open (docs/design.md).
//
// Every session starts with a handshake (handshake.go): the guest starts
// its session only on a HELLO from the host, answered READY, then GO.
// A memory snapshot loaded into a new QEMU leaves the guest in its old
// session without an EOF; the HELLO ends that session.
//
// Races: a port has one host end at a time. Bytes written by one session
// and read by the next (a reconnection in flight) fail yamux's framing,
// which ends that session on both sides; the next one starts clean.
// Streams of an ended session fail with an error, and are never moved to
// the next session.
package channel
