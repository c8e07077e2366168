// Package vmm runs strata's microVMs: it turns a machine description (a
// Config value) into a QEMU command line, starts QEMU unprivileged and
// confined, finds a running QEMU again after the caller restarts, and
// controls it over QMP (pause, resume, quit, and the raw commands that
// snapshots build on).
//
// The plan is a value: Config.Argv computes the whole command line without
// touching the system, so tests pin it and a snapshot can record it. Every
// machine of one DeviceSet version has the same devices with the same ids
// (a memory snapshot can be restored only into an identical device set);
// paths, sockets and memory size are the only things that differ between
// two machines.
//
// What it does:
//   - ProbeAccel picks the accelerator: KVM only where the CPU has
//     hardware virtualisation (vmx or svm) and /dev/kvm is not the PVM
//     software hypervisor, on which stock kernels do not boot; TCG
//     otherwise, with the multi-threaded TCG and the tsc_early_khz boot
//     parameter microvm needs under it (VMM.md);
//   - Start runs QEMU as the Config's unprivileged uid and gid, in its own
//     session (so that the caller's restart or signal never reaches it),
//     with QEMU's seccomp filter (-sandbox) on, and returns once QMP
//     answers;
//   - nothing is shared with a QEMU by a path its uid can write: Start
//     makes the monitor, channel and console sockets in the machine's
//     control directory (Config.Ctl: root's, 0700, checked and opened
//     without following a link) and hands them to QEMU as listening
//     descriptors; QEMU's working directory (Config.Dir) is the only one
//     its uid owns, and nothing there is opened, dialled or read;
//   - the guest's console is drained from its socket into a capped,
//     rotated log (LogBytes, and one rotated file), QEMU's own output
//     through a pipe into another: a guest or a QEMU that writes without
//     end costs the host a fixed amount of disk and memory;
//   - Attach adopts a QEMU that an earlier process started: it checks the
//     pid is still that QEMU (its start time, its -name, and the run
//     directory as its working directory), checks the control directory,
//     and reconnects QMP and the console's drain;
//   - a Machine's Done channel closes when its QEMU exits, whether it was
//     started or adopted (pidfd);
//   - the disk is a chain of qcow2 layers QEMU never opens by name: Start
//     passes descriptors (-add-fd) and spells the chain out in -blockdev,
//     and QEMU's image locking is off (the caller writes each layer from
//     one machine only);
//   - Save writes a machine's state (live, with the disk's new top put in
//     place at the switch-over, or with the guest stopped), Load reads one
//     into a machine started with Incoming, SwitchDisk freezes the disk's
//     top under a new one; a machine whose RAM is a file (a template, or
//     a fork of one) saves or loads its devices only (x-ignore-shared);
//     RAMRegionOf finds a RAM block's pages in a mapped-ram state, which
//     a fork maps where they are (RAMFile.Offset), and RAM in memory (a
//     memfd, RAMFile.InMemory) is what a template QEMU loads into;
//   - StreamDisk merges the layers under the disk's top into it (a block
//     job), RebaseDisk puts a merged copy of layers, made outside QEMU,
//     in their place under the layer above them (blockdev-reopen, no
//     job); both then drop the replaced layers' nodes and descriptors;
//   - frozen is read-only to QEMU: after a switch, the read-write
//     descriptor of every layer but the top leaves QEMU (remove-fd), and
//     a fork maps its template's RAM from a read-only descriptor;
//   - the monitor is bounded: a message longer than MaxQMPLine closes it,
//     and every command has a deadline (QMPTimeout when the caller's ctx
//     has none).
//
// What it does not do: it does not create disks, states, run or control
// directories (the caller owns their layout and ownership), does not speak
// to the guest (package channel does, over the socket Config.ChannelSocket
// names), and keeps no state on disk but the two logs.
//
// The QMP client is a small one of our own rather than
// digitalocean/go-qemu: that client's event channel stalls replies unless
// it is drained, its line scanner stops at 64 KiB, and what is needed here
// (commands with ids, events on a channel that never blocks replies, file
// descriptors with getfd) is about two hundred lines.
//
// Races: a Machine's methods may be called from many goroutines; QMP
// commands are sent one at a time in order. Attach trusts a pid only after
// comparing its start time, so a reused pid is never taken for a QEMU.
// The control directory is checked on its descriptor and the sockets are
// bound through it; its parent is root's, so no one else can swap it
// between the check and a later dial.
package vmm
