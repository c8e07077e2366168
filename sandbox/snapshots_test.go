package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
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

// These tests run VM snapshots, restores and forks over fakeDriver
// (fake_test.go): a fake Save writes which machine it saved and its disk's
// top, a fake Load reads them back, so a test can tell which memory a
// machine came back from and over which disk. Every test ends with the
// host's store holding exactly what the records name (checkStore).

// TestSnapshot takes one snapshot of each kind of a sandbox in each place
// it can be: the snapshot freezes the disk as it was (its chain is the
// sandbox's previous one) and the sandbox goes on over a new empty top; a
// memory snapshot keeps a state that needs this host's QEMU; a running
// sandbox runs on in the same machine, switched to the new top; the next
// boot uses the new chain.
func TestSnapshot(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		to     func(*testing.T, *harness, *sandbox.Manager) // nil: running
		state  sandbox.State
		memory bool
		code   string // the fault wanted, or ""
	}{
		{name: "running_memory", state: sandbox.Running, memory: true},
		{name: "running_disk_only", state: sandbox.Running},
		// A paused sandbox's memory is in the store already: the
		// snapshot shares it.
		{name: "paused_memory", to: pauseIt, state: sandbox.Paused, memory: true},
		{name: "paused_disk_only", to: pauseIt, state: sandbox.Paused},
		{name: "stopped_disk_only", to: stopIt, state: sandbox.Stopped},
		{name: "stopped_memory", to: stopIt, state: sandbox.Stopped, memory: true, code: "sandbox_not_running"},
		{name: "error_disk_only", to: killIt, state: sandbox.Error},
		{name: "error_memory", to: killIt, state: sandbox.Error, memory: true, code: "sandbox_not_running"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, m := snapshotHarness(t)
			if tc.to != nil {
				tc.to(t, h, m)
			}
			fm := h.drv.last("sb-1")
			before := h.get("sb-1")
			t0 := time.Now()
			s, err := m.Snapshot(ctx, "sb-1", sandbox.SnapshotRequest{Comment: "before the upgrade", Memory: tc.memory})
			if tc.code != "" {
				wantFault(t, "Snapshot", err, tc.code, tc.state)
				if after := recordJSON(t, h, "sb-1"); after != mustJSON(t, before) {
					t.Errorf("a refused snapshot changed the record:\n%s\nwas\n%s", after, mustJSON(t, before))
				}
				checkStore(t, m)
				return
			}
			if err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			if s.Unsynced == "" {
				t.Error("a snapshot answered ready before its files are on disk is not marked so")
			}
			m.Synced()
			s.Unsynced = ""
			after := h.get("sb-1")
			if stored, ok := after.Snapshot("v1"); !ok || !reflect.DeepEqual(*stored, s) {
				t.Errorf("recorded snapshot %+v, answered %+v", stored, s)
			}
			if s.ID != "v1" || s.Status != sandbox.SnapshotReady || s.Memory != tc.memory || s.Auto || s.Pinned || s.Comment != "before the upgrade" {
				t.Errorf("snapshot %+v; want v1, ready, memory %v, neither auto nor pinned, with its comment", s, tc.memory)
			}
			if s.SizeBytes < 0 || s.CreatedAt.Before(t0.Add(-time.Second)) || s.CreatedAt.After(time.Now().Add(time.Second)) {
				t.Errorf("snapshot size %d, created at %v (taken at %v)", s.SizeBytes, s.CreatedAt, t0)
			}
			if s.MemoryMiB != 256 || s.VCPUs != 1 || s.DiskGiB != 1 {
				t.Errorf("snapshot of a 256 MiB, 1 vCPU, 1 GiB sandbox records %d MiB, %d vCPUs, %d GiB", s.MemoryMiB, s.VCPUs, s.DiskGiB)
			}
			// The disk as it was is frozen; the sandbox goes on over a
			// new top above it.
			if !slices.Equal(s.Disk, before.Machine.Disk) || s.BaseDisk != h.image.Disk {
				t.Errorf("snapshot disk %v over %s; want the sandbox's chain %v over %s", s.Disk, s.BaseDisk, before.Machine.Disk, h.image.Disk)
			}
			top := after.Machine.Disk[0]
			if !slices.Equal(after.Machine.Disk[1:], before.Machine.Disk) || slices.Contains(before.Machine.Disk, top) || !exists(h.layerPath(top)) {
				t.Errorf("sandbox disk %v after the snapshot; want a new top over %v", after.Machine.Disk, before.Machine.Disk)
			}
			if after.State != tc.state {
				t.Errorf("state %q after the snapshot, want %q", after.State, tc.state)
			}
			if tc.memory {
				want := sandbox.Needs{QEMU: qemuVersion, DeviceSet: vmm.DeviceSet, Accel: vmm.TCG, Image: h.image.Key}
				if s.State == "" || !exists(h.statePath(s.State)) || s.Needs == nil || *s.Needs != want {
					t.Errorf("memory snapshot state %q (needs %+v); want a state in the store that needs %+v", s.State, s.Needs, want)
				}
				if tc.state == sandbox.Paused && s.State != before.Machine.Saved {
					t.Errorf("snapshot of a paused sandbox has state %q; want the pause's %q, shared", s.State, before.Machine.Saved)
				}
			} else if s.State != "" || s.Needs != nil {
				t.Errorf("disk-only snapshot has state %q, needs %+v", s.State, s.Needs)
			}
			if tc.state == sandbox.Running {
				// The same machine runs on, switched to the new top.
				if h.drv.starts("sb-1") != 1 || fm.exited() || fm.Top0() != "l"+top {
					t.Errorf("%d machines started, first exited %v, its top %q; want the first running over l%s", h.drv.starts("sb-1"), fm.exited(), fm.Top0(), top)
				}
				if running, _ := fm.Running(ctx); !running {
					t.Error("the machine's CPUs are stopped after the snapshot")
				}
				if tc.memory && fm.saves.Load() != 1 {
					t.Errorf("%d saves, want 1", fm.saves.Load())
				}
				checkHealth(t, m, "sb-1")
			}
			checkStore(t, m)

			// The next boot goes on over the new top.
			switch tc.state {
			case sandbox.Running:
				stopIt(t, h, m)
				fallthrough
			case sandbox.Stopped, sandbox.Error:
				if _, err := m.Start(ctx, "sb-1"); err != nil {
					t.Fatal(err)
				}
			case sandbox.Paused:
				if _, err := m.Resume(ctx, "sb-1"); err != nil {
					t.Fatal(err)
				}
			}
			h.waitState("sb-1", sandbox.Running)
			next := h.drv.last("sb-1")
			got, want := diskPaths(next), h.chainPaths(after.Machine.Disk)
			if tc.state == sandbox.Paused {
				// A load runs on a new top of its own over the disk its
				// memory was saved with (the snapshot's frozen one).
				got, want = got[1:], want[1:]
			}
			if !slices.Equal(got, want) {
				t.Errorf("next boot's disk %v, want %v", got, want)
			}
			if tc.state == sandbox.Paused && next.loaded.Load() != "sb-1" {
				t.Error("the paused sandbox did not come back from its saved memory")
			}
			if tc.memory && !exists(h.statePath(s.State)) {
				t.Errorf("the snapshot's state is gone from the store once the sandbox ran again")
			}
			checkStore(t, m)
		})
	}
}

