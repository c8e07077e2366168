// Package holders finds the processes that hold a directory: those whose
// working directory, root, executable, open files or mapped files are in
// it, and those whose mount namespace holds a mount of it. Its answer backs
// the 409 directory_busy error (BusyError) that tells a client which
// processes to stop before a checkpoint is taken or restored.
//
// # What it matches
//
// Busy is a kernel fact, not a path fact, so for a managed root
// (Target.WholeDev) Scanner.Holders matches the overlay superblock's device
// number, not path strings. It reads, for every process
// but the caller: the cwd, root and exe links and every fd/N link (stat
// through the link, then readlink only when the device alone does not
// decide), the maps file, and, for a process in another mount namespace
// (ns/mnt differs from the caller's), its mountinfo. Kinds: cwd, root, fd,
// mmap (a mapped file, the executable included), mount-namespace, and
// unknown when an entry exists but cannot be read (EACCES, ELOOP...); ENOENT
// and ESRCH mean the process or the fd went away and are skipped.
//
// The mount-namespace rule: for a managed root, any mount whose
// major:minor is Dev (a copy of the overlay in another namespace keeps the
// superblock alive and writable after ours is swapped). For a plain
// directory, a mount whose mount point is at or under Path, or a bind mount
// of it (same device, mount root at or under the directory's path inside
// its filesystem). A namespace cloned from ours merely sees the directory
// through its copy of "/" and is not counted: its processes are judged by
// their cwd, fds and maps like everyone else's.
//
// # Kernel facts
//
// Measured on Linux 6.18 as root in a private mount namespace, with an
// overlay (lowerdir, upperdir, workdir on ext4) mounted at /tmp/x/m:
//
//   - cwd in the overlay: /proc/PID/cwd reads /tmp/x/m and stats to the
//     overlay's st_dev (0:38), not ext4's (254:0). Same for root (chroot
//     into the overlay) and exe (a binary run from the overlay).
//   - An open fd: fd/N reads the merged path and stats to the overlay's
//     st_dev, with the layer file's inode number.
//   - mmap, even after the fd is closed: maps prints the merged path and
//     the overlay's device ("00:26", hex; mountinfo prints the same device
//     as "0:38", decimal), with the layer file's inode number. map_files/*
//     reads the merged path and stat -L gives the overlay's st_dev too, so
//     maps (one read per process) is used instead of map_files (one stat
//     per mapping). Older kernels print the layer file's device in maps
//     with the merged path (4.19 until the backing-file rework of 6.8 or
//     so), and before 4.19 the layer file's own path; not measured here,
//     hence the path and BackingDirs rules of the mmap match.
//   - A process started with unshare -m after the mount: its
//     /proc/PID/mountinfo lists the overlay with the same 0:38; its cwd in
//     the overlay reads as the path in its own namespace.
//   - After umount -l in our namespace, the links and maps of the
//     remaining users read as paths relative to the detached mount ("/sub",
//     "/big") but still stat to the overlay's device: matching by path
//     alone would miss them, matching by device does not.
//   - umount and mount -o remount,ro fail with EBUSY while such holders
//     exist (for remount,ro: a file open for writing, mapped shared).
//   - In this project's development sandboxes, pid 1 (the sandbox's own
//     supervisor) cannot be inspected even by root: cwd, root, exe, ns/mnt,
//     maps and every fd/N give EACCES, while comm, the fd listing and
//     mountinfo read fine. Every scan there reports it as "unknown"; what
//     to make of that is the caller's decision (Holders reports, it does
//     not judge).
//
// # What it does not do
//
// It never pauses, kills or signals a process, and it does not change the
// filesystem. It scans processes, not threads: a thread with its own cwd
// or fd table (unshare(CLONE_FS or CLONE_FILES)) is judged by its
// process's. It reads the /proc of the caller's pid namespace only. Paths
// that do not resolve in the caller's namespace (other namespaces,
// detached mounts) are matched by device only, which for a plain directory
// (no whole device) means they can be missed.
//
// # Races: the scan is advisory
//
// A scan is a time-of-check answer: a process can open a file in the
// directory, chdir into it or map a file from it right after the scan said
// it was idle, and one that exited a moment ago may still be listed. The
// scan only gives the client a useful 409 with the list of holders. The
// real gates are the kernel's, and they are atomic: remount,ro fails with
// EBUSY while a file is open for writing (a writable shared mapping too),
// and a non-lazy umount fails with EBUSY while anything uses the mount.
// Callers must rely on those, and treat EBUSY from them as directory_busy
// even when the scan found nobody.
package holders
