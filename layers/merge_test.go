package layers

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fstree"
	"strata/internal/testenv"
	"strata/layers/overlay"
)

// overlayLayers builds layers as a store does, with real overlay mounts
// (redirect_dir=on): the first is written as a plain directory, each next
// one as the upper of a mount over all the layers before it. Paths are
// absolute: a few layers fit mount(2)'s one page.
type overlayLayers struct {
	t      *testing.T
	dir    string   // <id>/fs, <id>/work and the mountpoints
	ids    []uint64 // the layers written, oldest first
	next   uint64
	mounts int
}

func newOverlayLayers(t *testing.T) *overlayLayers {
	return &overlayLayers{t: t, dir: t.TempDir()}
}

// newLayer makes an empty layer directory (fs and work) and returns its id.
func (o *overlayLayers) newLayer() uint64 {
	o.t.Helper()
	o.next++
	for _, d := range []string{overlay.RelFS(o.next), overlay.RelWork(o.next)} {
		if err := os.MkdirAll(filepath.Join(o.dir, d), 0o755); err != nil {
			o.t.Fatal(err)
		}
	}
	return o.next
}

func (o *overlayLayers) fs(id uint64) string { return filepath.Join(o.dir, overlay.RelFS(id)) }

// mount mounts an overlay of lowers (topmost first) and upper (0: none,
// read-only) on a new mountpoint, and returns it with its unmount. The
// options are written out here, redirect_dir=on whatever the store
// would choose: these layers are the kernel's, redirects and all.
func (o *overlayLayers) mount(upper uint64, lowers []uint64) (string, func()) {
	o.t.Helper()
	o.mounts++
	mp := filepath.Join(o.dir, fmt.Sprintf("m%d", o.mounts))
	if err := os.Mkdir(mp, 0o755); err != nil {
		o.t.Fatal(err)
	}
	var dirs []string
	for _, id := range lowers {
		dirs = append(dirs, o.fs(id))
	}
	opts := "lowerdir=" + strings.Join(dirs, ":")
	if upper != 0 {
		opts += ",upperdir=" + o.fs(upper) + ",workdir=" + filepath.Join(o.dir, overlay.RelWork(upper))
	}
	opts += ",index=off,redirect_dir=on,metacopy=off"
	if err := unix.Mount("overlay", mp, "overlay", 0, opts); err != nil {
		o.t.Fatalf("mount %s: %v", opts, err)
	}
	return mp, func() {
		if err := unix.Unmount(mp, 0); err != nil {
			o.t.Fatalf("unmount %s: %v", mp, err)
		}
	}
}

// write adds a layer made by edit: on the first layer's directory itself,
// then on a mount of a new upper over every layer so far.
func (o *overlayLayers) write(edit func(dir string) error) {
	o.t.Helper()
	id := o.newLayer()
	if len(o.ids) == 0 {
		if err := edit(o.fs(id)); err != nil {
			o.t.Fatal(err)
		}
		o.ids = append(o.ids, id)
		return
	}
	mp, unmount := o.mount(id, reversed(o.ids))
	err := edit(mp)
	unmount()
	if err != nil {
		o.t.Fatal(err)
	}
	o.ids = append(o.ids, id)
}

// view is what a read-only mount of lowers (topmost first) shows.
func (o *overlayLayers) view(lowers []uint64) (fstree.Tree, error) {
	o.t.Helper()
	if len(lowers) < 2 {
		// overlayfs wants two lower layers without an upper.
		lowers = append(slices.Clone(lowers), o.newLayer())
	}
	mp, unmount := o.mount(0, lowers)
	defer unmount()
	return fstree.Snapshot(mp)
}

func reversed(ids []uint64) []uint64 {
	out := slices.Clone(ids)
	slices.Reverse(out)
	return out
}

