package sandbox

import (
	"context"
	"log/slog"
	"net"
	"time"

	"strata/egress"
	"strata/vmm"
)

// Config configures a Manager. Dir, Image, Driver, Accel and Records are
// required.
type Config struct {
	// Dir holds one directory per sandbox (its disk and run files). It
	// and its parents must be traversable by the sandboxes' uids, owned by
	// root (or this process's uid) and not writable by group or others
	// (sticky parents excepted): New checks both (checkOwnership).
	Dir     string
	Image   Image
	Driver  vmm.Driver
	Accel   vmm.Probe
	Records Records
	Log     *slog.Logger
	// UIDBase is the first id of this deployment's range (ids.go): its
	// sandboxes' QEMUs get the lowest uid (and gid) free from there, its
	// templates' groups count from UIDBase+IDRangeSize/2. Zero: the
	// range the deployment already claims, or the first free one from
	// DefaultUIDBase. A range another deployment on the host claims, or
	// that overlaps the host's own ids, is refused.
	UIDBase uint32
	// IDClaims is the host-wide file of the deployments' claims of id
	// ranges (DefaultIDClaims when empty); one for every deployment of
	// the host.
	IDClaims string
	// BootTimeout bounds a boot to guestd answering (120 s); StopTimeout
	// a clean shutdown before QEMU is killed (10 s).
	BootTimeout, StopTimeout time.Duration
	// ReserveMiB is host memory kept free beyond the sandboxes' own
	// (512 MiB when zero): a create that would cut into it is refused
	// with host_capacity.
	ReserveMiB int
	// Booted is called once guestd answers after each boot, before the
	// sandbox is running (hostproxy hands the guest its credentials).
	Booted func(ctx context.Context, r Record) error
	// Egress is the deployment's network settings for every sandbox
	// (package egress); nil: sandboxes' NICs are connected to nothing.
	Egress *egress.Config
	// ServeGuest serves the calls processes in the sandbox make through
	// its channel, until ln is closed.
	ServeGuest func(id string, ln net.Listener)
	// MemAvailable and MemTotal read the host's available and total
	// memory in MiB (/proc/meminfo when nil).
	MemAvailable, MemTotal func() (int, error)
	// Overcommit is the ratio of the sandboxes' memory to the host's
	// (MemTotal less ReserveMiB) that admission allows (1 when zero:
	// none).
	Overcommit float64
	// StoreReserveBytes is the free space kept on the store's filesystem
	// (DefaultStoreReserveBytes when zero): an operation that would cut
	// into it answers insufficient_storage.
	StoreReserveBytes int64
	// DiskOvercommit is the ratio of what the disks of the sandboxes with
	// a QEMU may still grow by (each its disk_gib less its top's
	// allocated bytes) to the store's free space less StoreReserveBytes
	// that admission allows at create, fork and start
	// (DefaultDiskOvercommit when zero).
	DiskOvercommit float64
	// SnapshotQuotaBytes caps the bytes of one sandbox's snapshots
	// (DefaultSnapshotQuotaFactor × its memory and disk when zero).
	SnapshotQuotaBytes int64
	// QEMUVersion is the host's `qemu --version` (vmm.QEMU.Version): a
	// memory snapshot records it and loads only into the same.
	QEMUVersion string
	// Heartbeat is how often the host pings each guest through its
	// channel (1 s when zero; negative: never; five times less often
	// while the channel is quiet: package channel), and PingTimeout how long
	// a ping of a guest whose CPUs run may go unanswered before its
	// channel is reset and the sandbox is unresponsive (3 s when zero).
	Heartbeat, PingTimeout time.Duration
	// UnresponsiveLimit is how long a sandbox may stay unresponsive
	// before its QEMU is stopped and it is put in error (3 minutes when
	// zero).
	UnresponsiveLimit time.Duration
	// Pool is how many sandboxes of PoolShape are kept booted ahead, of
	// no account, for creates of that shape to take (pool.go); 0: none.
	// NewID names them (hostproxy's ids).
	Pool      int
	PoolShape Shape
	NewID     func() (string, error)
	// ForksAhead is how many snapshots, the last forked host-wide, keep
	// one fork made ahead for the next fork to take (forkahead.go); 0: none.
	// NewID names them.
	ForksAhead int
	// LazyTemplates makes a memory snapshot's template at its first fork
	// instead of as soon as the snapshot is taken (templateLater): no
	// template QEMU for snapshots never forked, a first fork slower by
	// the template's load.
	LazyTemplates bool
}
