package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"time"

	"strata/internal/failpoint"
	"strata/vmm"
)

// Failpoints of the snapshot operations (internal/failpoint): a crash test
// kills hostproxy right after each step.
const (
	FailpointSnapshotRecorded    = "vm.snapshot.recorded"     // processing, new top named
	FailpointSnapshotSaved       = "vm.snapshot.saved"        // state written, not yet ready
	FailpointRestoreAuto         = "vm.restore.auto"          // the automatic snapshot taken (or, running, its guest stopped and its disk switched)
	FailpointRestoreAutoSaving   = "vm.restore.auto.saving"   // booted from the snapshot, the old guest's memory not yet written (in the background)
	FailpointRestoreRecorded     = "vm.restore.recorded"      // the record is the snapshot's
	FailpointRestoreEnded        = "vm.restore.ended"         // the old QEMU ended
	FailpointForkRecorded        = "vm.fork.recorded"         // the fork's record inserted
	FailpointForkAheadResynced   = "vm.fork.ahead.resynced"   // a fork made ahead taken: its CPUs started, its guest resynced, not yet the account's
	FailpointBootLoaded          = "vm.boot.loaded"           // a saved state loaded, guest running
	FailpointPauseSaved          = "vm.pause.saved"           // memory written, not yet named
	FailpointTemplateFilled      = "vm.template.filled"       // a template's devices saved, its RAM not yet the forks' to read
	FailpointTemplateShared      = "vm.template.shared"       // its RAM the template group's, the template still building
	FailpointPauseTemplateFilled = "vm.pause.template.filled" // a pause template's devices saved, the paused state not yet its group's
)

// SnapshotTimeout bounds the taking of one snapshot.
const SnapshotTimeout = 3 * time.Minute

// Snapshot limits per sandbox (automatic ones are not counted), and the
// automatic snapshots a restore keeps.
const (
	MaxMemorySnapshots = 10
	MaxDiskSnapshots   = 100
	KeepAutoSnapshots  = 5
)

// Failed snapshots hold no files; a sandbox keeps the newest
// KeepFailedSnapshots of them, none older than FailedSnapshotAge, so that
// a client can see what failed. Retention never counts them.
const (
	KeepFailedSnapshots = 3
	FailedSnapshotAge   = time.Hour
)

// SnapshotRequest is what a snapshot is asked for with.
type SnapshotRequest struct {
	// Name, when set, names the snapshot: unique among the sandbox's
	// (ErrSnapshotNameTaken), accepted wherever its id is.
	Name    string
	Comment string
	// Memory keeps memory and devices too (processes come back
	// running); otherwise only the disk (a fresh boot).
	Memory bool
	// RetentionMax, when not zero, lets the oldest snapshots of the same
	// kind that are neither pinned nor automatic go, so that at most
	// this many of the kind remain.
	RetentionMax int
}

// RestoreResult is what a restore did.
type RestoreResult struct {
	SnapshotID string `json:"snapshot_id"`
	AutoID     string `json:"auto_id"`
	State      State  `json:"state"`
}

// have is what this host loads memory states into.
func (m *Manager) have() Needs {
	return Needs{QEMU: m.cfg.QEMUVersion, DeviceSet: vmm.DeviceSet, Accel: m.cfg.Accel.Accel, Image: m.cfg.Image.Key}
}

// Snapshot takes a snapshot of a sandbox. A memory snapshot of a running
// sandbox copies its memory while it runs and stops it only for the last
// pages and the switch of its disk; a disk-only one freezes the disk
// under a new top without stopping it. A paused sandbox's memory snapshot
// shares the state its pause saved; a stopped sandbox has only its disk.
func (m *Manager) Snapshot(ctx context.Context, id string, req SnapshotRequest) (Snapshot, error) {
	done, err := m.begin(id)
	if err != nil {
		return Snapshot{}, err
	}
	defer done()
	s, err := m.snapshot(ctx, id, req, false, "", nil)
	// What retention let go, or a top a failed save never used: not on
	// the way to the answer; nor the merge of the layers retention let
	// go (it runs once the snapshot's mark is released).
	m.collectLater()
	m.compactLater(id)
	return s, err
}