// checkMerges merges every run of consecutive layers over the layers under
// it, as compaction and squash do, and checks that a read-only mount with
// the run replaced by its merged layer shows what the original stack
// shows: the same tree (readdir and lookup), contents, modes, owners and
// xattrs. The layers above the run keep their redirects into it.
func (o *overlayLayers) checkMerges(label string) {
	o.t.Helper()
	want, err := o.view(reversed(o.ids))
	if err != nil {
		o.t.Fatalf("%s: the original stack: %v", label, err)
	}
	for lo := range o.ids {
		for hi := lo; hi < len(o.ids); hi++ {
			var srcs, below []string
			for _, id := range o.ids[lo : hi+1] {
				srcs = append(srcs, o.fs(id))
			}
			for _, id := range reversed(o.ids[:lo]) {
				below = append(below, o.fs(id))
			}
			m := o.newLayer()
			if err := merge(context.Background(), o.fs(m), srcs, below, canClone(o.dir)); err != nil {
				o.t.Fatalf("%s: merge of layers %d..%d: %v", label, lo, hi, err)
			}
			stack := append(append(reversed(o.ids[hi+1:]), m), reversed(o.ids[:lo])...)
			got, err := o.view(stack)
			if err != nil {
				o.t.Fatalf("%s: layers %d..%d merged: %v\n%s", label, lo, hi, err, o.dump(m))
			}
			if d := fstree.Diff(want, got); len(d) > 0 {
				o.t.Fatalf("%s: layers %d..%d merged differ from the stack:\n%s\nmerged layer:\n%s", label, lo, hi, strings.Join(d, "\n"), o.dump(m))
			}
			os.RemoveAll(filepath.Join(o.dir, overlay.LayerName(m)))
		}
	}
}

// dump lists a layer with its overlay xattrs and whiteouts, for failures.
func (o *overlayLayers) dump(id uint64) string {
	var b strings.Builder
	root := o.fs(id)
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		unix.Lstat(p, &st)
		kind := "file"
		switch {
		case d.IsDir():
			kind = "dir"
		case isWhiteout(&st):
			kind = "whiteout"
		case d.Type()&os.ModeSymlink != 0:
			kind = "symlink"
		}
		fmt.Fprintf(&b, "  %s %s", kind, rel)
		for _, x := range []string{xattrOpaque, xattrRedirect} {
			if v, err := getXattr(p, x); err == nil {
				fmt.Fprintf(&b, " %s=%q", strings.TrimPrefix(x, overlayXattrPrefix), v)
			}
		}
		b.WriteByte('\n')
		return nil
	})
	return b.String()
}

// Edits for the table below, each an fstest-like change of a mounted tree.
type treeOp func(dir string) error

func mk(p, content string) treeOp {
	return func(dir string) error {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, p), []byte(content), 0o644)
	}
}

func mkdir(p string) treeOp {
	return func(dir string) error { return os.MkdirAll(filepath.Join(dir, p), 0o755) }
}

// mv is rename(2) (os.Rename refuses to replace a directory).
func mv(from, to string) treeOp {
	return func(dir string) error {
		if err := unix.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
			return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
		}
		return nil
	}
}

func rm(p string) treeOp {
	return func(dir string) error { return os.RemoveAll(filepath.Join(dir, p)) }
}

func ops(list ...treeOp) func(dir string) error {
	return func(dir string) error {
		for i, op := range list {
			if err := op(dir); err != nil {
				return fmt.Errorf("change %d: %w", i, err)
			}
		}
		return nil
	}
}

