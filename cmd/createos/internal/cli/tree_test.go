package cli

import (
	"strings"
	"testing"
)

// TestDrawLineage draws small histories; each want is the whole drawing.
func TestDrawLineage(t *testing.T) {
	cp := func(id, path, parent string) Checkpoint {
		return Checkpoint{ID: id, Path: path, ParentID: parent, CreatedAt: "T"}
	}
	cases := []struct {
		name string
		list []Checkpoint
		want string
	}{
		{"empty", nil, "No checkpoints.\n"},
		{"linear", []Checkpoint{cp("A", "/p", ""), cp("B", "/p", "A"), cp("C", "/p", "B")}, `
/p
*  C  T         0 B  <- live
*  B  T         0 B
*  A  T         0 B
`},
		{"seed example: A B C, restore B, D", []Checkpoint{cp("A", "/p", ""), cp("B", "/p", "A"), cp("C", "/p", "B"), cp("D", "/p", "B")}, `
/p
*    D  T         0 B  <- live
| *  C  T         0 B
|/
*    B  T         0 B
*    A  T         0 B
`},
		{"three branches from one checkpoint", []Checkpoint{cp("A", "/p", ""), cp("B", "/p", "A"), cp("C", "/p", "A"), cp("D", "/p", "A")}, `
/p
*      D  T         0 B  <- live
| *    C  T         0 B
| | *  B  T         0 B
| |/
|/
*      A  T         0 B
`},
		{"nested branches stay apart", []Checkpoint{cp("A", "/p", ""), cp("B", "/p", "A"), cp("C", "/p", "B"), cp("E", "/p", "A"), cp("D", "/p", "B"), cp("F", "/p", "E")}, `
/p
*      F  T         0 B  <- live
*      E  T         0 B
| *    D  T         0 B
| | *  C  T         0 B
| |/
| *    B  T         0 B
|/
*      A  T         0 B
`},
		{"deleted parent starts a new root", []Checkpoint{cp("A", "/p", ""), cp("C", "/p", "B"), cp("D", "/p", "C")}, `
/p
*  D  T         0 B  <- live
*  C  T         0 B  (parent B deleted)
*  A  T         0 B
`},
		{"directories newest activity first", []Checkpoint{cp("A", "/p", ""), cp("X", "/q", ""), cp("B", "/p", "A")}, `
/p
*  B  T         0 B  <- live
*  A  T         0 B

/q
*  X  T         0 B  <- live
`},
		{"sizes and automatic checkpoints", []Checkpoint{cp("A", "/p", ""), {ID: "S", Path: "/p", ParentID: "A", CreatedAt: "T", Name: "before restoring A", Auto: true, SizeBytes: 1536},
			{ID: "B", Path: "/p", ParentID: "A", CreatedAt: "T", SizeBytes: 5 << 20}}, `
/p
*    B  T     5.0 MiB  <- live
| *  S  T     1.5 KiB  [auto]  before restoring A
|/
*    A  T         0 B
`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			if err := writeTree(&b, BuildLineage(tc.list, nil)); err != nil {
				t.Fatal(err)
			}
			if want := strings.TrimPrefix(tc.want, "\n"); b.String() != want {
				t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
			}
		})
	}
}

// FuzzBuildLineage: any list, however its parent_ids point (cycles,
// forward references, other paths), draws every record exactly once and
// marks one live checkpoint per directory.
func FuzzBuildLineage(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 2, 1, 3, 1})
	f.Add([]byte{0, 3, 1, 0, 2, 2, 3, 1, 4, 9})
	f.Fuzz(func(t *testing.T, spec []byte) {
		var list []Checkpoint
		for i := 0; i+1 < len(spec) && len(list) < 64; i += 2 {
			id := string(rune('a' + len(list)))
			parent := ""
			if p := int(spec[i+1]); p > 0 {
				parent = string(rune('a' + p - 1))
			}
			list = append(list, Checkpoint{ID: id, Path: "/" + string(rune('0'+spec[i]%3)), ParentID: parent})
		}
		lineages := BuildLineage(list, nil)
		seen := map[string]int{}
		paths := map[string]bool{}
		for _, l := range lineages {
			live := 0
			for _, r := range drawLineage(l) {
				if r.node != nil {
					seen[r.node.ID]++
					if r.node.Live {
						live++
					}
				}
			}
			if live != 1 {
				t.Fatalf("%s has %d live checkpoints", l.Path, live)
			}
			paths[l.Path] = true
		}
		for _, cp := range list {
			if seen[cp.ID] != 1 {
				t.Fatalf("%s drawn %d times", cp.ID, seen[cp.ID])
			}
		}
		if len(seen) != len(list) {
			t.Fatalf("drew %d records of %d", len(seen), len(list))
		}
	})
}
