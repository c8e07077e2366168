package sandbox_test

import (
	"context"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"strata/internal/fault"
	"strata/sandbox"
	"strata/vmm"
)

// TestRestoreKeepsWhatItReplaced: a restore of a running sandbox keeps
// the state it replaces as auto-N, whose memory is written in the
// background. When that write cannot be made (a full store, a QEMU
// error, the host service stopping in the middle of it), auto-N is never
// failed with its disk collected: it stays a ready, disk-only snapshot of
// the frozen pre-restore disk, with a sentence saying why, and a restore
// of it boots that disk afresh.
//
// Regression: a kill of hostproxy during the write left auto-N failed,
// its layer collected, and the pre-restore state gone.
func TestRestoreKeepsWhatItReplaced(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// lose makes the write of auto-1's memory fail; it returns the
		// Manager that runs on.
		lose func(t *testing.T, h *harness, m *sandbox.Manager) *sandbox.Manager
		why  string
	}{
		{"store full", func(t *testing.T, h *harness, m *sandbox.Manager) *sandbox.Manager {
			h.drv.last("sb-1").plan.saveENOSPC = true
			restore(t, m, "sb-1", "v1", false)
			return m
		}, "the host's store is full"},
		{"QEMU fails", func(t *testing.T, h *harness, m *sandbox.Manager) *sandbox.Manager {
			h.drv.last("sb-1").plan.saveFails = "qemu of sb-1: saving its state failed: migration failed"
			restore(t, m, "sb-1", "v1", false)
			return m
		}, "QEMU failed to save it"},
		{"host service stops", func(t *testing.T, h *harness, m *sandbox.Manager) *sandbox.Manager {
			// What a kill during the write leaves: the sandbox is the
			// snapshot's (its record and its machine), and auto-1 is
			// processing, its state file half-written.
			restore(t, m, "sb-1", "v1", false)
			m.Close()
			editSnapshot(t, h, "sb-1", "auto-1", func(s *sandbox.Snapshot) {
				if s.State == "" {
					t.Fatal("auto-1 was taken without its memory")
				}
				s.Status, s.Unsynced = sandbox.SnapshotProcessing, ""
			})
			m2 := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
			if err := m2.Recover(ctx); err != nil {
				t.Fatalf("Recover: %v", err)
			}
			return m2
		}, "still being written when the host service stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, m := snapshotHarness(t)
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
			before := slices.Clone(h.get("sb-1").Machine.Disk)
			m = tc.lose(t, h, m)
			m.Synced()

			r := h.get("sb-1")
			auto, ok := r.Snapshot("auto-1")
			if !ok {
				t.Fatal("auto-1 is gone")
			}
			if auto.Status != sandbox.SnapshotReady || auto.Memory || auto.State != "" || auto.Needs != nil || !slices.Equal(auto.Disk, before) {
				t.Fatalf("auto-1 %+v; want ready, disk-only, over the disk the restore replaced %v", auto, before)
			}
			if !strings.Contains(auto.MemoryLost, tc.why) {
				t.Fatalf("auto-1 says %q; want it to say %q", auto.MemoryLost, tc.why)
			}
			if auto.SizeBytes <= 0 || auto.Unsynced != "" {
				t.Fatalf("auto-1's size %d, unsynced %q", auto.SizeBytes, auto.Unsynced)
			}
			checkStore(t, m) // its state is collected, its disk kept

			// The undo boots the replaced disk afresh.
			res, err := m.Restore(ctx, "sb-1", "auto-1", false)
			if err != nil {
				t.Fatalf("Restore to auto-1: %v", err)
			}
			m.AutoSaved()
			fm := h.drv.last("sb-1")
			if res.State != sandbox.Running || fm.cfg.Incoming || !slices.Equal(diskPaths(fm)[1:], h.chainPaths(before)) {
				t.Fatalf("the undo answered %+v; its machine loads memory %v over %v; want a fresh boot over %v", res, fm.cfg.Incoming, diskPaths(fm)[1:], h.chainPaths(before))
			}
			checkStore(t, m)
		})
	}
}

