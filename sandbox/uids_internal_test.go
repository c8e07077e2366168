package sandbox

import (
	"maps"
	"slices"
	"testing"
)

func TestParseStatusIDs(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     string
		uids, gids []uint32
	}{
		{"qemu", "Name:\tqemu-system-x86\nUmask:\t0077\nState:\tS (sleeping)\nUid:\t300001\t300001\t300001\t300001\nGid:\t300001\t300001\t300001\t300001\nFDSize:\t64\nGroups:\t350002 350007 \n", []uint32{300001}, []uint32{300001, 350002, 350007}},
		{"setuid midway", "Uid:\t0\t300004\t0\t300004\nGid:\t0\t0\t0\t0\nGroups:\t\n", []uint32{0, 300004}, []uint32{0}},
		{"garbage", "Uid:\tx -1 99999999999\nGid\n:::\nGroups: 7", nil, []uint32{7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := processIDs{uids: map[uint32]bool{}, gids: map[uint32]bool{}}
			parseStatusIDs([]byte(tc.status), h)
			if got := slices.Sorted(maps.Keys(h.uids)); !slices.Equal(got, tc.uids) {
				t.Errorf("uids %v, want %v", got, tc.uids)
			}
			if got := slices.Sorted(maps.Keys(h.gids)); !slices.Equal(got, tc.gids) {
				t.Errorf("gids %v, want %v", got, tc.gids)
			}
		})
	}
}

// FuzzParseStatusIDs: whatever a status file holds, every id found is
// a number written in a Uid, Gid or Groups line, and nothing panics.
func FuzzParseStatusIDs(f *testing.F) {
	f.Add([]byte("Uid:\t1\t2\t3\t4\nGid:\t5\t6\t7\t8\nGroups:\t9 10\n"))
	f.Add([]byte("Uid:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h := processIDs{uids: map[uint32]bool{}, gids: map[uint32]bool{}}
		parseStatusIDs(b, h)
		if len(h.uids)+len(h.gids) > len(b) {
			t.Fatalf("%d ids from %d bytes", len(h.uids)+len(h.gids), len(b))
		}
	})
}