// TestMergeRedirects merges layers that real overlay mounts wrote with
// directory renames (trusted.overlay.redirect, relative within a parent,
// absolute across parents), every run of them over the layers under it,
// and mounts the result in place of the run: it must show what the
// original stack shows. Before merge followed redirects, a renamed
// directory lost the contents its old place held in the merged layers.
func TestMergeRedirects(t *testing.T) {
	testenv.RequiresRootMounts(t)
	tests := []struct {
		name   string
		layers []func(dir string) error
	}{
		{"rename within a parent", []func(string) error{
			ops(mk("a/b/c/f", "f")),
			ops(mv("a/b", "a/b2")),
		}},
		{"rename across parents", []func(string) error{
			ops(mk("a/b/f", "f"), mkdir("x")),
			ops(mv("a/b", "x/b")),
		}},
		{"rename of a renamed directory", []func(string) error{
			ops(mk("a/b/f", "f"), mk("d/g", "g")),
			ops(mv("a/b", "c")),
			ops(mv("c", "d/e")),
			ops(mv("d", "a/d")),
		}},
		{"renamed back", []func(string) error{
			ops(mk("a/f", "f")),
			ops(mv("a", "b")),
			ops(mk("b/g", "g"), mv("b", "a")),
		}},
		{"parent renamed after its child", []func(string) error{
			ops(mk("p/q/r/f", "f")),
			ops(mv("p/q/r", "s")),
			ops(mv("p", "p2")),
			ops(mv("s", "p2/r2")),
		}},
		{"child moved out of a renamed parent", []func(string) error{
			ops(mk("p/c/f", "f"), mk("p/g", "g")),
			ops(mv("p", "p2")),
			ops(mv("p2/c", "c2"), mk("p2/c", "file where c was")),
		}},
		{"into a directory of another layer", []func(string) error{
			ops(mk("a/f", "f")),
			ops(mk("b/g", "g")),
			ops(mv("a", "b/a")),
			ops(mv("b", "c")),
		}},
		{"old name made again", []func(string) error{
			ops(mk("a/f", "f"), mk("a/sub/h", "h")),
			ops(mv("a", "b"), mk("a/g", "new a")),
			ops(rm("b/sub"), mv("a", "b/sub")),
		}},
		{"old name becomes a file", []func(string) error{
			ops(mk("a/f", "f")),
			ops(mv("a", "b"), mk("a", "a file")),
			ops(rm("a"), mv("b", "a")),
		}},
		{"onto an empty directory", []func(string) error{
			ops(mk("a/f", "f"), mkdir("b"), mk("c/g", "g")),
			ops(mv("a", "b")),
			ops(mkdir("c/e"), mv("b", "c/e")),
		}},
		{"opaque directory renamed", []func(string) error{
			ops(mk("a/f", "f"), mk("a/g", "g")),
			ops(rm("a"), mk("a/h", "h")),
			ops(mv("a", "b")),
			ops(mk("a/i", "i")),
		}},
		{"depths one to five", []func(string) error{
			ops(mk("d1/d2/d3/d4/d5/f", "f"), mk("d1/d2/g", "g")),
			ops(mv("d1/d2/d3/d4/d5", "d1/d2/d3/d4/e5")),
			ops(mv("d1/d2", "d1/e2")),
			ops(mv("d1", "e1")),
			ops(mv("e1/e2/d3/d4", "x4")),
		}},
		{"whiteouts in a renamed directory", []func(string) error{
			ops(mk("a/f", "f"), mk("a/g", "g"), mk("a/s/h", "h")),
			ops(mv("a", "b"), rm("b/f")),
			ops(rm("b/s"), mk("b/f", "again")),
		}},
		{"two directories swapped", []func(string) error{
			ops(mk("a/fa", "a"), mk("b/fb", "b")),
			ops(mv("a", "t"), mv("b", "a"), mv("t", "b")),
			ops(mk("a/new", "n")),
		}},
		{"deleted after a rename", []func(string) error{
			ops(mk("a/b/f", "f"), mk("x/y", "y")),
			ops(mv("a/b", "x/b")),
			ops(rm("x")),
			ops(mk("x/b/g", "g")),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := newOverlayLayers(t)
			for _, l := range tc.layers {
				o.write(l)
			}
			o.checkMerges(tc.name)
		})
	}
}

