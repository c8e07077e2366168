package pathpolicy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
	"strata/internal/testenv"
)

func TestCheckTree(t *testing.T) {
	display := func(rel string) string { return "/workspace/project/" + rel }
	tests := []struct {
		name      string
		tree      []node
		whiteouts bool
		code      string // "" means accepted
		offending string
	}{
		{name: "empty"},
		{name: "files, dirs and symlinks", tree: []node{
			file("a"), mkdir("b/c/d"), file("b/c/d/e"), symlink("b/l", "/etc"), symlink("dangling", "nowhere"),
			symlink("b/c/dirlink", ".."),
		}},
		{name: "hardlinked file", tree: []node{mkdir("x/y"), file("x/y/f"), hardlink("x/y/g", "x/y/f")},
			code: CodePathHardlink},
		{name: "fifo", tree: []node{mkdir("a"), fifo("a/p")}, code: CodePathSpecialFile, offending: "/workspace/project/a/p"},
		{name: "socket at the top", tree: []node{socket("s")}, code: CodePathSpecialFile, offending: "/workspace/project/s"},
		{name: "fifo in an upper layer is still special", tree: []node{fifo("p")}, whiteouts: true,
			code: CodePathSpecialFile, offending: "/workspace/project/p"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, tt.tree)
			err := CheckTree(context.Background(), dir, tt.whiteouts, display)
			if tt.code == "" {
				if err != nil {
					t.Fatalf("CheckTree = %v, want nil", err)
				}
				return
			}
			want := map[string]any{"path": "/workspace/project"}
			if tt.offending != "" {
				want["offending"] = tt.offending
			}
			wantFault(t, err, fault.Unprocessable, tt.code, want)
		})
	}
}

// TestCheckTreeWhiteouts pins that overlay whiteouts (character devices
// 0/0, linked to one shared inode) pass in an upper layer, while other
// devices and real hardlinks do not.
func TestCheckTreeWhiteouts(t *testing.T) {
	testenv.RequiresRoot(t)
	tests := []struct {
		name      string
		tree      []node
		whiteouts bool
		code      string
		offending string
	}{
		{name: "whiteouts in an upper layer", whiteouts: true, tree: []node{
			chardev("gone", 0), mkdir("d"), hardlink("d/gone-too", "gone"), hardlink("d/and-this", "gone"),
		}},
		{name: "whiteout outside an upper layer", tree: []node{chardev("w", 0)},
			code: CodePathSpecialFile, offending: "/root/w"},
		{name: "char device 1/3 in an upper layer", whiteouts: true, tree: []node{chardev("null", unix.Mkdev(1, 3))},
			code: CodePathSpecialFile, offending: "/root/null"},
		{name: "block device in an upper layer", whiteouts: true, tree: []node{blockdev("sda", unix.Mkdev(8, 0))},
			code: CodePathSpecialFile, offending: "/root/sda"},
		{name: "hardlinked file beside whiteouts", whiteouts: true, tree: []node{
			chardev("w", 0), hardlink("w2", "w"), mkdir("d"), file("d/f"), hardlink("d/g", "d/f"),
		}, code: CodePathHardlink},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, tt.tree)
			err := CheckTree(context.Background(), dir, tt.whiteouts, func(rel string) string { return filepath.Join("/root", rel) })
			if tt.code == "" {
				if err != nil {
					t.Fatalf("CheckTree = %v, want nil", err)
				}
				return
			}
			want := map[string]any{"path": "/root"}
			if tt.offending != "" {
				want["offending"] = tt.offending
			}
			wantFault(t, err, fault.Unprocessable, tt.code, want)
		})
	}
}

func TestCheckTreeDefaultDisplay(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, []node{fifo("a/p")})
	err := CheckTree(context.Background(), dir, false, nil)
	wantFault(t, err, fault.Unprocessable, CodePathSpecialFile,
		map[string]any{"path": dir, "offending": filepath.Join(dir, "a/p")})
}

func TestCheckTreeErrors(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, []node{file("f"), symlink("l", ".")})
	for _, p := range []string{filepath.Join(dir, "missing"), filepath.Join(dir, "f"), filepath.Join(dir, "l")} {
		if err := CheckTree(context.Background(), p, false, nil); err == nil || fault.As(err) != nil {
			t.Errorf("CheckTree(%s) = %v, want an unclassified error", p, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := CheckTree(ctx, dir, false, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled CheckTree = %v", err)
	}
}

// TestCheckTreeDeep walks a tree deeper than one getdents buffer per level
// and wider than one buffer per directory, and finds the one bad file at
// the bottom.
func TestCheckTreeDeep(t *testing.T) {
	root := t.TempDir()
	rel := ""
	for i := range 100 {
		rel = filepath.Join(rel, fmt.Sprintf("level-%03d", i))
	}
	var tree []node
	for i := range 3000 {
		tree = append(tree, file(fmt.Sprintf("wide/file-with-a-fairly-long-name-%05d", i)))
	}
	tree = append(tree, mkdir(rel), file(filepath.Join(rel, "ok")))
	writeTree(t, root, tree)
	if err := CheckTree(context.Background(), root, false, nil); err != nil {
		t.Fatalf("CheckTree = %v", err)
	}
	writeTree(t, root, []node{fifo(filepath.Join(rel, "bad"))})
	err := CheckTree(context.Background(), root, false, nil)
	wantFault(t, err, fault.Unprocessable, CodePathSpecialFile, map[string]any{"offending": filepath.Join(root, rel, "bad")})
}

// BenchmarkCheckTree walks 20,000 files in 200 directories (warm cache).
func BenchmarkCheckTree(b *testing.B) {
	dir := b.TempDir()
	for d := range 200 {
		sub := filepath.Join(dir, fmt.Sprintf("dir-%03d", d))
		if err := os.Mkdir(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 100 {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("file-%03d.go", f)), nil, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := CheckTree(ctx, dir, false, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/20200, "ns/entry")
}

// TestCheckTreeBytes: the walk's byte count is the allocated blocks of
// the tree's directories (the root included) and regular files, as a
// separate walk that stats everything counts them; symlinks count 0.
func TestCheckTreeBytes(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, []node{mkdir("a/b"), file("a/b/f"), file("top"), symlink("a/l", strings.Repeat("x", 300))})
	if err := os.WriteFile(filepath.Join(dir, "a/big"), make([]byte, 70000), 0o644); err != nil {
		t.Fatal(err)
	}
	var want int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		var st unix.Stat_t
		if err == nil && unix.Lstat(p, &st) == nil && (d.IsDir() || d.Type().IsRegular()) {
			want += st.Blocks * 512
		}
		return err
	})
	got, err := CheckTreeBytes(context.Background(), dir, false, nil)
	if err != nil || got != want || got < 70000 {
		t.Fatalf("CheckTreeBytes = %d, %v; want %d (at least the 70000-byte file)", got, err, want)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if got, err := CheckTreeFDBytes(context.Background(), fd, dir, false, nil); err != nil || got != want {
		t.Fatalf("CheckTreeFDBytes = %d, %v; want %d", got, err, want)
	}
}