// snapshot is Snapshot's work, also a restore's automatic one; the caller
// holds the sandbox's operation mark.
// For an automatic one, keep names a snapshot the pruning of old automatic
// ones must leave (the one being restored).
//
// With later (a restore's automatic snapshot of a running sandbox, with
// memory), the guest is stopped and its disk switched before snapshot
// returns, and the write of its memory is left to later.run: the
// snapshot is returned processing, and later.run (in the background)
// writes the state and makes it ready or failed. later.machine is the
// machine whose memory it writes; it must not be ended before.
func (m *Manager) snapshot(ctx context.Context, id string, req SnapshotRequest, auto bool, keep string, later *laterSave) (Snapshot, error) {
	// Bounded: a guest that never lets its memory converge, or never
	// answers its sync, does not hold the sandbox (or the store) for good.
	ctx, cancel := context.WithTimeout(ctx, SnapshotTimeout)
	defer cancel()
	// The store's lock only until the new files are named in the record.
	m.storeMu.RLock()
	locked := true
	unlock := func() {
		if locked {
			locked = false
			m.storeMu.RUnlock()
		}
	}
	defer unlock()
	r, err := m.cfg.Records.Get(ctx, id)
	if err != nil {
		return Snapshot{}, err
	}
	if r.Machine == nil {
		return Snapshot{}, ErrNotAMachine
	}
	mc := m.machineOf(id)
	// How the snapshot is taken depends on where the sandbox is.
	var how string
	switch {
	case mc != nil && (r.State == Running || r.State == Paused):
		how = "qemu"
	case r.State == Paused && r.Machine.Saved != "", r.State == Stopped || r.State == Error:
		how = "host"
		if req.Memory && r.Machine.Saved == "" {
			return Snapshot{}, ErrNotRunning.With("state", string(r.State))
		}
	default:
		return Snapshot{}, ErrWrongState.With("state", string(r.State))
	}
	if len(r.Machine.Disk) == 0 {
		return Snapshot{}, ErrWrongState.With("state", string(r.State))
	}
	// What the store must hold: the new top (and a restore's), and the
	// guest's memory when it is saved now.
	need, estimate := int64(layerBytes), allocated(m.layerPath(r.Machine.Disk[0]))
	if req.Memory && how == "qemu" {
		need += int64(r.MemoryMiB) << 20
		estimate += int64(r.MemoryMiB) << 20
	}
	if auto {
		need += layerBytes
	}
	if err := m.checkStorage(need); err != nil {
		return Snapshot{}, err
	}
	if !auto {
		// A restore's automatic snapshot is bounded by KeepAutoSnapshots
		// instead: a quota must not stop a restore.
		if err := admitQuota(snapshotBytes(r), estimate, m.snapshotQuota(r)); err != nil {
			return Snapshot{}, err
		}
	}
	if !auto {
		if _, err := victims(r, req); err != nil {
			return Snapshot{}, err
		}
	}
	frozen := slices.Clone(r.Machine.Disk)
	top, err := m.newLayer(ctx, r.Machine.BaseDisk, frozen[0], m.diskBytes(r.DiskGiB))
	if err != nil {
		return Snapshot{}, m.storageFault(err)
	}
	var state string
	var sf *os.File
	if req.Memory && how == "qemu" {
		if state, sf, err = m.newState(); err != nil {
			return Snapshot{}, m.storageFault(err)
		}
		// Closed by the save's end, which may come later.
		defer func() {
			if sf != nil {
				sf.Close()
			}
		}()
	} else if req.Memory {
		state = r.Machine.Saved // shared with the pause that saved it
		// And so is its template, once made.
		m.stopPauseTemplate(id, true)
	}
	var snap Snapshot
	// The record first: the snapshot (processing) and the disk's new
	// top. The chain [top, frozen…] is right whether or not QEMU has
	// switched yet: top is empty until QEMU writes to it, which it does
	// only once it has.
	r, err = m.cfg.Records.Update(ctx, id, func(rec *Record) error {
		if rec.Machine == nil || len(rec.Machine.Disk) == 0 || rec.Machine.Disk[0] != frozen[0] {
			return ErrInProgress
		}
		if req.Name != "" {
			if _, ok := rec.SnapshotNamed(req.Name); ok {
				return ErrSnapshotNameTaken.With("name", req.Name)
			}
		}
		if auto {
			rec.AutoSeq++
			snap.ID = fmt.Sprintf("auto-%d", rec.AutoSeq)
		} else {
			rec.SnapshotSeq++
			snap.ID = fmt.Sprintf("v%d", rec.SnapshotSeq)
		}
		snap = Snapshot{
			ID: snap.ID, Name: req.Name, Comment: req.Comment, Memory: req.Memory, Auto: auto,
			Status: SnapshotProcessing, CreatedAt: time.Now().UTC(),
			Disk: frozen, BaseDisk: rec.Machine.BaseDisk, State: state,
			MemoryMiB: rec.MemoryMiB, VCPUs: rec.VCPUs, DiskGiB: rec.DiskGiB,
		}
		if req.Memory {
			needs := m.have()
			needs.Image = rec.Machine.Image
			snap.Needs = &needs
		}
		if t := rec.Machine.savedTemplate(); t != nil && how == "host" && req.Memory && t.RAM == state {
			shared := *t
			snap.Template = &shared
		}
		rec.Snapshots = append(rec.Snapshots, snap)
		rec.Machine.Disk = append([]string{top}, frozen...)
		return nil
	})
	if err != nil {
		return Snapshot{}, err
	}
	unlock() // named: collect keeps them
	failpoint.Hit(FailpointSnapshotRecorded)
	t0 := time.Now()
	var pause time.Duration
	var snapLive bool
	layer := vmm.Layer{Node: "l" + top, Path: m.layerPath(top)}
	if later != nil && how == "qemu" && req.Memory && r.State == Running {
		// Stopped and switched now, written later: the guest is of
		// this instant, and its disk's old top is frozen with it.
		err = mc.vm.Pause(ctx)
		if err == nil {
			if err = mc.vm.SwitchDisk(ctx, layer); err != nil {
				mc.vm.Resume(context.WithoutCancel(ctx))
				m.unswitch(id, top, frozen)
			}
		}
		if err == nil {
			f := sf
			sf = nil // the background save closes it
			later.machine, later.snapID = mc, snap.ID
			later.run = func(ctx context.Context) {
				defer f.Close()
				ctx, cancel := context.WithTimeout(ctx, SnapshotTimeout)
				defer cancel()
				st, err := mc.vm.Save(ctx, f, vmm.SaveOptions{})
				m.log.Debug("memory saved", "sandbox", id, "snapshot", snap.ID, "took", st.Total, "in_background", true, "format", st.Format, "direct_io", st.DirectIO, "transferred", st.Transferred)
				m.finishSnapshot(ctx, id, req, snap, frozen, state, how, auto, keep, err, 0, false, t0)
			}
			return snap, nil
		}
		// Not stopped, or not switched: the snapshot fails now.
		return m.finishSnapshot(ctx, id, req, snap, frozen, state, how, auto, keep, err, 0, false, t0)
	}
	switch {
	case how == "qemu" && req.Memory:
		var st vmm.SaveStats
		// Live: the guest runs while its memory is copied and stops
		// for the rest (QEMU 10: correct under TCG too, VMM.md). A
		// restore's automatic snapshot is of a machine about to end.
		live := r.State == Running && !auto
		st, err = mc.vm.Save(ctx, sf, vmm.SaveOptions{Live: live, Resume: r.State == Running && !auto, Overlay: &layer})
		pause = st.Pause
		snapLive = live
		m.log.Debug("memory saved", "sandbox", id, "snapshot", snap.ID, "took", st.Total, "pause", st.Pause, "live", live, "converged", st.Converged, "format", st.Format, "direct_io", st.DirectIO, "transferred", st.Transferred, "passes", st.Passes)
		if err != nil && !st.Switched {
			m.unswitch(id, top, frozen)
		}
	case how == "qemu":
		// A disk-only snapshot is what a power cut would leave: the
		// guest's own buffers are written out first.
		sctx, scancel := context.WithTimeout(ctx, 15*time.Second)
		_, serr := guestCall(sctx, mc, http.MethodPost, "/v1/exec", []byte(`{"cmd":["sync"],"timeout_s":10}`))
		scancel()
		if serr != nil {
			m.log.Warn("guest not synced before a disk-only snapshot", "sandbox", id, "err", serr)
		}
		if err = mc.vm.SwitchDisk(ctx, layer); err != nil {
			m.unswitch(id, top, frozen)
		}
	}
	return m.finishSnapshot(ctx, id, req, snap, frozen, state, how, auto, keep, err, pause, snapLive, t0)
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
		later.run(context.WithoutCancel(m.ctx))
		mc.vm.Kill()
		<-mc.vm.Done()
		mc.vm.Close()
		m.endLaterSave(later.key)
		m.collectLater() // a failed state, the old machine's last top
	}()
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

