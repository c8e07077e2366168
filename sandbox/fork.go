package sandbox

import (
	"context"
	"os"
	"slices"

	"strata/internal/failpoint"
)

// Fork makes a new sandbox from a snapshot of another: r carries the new
// sandbox's id, account and name; its size is the snapshot's. The fork
// names the snapshot's files in its own record, so it does not depend on
// the source sandbox or the snapshot staying. It boots in the background
// (loading the snapshot's memory when it has one) as a create does, or
// is a fork made ahead of that snapshot, taken running under its own id
// (forkahead.go).
func (m *Manager) Fork(ctx context.Context, srcID, snapID string, r Record) (Record, error) {
	key := From{Sandbox: srcID, Snapshot: snapID}
	if taken, ok, err := m.takeForkAhead(ctx, key, r); ok {
		if err == nil {
			m.forksAheadLater(key)
		}
		return taken, err
	}
	f, err := giveWay(ctx, m, func() (Record, error) { return m.forkNew(ctx, srcID, snapID, r) })
	if err == nil {
		m.forksAheadLater(key)
	}
	return f, err
}

// forkNew is Fork that boots a new QEMU.
func (m *Manager) forkNew(ctx context.Context, srcID, snapID string, r Record) (Record, error) {
	m.awaitWritten(ctx, srcID, snapID)
	// What the fork loads is on disk first: a power cut after the fork
	// answers never leaves it a torn state.
	if src, err := m.cfg.Records.Get(ctx, srcID); err == nil {
		if snap, ok := src.Snapshot(snapID); ok && snap.Status == SnapshotReady {
			if err := m.durable(srcID, *snap); err != nil {
				return Record{}, err
			}
		}
	}
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	src, err := m.cfg.Records.Get(ctx, srcID)
	if err != nil {
		return Record{}, err
	}
	snap, ok := src.Snapshot(snapID)
	if !ok {
		return Record{}, ErrSnapshotNotFound.With("snapshot_id", snapID)
	}
	if err := m.loadable(snap, snap.Memory); err != nil {
		return Record{}, err
	}
	// Its top, and the snapshot's template if the first fork is to make
	// it.
	need := int64(layerBytes)
	if snap.Memory && (snap.Template == nil || snap.Template.Building) {
		need += m.templateBytes(*snap)
	}
	if err := m.checkStorage(need); err != nil {
		return Record{}, err
	}
	if err := m.holdDisk(ctx, r.ID, snap.DiskGiB, ""); err != nil {
		return Record{}, err
	}
	top, err := m.newLayer(ctx, snap.BaseDisk, snap.Disk[0], m.diskBytes(snap.DiskGiB))
	if err != nil {
		m.unreserve(r.ID)
		return Record{}, m.storageFault(err)
	}
	r.MemoryMiB, r.VCPUs, r.DiskGiB = snap.MemoryMiB, snap.VCPUs, snap.DiskGiB
	r.From = &From{Sandbox: srcID, Snapshot: snapID}
	mach := Machine{BaseDisk: snap.BaseDisk, Image: m.cfg.Image.Key, Disk: append([]string{top}, snap.Disk...)}
	if snap.Memory {
		// From the snapshot's template (made at the first fork); its
		// whole state if the template cannot be made.
		mach.Saved = snap.State
		mach.LoadDisk, mach.FreshTop = slices.Clone(snap.Disk), true
		mach.FromTemplate = &From{Sandbox: srcID, Snapshot: snapID}
		mach.Image = snap.Needs.Image
	}
	id := r.ID
	r, err = m.create(ctx, r, mach)
	if err != nil {
		m.unreserve(id)
		os.Remove(m.layerPath(top))
		return Record{}, err
	}
	failpoint.Hit(FailpointForkRecorded)
	m.log.Info("sandbox forked", "sandbox", r.ID, "from", srcID, "snapshot", snapID, "memory", snap.Memory)
	return r, nil
}
