package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"strata/internal/failpoint"
	"strata/internal/fault"
)

// RestoreResult is what a restore did.
type RestoreResult struct {
	SnapshotID string `json:"snapshot_id"`
	AutoID     string `json:"auto_id"`
	State      State  `json:"state"`
}

// Restore puts a sandbox back to one of its snapshots. Its current state
// is kept first as an automatic snapshot (with its memory when it has
// one); then the sandbox boots from the snapshot's disk, loading its
// memory unless diskOnly or it has none. It answers once the sandbox
// runs again.
func (m *Manager) Restore(ctx context.Context, id, snapID string, diskOnly bool) (RestoreResult, error) {
	return giveWay(ctx, m, func() (RestoreResult, error) { return m.restore(ctx, id, snapID, diskOnly) })
}

func (m *Manager) restore(ctx context.Context, id, snapID string, diskOnly bool) (RestoreResult, error) {
	done, err := m.begin(id)
	if err != nil {
		return RestoreResult{}, err
	}
	defer done()
	m.stopPauseTemplate(id, false)
	ctx = context.WithoutCancel(ctx) // once begun, it runs to its end
	wctx, wcancel := context.WithTimeout(ctx, SnapshotTimeout)
	m.awaitWritten(wctx, id, snapID)
	wcancel()
	// The snapshot is held before it is looked at: from here a delete of
	// it answers snapshot_in_use, so that the restore never takes its
	// automatic snapshot and then finds its target gone. The look is a
	// write transaction: it sees every delete that came before the hold.
	defer m.holdSnapshot(id, snapID)()
	r, err := m.cfg.Records.Update(ctx, id, func(*Record) error { return nil })
	if err != nil {
		return RestoreResult{}, err
	}
	if r.Machine == nil {
		return RestoreResult{}, ErrNotAMachine
	}
	snap, ok := r.Snapshot(snapID)
	if !ok {
		return RestoreResult{}, ErrSnapshotNotFound.With("snapshot_id", snapID)
	}
	withMemory := snap.Memory && !diskOnly
	if err := m.loadable(snap, withMemory); err != nil {
		return RestoreResult{}, err
	}
	if err := m.durable(id, *snap); err != nil {
		return RestoreResult{}, err
	}
	target := *snap
	switch r.State {
	case Running, Paused, Stopped, Error:
	default:
		return RestoreResult{}, ErrWrongState.With("state", string(r.State))
	}
	// The current state, kept as auto-N: with its memory when the
	// sandbox has one to keep.
	live := m.machineOf(id) != nil
	keepMemory := live && (r.State == Running || r.State == Paused) || r.State == Paused && r.Machine.Saved != ""
	if !live {
		// A sandbox with no QEMU gets one: the host must have room for
		// it, as for a start (the boot ends the reservation).
		if err := m.reserve(ctx, id, target.MemoryMiB); err != nil {
			return RestoreResult{}, err
		}
	}
	// A running guest's memory is written in the background, once the
	// snapshot's QEMU runs (laterSave): its old QEMU stays until then,
	// so the host must have the memory of both; when it has not, the
	// memory is written first, before the load.
	var later *laterSave
	if live && keepMemory && r.State == Running {
		key, err := m.admitLaterSave(ctx, id, target.MemoryMiB)
		if err == nil {
			later = &laterSave{key: key, booted: make(chan struct{})}
		} else {
			m.log.Info("the automatic snapshot is written before the load: the host has no memory for both machines", "sandbox", id, "err", err)
		}
	}
	auto, err := m.snapshot(ctx, id, SnapshotRequest{Memory: keepMemory, Comment: "before restoring " + snapID}, true, snapID, later)
	if later != nil && later.run == nil {
		// Nothing was left for later (the snapshot failed, or was
		// taken whole): the old machine is counted as itself again.
		m.endLaterSave(later.key)
		later = nil
	}
	if err != nil {
		m.unreserve(id)
		return RestoreResult{}, fmt.Errorf("keeping the current state before the restore: %w", err)
	}
	failpoint.Hit(FailpointRestoreAuto)
	// The sandbox becomes the snapshot: recorded first (creating, no
	// process, a new top over the snapshot's disk, the memory to load),
	// then the old QEMU ends. A crash in between is finished by Recover:
	// the old QEMU is no record's and is killed, the boot runs.
	m.storeMu.RLock()
	// The snapshot again, under storeMu: a delete of it since the first
	// read may have let collect take its files; now none can.
	r, err = m.cfg.Records.Get(ctx, id)
	if err == nil {
		if s, ok := r.Snapshot(snapID); !ok || s.Status != SnapshotReady {
			err = ErrSnapshotNotFound.With("snapshot_id", snapID)
		} else {
			target = *s
		}
	}
	var top string
	if err == nil {
		top, err = m.newLayer(ctx, target.BaseDisk, target.Disk[0], m.diskBytes(target.DiskGiB))
	}
	if err == nil {
		_, err = m.cfg.Records.Update(ctx, id, func(rec *Record) error {
			rec.State, rec.Error = Creating, ""
			rec.Machine.Process = nil
			rec.Machine.Disk = append([]string{top}, target.Disk...)
			rec.Machine.BaseDisk = target.BaseDisk
			rec.Machine.Saved, rec.Machine.FromTemplate = "", nil
			rec.Machine.dropRAM()
			rec.Machine.LoadDisk, rec.Machine.FreshTop = nil, false
			if withMemory {
				rec.Machine.Saved = target.State
				rec.Machine.LoadDisk, rec.Machine.FreshTop = slices.Clone(target.Disk), true
				rec.MemoryMiB, rec.VCPUs = target.MemoryMiB, target.VCPUs
				if t := target.Template; t != nil && !t.Building && m.haveFiles(m.ramPath(t.RAM, t.RAMOffset), m.statePath(t.State)) {
					// Through the snapshot's template, as a fork: its
					// RAM mapped where it is, its devices alone loaded.
					rec.Machine.Saved = t.State
					rec.Machine.RAM, rec.Machine.RAMGid, rec.Machine.RAMOffset = t.RAM, t.Gid, t.RAMOffset
				}
			}
			rec.DiskGiB = target.DiskGiB
			return nil
		})
	}
	m.storeMu.RUnlock()
	if err != nil {
		m.unreserve(id)
		if later != nil {
			// The sandbox stays as it was: its automatic snapshot is
			// finished here, and its guest runs on.
			later.run(ctx)
			m.endLaterSave(later.key)
		}
		if mc := m.machineOf(id); mc != nil && r.State == Running {
			mc.vm.Resume(ctx) // the automatic snapshot stopped it
		}
		return RestoreResult{}, err
	}
	failpoint.Hit(FailpointRestoreRecorded)
	if later != nil {
		m.saveLater(id, later)
	}
	m.teardown(id)
	failpoint.Hit(FailpointRestoreEnded)
	m.log.Info("sandbox restoring", "sandbox", id, "snapshot", snapID, "memory", withMemory, "auto", auto.ID)
	m.boot(ctx, id, Creating)
	if later != nil {
		// The sandbox is the snapshot's now, its old machine's memory
		// not yet written.
		failpoint.Hit(FailpointRestoreAutoSaving)
		close(later.booted)
	}
	m.collectLater() // the automatic snapshots pruned, the old top
	r, err = m.cfg.Records.Get(ctx, id)
	if err != nil {
		return RestoreResult{}, err
	}
	if r.State != Running {
		return RestoreResult{}, fmt.Errorf("sandbox %s did not come back from snapshot %s: %s", id, snapID, r.Error)
	}
	return RestoreResult{SnapshotID: snapID, AutoID: auto.ID, State: r.State}, nil
}