// finishSnapshot records what a snapshot's save came to (err): ready with
// its size, or failed with no files; retention's victims and the old
// automatic snapshots go with a ready one, whose files are then written
// back in the background.
func (m *Manager) finishSnapshot(ctx context.Context, id string, req SnapshotRequest, snap Snapshot, frozen []string, state, how string, auto bool, keep string, err error, pause time.Duration, snapLive bool, t0 time.Time) (Snapshot, error) {
	failpoint.Hit(FailpointSnapshotSaved)
	status := SnapshotReady
	if err != nil {
		status = SnapshotFailed
		m.log.Error("snapshot failed", "sandbox", id, "snapshot", snap.ID, "err", err)
	}
	size := allocated(m.layerPath(frozen[0]))
	if state != "" && how == "qemu" {
		size += allocated(m.statePath(state))
	}
	// Ready before its files are on disk: they are written back in the
	// background (syncLater); until then the record carries this boot's
	// id, and a Recover after a power cut fails the snapshot.
	boot := bootID()
	_, uerr := m.cfg.Records.Update(context.WithoutCancel(ctx), id, func(rec *Record) error {
		s, ok := rec.Snapshot(snap.ID)
		if !ok {
			return nil
		}
		s.Status, s.SizeBytes = status, size
		if req.Memory && pause > 0 {
			s.PauseMs, s.Live = float64(pause.Microseconds())/1000, snapLive
		}
		defer pruneFailed(rec, time.Now())
		if status == SnapshotReady {
			s.Unsynced = boot
		}
		if status == SnapshotFailed {
			s.State, s.Disk, s.SizeBytes = "", nil, 0
		}
		snap = *s
		if status != SnapshotReady {
			return nil
		}
		// victims counts the snapshot to come: this one is in already.
		others := Record{Snapshots: slices.DeleteFunc(slices.Clone(rec.Snapshots), func(s Snapshot) bool { return s.ID == snap.ID })}
		if auto {
			pruneAutos(rec, keep)
		} else if gone, verr := victims(others, req); verr == nil {
			rec.Snapshots = slices.DeleteFunc(rec.Snapshots, func(s Snapshot) bool { return slices.Contains(gone, s.ID) })
		}
		return nil
	})
	if uerr != nil {
		return Snapshot{}, uerr
	}
	if err != nil {
		if req.Memory {
			err = m.saveFault(err, int64(snap.MemoryMiB)<<20)
		}
		return snap, fmt.Errorf("snapshot %s of %s: %w", snap.ID, id, m.storageFault(err))
	}
	m.syncLater(id, snap)
	m.templateLater(id, snap)
	m.log.Info("snapshot taken", "sandbox", id, "snapshot", snap.ID, "memory", req.Memory, "took", time.Since(t0).Round(time.Millisecond), "pause", pause.Round(time.Millisecond), "size_bytes", size)
	return snap, nil
}