// TestSnapshotIDs: snapshots are v1, v2… and a restore's automatic ones
// auto-1, auto-2…, each numbered on from the last given, so an id is
// never given twice, whatever was deleted.
func TestSnapshotIDs(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	snap := func(memory bool) func() (string, error) {
		return func() (string, error) {
			s, err := m.Snapshot(ctx, "sb-1", sandbox.SnapshotRequest{Memory: memory})
			return s.ID, err
		}
	}
	del := func(ids ...string) func() (string, error) {
		return func() (string, error) {
			for _, id := range ids {
				if err := m.DeleteSnapshot(ctx, "sb-1", id); err != nil {
					return "", err
				}
			}
			return "", nil
		}
	}
	rest := func(id string) func() (string, error) {
		return func() (string, error) {
			res, err := m.Restore(ctx, "sb-1", id, false)
			m.AutoSaved()
			return res.AutoID, err
		}
	}
	steps := []struct {
		name   string
		do     func() (string, error)
		made   string // the id of the snapshot the step made, or ""
		memory bool   // whether it keeps memory
		ids    []string
	}{
		{"memory", snap(true), "v1", true, []string{"v1"}},
		{"disk_only", snap(false), "v2", false, []string{"v1", "v2"}},
		{"memory_again", snap(true), "v3", true, []string{"v1", "v2", "v3"}},
		{"delete_the_newest", del("v3", "v2"), "", false, []string{"v1"}},
		{"after_deletes", snap(false), "v4", false, []string{"v1", "v4"}},
		{"restore", rest("v1"), "auto-1", true, []string{"v1", "v4", "auto-1"}},
		{"restore_again", rest("v4"), "auto-2", true, []string{"v1", "v4", "auto-1", "auto-2"}},
		{"delete_the_newest_auto", del("auto-2"), "", false, []string{"v1", "v4", "auto-1"}},
		{"restore_after_delete", rest("v1"), "auto-3", true, []string{"v1", "v4", "auto-1", "auto-3"}},
		{"delete_all", del("v1", "v4", "auto-1", "auto-3"), "", false, []string{}},
		{"after_all_deleted", snap(true), "v5", true, []string{"v5"}},
		{"restore_after_all_deleted", rest("v5"), "auto-4", true, []string{"v5", "auto-4"}},
	}
	for _, st := range steps {
		made, err := st.do()
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		r := h.get("sb-1")
		if made != st.made || !slices.Equal(snapshotIDs(r), st.ids) {
			t.Fatalf("%s: made %q, snapshots %v; want %q, %v", st.name, made, snapshotIDs(r), st.made, st.ids)
		}
		if made != "" {
			s, _ := r.Snapshot(made)
			auto := strings.HasPrefix(made, "auto-")
			if s.Auto != auto || s.Memory != st.memory || s.Status != sandbox.SnapshotReady || s.CreatedAt.IsZero() || s.SizeBytes < 0 {
				t.Errorf("%s: %+v; want auto %v, memory %v, ready, with its time and size", st.name, s, auto, st.memory)
			}
		}
		checkStore(t, m)
	}
	if r := h.get("sb-1"); r.SnapshotSeq != 5 || r.AutoSeq != 4 {
		t.Errorf("record's numbers %d, %d; want 5 and 4", r.SnapshotSeq, r.AutoSeq)
	}
}

