package sandbox

import (
	"context"
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
				if err != nil {
					// The state the restore replaced is never lost: its
					// disk is frozen and the snapshot keeps it.
					m.keepDisk(ctx, id, snap.ID, keep, memoryLost(m.saveFault(err, int64(snap.MemoryMiB)<<20)))
					return
				}
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