// unswitch takes back a new top that QEMU never switched to: the record's
// disk is the frozen chain again (top is collected).
func (m *Manager) unswitch(id, top string, frozen []string) {
	m.cfg.Records.Update(context.Background(), id, func(rec *Record) error {
		if rec.Machine != nil && len(rec.Machine.Disk) > 0 && rec.Machine.Disk[0] == top {
			rec.Machine.Disk = slices.Clone(frozen)
		}
		return nil
	})
}

// victims are the snapshots a new one of req's kind makes go: none under
// the limit; with retention, the oldest of the kind that are neither
// pinned nor automatic, as many as needed; without it, or when too few
// are eligible, snapshot_limit.
func victims(r Record, req SnapshotRequest) ([]string, error) {
	limit := MaxDiskSnapshots
	if req.Memory {
		limit = MaxMemorySnapshots
	}
	hard := limit
	if req.RetentionMax > 0 {
		limit = min(limit, req.RetentionMax)
	}
	var kind, eligible []string
	for _, s := range r.Snapshots {
		if s.Auto || s.Memory != req.Memory || s.Status == SnapshotFailed {
			continue
		}
		kind = append(kind, s.ID)
		if !s.Pinned && s.Status == SnapshotReady {
			eligible = append(eligible, s.ID)
		}
	}
	over := len(kind) + 1 - limit
	if over <= 0 {
		return nil, nil
	}
	if req.RetentionMax == 0 || over > len(eligible) {
		return nil, ErrSnapshotLimit.With("limit", hard).With("memory", req.Memory)
	}
	return eligible[:over], nil
}

