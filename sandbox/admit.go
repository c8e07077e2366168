package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
)

// Admission of host resources: an operation that would take the host's
// store or memory past what it may is refused before anything changes.
//
// Storage: the free space of the store's filesystem (statfs, blocks
// available to others) must hold what the operation writes plus
// StoreReserveBytes: a memory snapshot or a pause its guest's whole RAM,
// a fork of a memory snapshot with no template yet the template's
// devices and, unless forks map the snapshot's state, its RAM,
// and every new disk layer layerBytes of metadata. Snapshots of one
// sandbox are capped in bytes too (SnapshotQuotaBytes).
//
// Disks: a guest's disk grows into the store as it writes, up to its
// disk_gib; QEMU then stops every guest whose write finds the store full
// (io-error). At create, fork and start, what the disks of the sandboxes
// with a QEMU may still grow by (each disk_gib less its top's allocated
// bytes, at least 0), the new one's included, may not pass the store's
// free space less StoreReserveBytes, times DiskOvercommit.
//
// Memory: every sandbox that has a QEMU (running, booting, paused with
// its QEMU) counts with its whole memory_mib plus QEMUOverheadMiB, and
// the sum may not pass (MemTotal − ReserveMiB) × Overcommit; the host's
// available memory must also hold a new guest and ReserveMiB beyond the
// boots under way (their guests do not show in it yet).

// layerBytes is what a new, empty qcow2 layer takes at most: its header,
// tables and refcounts (a 64 GiB one takes 256 KiB).
const layerBytes = 1 << 20

// QEMUOverheadMiB is what one QEMU takes beyond its guest's memory
// (its own code and heap, TCG's translation cache in use, device
// buffers), as memory admission counts it.
const QEMUOverheadMiB = 64

// The defaults of the admission settings.
const (
	DefaultStoreReserveBytes = 1 << 30
	// DefaultSnapshotQuotaFactor × a sandbox's memory and disk is its
	// snapshots' quota unless SnapshotQuotaBytes says otherwise.
	DefaultSnapshotQuotaFactor = 8
	// DefaultDiskOvercommit lets the disks' growth be 4 × the store's
	// free space: guests rarely fill their disks, and at 1 a store of
	// 80 GB would hold only 19 sandboxes of 4 GiB however little they
	// write. 1 makes a full store impossible.
	DefaultDiskOvercommit = 4
)

var (
	ErrInsufficientStorage = fault.New(fault.InsufficientStorage, "insufficient_storage", "not enough free space on the host's store to proceed safely; delete snapshots or sandboxes")
	ErrSnapshotQuota       = fault.New(fault.Conflict, "snapshot_quota_exceeded", "the sandbox's snapshots take as many bytes as it may have; delete some first")
)

// admitStorage is the storage rule: need bytes written, free available,
// reserve kept.
func admitStorage(need, free, reserve int64) error {
	if need+reserve > free {
		return ErrInsufficientStorage.With("needed_bytes", need).With("reserve_bytes", reserve).With("free_bytes", free)
	}
	return nil
}

// checkStorage refuses an operation that writes need bytes into the store
// when its filesystem cannot hold them and the reserve.
func (m *Manager) checkStorage(need int64) error {
	free, err := m.storeFree()
	if err != nil {
		return err
	}
	return admitStorage(need, free, m.cfg.StoreReserveBytes)
}