// TestRecoverFailsAnAutoNotYetReplacing: an automatic snapshot whose
// restore was not yet recorded when the host service stopped is failed as
// any unfinished snapshot: its disk is still the sandbox's own, which
// goes on with it (nothing was replaced).
func TestRecoverFailsAnAutoNotYetReplacing(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	m.Close()
	// The automatic snapshot as the restore takes it: processing, over
	// the frozen top, the sandbox on a new top above it.
	if _, err := h.recs.Update(ctx, "sb-1", func(r *sandbox.Record) error {
		v1, _ := r.Snapshot("v1")
		a := *v1
		r.AutoSeq++
		a.ID, a.Auto, a.Status, a.Unsynced, a.Template = "auto-1", true, sandbox.SnapshotProcessing, "", nil
		a.Disk = slices.Clone(r.Machine.Disk)
		r.Snapshots = append(r.Snapshots, a)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	m2 := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
	if err := m2.Recover(ctx); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	r := h.get("sb-1")
	if auto, _ := r.Snapshot("auto-1"); auto.Status != sandbox.SnapshotFailed || len(auto.Disk) != 0 || auto.MemoryLost != "" {
		t.Fatalf("auto-1 %+v; want failed, with no files", auto)
	}
	if r.State != sandbox.Running {
		t.Fatalf("sandbox %s", r.State)
	}
	checkStore(t, m2)
}

// TestRestore restores sb-1 to its first snapshot, v1, from each place it
// can be. The current state is kept first as auto-1 (with its memory
// when it has one); the sandbox then runs on a new machine over a new top
// above v1's disk, from v1's memory unless it is restored disk-only or
// has none. v1 itself is never written: a second restore finds it as it
// was.
func TestRestore(t *testing.T) {
	cases := []struct {
		name       string
		memory     bool                                         // v1 keeps memory
		to         func(*testing.T, *harness, *sandbox.Manager) // nil: running
		diskOnly   bool
		autoMemory bool // auto-1 keeps memory
	}{
		{name: "running_memory", memory: true, autoMemory: true},
		{name: "running_memory_disk_only", memory: true, diskOnly: true, autoMemory: true},
		{name: "running_disk_only_snapshot", autoMemory: true},
		{name: "paused_memory", memory: true, to: pauseIt, autoMemory: true},
		{name: "paused_disk_only_snapshot", to: pauseIt, autoMemory: true},
		{name: "stopped_memory", memory: true, to: stopIt},
		{name: "stopped_memory_disk_only", memory: true, to: stopIt, diskOnly: true},
		{name: "error_memory", memory: true, to: killIt},
		{name: "error_disk_only_snapshot", to: killIt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, m := snapshotHarness(t)
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: tc.memory})
			// The top v1's memory was saved over, and a second snapshot:
			// the disk has moved on from v1's.
			v1Top := h.get("sb-1").Machine.Disk[0]
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
			if tc.to != nil {
				tc.to(t, h, m)
			}
			before := h.get("sb-1")
			v1, _ := before.Snapshot("v1")
			old := h.drv.last("sb-1")
			starts := h.drv.starts("sb-1")

			res := restore(t, m, "sb-1", "v1", tc.diskOnly)
			if want := (sandbox.RestoreResult{SnapshotID: "v1", AutoID: "auto-1", State: sandbox.Running}); res != want {
				t.Errorf("Restore answered %+v, want %+v", res, want)
			}
			r := h.get("sb-1")
			if got := snapshotIDs(r); !slices.Equal(got, []string{"v1", "v2", "auto-1"}) {
				t.Errorf("snapshots %v, want v1, v2, auto-1", got)
			}
			// What it was is auto-1.
			auto, _ := r.Snapshot("auto-1")
			if !auto.Auto || auto.Memory != tc.autoMemory || auto.Status != sandbox.SnapshotReady || !slices.Equal(auto.Disk, before.Machine.Disk) || auto.Comment != "before restoring v1" {
				t.Errorf("auto-1 %+v; want automatic, memory %v, ready, over the chain %v", auto, tc.autoMemory, before.Machine.Disk)
			}
			if before.State == sandbox.Paused && auto.State != before.Machine.Saved {
				t.Errorf("auto-1 of a paused sandbox has state %q, want the pause's %q", auto.State, before.Machine.Saved)
			}
			// It runs a new machine over a new top above v1's disk.
			fm := h.drv.last("sb-1")
			if h.drv.starts("sb-1") != starts+1 || r.State != sandbox.Running || r.Error != "" || r.Machine.Process == nil || *r.Machine.Process != fm.proc {
				t.Fatalf("after the restore: %d machines started (%d before), record %+v; want a new one running", h.drv.starts("sb-1"), starts, r)
			}
			if old != nil && !old.exited() {
				t.Error("the machine of before the restore still runs")
			}
			top := r.Machine.Disk[0]
			if !slices.Equal(r.Machine.Disk[1:], v1.Disk) || slices.Contains(before.Machine.Disk, top) {
				t.Errorf("disk %v after the restore; want a new top over v1's %v", r.Machine.Disk, v1.Disk)
			}
			if got, want := diskPaths(fm), h.chainPaths(r.Machine.Disk); !slices.Equal(got, want) {
				t.Errorf("machine's disk %v, want %v", got, want)
			}
			loads := tc.memory && !tc.diskOnly
			if fm.cfg.Incoming != loads || (loads && (fm.loaded.Load() != "sb-1" || fm.loadedTop.Load() != "l"+v1Top)) {
				t.Errorf("machine incoming %v, loaded %v saved over %v; want loading %v (v1's state, saved over l%s)", fm.cfg.Incoming, fm.loaded.Load(), fm.loadedTop.Load(), loads, v1Top)
			}
			if r.Machine.Saved != "" {
				t.Errorf("running record still names a state to load: %q", r.Machine.Saved)
			}
			if now, _ := r.Snapshot("v1"); !reflect.DeepEqual(now, v1) {
				t.Errorf("v1 changed by its restore: %+v, was %+v", now, v1)
			}
			checkHealth(t, m, "sb-1")
			checkStore(t, m)

			// Again: v1 is as it was, and the restore before it is kept
			// with its memory.
			res = restore(t, m, "sb-1", "v1", tc.diskOnly)
			r2 := h.get("sb-1")
			auto2, _ := r2.Snapshot(res.AutoID)
			if res.AutoID != "auto-2" || !auto2.Memory || !slices.Equal(r2.Machine.Disk[1:], v1.Disk) || r2.Machine.Disk[0] == top {
				t.Errorf("second restore: %+v, auto %+v, disk %v; want auto-2 with memory, a newer top over %v", res, auto2, r2.Machine.Disk, v1.Disk)
			}
			checkStore(t, m)
		})
	}
}