// laterSave is the part of a restore's automatic snapshot that runs once
// the restore no longer waits: the write of the stopped guest's memory
// (snapshot).
type laterSave struct {
	key     string // its memory, as admission counts it (admitLaterSave)
	snapID  string
	machine *machine
	run     func(ctx context.Context)
	// booted is closed once the restored sandbox's boot has ended: the
	// write waits for it (on two cores it slowed the load fourfold,
	// 157 ms to 635 ms, for a restore 200 ms shorter; after the boot,
	// the old QEMU's stopped guest costs the restore nothing).
	booted chan struct{}
}

// saveLater takes the machine of a restore's automatic snapshot from the
// sandbox (no request reaches it, no teardown or watcher ends it: its
// guest is stopped, its channel closed) and writes its memory in the
// background once the restored sandbox's boot has ended; its QEMU then
// ends, and the memory admission counted for it is freed. A shutdown of
// the Manager waits for the write (Close). A crash before the write ends leaves the snapshot
// processing, which the next start fails (failUnfinished), and the QEMU
// no record claims, which it kills (killStrays); the restored sandbox is
// not touched either way.
func (m *Manager) saveLater(id string, later *laterSave) {
	mc := later.machine
	m.mu.Lock()
	if m.live[id] == mc {
		delete(m.live, id)
	}
	m.mu.Unlock()
	mc.expectExit()
	mc.guestLn.Close()
	mc.ch.Close()
	written := make(chan struct{})
	m.mu.Lock()
	m.written[id+"/"+later.snapID] = written
	m.mu.Unlock()
	m.wg.Add(1)
	m.laterSaves.Add(1)
	go func() {
		defer m.wg.Done()
		defer m.laterSaves.Done()
		defer func() {
			m.mu.Lock()
			delete(m.written, id+"/"+later.snapID)
			m.mu.Unlock()
			close(written)
		}()
		// Restore closes booted once its boot has returned, which a
		// shutdown hastens. The write is not cut by a shutdown: a
		// restart of the host service right after a restore would
		// otherwise cost the restore's undo (SnapshotTimeout bounds it).
		<-later.booted
		// Nobody waits for this write: the restored sandbox goes first.
		if err := mc.vm.Background(); err != nil {
			m.log.Debug("the old machine not lowered", "sandbox", id, "err", err)
		}
		later.run(context.WithoutCancel(m.ctx))
		mc.vm.Kill()
		<-mc.vm.Done()
		mc.vm.Close()
		m.endLaterSave(later.key)
		m.collectLater() // a failed state, the old machine's last top
	}()
}

