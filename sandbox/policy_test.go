package sandbox

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"strata/internal/fault"
)

// These test the policy functions of the package from inside it: pure
// functions of records and numbers, no QEMU, no root.

func snaps(specs ...string) []Snapshot {
	// Each spec is "<id>:<flags>": a auto, p pinned, f failed, r
	// processing, o old (two FailedSnapshotAge ago).
	now := time.Now()
	var out []Snapshot
	for _, spec := range specs {
		id, flags, _ := strings.Cut(spec, ":")
		s := Snapshot{ID: id, Status: SnapshotReady, CreatedAt: now}
		for _, f := range flags {
			switch f {
			case 'a':
				s.Auto = true
			case 'p':
				s.Pinned = true
			case 'f':
				s.Status = SnapshotFailed
			case 'r':
				s.Status = SnapshotProcessing
			case 'o':
				s.CreatedAt = now.Add(-2 * FailedSnapshotAge)
			}
		}
		out = append(out, s)
	}
	return out
}

func ids(ss []Snapshot) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, s.ID)
	}
	return out
}

func TestPruneAutos(t *testing.T) {
	cases := []struct {
		name string
		in   []string
		keep string
		want []string
	}{
		{"under_the_limit", []string{"a1:a", "a2:a"}, "", []string{"a1", "a2"}},
		{"oldest_ready_go", []string{"a1:a", "a2:a", "a3:a", "a4:a", "a5:a", "a6:a", "a7:a"}, "", []string{"a3", "a4", "a5", "a6", "a7"}},
		{"failed_not_counted", []string{"a1:a", "f1:af", "f2:af", "f3:af", "a2:a", "a3:a", "a4:a", "a5:a"}, "", []string{"a1", "f1", "f2", "f3", "a2", "a3", "a4", "a5"}},
		{"processing_not_counted", []string{"a1:a", "a2:a", "a3:a", "a4:a", "a5:a", "r1:ar"}, "", []string{"a1", "a2", "a3", "a4", "a5", "r1"}},
		{"pinned_and_keep_kept", []string{"a1:ap", "a2:a", "a3:a", "a4:a", "a5:a", "a6:a", "a7:a", "a8:a"}, "a2", []string{"a1", "a2", "a4", "a5", "a6", "a7", "a8"}},
		{"user_snapshots_untouched", []string{"v1", "v2", "a1:a", "a2:a", "a3:a", "a4:a", "a5:a", "a6:a"}, "", []string{"v1", "v2", "a2", "a3", "a4", "a5", "a6"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := Record{Snapshots: snaps(tc.in...)}
			pruneAutos(&rec, tc.keep)
			if got := ids(rec.Snapshots); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPruneFailed(t *testing.T) {
	cases := []struct {
		name string
		in   []string
		want []string
	}{
		{"none_failed", []string{"v1", "a1:a"}, []string{"v1", "a1"}},
		{"newest_three_kept", []string{"f1:f", "v1", "f2:af", "f3:f", "f4:f", "f5:f"}, []string{"v1", "f3", "f4", "f5"}},
		{"old_ones_go", []string{"f1:fo", "f2:f", "v1"}, []string{"f2", "v1"}},
		{"old_ready_ones_stay", []string{"v1:o", "a1:ao", "f1:fo"}, []string{"v1", "a1"}},
		{"pinned_failed_go_too", []string{"f1:fpo"}, []string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := Record{Snapshots: snaps(tc.in...)}
			pruneFailed(&rec, time.Now())
			if got := ids(rec.Snapshots); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// FuzzRetention: whatever the snapshots, pruneAutos and pruneFailed never
// drop a user snapshot, a processing one or the one kept, and leave at
// most KeepAutoSnapshots ready unpinned automatic ones (besides keep) and
// at most KeepFailedSnapshots failed ones.
func FuzzRetention(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, uint8(3))
	f.Add([]byte{1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3}, uint8(0))
	f.Fuzz(func(t *testing.T, kinds []byte, keepAt uint8) {
		now := time.Now()
		var rec Record
		for i, k := range kinds {
			s := Snapshot{ID: fmt.Sprintf("s%d", i), Auto: k&1 != 0, Pinned: k&8 != 0, CreatedAt: now}
			switch (k >> 1) & 3 {
			case 0:
				s.Status = SnapshotReady
			case 1:
				s.Status = SnapshotFailed
			case 2:
				s.Status = SnapshotProcessing
			case 3:
				s.Status, s.CreatedAt = SnapshotFailed, now.Add(-2*FailedSnapshotAge)
			}
			rec.Snapshots = append(rec.Snapshots, s)
		}
		keep := fmt.Sprintf("s%d", keepAt)
		before := slices.Clone(rec.Snapshots)
		pruneAutos(&rec, keep)
		pruneFailed(&rec, now)
		after := map[string]bool{}
		autos, failed := 0, 0
		for _, s := range rec.Snapshots {
			after[s.ID] = true
			switch {
			case s.Status == SnapshotFailed:
				failed++
			case s.Auto && !s.Pinned && s.Status == SnapshotReady && s.ID != keep:
				autos++
			}
		}
		for _, s := range before {
			if s.Status != SnapshotFailed && (!s.Auto || s.Pinned || s.Status == SnapshotProcessing || s.ID == keep) && !after[s.ID] {
				t.Fatalf("%+v dropped", s)
			}
		}
		if autos > KeepAutoSnapshots || failed > KeepFailedSnapshots {
			t.Fatalf("%d ready automatic and %d failed snapshots kept", autos, failed)
		}
	})
}

func TestAdmitStorage(t *testing.T) {
	cases := []struct {
		name                string
		need, free, reserve int64
		ok                  bool
	}{
		{"room", 100, 1000, 500, true},
		{"exactly", 500, 1000, 500, true},
		{"one_byte_short", 501, 1000, 500, false},
		{"reserve_alone_too_much", 0, 100, 500, false},
		{"full", 1, 0, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := admitStorage(tc.need, tc.free, tc.reserve)
			if (err == nil) != tc.ok {
				t.Fatalf("got %v, want ok=%v", err, tc.ok)
			}
			if err != nil {
				fe := fault.As(err)
				if fe == nil || fe.Code != "insufficient_storage" || fe.Kind != fault.InsufficientStorage || fe.Fields["needed_bytes"] != tc.need || fe.Fields["free_bytes"] != tc.free {
					t.Errorf("error %#v", fe)
				}
			}
		})
	}
}

func TestAdmitQuota(t *testing.T) {
	cases := []struct {
		name              string
		used, need, quota int64
		ok                bool
	}{
		{"empty", 0, 10, 100, true},
		{"up_to_the_quota", 90, 10, 100, true},
		{"past_it", 91, 10, 100, false},
		{"already_past", 200, 0, 100, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := admitQuota(tc.used, tc.need, tc.quota)
			if (err == nil) != tc.ok || err != nil && fault.CodeOf(err) != "snapshot_quota_exceeded" {
				t.Fatalf("got %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestAdmitMemory(t *testing.T) {
	host := memoryLoad{Total: 8192, Available: 8192, Reserve: 512, Overcommit: 1}
	with := func(edit func(*memoryLoad)) memoryLoad { l := host; edit(&l); return l }
	cases := []struct {
		name string
		load memoryLoad
		want int
		ok   bool
		room int
	}{
		{"empty_host", host, 1024, true, 8192 - 512 - QEMUOverheadMiB},
		{"whole_host_less_reserve_and_overhead", host, 8192 - 512 - QEMUOverheadMiB, true, 8192 - 512 - QEMUOverheadMiB},
		{"one_mib_more", host, 8192 - 512 - QEMUOverheadMiB + 1, false, 8192 - 512 - QEMUOverheadMiB},
		{"running_sandboxes_count_whole", with(func(l *memoryLoad) { l.Committed = 7 * (1024 + QEMUOverheadMiB) }), 1024, false, 8192 - 512 - 8*QEMUOverheadMiB - 7*1024},
		{"overcommit_lets_it_in", with(func(l *memoryLoad) { l.Committed = 7 * (1024 + QEMUOverheadMiB); l.Overcommit = 2 }), 1024, true, 2*(8192-512) - 8*QEMUOverheadMiB - 7*1024},
		{"available_still_binds", with(func(l *memoryLoad) { l.Overcommit = 4; l.Available = 1500 }), 1024, false, 1500 - 512},
		{"boots_under_way_not_yet_in_available", with(func(l *memoryLoad) { l.Available = 2000; l.Booting = 700; l.Committed = 700 + QEMUOverheadMiB }), 1024, false, 2000 - 700 - 512},
		{"no_memory", with(func(l *memoryLoad) { l.Available = 0 }), 128, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ok, room := admitMemory(tc.load, tc.want)
			if ok != tc.ok || room != tc.room {
				t.Fatalf("got %v, room %d; want %v, room %d", ok, room, tc.ok, tc.room)
			}
		})
	}
}

// FuzzAdmitMemory: an admitted guest never takes the committed memory
// past (total − reserve) × overcommit, nor the available memory below the
// reserve beyond the boots under way; admission is monotonic in want.
func FuzzAdmitMemory(f *testing.F) {
	f.Add(8192, 6000, 512, 1.0, 2048, 700, 1024)
	f.Add(1024, 1024, 512, 3.0, 0, 0, 512)
	f.Fuzz(func(t *testing.T, total, avail, reserve int, over float64, committed, booting, want int) {
		if total < 0 || total > 1<<24 || avail < 0 || avail > 1<<24 || reserve < 0 || reserve > 1<<20 || committed < 0 || committed > 1<<24 || booting < 0 || booting > committed || want <= 0 || want > 1<<20 || !(over >= 1 && over <= 16) {
			return
		}
		l := memoryLoad{Total: total, Available: avail, Reserve: reserve, Overcommit: over, Committed: committed, Booting: booting}
		ok, room := admitMemory(l, want)
		if ok {
			if float64(committed+want+QEMUOverheadMiB) > float64(total-reserve)*over+1 || want+booting+reserve > avail {
				t.Fatalf("%+v admitted %d", l, want)
			}
			if smaller, _ := admitMemory(l, want/2+1); !smaller && want/2+1 <= want {
				t.Fatalf("%+v admitted %d but not %d", l, want, want/2+1)
			}
		}
		if room < 0 {
			t.Fatalf("room %d", room)
		}
	})
}

// TestAdmitDisks: the disks' growth, the new one's with the others',
// within (free − reserve) × overcommit.
func TestAdmitDisks(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		name                       string
		others, want, free, reserv int64
		overcommit                 float64
		ok                         bool
	}{
		{"room", 2 * gib, 1 * gib, 5 * gib, 1 * gib, 1, true},
		{"exactly", 3 * gib, 1 * gib, 5 * gib, 1 * gib, 1, true},
		{"one_byte_over", 3*gib + 1, 1 * gib, 5 * gib, 1 * gib, 1, false},
		{"overcommitted", 12 * gib, 4 * gib, 5 * gib, 1 * gib, 4, true},
		{"past_overcommit", 13 * gib, 4 * gib, 5 * gib, 1 * gib, 4, false},
		{"under_the_reserve", 0, 1, 1 * gib, 2 * gib, 4, false},
		{"a_full_disk_grows_no_more", 0, 0, 1 * gib, 1 * gib, 1, true},
		{"first_on_a_small_store", 0, 4 * gib, 1 * gib, 0, 4, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := admitDisks(tc.others, tc.want, tc.free, tc.reserv, tc.overcommit)
			if (err == nil) != tc.ok {
				t.Fatalf("got %v, want ok=%v", err, tc.ok)
			}
			if err != nil {
				fe := fault.As(err)
				if fe == nil || fe.Code != "insufficient_storage" || fe.Kind != fault.InsufficientStorage || fe.Fields["needed_bytes"] != tc.want || fe.Fields["free_bytes"] != tc.free || fe.Fields["committed_bytes"] != tc.others {
					t.Errorf("error %#v", fe)
				}
			}
		})
	}
	for _, c := range []struct{ disk, allocated, want int64 }{{4 * gib, 0, 4 * gib}, {4 * gib, gib, 3 * gib}, {gib, 2 * gib, 0}} {
		if got := diskGrowth(c.disk, c.allocated); got != c.want {
			t.Errorf("diskGrowth(%d, %d) = %d, want %d", c.disk, c.allocated, got, c.want)
		}
	}
}

// FuzzAdmitDisks: an admitted growth fits the limit; more free space or
// a higher ratio never refuses what was admitted, and less growth never
// refuses either.
func FuzzAdmitDisks(f *testing.F) {
	f.Add(int64(2<<30), int64(1<<30), int64(5<<30), int64(1<<30), 4.0)
	f.Add(int64(0), int64(0), int64(0), int64(0), 1.0)
	f.Fuzz(func(t *testing.T, others, want, free, reserve int64, overcommit float64) {
		if others < 0 || want < 0 || free < 0 || reserve < 0 || !(overcommit >= 0) || overcommit > 1e6 || others > 1<<50 || want > 1<<50 || free > 1<<50 || reserve > 1<<50 {
			return
		}
		if admitDisks(others, want, free, reserve, overcommit) != nil {
			return
		}
		if float64(others+want) > float64(max(free-reserve, 0))*overcommit {
			t.Fatalf("admitted %d + %d over (%d − %d) × %v", others, want, free, reserve, overcommit)
		}
		if admitDisks(others, want, free+1<<20, reserve, overcommit) != nil || admitDisks(others, want, free, reserve, overcommit*2) != nil || admitDisks(others/2, want/2, free, reserve, overcommit) != nil {
			t.Fatalf("admitted %d + %d at (%d − %d) × %v, refused with more room or less growth", others, want, free, reserve, overcommit)
		}
	})
}
