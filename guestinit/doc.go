// Package guestinit is strata-init, PID 1 of a strata microVM. It brings
// the guest from the kernel's hand-off to a supervised guestd, and takes it
// down again when asked.
//
// # Stages
//
// Stage 1 runs in the initramfs, where strata-init is /init (it runs when
// "/" is the kernel's rootfs, a ramfs or tmpfs): it mounts /proc, /sys and
// devtmpfs on /dev, loads the kernel modules that /modules.order lists
// (absolute paths, one a line, in dependency order; EEXIST is success, any
// other failure is printed and the boot goes on: a missing driver shows up
// as the root disk not appearing), mounts the root disk (strata.root=,
// default /dev/vda, XFS, read-write) on /newroot, mounts a tmpfs on
// /newroot/run and copies /guestd from the initramfs to
// /run/strata/bin/guestd, so the guestd that runs is the one the image was
// built with, never a file on the (writable) disk; /createos goes to
// /run/strata/bin/createos the same way, and /usr/local/bin/createos (on
// every guest shell's PATH) is made a link to it; the Python SDK's
// package (/python/strata) goes to /run/strata/python/strata, linked from
// each system Python's /usr/local/lib/python3.N/dist-packages/strata. It then frees the
// initramfs copies, moves /dev, /proc and /sys into the new root and
// switches to it (MS_MOVE of /newroot onto "/", chroot ".").
//
// Stage 2 runs on the real root (the same process, no exec): it mounts
// devpts, /dev/shm and cgroup2 (/tmp stays on the disk), links
// /dev/virtio-ports/<name> to each virtio-serial port (there is no udev),
// sets the hostname (strata.hostname=, default "sandbox"), brings up lo,
// grows the root XFS to the whole disk when the disk is larger (the
// kernel's XFS_IOC_FSGROWFSDATA, as xfs_growfs does, without running it),
// prints one self-check line ("strata-init: check root=xfs reflink=1 …")
// and starts guestd (/run/strata/bin/guestd --vm, console
// output, a fixed PATH and HOME=/root) in its own session, printing
// "strata-init: guestd started" the first time. A guestd that exits is
// restarted after 1 s, each time logged on the console. Every child,
// guestd's orphans included, is reaped.
//
// # Shutdown
//
// SIGTERM (guestd sends it when the host asks for a clean stop), SIGINT
// (ctrl-alt-del) or SIGPWR: guestd gets SIGTERM and up to 8 s to exit,
// then every other process gets SIGTERM, 2 s later SIGKILL; strata-init
// syncs, unmounts every mount in the reverse of mount order, remounts "/"
// read-only and reboots (LINUX_REBOOT_CMD_RESTART). The VM runs with
// -no-reboot and reboot=t, so the restart ends QEMU. PID 1 never exits
// (that panics the kernel): a fatal error is printed and ends in the same
// reboot, after a sync.
//
// # Kernel command line
//
// strata.hostname=NAME (an invalid name falls back to "sandbox" with a
// warning), strata.root=DEVICE, and for tests strata.check=1 (run sh, git
// and python3 once and print their answers on a "strata-init: check"
// line) or strata.check=shutdown (the same, then a clean shutdown as if
// SIGTERM had come).
//
// # What is tested where
//
// The command-line parser, the modules.order parser, the mount plans and
// the unmount order are pure functions with table and fuzz tests. The
// reaper and the supervisor run in tests with the test process as a child
// subreaper. The syscalls of the two stages are exercised only by booting
// the image (guestimage.TestBuildAndBoot).
//
// # Races
//
// The reaper reaps every child with wait4(-1): a child that strata-init
// itself waits for is registered under the reaper's lock before the fork
// returns, so its status cannot be taken by the reaper loop first. Nothing
// in strata-init uses os/exec's Wait after the reaper starts.
package guestinit
