package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"strata/sandbox"
)

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
