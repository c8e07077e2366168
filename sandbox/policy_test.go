package sandbox

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
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
