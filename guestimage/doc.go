// Package guestimage builds the guest image of strata's microVM
// sandboxes: an uncompressed kernel (vmlinux), an initramfs holding
// strata-init, guestd, createos, the Python SDK's package (python.go) and
// the kernel modules the boot needs, and a root
// disk (qcow2, XFS with reflink, a Debian userland). It builds; it does
// not boot (the VMM does, from image.json).
//
// # Cache
//
// Images are built once and cached outside the repository, in two levels
// so that a code change does not redo the Debian part:
//
//	<cache>/base/<basekey>/    vmlinux, base.qcow2, modules/*.ko, modules.order, base.json
//	<cache>/images/<imagekey>/ initramfs.cpio, image.json
//
// basekey is the sha256 of every input of the base (LayoutVersion, the
// Debian suite, the package list, the kernel package's exact name and
// version, the wanted modules, the disk size); imagekey is the sha256 of
// the basekey, LayoutVersion, the sha256 of the guestd, strata-init and
// createos binaries and the digest of the Python package's files. An image directory holds only what differs per image: its
// image.json names the base's vmlinux and base.qcow2 by absolute path (no
// copies). Everything is world-readable (0644 files, 0755 directories):
// QEMU runs as an unprivileged user.
//
// The kernel package is resolved from the host's apt lists (apt-cache
// policy and show: no apt-get update), so the basekey changes, and a new
// base is built, when the host's lists offer a newer kernel. The userland
// is whatever the suite (with its -updates and -security) holds at the
// first build of a basekey: a base is a snapshot, not a reproducible
// build.
//
// # Crash safety and concurrency
//
// Each level is built in <level>/.tmp-* beside its final directory and
// renamed into place: a directory without its .json never exists under
// its key, so "the .json is there" means "complete". Builds take an
// exclusive flock on <cache>/.lock, so two builds wait for each other;
// stale .tmp-* directories are removed under that lock. The root disk is
// filled through a loop mount made in a private mount namespace (one
// locked OS thread), so the mount cannot leak onto the host and
// disappears with the process even when it is killed.
//
// A cache hit takes no lock: it touches its image directory (the mtime
// orders images for pruning) and returns. A build keeps the 3 most
// recently built or used image directories and deletes the others; a
// concurrent hit on an image that is being pruned is possible only after
// three newer images were built in between. Bases are never deleted: a
// sandbox's disk is a qcow2 overlay whose backing file is base.qcow2.
//
// # What is tested where
//
// Keys, the apt output parsers, the bzImage payload finder, the
// module-order computation and the cpio writer are pure and unit-tested
// (with fuzz targets for the parsers). TestBuildAndBoot, as root, builds
// into $STRATA_IMAGE_CACHE (default /var/cache/strata) and boots the
// image under QEMU.
package guestimage