// keepDisk makes a restore's automatic snapshot whose memory could not be
// written (why says so, as a sentence) what it still is: a disk-only
// snapshot of the frozen disk the restore replaced, ready, its state left
// to collection. A restore of it boots that disk as a fresh boot. Its
// layer is written back in the background (syncLater), as any ready
// snapshot's.
func (m *Manager) keepDisk(ctx context.Context, id, snapID, keep, why string) {
	boot := bootID()
	var kept *Snapshot
	_, err := m.cfg.Records.Update(context.WithoutCancel(ctx), id, func(rec *Record) error {
		s, ok := rec.Snapshot(snapID)
		if !ok || s.Status != SnapshotProcessing || len(s.Disk) == 0 {
			return nil
		}
		s.Status, s.Memory, s.State, s.Needs, s.Template = SnapshotReady, false, "", nil, nil
		s.MemoryLost, s.Unsynced = why, boot
		s.SizeBytes = allocated(m.layerPath(s.Disk[0]))
		c := *s
		kept = &c
		pruneAutos(rec, keep)
		return nil
	})
	if err != nil {
		m.log.Error("automatic snapshot not kept disk-only", "sandbox", id, "snapshot", snapID, "err", err)
		return
	}
	if kept == nil {
		return
	}
	m.log.Warn("automatic snapshot kept disk-only", "sandbox", id, "snapshot", snapID, "why", why)
	m.syncLater(id, *kept)
}

// memoryLost is the sentence a snapshot kept disk-only carries: why its
// memory could not be written, in the API's words (no host path, no
// QEMU error text).
func memoryLost(err error) string {
	const tail = "; it keeps the disk the restore replaced, which restores as a fresh boot"
	switch {
	case fault.CodeOf(err) == ErrInsufficientStorage.Code:
		return "its memory could not be written: the host's store is full" + tail
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("its memory could not be written within %s", SnapshotTimeout) + tail
	case err == nil:
		return "its memory was still being written when the host service stopped" + tail
	default:
		return "its memory could not be written: QEMU failed to save it" + tail
	}
}

// awaitWritten waits, at most until ctx ends, for the background write
// of snapshot snapID of sandbox id (saveLater), if one is under way: an
// undo asked right after a restore restores its automatic snapshot once
// it is written, instead of answering snapshot_not_ready.
func (m *Manager) awaitWritten(ctx context.Context, id, snapID string) {
	m.mu.Lock()
	written := m.written[id+"/"+snapID]
	m.mu.Unlock()
	if written == nil {
		return
	}
	select {
	case <-written:
	case <-ctx.Done():
	}
}

// AutoSaved waits until the automatic snapshots that restores left to
// write in the background (saveLater) are ready or failed, and their old
// machines have ended.
func (m *Manager) AutoSaved() { m.laterSaves.Wait() }

// holdSnapshot marks a snapshot in use by a restore until the func it
// returns is called: DeleteSnapshot refuses it meanwhile.
func (m *Manager) holdSnapshot(id, snapID string) (release func()) {
	return m.leases.take(leaseInUse, id+"/"+snapID)
}

func (m *Manager) snapshotInUse(id, snapID string) bool {
	return m.leases.has(leaseInUse, id+"/"+snapID)
}

// replaced tells whether s is a restore's automatic snapshot of memory
// whose disk the sandbox has left: its frozen top is no longer in the
// sandbox's chain, so nothing writes it again.
func replaced(r Record, s Snapshot) bool {
	return s.Auto && s.Memory && len(s.Disk) > 0 && r.Machine != nil && !slices.Contains(r.Machine.Disk, s.Disk[0])
}