// TestSnapshotLimits: a sandbox keeps at most MaxMemorySnapshots memory
// snapshots and MaxDiskSnapshots disk-only ones, each kind counted on its
// own and automatic ones not at all. One more is refused with
// snapshot_limit, deleting nothing; with RetentionMax, the oldest of the
// kind that are neither pinned nor automatic go (as many as needed to
// keep RetentionMax), and when too few can, it is refused all the same.
//
// Regression: the retention that ran once the snapshot was ready counted
// the new snapshot twice (it was in the record already, and victims adds
// the one to come), so one snapshot too many went: RetentionMax 3 kept 2,
// a snapshot at the limit took the two oldest, and with only itself left
// eligible the new snapshot deleted itself after answering success.
func TestSnapshotLimits(t *testing.T) {
	ctx := context.Background()
	mem := sandbox.MaxMemorySnapshots
	seq := func(from, to int) []string {
		var ids []string
		for i := from; i <= to; i++ {
			ids = append(ids, fmt.Sprintf("v%d", i))
		}
		return ids
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, h *harness, m *sandbox.Manager)
		req   sandbox.SnapshotRequest
		code  string   // the fault wanted, or ""
		ids   []string // the snapshots after
	}{
		{
			name:  "memory_under_the_limit",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) { takeSnapshots(t, m, mem-1, true) },
			req:   sandbox.SnapshotRequest{Memory: true},
			ids:   seq(1, mem),
		},
		{
			name:  "memory_over_the_limit",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) { takeSnapshots(t, m, mem, true) },
			req:   sandbox.SnapshotRequest{Memory: true},
			code:  "snapshot_limit",
			ids:   seq(1, mem),
		},
		{
			name:  "retention_at_the_limit",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) { takeSnapshots(t, m, mem, true) },
			req:   sandbox.SnapshotRequest{Memory: true, RetentionMax: mem},
			ids:   seq(2, mem+1),
		},
		{
			name:  "retention_below_the_limit",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) { takeSnapshots(t, m, 5, true) },
			req:   sandbox.SnapshotRequest{Memory: true, RetentionMax: 3},
			ids:   seq(4, 6),
		},
		{
			name:  "retention_not_reached",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) { takeSnapshots(t, m, 2, true) },
			req:   sandbox.SnapshotRequest{Memory: true, RetentionMax: 3},
			ids:   seq(1, 3),
		},
		{
			name: "retention_skips_pinned",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) {
				takeSnapshots(t, m, mem, true)
				pin(t, m, "sb-1", "v1", "v2")
			},
			req: sandbox.SnapshotRequest{Memory: true, RetentionMax: mem},
			ids: append([]string{"v1", "v2"}, seq(4, mem+1)...),
		},
		{
			name: "retention_skips_autos",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) {
				takeSnapshots(t, m, 1, true)
				restore(t, m, "sb-1", "v1", false) // auto-1, with memory
			},
			req: sandbox.SnapshotRequest{Memory: true, RetentionMax: 1},
			ids: []string{"auto-1", "v2"},
		},
		{
			name: "autos_not_counted",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) {
				takeSnapshots(t, m, mem-1, true)
				restore(t, m, "sb-1", "v1", false)
			},
			req: sandbox.SnapshotRequest{Memory: true},
			ids: append(seq(1, mem-1), "auto-1", fmt.Sprintf("v%d", mem)),
		},
		{
			name: "retention_none_eligible",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) {
				takeSnapshots(t, m, mem, true)
				pin(t, m, "sb-1", seq(1, mem)...)
			},
			req:  sandbox.SnapshotRequest{Memory: true, RetentionMax: mem},
			code: "snapshot_limit",
			ids:  seq(1, mem),
		},
		{
			name: "retention_too_few_eligible",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) {
				takeSnapshots(t, m, mem, true)
				pin(t, m, "sb-1", seq(2, mem)...)
			},
			req:  sandbox.SnapshotRequest{Memory: true, RetentionMax: mem - 2},
			code: "snapshot_limit",
			ids:  seq(1, mem),
		},
		{
			name:  "disk_only_not_counted_against_memory",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) { takeSnapshots(t, m, mem, true) },
			req:   sandbox.SnapshotRequest{},
			ids:   seq(1, mem+1),
		},
		{
			name: "memory_retention_spares_disk_only",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) {
				takeSnapshots(t, m, 1, false)
				takeSnapshots(t, m, mem, true)
			},
			req: sandbox.SnapshotRequest{Memory: true, RetentionMax: mem},
			ids: append([]string{"v1"}, seq(3, mem+2)...),
		},
		{
			name: "disk_only_over_the_limit",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) {
				copyDiskSnapshots(t, h, m, sandbox.MaxDiskSnapshots)
			},
			req:  sandbox.SnapshotRequest{},
			code: "snapshot_limit",
			ids:  seq(1, sandbox.MaxDiskSnapshots),
		},
		{
			name: "memory_beside_disk_only_at_the_limit",
			setup: func(t *testing.T, h *harness, m *sandbox.Manager) {
				copyDiskSnapshots(t, h, m, sandbox.MaxDiskSnapshots)
			},
			req: sandbox.SnapshotRequest{Memory: true},
			ids: seq(1, sandbox.MaxDiskSnapshots+1),
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, m := snapshotHarness(t)
			tc.setup(t, h, m)
			before := h.get("sb-1")
			files := checkStore(t, m).Files
			s, err := m.Snapshot(ctx, "sb-1", tc.req)
			after := h.get("sb-1")
			if got := snapshotIDs(after); !slices.Equal(got, tc.ids) {
				t.Errorf("snapshots %v, want %v", got, tc.ids)
			}
			if tc.code != "" {
				wantFault(t, "Snapshot", err, tc.code, "")
				limit := sandbox.MaxDiskSnapshots
				if tc.req.Memory {
					limit = sandbox.MaxMemorySnapshots
				}
				if f := fault.As(err).Fields; f["limit"] != limit || f["memory"] != tc.req.Memory {
					t.Errorf("fields %v; want limit %d, memory %v", f, limit, tc.req.Memory)
				}
				if mustJSON(t, after) != mustJSON(t, before) {
					t.Error("a refused snapshot changed the record")
				}
				if rep := checkStore(t, m); rep.Files != files {
					t.Errorf("%d store files after a refused snapshot, %d before", rep.Files, files)
				}
				return
			}
			if err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			if want := fmt.Sprintf("v%d", before.SnapshotSeq+1); s.ID != want || s.Memory != tc.req.Memory {
				t.Errorf("made %s (memory %v), want %s (memory %v)", s.ID, s.Memory, want, tc.req.Memory)
			}
			// What retention deleted, it deleted whole: the store holds
			// no file of it that nothing else names.
			checkStore(t, m)
		})
	}
}

