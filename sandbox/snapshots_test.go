package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
	"strata/sandbox"
	"strata/vmm"
)

// These tests run VM snapshots, restores and forks over fakeDriver
// (fake_test.go): a fake Save writes which machine it saved and its disk's
// top, a fake Load reads them back, so a test can tell which memory a
// machine came back from and over which disk. Every test ends with the
// host's store holding exactly what the records name (checkStore).

// qemuVersion is the host's QEMU as these tests' Managers report it: a
// memory snapshot records it.
const qemuVersion = "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)"

// snapshotHarness starts a Manager (reporting qemuVersion) with sandbox
// sb-1 running.
func snapshotHarness(t *testing.T) (*harness, *sandbox.Manager) {
	t.Helper()
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
	h.running(m, "sb-1")
	return h, m
}

// checkStore fails t unless the host's store holds exactly what the
// records name: no file missing, none orphaned, no snapshot unfinished.
func checkStore(t *testing.T, m *sandbox.Manager) sandbox.StoreReport {
	t.Helper()
	// A load collects the store in the background, and a restore writes
	// its automatic snapshot's memory there after it answers: orphans and
	// unfinished snapshots may stand for a moment (longer on a busy
	// machine), missing files never.
	var rep sandbox.StoreReport
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var err error
		if rep, err = m.Check(context.Background()); err != nil {
			t.Fatalf("Check: %v", err)
		}
		if rep.Clean() || len(rep.Missing) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if !rep.Clean() {
		t.Errorf("store not clean: %d files, missing %v, orphans %v, unfinished %v", rep.Files, rep.Missing, rep.Orphans, rep.Unfinished)
	}
	return rep
}

func (h *harness) layerPath(id string) string { return filepath.Join(h.dir, "store", id+".qcow2") }
func (h *harness) statePath(id string) string { return filepath.Join(h.dir, "store", id+".state") }

// chainPaths is the disk QEMU must get for layers (top first): their
// files in the store, then the image's base.
func (h *harness) chainPaths(layers []string) []string {
	var out []string
	for _, id := range layers {
		out = append(out, h.layerPath(id))
	}
	return append(out, h.image.Disk)
}

