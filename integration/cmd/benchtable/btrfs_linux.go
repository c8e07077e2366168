package main

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// btrfs's snapshot ioctl, called from this process as strata's capture is
// (golang.org/x/sys/unix has no btrfs ioctls): BTRFS_IOC_SNAP_CREATE_V2,
// _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2), from linux/btrfs.h.
const (
	btrfsIocSnapCreateV2 = 0x50009417
	btrfsSubvolRdonly    = 1 << 1
	btrfsSubvolNameMax   = 4039
)

// btrfsVolArgsV2 is struct btrfs_ioctl_vol_args_v2 (4096 bytes).
type btrfsVolArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [btrfsSubvolNameMax + 1]byte
}

// btrfsSnapshot makes a read-only snapshot of the subvolume open at src,
// named name in the directory open at dir.
func btrfsSnapshot(dir, src int, name string) error {
	if len(name) > btrfsSubvolNameMax {
		return fmt.Errorf("btrfs snapshot name %q is too long", name)
	}
	var args btrfsVolArgsV2
	args.fd = int64(src)
	args.flags = btrfsSubvolRdonly
	copy(args.name[:], name)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(dir), btrfsIocSnapCreateV2, uintptr(unsafe.Pointer(&args))); errno != 0 {
		return fmt.Errorf("BTRFS_IOC_SNAP_CREATE_V2 %s: %w", name, errno)
	}
	return nil
}

// The struct's size is the ioctl number's: a layout that drifted would
// be refused by the kernel (or worse), so it fails the build instead.
var _ [4096 - unsafe.Sizeof(btrfsVolArgsV2{})]struct{}
var _ [unsafe.Sizeof(btrfsVolArgsV2{}) - 4096]struct{}