// TestMergeRandomRenames is TestMergeRedirects on random stacks: random
// trees and random changes (treeEditor), each layer written by a real
// overlay mount, every run of layers merged and compared.
func TestMergeRandomRenames(t *testing.T) {
	testenv.RequiresRootMounts(t)
	seed := testSeed(t)
	rounds := 12
	if testing.Short() {
		rounds = 2
	}
	for round := range rounds {
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		o := newOverlayLayers(t)
		ed := &treeEditor{rng: rng}
		var log []string
		o.write(func(dir string) error { deepTree(t, dir); return nil })
		for range 5 {
			o.write(func(dir string) error {
				for range 1 + rng.IntN(8) {
					desc, err := ed.edit(dir)
					log = append(log, fmt.Sprintf("layer %d: %s", len(o.ids)+1, desc))
					if err != nil {
						return fmt.Errorf("%s: %w", desc, err)
					}
				}
				return nil
			})
		}
		label := fmt.Sprintf("round %d (seed %d), changes:\n  %s\n", round, seed, strings.Join(log, "\n  "))
		o.checkMerges(label)
	}
}

func TestValidRedirect(t *testing.T) {
	tests := []struct {
		r    string
		want bool
	}{
		{"b", true},
		{"/a/b", true},
		{"/a", true},
		{"", false},
		{"/", false},
		{"a/b", false},
		{"//a", false},
		{"/a//b", false},
		{"/a/", false},
		{".", false},
		{"..", false},
		{"/a/../b", false},
		{"/./a", false},
		{"...", true},
	}
	for _, tc := range tests {
		if got := validRedirect(tc.r); got != tc.want {
			t.Errorf("validRedirect(%q) = %v, want %v", tc.r, got, tc.want)
		}
	}
}

// FuzzValidRedirect checks that a redirect merge follows never leaves the
// layer: a valid one is an entry name or a clean path below the root.
func FuzzValidRedirect(f *testing.F) {
	for _, r := range []string{"b", "/a/b", "/a/../b", "//", ".."} {
		f.Add(r)
	}
	f.Fuzz(func(t *testing.T, r string) {
		if !validRedirect(r) {
			return
		}
		if strings.HasPrefix(r, "/") {
			if r == "/" || path.Clean(r) != r {
				t.Fatalf("valid absolute redirect %q is not a clean path below the root", r)
			}
			return
		}
		if strings.Contains(r, "/") || r == "." || r == ".." {
			t.Fatalf("valid relative redirect %q is not an entry name", r)
		}
	})
}

// BenchmarkMerge merges two layers of 1,000 changed files each (a few
// renamed directories among them) over a base of 20,000 files in 200
// directories: the cost of one compaction step.
func BenchmarkMerge(b *testing.B) {
	testenv.RequiresRoot(b)
	dir := b.TempDir()
	base, l1, l2 := filepath.Join(dir, "base"), filepath.Join(dir, "l1"), filepath.Join(dir, "l2")
	for d := range 200 {
		for f := range 100 {
			p := filepath.Join(base, fmt.Sprintf("d%d/f%d", d, f))
			if f == 0 {
				os.MkdirAll(filepath.Dir(p), 0o755)
			}
			os.WriteFile(p, []byte(p), 0o644)
		}
	}
	for i, l := range []string{l1, l2} {
		for d := range 100 {
			for f := range 10 {
				p := filepath.Join(l, fmt.Sprintf("d%d/f%d", d*2+i, f))
				os.MkdirAll(filepath.Dir(p), 0o755)
				os.WriteFile(p, []byte("changed"), 0o644)
			}
		}
	}
	// Layer 2 renamed d0 to r0 and d2 to d4/r2, as the kernel records it.
	for _, r := range [][2]string{{"r0", "d0"}, {"d4/r2", "/d2"}} {
		p := filepath.Join(l2, r[0])
		os.MkdirAll(p, 0o755)
		if err := unix.Lsetxattr(p, xattrRedirect, []byte(r[1]), 0); err != nil {
			b.Fatal(err)
		}
		if err := unix.Mknod(filepath.Join(l2, strings.TrimPrefix(r[1], "/")), unix.S_IFCHR, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		dst := filepath.Join(dir, fmt.Sprintf("m%d", i))
		os.Mkdir(dst, 0o755)
		if err := merge(context.Background(), dst, []string{l1, l2}, []string{base}, canClone(base)); err != nil {
			b.Fatal(err)
		}
	}
}