// pruneAutos keeps the newest KeepAutoSnapshots ready automatic
// snapshots (pinned ones, and keep, are kept beyond them); failed and
// processing ones are not counted (pruneFailed takes the failed).
func pruneAutos(rec *Record, keep string) {
	n := 0
	for i := len(rec.Snapshots) - 1; i >= 0; i-- {
		s := rec.Snapshots[i]
		if !s.Auto || s.Pinned || s.Status != SnapshotReady || s.ID == keep {
			continue
		}
		n++
		if n > KeepAutoSnapshots {
			rec.Snapshots = slices.Delete(rec.Snapshots, i, i+1)
		}
	}
}

// pruneFailed drops the failed snapshots beyond the newest
// KeepFailedSnapshots, and those older than FailedSnapshotAge at now.
func pruneFailed(rec *Record, now time.Time) {
	n := 0
	for i := len(rec.Snapshots) - 1; i >= 0; i-- {
		s := rec.Snapshots[i]
		if s.Status != SnapshotFailed {
			continue
		}
		n++
		if n > KeepFailedSnapshots || now.Sub(s.CreatedAt) > FailedSnapshotAge {
			rec.Snapshots = slices.Delete(rec.Snapshots, i, i+1)
		}
	}
}

// DeleteSnapshot deletes a snapshot: its files go unless a fork or
// another snapshot names them. It never touches the sandbox's machine.
func (m *Manager) DeleteSnapshot(ctx context.Context, id, snapID string) error {
	if _, err := m.cfg.Records.Update(ctx, id, func(rec *Record) error {
		s, ok := rec.Snapshot(snapID)
		if !ok {
			return ErrSnapshotNotFound.With("snapshot_id", snapID)
		}
		if s.Status == SnapshotProcessing {
			return ErrInProgress
		}
		if m.snapshotInUse(id, snapID) {
			return ErrSnapshotInUse.With("snapshot_id", snapID)
		}
		rec.Snapshots = slices.DeleteFunc(rec.Snapshots, func(s Snapshot) bool { return s.ID == snapID })
		return nil
	}); err != nil {
		return err
	}
	m.log.Info("snapshot deleted", "sandbox", id, "snapshot", snapID)
	m.compactLater(id)
	return m.collect(context.WithoutCancel(ctx))
}

// PinSnapshot pins or unpins a snapshot: retention never deletes a pinned
// one.
func (m *Manager) PinSnapshot(ctx context.Context, id, snapID string, pinned bool) (Snapshot, error) {
	var out Snapshot
	_, err := m.cfg.Records.Update(ctx, id, func(rec *Record) error {
		s, ok := rec.Snapshot(snapID)
		if !ok {
			return ErrSnapshotNotFound.With("snapshot_id", snapID)
		}
		s.Pinned = pinned
		out = *s
		return nil
	})
	return out, err
}