// TestRestoreKeepsFiveAutos: each restore makes an automatic snapshot; the
// newest KeepAutoSnapshots unpinned ones are kept, older ones go (files
// and all), pinned ones stay beyond them, and no other snapshot goes.
func TestRestoreKeepsFiveAutos(t *testing.T) {
	cases := []struct {
		name     string
		restores int
		pinned   string // an auto pinned once made
		autos    []string
	}{
		{name: "five", restores: 5, autos: []string{"auto-1", "auto-2", "auto-3", "auto-4", "auto-5"}},
		{name: "sixth_prunes_the_oldest", restores: 6, autos: []string{"auto-2", "auto-3", "auto-4", "auto-5", "auto-6"}},
		{name: "pinned_kept", restores: 7, pinned: "auto-1", autos: []string{"auto-1", "auto-3", "auto-4", "auto-5", "auto-6", "auto-7"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, m := snapshotHarness(t)
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
			var states []string // of every auto made, oldest first
			for i := range tc.restores {
				res := restore(t, m, "sb-1", []string{"v1", "v2"}[i%2], false)
				if res.AutoID == tc.pinned {
					pin(t, m, "sb-1", tc.pinned)
				}
				r := h.get("sb-1")
				if s, ok := r.Snapshot(res.AutoID); ok {
					states = append(states, s.State)
				}
			}
			r := h.get("sb-1")
			if got, want := snapshotIDs(r), append([]string{"v1", "v2"}, tc.autos...); !slices.Equal(got, want) {
				t.Errorf("snapshots %v, want %v", got, want)
			}
			kept := map[string]bool{}
			for _, s := range r.Snapshots {
				kept[s.State] = true
			}
			checkStore(t, m) // the store is collected in the background
			for i, st := range states {
				if !kept[st] && exists(h.statePath(st)) {
					t.Errorf("the state of pruned auto-%d is still in the store", i+1)
				}
			}
		})
	}
}