// TestSnapshotPinAndDelete: pinning changes only the pin; deleting a
// snapshot deletes its files unless something else names them, and never
// touches the sandbox; what cannot be done is refused with a code.
func TestSnapshotPinAndDelete(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		run  func(t *testing.T, h *harness, m *sandbox.Manager)
	}{
		{"pin_unpin", func(t *testing.T, h *harness, m *sandbox.Manager) {
			for _, pinned := range []bool{true, false, true} {
				s, err := m.PinSnapshot(ctx, "sb-1", "v1", pinned)
				if err != nil {
					t.Fatal(err)
				}
				r := h.get("sb-1")
				stored, _ := r.Snapshot("v1")
				if s.Pinned != pinned || !reflect.DeepEqual(*stored, s) {
					t.Errorf("pin %v: answered %+v, recorded %+v", pinned, s, stored)
				}
			}
		}},
		{"pin_unknown", func(t *testing.T, h *harness, m *sandbox.Manager) {
			_, err := m.PinSnapshot(ctx, "sb-1", "v9", true)
			wantFault(t, "PinSnapshot", err, "snapshot_not_found", "")
			_, err = m.PinSnapshot(ctx, "sb-nope", "v1", true)
			wantFault(t, "PinSnapshot", err, "sandbox_not_found", "")
		}},
		{"delete_unknown", func(t *testing.T, h *harness, m *sandbox.Manager) {
			before := recordJSON(t, h, "sb-1")
			wantFault(t, "DeleteSnapshot", m.DeleteSnapshot(ctx, "sb-1", "v9"), "snapshot_not_found", "")
			wantFault(t, "DeleteSnapshot", m.DeleteSnapshot(ctx, "sb-nope", "v1"), "sandbox_not_found", "")
			if recordJSON(t, h, "sb-1") != before {
				t.Error("a refused delete changed the record")
			}
		}},
		{"delete_processing", func(t *testing.T, h *harness, m *sandbox.Manager) {
			editSnapshot(t, h, "sb-1", "v1", func(s *sandbox.Snapshot) { s.Status = sandbox.SnapshotProcessing })
			before := recordJSON(t, h, "sb-1")
			wantFault(t, "DeleteSnapshot", m.DeleteSnapshot(ctx, "sb-1", "v1"), "operation_in_progress", "")
			if recordJSON(t, h, "sb-1") != before {
				t.Error("a refused delete changed the record")
			}
			// Check tells of the snapshot still being taken.
			rep, err := m.Check(ctx)
			if err != nil || !slices.Equal(rep.Unfinished, []string{"sb-1/v1"}) || len(rep.Missing)+len(rep.Orphans) != 0 {
				t.Errorf("Check: %+v, %v; want sb-1/v1 unfinished, nothing else", rep, err)
			}
			editSnapshot(t, h, "sb-1", "v1", func(s *sandbox.Snapshot) { s.Status = sandbox.SnapshotReady })
		}},
		{"delete_pinned", func(t *testing.T, h *harness, m *sandbox.Manager) {
			pin(t, m, "sb-1", "v1")
			if err := m.DeleteSnapshot(ctx, "sb-1", "v1"); err != nil {
				t.Fatalf("a pinned snapshot is deleted when asked: %v", err)
			}
		}},
		{"delete_frees_its_files", func(t *testing.T, h *harness, m *sandbox.Manager) {
			fm := h.drv.last("sb-1")
			before := h.get("sb-1")
			v1, _ := before.Snapshot("v1")
			if err := m.DeleteSnapshot(ctx, "sb-1", "v1"); err != nil {
				t.Fatal(err)
			}
			after := h.get("sb-1")
			if exists(h.statePath(v1.State)) {
				t.Error("the deleted snapshot's state is still in the store")
			}
			// Its disk is the lower part of the sandbox's: kept.
			for _, p := range h.chainPaths(after.Machine.Disk) {
				if !exists(p) {
					t.Errorf("the sandbox's layer %s went with its snapshot", p)
				}
			}
			// The same top, over the same chain or (the deleted
			// snapshot's layers merged into it) a shorter part of it.
			short := len(after.Machine.Disk) > 0 && after.Machine.Disk[0] == before.Machine.Disk[0] &&
				slices.Equal(after.Machine.Disk[1:], before.Machine.Disk[len(before.Machine.Disk)-len(after.Machine.Disk)+1:])
			if !short || after.State != sandbox.Running || fm.exited() || h.drv.starts("sb-1") != 1 {
				t.Errorf("deleting a snapshot touched the sandbox: %+v", after)
			}
			checkHealth(t, m, "sb-1")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, m := snapshotHarness(t)
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
			tc.run(t, h, m)
			checkStore(t, m)
		})
	}
}