// loadable checks that a snapshot can be restored or forked: ready, and
// its memory loadable here unless only its disk is wanted.
func (m *Manager) loadable(s *Snapshot, withMemory bool) error {
	if s.Status != SnapshotReady {
		return ErrSnapshotNotReady.With("status", string(s.Status))
	}
	if withMemory && s.Needs != nil {
		if d := s.Needs.Differs(m.have()); len(d) > 0 {
			return ErrSnapshotIncompatible.With("differs", d)
		}
	}
	return nil
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
	if err := m.checkDisks(ctx, r.ID, snap.DiskGiB, ""); err != nil {
		return Record{}, err
	}
	top, err := m.newLayer(ctx, snap.BaseDisk, snap.Disk[0], m.diskBytes(snap.DiskGiB))
	if err != nil {
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
	r, err = m.create(ctx, r, mach)
	if err != nil {
		os.Remove(m.layerPath(top))
		return Record{}, err
	}
	failpoint.Hit(FailpointForkRecorded)
	m.log.Info("sandbox forked", "sandbox", r.ID, "from", srcID, "snapshot", snapID, "memory", snap.Memory)
	return r, nil
}

// load reads a saved memory state into a QEMU started with Incoming and
// runs it.
func (m *Manager) load(ctx context.Context, vm vmm.Machine, state string) error {
	f, err := os.Open(m.statePath(state))
	if err != nil {
		return err
	}
	defer f.Close()
	lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := vm.Load(lctx, f); err != nil {
		return err
	}
	return vm.Resume(lctx)
}

// dropSaved forgets the memory a sandbox was to load (it did not load).
func (m *Manager) dropSaved(id string) {
	m.cfg.Records.Update(context.Background(), id, func(r *Record) error {
		r.Machine.Saved, r.Machine.LoadDisk = "", nil
		return nil
	})
}

// resync tells guestd that its memory is another moment's: it sets the
// guest's clock, reseeds its RNG (a fork's siblings share its state) and
// takes the sandbox's hostname.
func (m *Manager) resync(ctx context.Context, mc *machine, r Record) error {
	seed := make([]byte, 64)
	rand.Read(seed)
	req := map[string]any{"time_unix_nano": time.Now().UnixNano(), "seed": seed}
	if h := hostname(r); hostLabel(h) {
		req["hostname"] = h // a fork takes its own name
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = guestCall(rctx, mc, http.MethodPost, "/v1/resync", body)
	if err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("guestd did not answer the resync: %w", err)
	}
	return err
}

// hostLabel tells whether h is a hostname guestd takes (one RFC 1123
// label): sandbox names always are; configured ids may not be.
func hostLabel(h string) bool {
	if len(h) == 0 || len(h) > 63 || h[0] == '-' || h[len(h)-1] == '-' {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// bootID is the host's boot id: a snapshot marked with it is not yet on
// disk, which after a reboot (another id) means it may be torn.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return string(bytes.TrimSpace(b))
}

// syncLater writes a ready snapshot's files to disk in the background
// and then clears its mark.
func (m *Manager) syncLater(id string, s Snapshot) {
	if s.Unsynced == "" {
		return
	}
	m.syncs.Add(1)
	started := m.goAfter(func() {
		defer m.syncs.Done()
		if err := m.syncSnapshot(id, s); err != nil {
			m.log.Error("snapshot not written to disk", "sandbox", id, "snapshot", s.ID, "err", err)
		}
	})
	if !started {
		m.syncs.Done() // the next Recover writes it back
	}
}

// durable writes a ready snapshot's files to disk now unless they are
// already (its mark is clear): a fork or a restore never loads a state
// that a power cut could still tear. A sync in the background at the
// same time does the same harmlessly.
func (m *Manager) durable(id string, s Snapshot) error {
	if s.Unsynced == "" {
		return nil
	}
	if err := m.syncSnapshot(id, s); err != nil {
		return fmt.Errorf("snapshot %s of %s not written to disk: %w", s.ID, id, err)
	}
	return nil
}

// syncSnapshot writes a snapshot's files (its frozen top and its state)
// and the store's directory to disk, then clears the snapshot's mark.
func (m *Manager) syncSnapshot(id string, s Snapshot) error {
	var files []string
	if len(s.Disk) > 0 {
		files = append(files, m.layerPath(s.Disk[0]))
	}
	if s.State != "" {
		files = append(files, m.statePath(s.State))
	}
	t0 := time.Now()
	for _, f := range files {
		if err := syncFile(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := syncDir(m.storeDir()); err != nil {
		return err
	}
	_, err := m.cfg.Records.Update(context.Background(), id, func(rec *Record) error {
		if sn, ok := rec.Snapshot(s.ID); ok {
			sn.Unsynced = ""
		}
		return nil
	})
	m.log.Debug("snapshot on disk", "sandbox", id, "snapshot", s.ID, "took", time.Since(t0).Round(time.Millisecond))
	return err
}

// holdSnapshot marks a snapshot in use by a restore until the func it
// returns is called: DeleteSnapshot refuses it meanwhile.
func (m *Manager) holdSnapshot(id, snapID string) (release func()) {
	key := id + "/" + snapID
	m.mu.Lock()
	m.inUse[key]++
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		if m.inUse[key]--; m.inUse[key] <= 0 {
			delete(m.inUse, key)
		}
		m.mu.Unlock()
	}
}

func (m *Manager) snapshotInUse(id, snapID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inUse[id+"/"+snapID] > 0
}

// Synced waits until the snapshots taken so far are on disk (their files
// written back, their records unmarked).
func (m *Manager) Synced() { m.syncs.Wait() }