// TestRestoreRefused: a restore that cannot be done answers why and
// changes nothing: no automatic snapshot, the same machine running.
func TestRestoreRefused(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		id     string
		snapID string
		setup  func(t *testing.T, h *harness)
		code   string
	}{
		{name: "unknown_snapshot", id: "sb-1", snapID: "v9", code: "snapshot_not_found"},
		{name: "unknown_sandbox", id: "sb-nope", snapID: "v1", code: "sandbox_not_found"},
		{name: "processing", id: "sb-1", snapID: "v1", code: "snapshot_not_ready", setup: func(t *testing.T, h *harness) {
			editSnapshot(t, h, "sb-1", "v1", func(s *sandbox.Snapshot) { s.Status = sandbox.SnapshotProcessing })
		}},
		{name: "failed", id: "sb-1", snapID: "v1", code: "snapshot_not_ready", setup: func(t *testing.T, h *harness) {
			editSnapshot(t, h, "sb-1", "v1", func(s *sandbox.Snapshot) { s.Status, s.State, s.Disk = sandbox.SnapshotFailed, "", nil })
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, m := snapshotHarness(t)
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
			if tc.setup != nil {
				tc.setup(t, h)
			}
			// A compaction the snapshot started may still merge the
			// layers the edited snapshot let go: done before the look.
			m.Compacted()
			before := recordJSON(t, h, "sb-1")
			fm := h.drv.last("sb-1")
			_, err := m.Restore(ctx, tc.id, tc.snapID, false)
			wantFault(t, "Restore", err, tc.code, "")
			if _, err := m.Fork(ctx, tc.id, tc.snapID, sandbox.Record{ID: "sb-fork", Account: "acct"}); fault.CodeOf(err) != tc.code {
				t.Errorf("Fork: %v, want %s", err, tc.code)
			}
			if after := recordJSON(t, h, "sb-1"); after != before {
				t.Errorf("record changed:\n%s\nwas\n%s", after, before)
			}
			if h.drv.starts("sb-1") != 1 || fm.exited() || h.drv.starts("sb-fork") != 0 {
				t.Error("a refused restore or fork touched a machine")
			}
			// v1 goes, with what the hand edits left unnamed (a failed
			// snapshot's state): the store is clean again.
			editSnapshot(t, h, "sb-1", "v1", func(s *sandbox.Snapshot) {
				if s.Status == sandbox.SnapshotProcessing {
					s.Status, s.State, s.Disk = sandbox.SnapshotFailed, "", nil
				}
			})
			if err := m.DeleteSnapshot(ctx, "sb-1", "v1"); err != nil {
				t.Fatal(err)
			}
			checkStore(t, m)
		})
	}
}

// TestRestoreIncompatible: a memory snapshot loads only into what it was
// saved from (the same QEMU, device set, accelerator and image). When the
// host has changed, a restore of its memory (or a fork) answers
// snapshot_incompatible saying what differs, and changes nothing; a
// restore of its disk alone goes ahead.
func TestRestoreIncompatible(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		edit func(*sandbox.Needs)
		what string // the key of the differs detail
	}{
		{"qemu", func(n *sandbox.Needs) { n.QEMU = "QEMU emulator version 8.2.2" }, "qemu"},
		// A snapshot of bookworm's own QEMU, before strata needed 10.0.
		{"qemu_7.2", func(n *sandbox.Needs) { n.QEMU = "QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u16)" }, "qemu"},
		{"device_set", func(n *sandbox.Needs) { n.DeviceSet = "microvm-0" }, "device_set"},
		{"accel", func(n *sandbox.Needs) { n.Accel = vmm.KVM }, "accel"},
		{"image", func(n *sandbox.Needs) { n.Image = "an-older-image" }, "image"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, m := snapshotHarness(t)
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
			editSnapshot(t, h, "sb-1", "v1", func(s *sandbox.Snapshot) { tc.edit(s.Needs) })
			checkIncompatible(t, h, m, tc.what)
		})
	}
	// The host's QEMU upgraded under a running sandbox: a new Manager
	// (hostproxy restarted) reports the new version.
	t.Run("host_qemu_upgraded", func(t *testing.T) {
		h, m1 := snapshotHarness(t)
		takeSnapshot(t, m1, "sb-1", sandbox.SnapshotRequest{Memory: true})
		m1.Close()
		m2 := h.manager(func(c *sandbox.Config) { c.QEMUVersion = "QEMU emulator version 10.1.0" })
		if err := m2.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		checkIncompatible(t, h, m2, "qemu")
	})
}