// storeFree is the space the store's filesystem has for others.
func (m *Manager) storeFree() (int64, error) {
	var st unix.Statfs_t
	err := unix.Statfs(m.storeDir(), &st)
	if errors.Is(err, unix.ENOENT) {
		err = unix.Statfs(m.cfg.Dir, &st)
	}
	if err != nil {
		return 0, fmt.Errorf("statfs of the store: %w", err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// storageFault turns a write that ran out of space after its admission
// (another writer took the room) into insufficient_storage.
func (m *Manager) storageFault(err error) error {
	if err == nil || fault.As(err) != nil || !errors.Is(err, syscall.ENOSPC) {
		return err
	}
	free, _ := m.storeFree()
	return ErrInsufficientStorage.With("free_bytes", free).Wrap(err)
}

// saveFault is storageFault for a failed save of need bytes: QEMU may
// report a full disk in words that vmm did not recognise, or fail in
// another way because the store filled under it, so after any failed
// save the store's free space is checked again, and a store left under
// its reserve answers insufficient_storage.
func (m *Manager) saveFault(err error, need int64) error {
	if err == nil || fault.As(err) != nil {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) {
		return m.storageFault(err)
	}
	free, ferr := m.storeFree()
	if ferr != nil || !shortAfterSave(free, m.cfg.StoreReserveBytes) {
		return err
	}
	return ErrInsufficientStorage.With("needed_bytes", need).With("reserve_bytes", m.cfg.StoreReserveBytes).With("free_bytes", free).Wrap(err)
}

// shortAfterSave is the rule saveFault applies: a store whose free space
// is under its reserve is why a save failed.
func shortAfterSave(free, reserve int64) bool { return free < reserve }

// diskGrowth is what a disk of diskBytes whose top has allocated bytes
// may still take from the store.
func diskGrowth(diskBytes, allocated int64) int64 { return max(diskBytes-allocated, 0) }

// admitDisks is the disks' rule: others' growth and the new one's (want)
// within (free − reserve) × overcommit.
func admitDisks(others, want, free, reserve int64, overcommit float64) error {
	limit := float64(max(free-reserve, 0)) * overcommit
	if float64(others)+float64(want) > limit {
		return ErrInsufficientStorage.With("needed_bytes", want).With("committed_bytes", others).With("free_bytes", free).With("reserve_bytes", reserve).With("disk_overcommit", overcommit)
	}
	return nil
}

// holdDisk admits a boot of id (a disk of diskGiB; its top, if it has
// one already, the store file top) as admitDisks rules, and holds what it
// admitted until the boot ends (unreserve): two creates, forks or starts
// at once each count the other's disk, so that together they never pass
// what the store may hold. Once its QEMU runs, a sandbox's disk counts
// as a live one's.
func (m *Manager) holdDisk(ctx context.Context, id string, diskGiB int, top string) error {
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return err
	}
	// One admission at a time: the check and the hold are one step.
	m.diskMu.Lock()
	defer m.diskMu.Unlock()
	free, err := m.storeFree()
	if err != nil {
		return err
	}
	m.mu.Lock()
	withQEMU := map[string]bool{}
	for other := range m.live {
		withQEMU[other] = true
	}
	for other := range m.leases.amounts(leaseMemory) {
		withQEMU[other] = true
	}
	var others int64
	held := map[string]bool{}
	for other, bytes := range m.leases.amounts(leaseDisk) {
		held[other] = true
		if other != id {
			others += bytes
		}
	}
	m.mu.Unlock()
	for _, r := range records {
		if r.ID == id || held[r.ID] || !withQEMU[r.ID] {
			continue
		}
		var have int64
		if t := topOf(r); t != "" {
			have = allocated(m.layerPath(t))
		}
		others += diskGrowth(m.diskBytes(r.DiskGiB), have)
	}
	var have int64
	if top != "" {
		have = allocated(m.layerPath(top))
	}
	want := diskGrowth(m.diskBytes(diskGiB), have)
	if err := admitDisks(others, want, free, m.cfg.StoreReserveBytes, m.cfg.DiskOvercommit); err != nil {
		return err
	}
	m.leases.set(leaseDisk, id, want)
	return nil
}

// topOf is the store file of r's disk's top ("" before its first boot).
func topOf(r Record) string {
	if r.Machine == nil || len(r.Machine.Disk) == 0 {
		return ""
	}
	return r.Machine.Disk[0]
}

// snapshotQuota is the bytes r's snapshots may take.
func (m *Manager) snapshotQuota(r Record) int64 {
	if m.cfg.SnapshotQuotaBytes > 0 {
		return m.cfg.SnapshotQuotaBytes
	}
	return DefaultSnapshotQuotaFactor * (int64(r.MemoryMiB)<<20 + m.diskBytes(r.DiskGiB))
}

// admitQuota is the quota rule: the snapshots' bytes (used) and the new
// one's (need) within quota.
func admitQuota(used, need, quota int64) error {
	if used+need > quota {
		return ErrSnapshotQuota.With("quota_bytes", quota).With("used_bytes", used).With("needed_bytes", need)
	}
	return nil
}

// snapshotBytes is what r's snapshots take, as their records say.
func snapshotBytes(r Record) int64 {
	var n int64
	for _, s := range r.Snapshots {
		n += s.SizeBytes
	}
	return n
}

// memoryLoad is what memory admission weighs, in MiB.
type memoryLoad struct {
	Total, Available, Reserve int
	Overcommit                float64
	// Committed is the memory, with overhead, of every other sandbox
	// that has a QEMU or a boot under way; Booting that of the boots
	// under way alone (their guests are not in Available yet).
	Committed, Booting int
}

// admitMemory tells whether a guest of want MiB fits, and the room left
// (MiB) for the error when it does not.
func admitMemory(l memoryLoad, want int) (bool, int) {
	limit := int(float64(l.Total-l.Reserve) * l.Overcommit)
	room := min(limit-l.Committed-QEMUOverheadMiB, l.Available-l.Booting-l.Reserve)
	return want <= room, max(room, 0)
}

// memTotal reads the host's MemTotal in MiB.
func memTotal() (int, error) { return meminfo("MemTotal:") }

func memAvailable() (int, error) { return meminfo("MemAvailable:") }

func meminfo(key string) (int, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				return 0, err
			}
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/meminfo: no %s", key)
}

// reserve refuses a boot the host has no memory for (admitMemory);
// otherwise it reserves memoryMiB for id until its boot ends (unreserve).
func (m *Manager) reserve(ctx context.Context, id string, memoryMiB int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	avail, err := m.cfg.MemAvailable()
	if err != nil {
		return err
	}
	total, err := m.cfg.MemTotal()
	if err != nil {
		return err
	}
	// Under m.mu, which every reservation takes: the check and the
	// lease are one step.
	m.mu.Lock()
	defer m.mu.Unlock()
	l := memoryLoad{Total: total, Available: avail, Reserve: m.cfg.ReserveMiB, Overcommit: m.cfg.Overcommit}
	counted := map[string]bool{id: true}
	for other, mib := range m.leases.amounts(leaseMemory) {
		if other != id {
			l.Booting += int(mib)
			l.Committed += int(mib) + QEMUOverheadMiB
			counted[other] = true
		}
	}
	for other, mc := range m.live {
		if !counted[other] {
			l.Committed += mc.memoryMiB + QEMUOverheadMiB
		}
	}
	for _, mib := range m.leases.amounts(leaseLaterSave) {
		l.Committed += int(mib) + QEMUOverheadMiB
	}
	if ok, room := admitMemory(l, memoryMiB); !ok {
		return ErrHostCapacity.With("memory_mib", memoryMiB).With("available_mib", room).With("committed_mib", l.Committed)
	}
	m.leases.set(leaseMemory, id, int64(memoryMiB))
	return nil
}

// admitLaterSave admits a restore whose old machine stays while the new
// one loads (laterSave): the old one's memory is counted apart (under the
// returned key, until endLaterSave), and memoryMiB is reserved for the
// new one's boot as for any boot.
func (m *Manager) admitLaterSave(ctx context.Context, id string, memoryMiB int) (string, error) {
	mc := m.machineOf(id)
	if mc == nil {
		return "", ErrNotRunning
	}
	m.mu.Lock()
	m.savingSeq++
	key := fmt.Sprintf("%s#%d", id, m.savingSeq)
	m.leases.set(leaseLaterSave, key, int64(mc.memoryMiB))
	m.mu.Unlock()
	if err := m.reserve(ctx, id, memoryMiB); err != nil {
		m.endLaterSave(key)
		return "", err
	}
	return key, nil
}

func (m *Manager) endLaterSave(key string) { m.leases.end(leaseLaterSave, key) }

// unreserve ends what admission holds for id's boot: its memory
// (reserve) and its disk (holdDisk).
func (m *Manager) unreserve(id string) {
	m.leases.end(leaseMemory, id)
	m.leases.end(leaseDisk, id)
}
