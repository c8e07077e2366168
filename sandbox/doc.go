// Package sandbox runs sandboxes as microVMs on this host: their records,
// their disks and run directories, and the lifecycle that moves them
// between states (creating, running, unresponsive, pausing, paused,
// resuming, stopping, stopped, error, destroying, destroyed).
//
// A sandbox is one QEMU machine (package vmm) booted from the guest image,
// with its own copy-on-write disk over the image's shared read-only base
// (a chain of qcow2 layers in the host's store: a create copies nothing),
// guestd inside it, and one host↔guest channel (package channel) that
// carries both the host's calls to guestd and the guest's calls to the
// public API.
//
// What it does:
//   - Create, Start, Stop, Pause, Resume and Delete change a sandbox's
//     state in its record first (Records, which the caller keeps: hostproxy's
//     registry), then do the work. Create, Start, Pause and Resume answer
//     at once with the transitional state and finish in the background;
//     Stop and Delete answer once done;
//   - a sandbox is running once guestd answers through the channel, which
//     it does only after it has recovered its store: that answer is the
//     guest's signal, not a timed poll;
//   - a guest whose CPUs run but that stops answering the channel's
//     heartbeat (its guestd died) is unresponsive until its new guestd
//     answers, then resynced, given its credentials again and running
//     (unresponsive.go); past UnresponsiveLimit its QEMU is stopped and
//     it is in error. The manager's own calls to guestd go through
//     guestclient, bounded like every call to a guest;
//   - a QEMU that exits when nobody asked it to puts its sandbox in error,
//     with a sentence saying so; Start boots it again from its disk;
//   - Stop asks guestd for a clean shutdown (it syncs, init unmounts and
//     powers off) and kills QEMU if it has not exited within StopTimeout;
//   - Recover, at start, adopts every QEMU an earlier process left running
//     (restarting the caller never kills a sandbox), finishes or undoes
//     the transitions a crash interrupted, and kills any QEMU of this
//     state directory that no record claims;
//   - each QEMU runs as a uid and gid of its own (UIDBase and up), owning
//     only its run directory; its disk's layers are root's, handed to it
//     as descriptors;
//   - Snapshot keeps a sandbox whole (memory, devices and disk, copied
//     while the guest runs and finished in a pause of about 100 ms, its
//     disk switched to a new top in that pause; mapped-ram states) or its
//     disk only; Restore puts it back, keeping what it was as an automatic
//     snapshot, written after the restored guest runs; Fork makes a new sandbox from a snapshot, through the
//     snapshot's template: forks map the snapshot's own mapped-ram state
//     copy-on-write and load the devices the template saved apart, made
//     as soon as the snapshot is taken (template.go); Pause saves the
//     memory and ends QEMU, and the paused state is made a template in
//     the background (pausetemplate.go); Resume maps it and loads the
//     devices, or loads the whole state when it has no template yet. A
//     machine that maps its RAM from a file has the file read into the
//     page cache once it runs (warmRAM), so that its saves read no page
//     from the disk. Limits, retention and pins are per sandbox;
//   - a pool (pool.go, Config.Pool) keeps sandboxes of one shape booted
//     ahead, of no account; Create of that shape takes one (Records.Take)
//     and answers it running, and the pool boots the next;
//   - forks made ahead (forkahead.go, Config.ForksAhead): for the
//     snapshots forked last, one fork is made, run until guestd answers,
//     and its CPUs stopped; Fork of that snapshot takes it (Records.Take)
//     and answers it running, and the next is made. An operation that
//     admission refuses drops them all and tries again (giveWay);
//   - the host's store (store.go) keeps every layer, state and template
//     RAM file while a record names it, and collect deletes the rest, so
//     forks never depend on their source, and Check (CheckStore for a
//     stopped host) compares the store with the records.
//
// What it does not do: HTTP, authentication, or anything inside the guest
// (guestd's API is reached through Dial).
//
// Races: lifecycle operations on one sandbox (snapshots and restores
// included) are serialized; a second one while a transition is under way
// is refused with operation_in_progress. Deleting, pinning and listing
// snapshots take no part in that: they touch records only, and the
// store's lock keeps collect from taking a file an operation is about to
// name.
// The record is written before each step, so a crash leaves a state that
// Recover finishes: a sandbox is never left running with no record, and a
// record never names a QEMU that is not its own (Attach checks).
package sandbox