// TestDeleteSnapshotDuringItsRestore: a snapshot deleted while a restore
// of it is under way (here, while the restore's automatic snapshot is
// being saved) is refused with snapshot_in_use; the restore comes back
// running from it, and afterwards the delete goes through.
//
// Regressions: Restore read the snapshot before taking its automatic one
// and held storeMu only from after it, so a DeleteSnapshot in between
// collected the snapshot's layers and Restore recorded a chain over
// missing files (the sandbox was left in error); later, the restore
// answered 404 after it had already saved auto-N.
func TestDeleteSnapshotDuringItsRestore(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	// v2's top layer comes to be named by v2 alone: the sandbox is
	// restored to v1 (over another lineage) and the auto that kept the
	// chain through v2 is deleted.
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	stopIt(t, h, m)
	restore(t, m, "sb-1", "v1", false)
	if err := m.DeleteSnapshot(ctx, "sb-1", "auto-1"); err != nil {
		t.Fatal(err)
	}
	// The restore is held in its boot (its guestd waits for the gate):
	// the old machine's memory is written in the background by then.
	gate := make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	t.Cleanup(open)
	h.drv.setPlan(plan{gate: gate})
	starts := h.drv.starts("sb-1")
	restored := make(chan error, 1)
	go func() { _, err := m.Restore(ctx, "sb-1", "v2", false); restored <- err }()
	for h.drv.starts("sb-1") == starts {
		time.Sleep(time.Millisecond)
	}
	wantFault(t, "DeleteSnapshot during its restore", m.DeleteSnapshot(ctx, "sb-1", "v2"), "snapshot_in_use", "")
	open()
	if err := <-restored; err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if r := h.get("sb-1"); r.State != sandbox.Running || !slices.Contains(snapshotIDs(r), "v2") {
		t.Errorf("sandbox %q (%s), snapshots %v after the restore", r.State, r.Error, snapshotIDs(r))
	}
	if err := m.DeleteSnapshot(ctx, "sb-1", "v2"); err != nil {
		t.Fatalf("DeleteSnapshot once the restore is done: %v", err)
	}
	checkStore(t, m)
}

// TestRestoreOfADeletedSnapshotSavesNothing: a restore of a snapshot that
// a delete took first answers snapshot_not_found before it keeps the
// current state: no automatic snapshot is taken.
func TestRestoreOfADeletedSnapshotSavesNothing(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	if err := m.DeleteSnapshot(ctx, "sb-1", "v1"); err != nil {
		t.Fatal(err)
	}
	_, err := m.Restore(ctx, "sb-1", "v1", false)
	wantFault(t, "Restore of a deleted snapshot", err, "snapshot_not_found", "")
	if r := h.get("sb-1"); len(r.Snapshots) != 0 || r.AutoSeq != 0 || r.State != sandbox.Running {
		t.Errorf("after a refused restore: state %q, snapshots %v, auto_seq %d", r.State, snapshotIDs(r), r.AutoSeq)
	}
}