// TestFailedSnapshotsNotKeptByRetention: failed automatic snapshots do not
// count against KeepAutoSnapshots (they pushed ready ones out), and failed
// snapshots older than FailedSnapshotAge, or beyond the newest
// KeepFailedSnapshots, go at the next snapshot.
func TestFailedSnapshotsNotKeptByRetention(t *testing.T) {
	h, m := snapshotHarness(t)
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	restore(t, m, "sb-1", "v1", false) // auto-1, ready
	old := time.Now().Add(-2 * sandbox.FailedSnapshotAge)
	if _, err := h.recs.Update(context.Background(), "sb-1", func(r *sandbox.Record) error {
		for i := range 8 {
			r.AutoSeq++
			created := time.Now()
			if i < 2 {
				created = old
			}
			r.Snapshots = append(r.Snapshots, sandbox.Snapshot{ID: fmt.Sprintf("auto-%d", r.AutoSeq), Auto: true, Status: sandbox.SnapshotFailed, CreatedAt: created})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for range sandbox.KeepAutoSnapshots - 1 {
		restore(t, m, "sb-1", "v1", false)
	}
	r := h.get("sb-1")
	var ready, failed []string
	for _, s := range r.Snapshots {
		switch {
		case s.Auto && s.Status == sandbox.SnapshotReady:
			ready = append(ready, s.ID)
		case s.Status == sandbox.SnapshotFailed:
			failed = append(failed, s.ID)
		}
	}
	if len(ready) != sandbox.KeepAutoSnapshots || !slices.Contains(ready, "auto-1") {
		t.Errorf("ready automatic snapshots %v: want %d, auto-1 among them", ready, sandbox.KeepAutoSnapshots)
	}
	if want := []string{"auto-7", "auto-8", "auto-9"}; !slices.Equal(failed, want) {
		t.Errorf("failed snapshots kept %v, want the newest %d: %v", failed, sandbox.KeepFailedSnapshots, want)
	}
	checkStore(t, m)
}

// TestPauseHoldsNoStoreLock: while a pause saves a sandbox's memory (held
// back here), a collection of the store and the snapshots of another
// sandbox go on, and the state file the save writes is not collected:
// the pause ends paused and resumes.
//
// Regression: saveAndQuit held storeMu's read lock for its whole save (up
// to 30 s); a collection waiting for the write lock then blocked every
// other sandbox's snapshot, boot, fork and restore.
func TestPauseHoldsNoStoreLock(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	gate := make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the Manager's Close, which waits for the pause
	h.drv.setPlan(plan{saveGate: gate})
	h.running(m, "sb-2")
	fm := h.drv.last("sb-2")
	if _, err := m.Pause(ctx, "sb-2"); err != nil {
		t.Fatal(err)
	}
	for fm.saves.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- m.DeleteSnapshot(ctx, "sb-1", "v1") }()
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitFor):
		t.Fatal("a delete's collection waited for another sandbox's pause")
	}
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	open()
	h.waitState("sb-2", sandbox.Paused)
	if _, err := m.Resume(ctx, "sb-2"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-2", sandbox.Running)
	checkStore(t, m)
}

// TestCompactionBoundsTheChain: snapshots each followed by the delete of
// the one before, on a running sandbox (its QEMU switches to the merged
// layer) and on a stopped one (its record alone), leave chains within the bound
// and a store of a fixed size. (Regression: every snapshot added a layer
// for good; 2 snapshots kept, 31 layers.)
func TestCompactionBoundsTheChain(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	cycles := func(n int) {
		for range n {
			s := takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
			r := h.get("sb-1")
			for _, old := range r.Snapshots {
				if old.ID != s.ID {
					if err := m.DeleteSnapshot(ctx, "sb-1", old.ID); err != nil {
						t.Fatal(err)
					}
				}
			}
			waitChain(t, h, "sb-1")
		}
	}
	cycles(40)
	if h.drv.last("sb-1").rebases.Load() == 0 {
		t.Error("the running QEMU never switched to a merged layer")
	}
	rep := checkStore(t, m)
	if _, err := m.Stop(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	cycles(20)
	r := waitChain(t, h, "sb-1")
	for _, move := range []string{"disk chain switched to a merged layer", "snapshot layers merged"} {
		if !strings.Contains(h.logs.String(), move) {
			t.Errorf("no %q in the log", move)
		}
	}
	if after := checkStore(t, m); after.Files > rep.Files {
		t.Errorf("the store grew from %d to %d files over the cycles", rep.Files, after.Files)
	}
	// The stopped sandbox's top was rebased: its file names what the
	// record says is under it.
	out, err := exec.Command("qemu-img", "info", "--output=json", h.layerPath(r.Machine.Disk[0])).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := h.image.Disk
	if len(r.Machine.Disk) > 1 {
		want = h.layerPath(r.Machine.Disk[1])
	}
	var info struct {
		Backing string `json:"backing-filename"`
	}
	json.Unmarshal(out, &info)
	if info.Backing != want {
		t.Errorf("the top's backing file is %q, the record's chain %v", info.Backing, r.Machine.Disk)
	}
	if _, err := m.Start(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Running)
	if got, want := diskPaths(h.drv.last("sb-1")), h.chainPaths(h.get("sb-1").Machine.Disk); !slices.Equal(got, want) {
		t.Errorf("boot after the cycles: disk %v, want %v", got, want)
	}
}

// TestSnapshotWaitsForCompaction: a snapshot asked for while the
// sandbox's QEMU streams its disk waits for the stream, and the disk's
// top is switched only once the stream has ended (the fake refuses the
// switch under a job, as QEMU would).
func TestSnapshotWaitsForCompaction(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
	gate := make(chan struct{})
	h.drv.setPlan(plan{streamGate: gate})
	h.running(m, "sb-1")
	fm := h.drv.last("sb-1")
	// The newer one goes: its top, unpinned, is streamed into the live top.
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: false})
	v2 := takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: false})
	if err := m.DeleteSnapshot(ctx, "sb-1", v2.ID); err != nil {
		t.Fatal(err)
	}
	for fm.streams.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	done := make(chan error, 1)
	go func() {
		_, err := m.Snapshot(ctx, "sb-1", sandbox.SnapshotRequest{Memory: false})
		done <- err
	}()
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("a snapshot after a compaction: %v", err)
	}
	if fm.streamed.Load() == 0 {
		t.Error("the stream never completed")
	}
	m.Synced()
	checkStore(t, m)
}