// diskPaths is the disk a fake machine was started with.
func diskPaths(fm *fakeMachine) []string {
	var out []string
	for _, l := range fm.cfg.Disk {
		out = append(out, l.Path)
	}
	return out
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// snapshotIDs are the ids of a record's snapshots, oldest first.
func snapshotIDs(r sandbox.Record) []string {
	ids := []string{}
	for _, s := range r.Snapshots {
		ids = append(ids, s.ID)
	}
	return ids
}

// takeSnapshot takes a snapshot of id and fails t if it is refused.
func takeSnapshot(t *testing.T, m *sandbox.Manager, id string, req sandbox.SnapshotRequest) sandbox.Snapshot {
	t.Helper()
	s, err := m.Snapshot(context.Background(), id, req)
	if err != nil {
		t.Fatalf("Snapshot of %s (%+v): %v", id, req, err)
	}
	// Its files reach the disk in the background, and then its record
	// loses the mark: tests compare records once that is done.
	m.Synced()
	s.Unsynced = ""
	return s
}

// copyDiskSnapshots takes one disk-only snapshot of sb-1 and records n-1
// copies of it by hand (over the same frozen disk): taking
// MaxDiskSnapshots through the Manager takes seconds, each one deepening
// the chain.
func copyDiskSnapshots(t *testing.T, h *harness, m *sandbox.Manager, n int) {
	t.Helper()
	s := takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	if _, err := h.recs.Update(context.Background(), "sb-1", func(r *sandbox.Record) error {
		for range n - 1 {
			r.SnapshotSeq++
			c := s
			c.ID, c.Disk = fmt.Sprintf("v%d", r.SnapshotSeq), slices.Clone(s.Disk)
			r.Snapshots = append(r.Snapshots, c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// takeSnapshots takes n snapshots of sb-1 of one kind.
func takeSnapshots(t *testing.T, m *sandbox.Manager, n int, memory bool) {
	t.Helper()
	for range n {
		takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: memory})
	}
}

func restore(t *testing.T, m *sandbox.Manager, id, snapID string, diskOnly bool) sandbox.RestoreResult {
	t.Helper()
	res, err := m.Restore(context.Background(), id, snapID, diskOnly)
	if err != nil {
		t.Fatalf("Restore %s to %s: %v", id, snapID, err)
	}
	// A running guest's memory may still be written (saveLater).
	m.AutoSaved()
	return res
}

func pin(t *testing.T, m *sandbox.Manager, id string, snapIDs ...string) {
	t.Helper()
	for _, s := range snapIDs {
		if _, err := m.PinSnapshot(context.Background(), id, s, true); err != nil {
			t.Fatalf("pin %s: %v", s, err)
		}
	}
}

// editSnapshot changes a snapshot in its sandbox's record by hand, as a
// crash or an older host would have left it.
func editSnapshot(t *testing.T, h *harness, id, snapID string, edit func(*sandbox.Snapshot)) {
	t.Helper()
	if _, err := h.recs.Update(context.Background(), id, func(r *sandbox.Record) error {
		s, ok := r.Snapshot(snapID)
		if !ok {
			return fmt.Errorf("no snapshot %s", snapID)
		}
		edit(s)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// recordJSON is a record as the registry keeps it, for comparing a record
// before and after an operation that must change nothing.
func recordJSON(t *testing.T, h *harness, id string) string {
	t.Helper()
	b, err := json.Marshal(h.get(id))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The places a running sandbox is moved to before a snapshot or a restore.
func pauseIt(t *testing.T, h *harness, m *sandbox.Manager) {
	t.Helper()
	if _, err := m.Pause(context.Background(), "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
}

func stopIt(t *testing.T, h *harness, m *sandbox.Manager) {
	t.Helper()
	if _, err := m.Stop(context.Background(), "sb-1"); err != nil {
		t.Fatal(err)
	}
}

func killIt(t *testing.T, h *harness, m *sandbox.Manager) {
	t.Helper()
	h.drv.last("sb-1").Kill()
	h.waitState("sb-1", sandbox.Error)
}

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

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
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

// checkIncompatible checks that v1 of sb-1 (running) is refused as
// incompatible for what, changing nothing, and then restores its disk.
func checkIncompatible(t *testing.T, h *harness, m *sandbox.Manager, what string) {
	t.Helper()
	ctx := context.Background()
	fm := h.drv.last("sb-1")
	before := recordJSON(t, h, "sb-1")
	_, err := m.Restore(ctx, "sb-1", "v1", false)
	wantFault(t, "Restore", err, "snapshot_incompatible", "")
	differs, _ := fault.As(err).Fields["differs"].(map[string]string)
	if len(differs) != 1 || !strings.Contains(differs[what], "snapshot needs") {
		t.Errorf("differs %v; want only %s, saying what the snapshot needs", fault.As(err).Fields["differs"], what)
	}
	_, err = m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-fork", Account: "acct"})
	wantFault(t, "Fork", err, "snapshot_incompatible", "")
	if after := recordJSON(t, h, "sb-1"); after != before {
		t.Errorf("an incompatible restore changed the record:\n%s\nwas\n%s", after, before)
	}
	if _, err := h.recs.Get(ctx, "sb-fork"); fault.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("an incompatible fork was recorded: %v", err)
	}
	if h.drv.starts("sb-1") != 1 || fm.exited() || h.drv.starts("sb-fork") != 0 {
		t.Error("an incompatible restore or fork touched a machine")
	}
	checkStore(t, m)

	res := restore(t, m, "sb-1", "v1", true)
	r := h.get("sb-1")
	v1, _ := r.Snapshot("v1")
	restored := h.drv.last("sb-1")
	if res.AutoID != "auto-1" || restored == fm || restored.cfg.Incoming || !slices.Equal(r.Machine.Disk[1:], v1.Disk) {
		t.Errorf("disk-only restore: %+v, machine incoming %v, disk %v; want a fresh boot over v1's disk %v", res, restored.cfg.Incoming, r.Machine.Disk, v1.Disk)
	}
	checkHealth(t, m, "sb-1")
	checkStore(t, m)
}

// TestFork: a fork is a new sandbox booted from a snapshot of another: it
// loads the snapshot's memory (when it has some), runs as a uid of its
// own over a top of its own above the snapshot's disk, and names every
// file it needs in its own record, so that it outlives the snapshot and
// its source sandbox. Once it alone reads the snapshot's layers, the
// compaction after its stop merges them into its top.
//
// Regression: the cold boot was compared with the chain before the stop,
// and failed whenever the stop's compaction ran before the start.
func TestFork(t *testing.T) {
	ctx := context.Background()
	deleteSource := func(t *testing.T, h *harness, m *sandbox.Manager) {
		if err := m.Delete(ctx, "sb-1"); err != nil {
			t.Fatal(err)
		}
		checkDeleted(t, h, "sb-1")
	}
	cases := []struct {
		name   string
		memory bool
		then   func(t *testing.T, h *harness, m *sandbox.Manager) // what becomes of the source
		alone  bool                                               // then the fork alone reads the snapshot's layers
	}{
		{name: "memory_source_deleted", memory: true, then: deleteSource, alone: true},
		{name: "memory_snapshot_then_source_deleted", memory: true, alone: true, then: func(t *testing.T, h *harness, m *sandbox.Manager) {
			if err := m.DeleteSnapshot(ctx, "sb-1", "v1"); err != nil {
				t.Fatal(err)
			}
			deleteSource(t, h, m)
		}},
		{name: "disk_only_source_deleted", then: deleteSource, alone: true},
		{name: "memory_source_restored_elsewhere", memory: true, then: func(t *testing.T, h *harness, m *sandbox.Manager) {
			restore(t, m, "sb-1", "v2", false)
			for _, id := range []string{"v1", "v2", "auto-1"} {
				if err := m.DeleteSnapshot(ctx, "sb-1", id); err != nil {
					t.Fatal(err)
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, m := snapshotHarness(t)
			src := h.get("sb-1")
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: tc.memory})
			v1Top := h.get("sb-1").Machine.Disk[0]
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
			srcRec := h.get("sb-1")
			v1, _ := srcRec.Snapshot("v1")

			f, err := m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-fork", Account: "acct", Name: "forked"})
			if err != nil {
				t.Fatalf("Fork: %v", err)
			}
			if f.State != sandbox.Creating || f.MemoryMiB != v1.MemoryMiB || f.VCPUs != v1.VCPUs || f.DiskGiB != v1.DiskGiB {
				t.Errorf("Fork answered %+v; want creating, the snapshot's size", f)
			}
			f = h.waitState("sb-fork", sandbox.Running)
			ffm := h.drv.last("sb-fork")
			if f.Machine.Uid == src.Machine.Uid || ffm.cfg.Uid != f.Machine.Uid {
				t.Errorf("fork runs as uid %d (machine %d), its source as %d; want one of its own", f.Machine.Uid, ffm.cfg.Uid, src.Machine.Uid)
			}
			top := f.Machine.Disk[0]
			if !slices.Equal(f.Machine.Disk[1:], v1.Disk) || slices.Contains(h.get("sb-1").Machine.Disk, top) {
				t.Errorf("fork's disk %v; want a top of its own over v1's %v", f.Machine.Disk, v1.Disk)
			}
			if got, want := diskPaths(ffm), h.chainPaths(f.Machine.Disk); !slices.Equal(got, want) {
				t.Errorf("fork's machine disk %v, want %v", got, want)
			}
			if ffm.cfg.Incoming != tc.memory || (tc.memory && (ffm.loaded.Load() != "sb-1" || ffm.loadedTop.Load() != "l"+v1Top)) {
				t.Errorf("fork incoming %v, loaded %v over %v; want loading %v (sb-1's v1, over l%s)", ffm.cfg.Incoming, ffm.loaded.Load(), ffm.loadedTop.Load(), tc.memory, v1Top)
			}
			if tc.memory && (ffm.cfg.RAM == nil || ffm.cfg.RAM.Shared || ffm.resyncs.Load() != 1) {
				t.Errorf("fork's RAM %+v, %d resyncs; want the template's, private, and one resync", ffm.cfg.RAM, ffm.resyncs.Load())
			}
			if tc.memory {
				// The template maps the snapshot's own mapped-ram
				// state, where its RAM's pages are: no RAM file is
				// written, and the state is the template group's to
				// read, no one else's.
				state := h.statePath(v1.State)
				if r := ffm.cfg.RAM; r == nil || r.Path != state || r.Offset < 1<<20 || r.Offset != f.Machine.RAMOffset {
					t.Errorf("fork's RAM %+v (record offset %d); want the snapshot's state %s from its pages", r, f.Machine.RAMOffset, state)
				}
				fi, err := os.Stat(state)
				if err != nil {
					t.Fatal(err)
				}
				if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Gid != f.Machine.RAMGid || f.Machine.RAMGid == 0 || fi.Mode().Perm() != 0o640 {
					t.Errorf("the mapped state: uid %d gid %d mode %v; want root's, group %d, 0640", st.Uid, st.Gid, fi.Mode().Perm(), f.Machine.RAMGid)
				}
				if rams, _ := filepath.Glob(filepath.Join(h.dir, "store", "*.ram")); len(rams) != 0 {
					t.Errorf("RAM files %v: the template maps the state", rams)
				}
			}
			if f.Machine.Saved != "" || len(f.Snapshots) != 0 || f.Name != "forked" || f.Account != "acct" {
				t.Errorf("fork's record %+v (machine %+v)", f, f.Machine)
			}
			if want := (sandbox.From{Sandbox: "sb-1", Snapshot: "v1"}); f.From == nil || *f.From != want {
				t.Errorf("fork's record says it is from %+v, want %+v", f.From, want)
			}
			if h.drv.last("sb-1").exited() || h.get("sb-1").State != sandbox.Running {
				t.Error("the fork stopped its source")
			}
			checkHealth(t, m, "sb-fork")
			checkStore(t, m)

			tc.then(t, h, m)

			// The fork runs on, and every file it names is there: a
			// cold boot opens its whole chain.
			if r := h.get("sb-fork"); r.State != sandbox.Running || ffm.exited() {
				t.Fatalf("fork %q, machine exited %v; want it running on", r.State, ffm.exited())
			}
			checkHealth(t, m, "sb-fork")
			checkStore(t, m)
			// Its chain as the record has it once a compaction the
			// source's delete started has ended (it may have merged the
			// layers the fork alone reads into its top).
			m.Compacted()
			for _, p := range h.chainPaths(h.get("sb-fork").Machine.Disk) {
				if !exists(p) {
					t.Errorf("the fork's layer %s is gone", p)
				}
			}
			if _, err := m.Stop(ctx, "sb-fork"); err != nil {
				t.Fatal(err)
			}
			// The stop compacts the fork's chain: layers it alone reads
			// now are merged into its top (qemu-img rebases it).
			m.Compacted()
			stopped := h.get("sb-fork")
			want := f.Machine.Disk
			if tc.alone {
				want = want[:1]
			}
			if !slices.Equal(stopped.Machine.Disk, want) {
				t.Errorf("stopped fork's disk %v (%v before); want %v", stopped.Machine.Disk, f.Machine.Disk, want)
			}
			if _, err := m.Start(ctx, "sb-fork"); err != nil {
				t.Fatal(err)
			}
			h.waitState("sb-fork", sandbox.Running)
			if got, want := diskPaths(h.drv.last("sb-fork")), h.chainPaths(stopped.Machine.Disk); !slices.Equal(got, want) {
				t.Errorf("fork's cold boot disk %v, want %v", got, want)
			}
			checkStore(t, m)
		})
	}
}

// TestForkSiblings: two forks of one snapshot share its files but nothing
// they write: each has a uid and a top of its own; deleting one leaves
// the other whole.
func TestForkSiblings(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	for _, id := range []string{"sb-a", "sb-b"} {
		if _, err := m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: id, Account: "acct"}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := h.waitState("sb-a", sandbox.Running), h.waitState("sb-b", sandbox.Running)
	if a.Machine.Uid == b.Machine.Uid || a.Machine.Disk[0] == b.Machine.Disk[0] || !slices.Equal(a.Machine.Disk[1:], b.Machine.Disk[1:]) {
		t.Errorf("siblings' uids %d, %d and disks %v, %v; want their own uid and top over one chain", a.Machine.Uid, b.Machine.Uid, a.Machine.Disk, b.Machine.Disk)
	}
	for _, id := range []string{"sb-a", "sb-b"} {
		if h.drv.last(id).loaded.Load() != "sb-1" {
			t.Errorf("%s did not load sb-1's memory", id)
		}
	}
	checkStore(t, m)
	for _, id := range []string{"sb-1", "sb-a"} {
		if err := m.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if r := h.get("sb-b"); r.State != sandbox.Running || h.drv.last("sb-b").exited() {
		t.Errorf("sb-b %q once its sibling and source are deleted; want running", r.State)
	}
	checkHealth(t, m, "sb-b")
	checkStore(t, m)
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

// TestRecoverFailsUnfinishedSnapshot plays a crash in the middle of a
// memory snapshot: the record names the snapshot (processing, its state
// half-written) and the sandbox's new top, and the guest is stopped for
// the switch-over. The next Manager adopts the machine, lets the guest
// run again, marks the snapshot failed with no files, and collects its
// half-written state; a snapshot of a sandbox whose machine is gone is
// failed the same way. The new top is kept; once the failed snapshot no
// longer names the frozen top, compaction merges that layer into it.
//
// Regression: the test read the record while the compaction Recover
// starts could still shorten the chain, and failed now and then.
func TestRecoverFailsUnfinishedSnapshot(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		crash func(t *testing.T, h *harness, fm *fakeMachine) // what else the crash left
		state sandbox.State
	}{
		{name: "guest_stopped_for_the_switch", state: sandbox.Running, crash: func(t *testing.T, h *harness, fm *fakeMachine) {
			fm.Pause(ctx)
		}},
		{name: "guest_running", state: sandbox.Running},
		{name: "machine_gone", state: sandbox.Error, crash: func(t *testing.T, h *harness, fm *fakeMachine) {
			fm.Kill()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, m1 := snapshotHarness(t)
			takeSnapshot(t, m1, "sb-1", sandbox.SnapshotRequest{Memory: true})
			m1.Close()
			fm := h.drv.last("sb-1")

			// What the snapshot had done when the host service died: a
			// new top over the frozen disk, the snapshot recorded
			// (processing), half its state written.
			frozen := h.get("sb-1").Machine.Disk
			top, state := "00000000000000a1", "00000000000000b2"
			qemuImg(t, "create", "-q", "-f", "qcow2", "-u", "-b", h.layerPath(frozen[0]), "-F", "qcow2", h.layerPath(top), "64M")
			if err := os.WriteFile(h.statePath(state), []byte(`{"machine":"sb-`), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := h.recs.Update(ctx, "sb-1", func(r *sandbox.Record) error {
				r.SnapshotSeq++
				r.Snapshots = append(r.Snapshots, sandbox.Snapshot{
					ID: "v2", Memory: true, Status: sandbox.SnapshotProcessing, CreatedAt: time.Now().UTC(),
					Disk: frozen, BaseDisk: r.Machine.BaseDisk, State: state,
					Needs:     &sandbox.Needs{QEMU: qemuVersion, DeviceSet: vmm.DeviceSet, Accel: vmm.TCG, Image: h.image.Key},
					MemoryMiB: r.MemoryMiB, VCPUs: r.VCPUs, DiskGiB: r.DiskGiB,
				})
				r.Machine.Disk = append([]string{top}, frozen...)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if tc.crash != nil {
				tc.crash(t, h, fm)
			}

			m2 := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
			if err := m2.Recover(ctx); err != nil {
				t.Fatalf("Recover: %v", err)
			}
			m2.Compacted()
			r := h.get("sb-1")
			v2, _ := r.Snapshot("v2")
			if v2.Status != sandbox.SnapshotFailed || v2.State != "" || v2.Disk != nil || v2.SizeBytes != 0 {
				t.Errorf("interrupted snapshot %+v; want failed, naming no files", v2)
			}
			if exists(h.statePath(state)) {
				t.Error("the half-written state is still in the store")
			}
			v1, _ := r.Snapshot("v1")
			if v1.Status != sandbox.SnapshotReady || !exists(h.statePath(v1.State)) {
				t.Errorf("the snapshot before it %+v lost its state", v1)
			}
			// frozen is [the top v2 froze, v1's disk...]: only v2 named
			// its top, which the compaction merges into the new one.
			if want := append([]string{top}, v1.Disk...); !slices.Equal(r.Machine.Disk, want) || !slices.Equal(frozen[1:], v1.Disk) || !exists(h.layerPath(top)) {
				t.Errorf("disk %v after Recover (frozen %v, v1's %v); want the new top %s kept over %v", r.Machine.Disk, frozen, v1.Disk, top, want)
			}
			if r.State != tc.state {
				t.Fatalf("state %q after Recover, want %q", r.State, tc.state)
			}
			checkStore(t, m2)
			if tc.state == sandbox.Running {
				running, _ := fm.Running(ctx)
				if h.drv.starts("sb-1") != 1 || fm.exited() || !running || *r.Machine.Process != fm.proc {
					t.Errorf("%d machines started, exited %v, CPUs running %v; want the first adopted and running", h.drv.starts("sb-1"), fm.exited(), running)
				}
				checkHealth(t, m2, "sb-1")
			}
			// The failed one is deleted as any other; the next is v3.
			if err := m2.DeleteSnapshot(ctx, "sb-1", "v2"); err != nil {
				t.Fatal(err)
			}
			if tc.state == sandbox.Running {
				if s := takeSnapshot(t, m2, "sb-1", sandbox.SnapshotRequest{Memory: true}); s.ID != "v3" {
					t.Errorf("next snapshot %s, want v3", s.ID)
				}
			}
			checkStore(t, m2)
		})
	}
}

func qemuImg(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v: %s", args, err, out)
	}
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

// TestForkAndRestoreLoadOnlyDurableSnapshots: a snapshot that is ready but
// whose files are not yet known to be on disk (its mark is this boot's)
// is written to disk before a fork or a restore loads it: when they have
// answered, its record has no mark.
func TestForkAndRestoreLoadOnlyDurableSnapshots(t *testing.T) {
	ctx := context.Background()
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"fork", "restore"} {
		t.Run(op, func(t *testing.T) {
			h, m := snapshotHarness(t)
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
			editSnapshot(t, h, "sb-1", "v1", func(s *sandbox.Snapshot) { s.Unsynced = strings.TrimSpace(string(boot)) })
			switch op {
			case "fork":
				if _, err := m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-2", Account: "acct"}); err != nil {
					t.Fatal(err)
				}
				h.waitState("sb-2", sandbox.Running)
			case "restore":
				restore(t, m, "sb-1", "v1", false)
			}
			r := h.get("sb-1")
			if s, _ := r.Snapshot("v1"); s == nil || s.Unsynced != "" {
				t.Errorf("after the %s, v1 is %+v: want on disk (no mark)", op, s)
			}
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

// TestRecoverFailsTornSnapshots: a ready snapshot whose files were still
// being written back when the host went down (its mark is another boot's)
// is failed at the next start, and its files go; one marked with this
// boot (only the host service restarted) is written back and stays ready.
func TestRecoverFailsTornSnapshots(t *testing.T) {
	ctx := context.Background()
	h, m1 := snapshotHarness(t)
	takeSnapshot(t, m1, "sb-1", sandbox.SnapshotRequest{Memory: true})
	takeSnapshot(t, m1, "sb-1", sandbox.SnapshotRequest{Memory: true})
	m1.Close()
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	editSnapshot(t, h, "sb-1", "v1", func(s *sandbox.Snapshot) { s.Unsynced = "a-boot-before-a-power-cut" })
	editSnapshot(t, h, "sb-1", "v2", func(s *sandbox.Snapshot) { s.Unsynced = strings.TrimSpace(string(boot)) })
	m2 := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	m2.Synced()
	r := h.get("sb-1")
	v1, _ := r.Snapshot("v1")
	v2, _ := r.Snapshot("v2")
	if v1.Status != sandbox.SnapshotFailed || v1.State != "" || len(v1.Disk) != 0 {
		t.Errorf("torn v1 after Recover: %+v", v1)
	}
	if v2.Status != sandbox.SnapshotReady || v2.Unsynced != "" {
		t.Errorf("v2 after Recover: %+v; want ready and written back", v2)
	}
	if r.State != sandbox.Running {
		t.Errorf("sandbox %s after Recover", r.State)
	}
	checkStore(t, m2)
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

// waitChain waits until the sandbox's chains are within the bound of a
// linear history (docs/design.md): its disk at most 1 + S layers, each
// snapshot's at most S, S its snapshots; compaction runs in the
// background.
func waitChain(t *testing.T, h *harness, id string) sandbox.Record {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		r := h.get(id)
		s := len(r.Snapshots)
		ok := len(r.Machine.Disk) <= 1+s
		for _, sn := range r.Snapshots {
			ok = ok && len(sn.Disk) <= s
		}
		if ok {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's chains stay long: disk %v, snapshots %+v", id, r.Machine.Disk, r.Snapshots)
		}
		time.Sleep(5 * time.Millisecond)
	}
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

// TestTemplateGroupNotGivenWhileAFileHasIt: a group that a file of the
// store still has (a template a crash dropped after giving the
// snapshot's state its group) is never a new template's: its forks could
// open that file.
func TestTemplateGroupNotGivenWhileAFileHasIt(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	if _, err := m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-f1", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	g1 := h.waitState("sb-f1", sandbox.Running).Machine.RAMGid
	// v2's state keeps the next group as if a template had been dropped.
	src := h.get("sb-1")
	v2, _ := src.Snapshot("v2")
	if err := os.Chown(h.statePath(v2.State), 0, int(g1+1)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Fork(ctx, "sb-1", "v2", sandbox.Record{ID: "sb-f2", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	g2 := h.waitState("sb-f2", sandbox.Running).Machine.RAMGid
	if g2 == g1 || g2 == g1+1 || g2 == 0 {
		t.Fatalf("templates' groups %d and %d; the second may be neither the first's nor %d, which a file has", g1, g2, g1+1)
	}
	fi, err := os.Stat(h.statePath(v2.State))
	if err != nil {
		t.Fatal(err)
	}
	if gid := fi.Sys().(*syscall.Stat_t).Gid; gid != g2 {
		t.Errorf("v2's state has group %d, want its template's, %d", gid, g2)
	}
}

// TestTemplateAhead: a memory snapshot's template is made as soon as the
// snapshot is taken, by a QEMU of its own (the source's uid, a directory
// that goes with it), so that the first fork starts no template QEMU and
// maps the snapshot's state at once; a restore's automatic snapshot and
// a disk-only one get none.
func TestTemplateAhead(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion; c.LazyTemplates = false })
	src := h.running(m, "sb-1")
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	v1 := waitTemplate(t, h, "sb-1", "v1")
	tq := h.drv.last("sb-1" + "+template")
	if tq == nil || tq.cfg.Uid != src.Machine.Uid || tq.cfg.RAM == nil || !tq.cfg.RAM.InMemory {
		t.Fatalf("the template's QEMU: %+v; want one as sb-1's uid %d, its RAM in memory", tq, src.Machine.Uid)
	}
	for deadline := time.Now().Add(5 * time.Second); exists(filepath.Join(h.dir, "sb-1+template")); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the template QEMU's directory outlives it")
		}
	}
	if !tq.exited() {
		t.Fatal("the template's QEMU runs on")
	}
	after := h.get("sb-1")
	if v2, _ := after.Snapshot("v2"); v2.Template != nil {
		t.Errorf("a disk-only snapshot got a template: %+v", v2.Template)
	}
	if _, err := m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-f", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	f := h.waitState("sb-f", sandbox.Running)
	if n := h.drv.starts("sb-f"); n != 1 {
		t.Errorf("the first fork started %d QEMUs; want its own alone", n)
	}
	if f.Machine.RAM != v1.State || f.Machine.RAMOffset != v1.Template.RAMOffset || f.Machine.RAMGid != v1.Template.Gid {
		t.Errorf("the fork maps %s at %d (group %d); want v1's state %s at %d (group %d)", f.Machine.RAM, f.Machine.RAMOffset, f.Machine.RAMGid, v1.State, v1.Template.RAMOffset, v1.Template.Gid)
	}
	restore(t, m, "sb-1", "v1", false)
	time.Sleep(100 * time.Millisecond)
	for _, s := range h.get("sb-1").Snapshots {
		if s.Auto && s.Template != nil {
			t.Errorf("automatic snapshot %s got a template", s.ID)
		}
	}
	if h.drv.starts("sb-1"+"+template") != 1 {
		t.Errorf("%d template QEMUs; want v1's alone", h.drv.starts("sb-1"+"+template"))
	}
	checkStore(t, m)
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

// waitTemplate waits until a snapshot's template, made ahead, is done,
// and returns the snapshot.
func waitTemplate(t *testing.T, h *harness, id, snapID string) sandbox.Snapshot {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r := h.get(id)
		s, ok := r.Snapshot(snapID)
		if ok && s.Template != nil && !s.Template.Building {
			return *s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s of %s has no template 5 s after it was taken", snapID, id)
		}
	}
}

// waitPauseTemplate waits for paused sandbox id's pause template.
func waitPauseTemplate(t *testing.T, h *harness, id string) sandbox.Template {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r := h.get(id)
		if tp := r.Machine.SavedTemplate; tp != nil && !tp.Building && tp.RAM == r.Machine.Saved {
			return *tp
		}
		if time.Now().After(deadline) {
			t.Fatalf("paused %s has no pause template 5 s after its pause: %+v", id, r.Machine)
		}
	}
}

// TestPauseTemplate: a pause's state is made a template in the
// background; the resume maps the state and loads the devices alone; a
// memory snapshot of the paused sandbox shares the state and its
// template; a resume without one loads the whole state; a template a
// crash left building is dropped, the state root's alone again.
func TestPauseTemplate(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion; c.LazyTemplates = false })
	h.running(m, "sb-1")
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
	tpl := waitPauseTemplate(t, h, "sb-1")
	state := h.get("sb-1").Machine.Saved
	if fi, err := os.Stat(h.statePath(state)); err != nil || fi.Mode().Perm() != 0o640 || fi.Sys().(*syscall.Stat_t).Gid != tpl.Gid || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("the paused state once its template is made: %v %v; want root's, group %d, 0640", fi.Mode(), err, tpl.Gid)
	}
	if tq := h.drv.last("sb-1" + "+template"); tq == nil || !tq.exited() || tq.cfg.RAM == nil || !tq.cfg.RAM.InMemory {
		t.Fatalf("the pause template's QEMU: %+v; want one ended, its RAM in memory", tq)
	}
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	after := h.get("sb-1")
	v1, _ := after.Snapshot("v1")
	if v1.State != state || v1.Template == nil || *v1.Template != tpl {
		t.Fatalf("the paused sandbox's memory snapshot: state %s, template %+v; want the paused state %s and its template %+v", v1.State, v1.Template, state, tpl)
	}
	if _, err := m.Resume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	got := h.waitState("sb-1", sandbox.Running)
	vm := h.drv.last("sb-1")
	if r := vm.cfg.RAM; r == nil || r.Shared || r.Path != h.statePath(state) || r.Offset != tpl.RAMOffset || !slices.Equal(vm.cfg.Groups, []uint32{tpl.Gid}) {
		t.Fatalf("the resumed machine's RAM %+v, groups %v; want the paused state from %d, group %d", r, vm.cfg.Groups, tpl.RAMOffset, tpl.Gid)
	}
	if vm.loaded.Load() != "sb-1" || got.Machine.RAM != state || got.Machine.Saved != "" || got.Machine.SavedTemplate != nil {
		t.Errorf("resumed: loaded %v, record %+v; want sb-1's memory, mapped, nothing left to load", vm.loaded.Load(), got.Machine)
	}
	if n := h.drv.starts("sb-1" + "+template"); n != 1 {
		t.Errorf("%d template QEMUs; want the pause's alone (v1 shares it)", n)
	}
	checkStore(t, m)
	// The mapped state is read into the page cache once the machine
	// runs, holes included (the fake state's RAM is all holes): a save
	// of the resumed guest reads every page.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(h.logs.String(), `msg="RAM file in the page cache" path=`+h.statePath(state)); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the resumed machine's RAM file was not read into the page cache")
		}
	}
	if n := notCached(t, h.statePath(state), tpl.RAMOffset, int64(got.MemoryMiB)<<20); n > 0 {
		t.Errorf("%d pages of the mapped state are not in the page cache after it was read in", n)
	}

	// A load through the template that fails leaves the sandbox paused
	// on its whole state, which the next resume loads.
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
	broken := waitPauseTemplate(t, h, "sb-1")
	if err := os.WriteFile(h.statePath(broken.State), []byte("not a state"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Resume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
	if r := h.get("sb-1"); r.Machine.Saved != broken.RAM || r.Machine.SavedTemplate != nil || r.Machine.RAM != "" {
		t.Fatalf("after a failed load through the pause template: %+v; want the whole state %s to load, no template, no RAM mapped", r.Machine, broken.RAM)
	}
	if _, err := m.Resume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Running)
	if vm := h.drv.last("sb-1"); vm.cfg.RAM != nil || vm.loaded.Load() != "sb-1" {
		t.Errorf("resumed after the failed load: RAM %+v, loaded %v; want the whole state loaded", vm.cfg.RAM, vm.loaded.Load())
	}
	checkStore(t, m)

	// Paused again, its template forgotten: the whole state loads, and
	// the state the first resume mapped goes with its QEMU.
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
	waitPauseTemplate(t, h, "sb-1")
	h.recs.Update(ctx, "sb-1", func(r *sandbox.Record) error {
		r.Machine.SavedTemplate = nil
		return nil
	})
	if _, err := m.Resume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Running)
	if vm := h.drv.last("sb-1"); vm.cfg.RAM != nil || vm.loaded.Load() != "sb-1" {
		t.Errorf("resumed without a template: RAM %+v, loaded %v; want the whole state loaded", vm.cfg.RAM, vm.loaded.Load())
	}
	checkStore(t, m)

	// A template a crash left building: dropped by the next Recover,
	// the paused state root's alone.
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
	tpl = waitPauseTemplate(t, h, "sb-1")
	h.recs.Update(ctx, "sb-1", func(r *sandbox.Record) error {
		r.Machine.SavedTemplate.Building = true
		return nil
	})
	m.Close()
	m = h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion; c.LazyTemplates = true })
	if err := m.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	r := h.get("sb-1")
	if r.Machine.SavedTemplate != nil {
		t.Errorf("a pause template left building survived Recover: %+v", r.Machine.SavedTemplate)
	}
	if fi, err := os.Stat(h.statePath(r.Machine.Saved)); err != nil || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Gid != 0 {
		t.Errorf("the paused state after its template was dropped: %v %v; want root's alone, 0600", fi.Mode(), err)
	}
	if exists(h.statePath(tpl.State)) {
		t.Errorf("the dropped template's devices state %s is still in the store", tpl.State)
	}
	if _, err := m.Resume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Running)
	checkStore(t, m)
}

// notCached counts the pages of path's [off, off+size) that are not in
// the page cache.
func notCached(t *testing.T, path string, off, size int64) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), off, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	vec := make([]byte, (size+4095)/4096)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		if v&1 == 0 {
			n++
		}
	}
	return n
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