// TestRestoreOfAStoppedSandboxNeedsRoom: a restore boots a stopped
// sandbox, so it is refused with host_capacity, changing nothing, when
// the host has no memory for it; with room, it runs.
func TestRestoreOfAStoppedSandboxNeedsRoom(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	stopIt(t, h, m)
	before := h.get("sb-1")
	h.mem.Store(100)
	_, err := m.Restore(ctx, "sb-1", "v1", false)
	if fault.CodeOf(err) != "host_capacity" {
		t.Fatalf("Restore with no room: %v, want host_capacity", err)
	}
	if after := h.get("sb-1"); after.State != sandbox.Stopped || len(after.Snapshots) != len(before.Snapshots) {
		t.Fatalf("a refused restore changed the sandbox: %+v", after)
	}
	h.mem.Store(16 << 10)
	restore(t, m, "sb-1", "v1", false)
	if r := h.get("sb-1"); r.State != sandbox.Running {
		t.Fatalf("after the restore: %s", r.State)
	}
	checkStore(t, m)
}

// TestRestoreSavesAutoInBackground: a restore of a running sandbox
// answers running while its old machine's memory is still being written
// (auto-N processing, the old machine alive, its memory admitted beside
// the new one's); once the write ends, auto-N is ready with its state
// and the old machine has ended. A host without memory for both machines
// writes auto-N first, as before.
func TestRestoreSavesAutoInBackground(t *testing.T) {
	for _, tc := range []struct {
		name       string
		total      int // MemTotal, MiB
		background bool
	}{
		{"room for both", 16 << 10, true},
		{"room for one", 512 + 256 + 64 + 64 + 100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			m := h.manager(func(c *sandbox.Config) {
				c.QEMUVersion, c.ReserveMiB = qemuVersion, 512
				c.MemTotal = func() (int, error) { return tc.total, nil }
			})
			h.running(m, "sb-1")
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
			old := h.drv.last("sb-1")
			gate := make(chan struct{})
			var release sync.Once
			open := func() { release.Do(func() { close(gate) }) }
			t.Cleanup(open)
			old.plan.saveGate = gate
			saves := old.saves.Load()

			done := make(chan sandbox.RestoreResult, 1)
			go func() {
				res, err := m.Restore(context.Background(), "sb-1", "v1", false)
				if err != nil {
					t.Errorf("Restore: %v", err)
				}
				done <- res
			}()
			if !tc.background {
				// The restore waits for the write: nothing answers until
				// the gate opens.
				for old.saves.Load() == saves {
					time.Sleep(time.Millisecond)
				}
				select {
				case <-done:
					t.Fatal("a restore that had no room for both machines answered before auto-1 was written")
				case <-time.After(200 * time.Millisecond):
				}
				open()
				<-done
				r := h.get("sb-1")
				if auto, _ := r.Snapshot("auto-1"); auto.Status != sandbox.SnapshotReady || !old.exited() {
					t.Fatalf("auto-1 %+v, old machine exited %v: want ready, ended", auto, old.exited())
				}
				return
			}
			res := <-done
			r := h.get("sb-1")
			auto, _ := r.Snapshot("auto-1")
			if res.State != sandbox.Running || res.AutoID != "auto-1" || auto.Status != sandbox.SnapshotProcessing || auto.State == "" || old.exited() {
				t.Fatalf("restore answered %+v; auto-1 %+v, old machine exited %v: want running, auto-1 processing, the old machine writing it", res, auto, old.exited())
			}
			if fm := h.drv.last("sb-1"); fm == old || fm.exited() || r.Machine.Process == nil || *r.Machine.Process != fm.proc {
				t.Fatalf("the record's machine %+v is not a new, running one", r.Machine.Process)
			}
			checkHealth(t, m, "sb-1")
			// An undo at once waits for auto-1 to be written, and then
			// restores it (not snapshot_not_ready).
			undone := make(chan error, 1)
			go func() {
				_, err := m.Restore(context.Background(), "sb-1", "auto-1", false)
				undone <- err
			}()
			select {
			case err := <-undone:
				t.Fatalf("the undo answered %v before auto-1 was written", err)
			case <-time.After(200 * time.Millisecond):
			}
			open()
			if err := <-undone; err != nil {
				t.Fatalf("the undo: %v", err)
			}
			m.AutoSaved()
			r = h.get("sb-1")
			auto, _ = r.Snapshot("auto-1")
			if auto.Status != sandbox.SnapshotReady || auto.State == "" || !old.exited() {
				t.Fatalf("after the write: auto-1 %+v, old machine exited %v; want ready with its state, ended", auto, old.exited())
			}
			// Nobody waits for that write: its QEMU was lowered.
			if old.lowered.Load() != 1 {
				t.Fatalf("the old machine was lowered %d times, want once", old.lowered.Load())
			}
			if _, err := os.Stat(h.statePath(auto.State)); err != nil {
				t.Fatalf("auto-1's state: %v", err)
			}
			if fm := h.drv.last("sb-1"); !fm.cfg.Incoming || fm.loaded.Load() != "sb-1" {
				t.Fatalf("the undo's machine did not load auto-1's memory: incoming %v", fm.cfg.Incoming)
			}
			checkStore(t, m)
		})
	}
}