// TestSnapshotNames: a snapshot may be named, once per sandbox: a second
// snapshot of the name is name_taken and records nothing, and the name is
// free again once its snapshot is deleted.
func TestSnapshotNames(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	first := takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Name: "after-build"})
	if first.Name != "after-build" {
		t.Fatalf("snapshot %+v, want the name after-build", first)
	}
	_, err := m.Snapshot(ctx, "sb-1", sandbox.SnapshotRequest{Name: "after-build"})
	if fault.CodeOf(err) != "name_taken" || fault.KindOf(err) != fault.Conflict {
		t.Fatalf("a second after-build: %v, want name_taken", err)
	}
	r := h.get("sb-1")
	if len(r.Snapshots) != 1 {
		t.Fatalf("the refused snapshot was recorded: %+v", r.Snapshots)
	}
	if sn, ok := r.SnapshotNamed("after-build"); !ok || sn.ID != first.ID {
		t.Fatalf("SnapshotNamed(after-build): %+v %v", sn, ok)
	}
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Name: "other"})
	if err := m.DeleteSnapshot(ctx, "sb-1", first.ID); err != nil {
		t.Fatal(err)
	}
	if again := takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Name: "after-build"}); again.ID == first.ID {
		t.Fatalf("the name's new snapshot has the old one's id %s", again.ID)
	}
}