// TestRestoreThroughTemplate: a restore of a memory snapshot whose
// template is made maps the snapshot's state and loads the template's
// devices, as a fork does; one whose template is not there loads the
// whole state.
func TestRestoreThroughTemplate(t *testing.T) {
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion; c.LazyTemplates = false })
	h.running(m, "sb-1")
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	v1 := waitTemplate(t, h, "sb-1", "v1")
	restore(t, m, "sb-1", "v1", false)
	got := h.get("sb-1")
	vm := h.drv.last("sb-1")
	if r := vm.cfg.RAM; r == nil || r.Shared || r.Path != h.statePath(v1.State) || r.Offset != v1.Template.RAMOffset || !slices.Equal(vm.cfg.Groups, []uint32{v1.Template.Gid}) {
		t.Fatalf("the restored machine's RAM %+v, groups %v; want v1's state from %d, group %d", r, vm.cfg.Groups, v1.Template.RAMOffset, v1.Template.Gid)
	}
	if vm.loaded.Load() != "sb-1" || got.Machine.RAM != v1.State || got.State != sandbox.Running {
		t.Errorf("restored: loaded %v, record %+v; want sb-1's memory, mapped", vm.loaded.Load(), got.Machine)
	}
	checkStore(t, m)

	// The template gone (as if it had never been made): the whole state.
	h.recs.Update(context.Background(), "sb-1", func(r *sandbox.Record) error {
		s, _ := r.Snapshot("v1")
		s.Template = nil
		return nil
	})
	restore(t, m, "sb-1", "v1", false)
	if vm := h.drv.last("sb-1"); vm.cfg.RAM != nil || vm.loaded.Load() != "sb-1" {
		t.Errorf("restored without a template: RAM %+v, loaded %v; want the whole state loaded", vm.cfg.RAM, vm.loaded.Load())
	}
	checkStore(t, m)
}

// TestLoadStartsOverOnAFreshTop: a fork whose load was done, its guest
// running (and so writing its top), when the host service went down is
// loaded again on a new top over the snapshot's disk: never over the
// writes of the guest it loaded the first time.
func TestLoadStartsOverOnAFreshTop(t *testing.T) {
	ctx := context.Background()
	h, m1 := snapshotHarness(t)
	snap := takeSnapshot(t, m1, "sb-1", sandbox.SnapshotRequest{Memory: true})
	gate := make(chan struct{})
	h.drv.setPlan(plan{gate: gate}) // loaded, but guestd does not answer yet
	if _, err := m1.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-fork", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	first := waitMachine(t, h.drv, "sb-fork")
	for first.loaded.Load() == nil {
		time.Sleep(time.Millisecond)
	}
	firstTop := first.cfg.Disk[0].Path
	m1.Close()
	close(gate)
	h.drv.setPlan(plan{})
	m2 := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-fork", sandbox.Running)
	again := h.drv.last("sb-fork")
	if again == first || again.loaded.Load() != "sb-1" {
		t.Fatal("the interrupted load was not done again in a new machine")
	}
	got := diskPaths(again)
	if got[0] == firstTop || !slices.Equal(got[1:], h.chainPaths(snap.Disk)) {
		t.Fatalf("the load started over on %v; the first ran on %s over %v", got, firstTop, h.chainPaths(snap.Disk))
	}
	if first.howExited() == "" {
		t.Error("the first machine still runs")
	}
	checkStore(t, m2)
}
