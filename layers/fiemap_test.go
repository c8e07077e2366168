package layers

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/testenv"
)

// TestSameBlocks: a file is its own blocks, a clone shares them until it
// is written (even before write-back), and a copy with equal bytes does
// not: sameBlocks proves equal content only where the blocks are one.
func TestSameBlocks(t *testing.T) {
	testenv.RequiresRootMounts(t)
	dir := xfsDir(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	a := filepath.Join(dir, "a")
	must(t, os.WriteFile(a, data, 0o644))
	must(t, syncFS(dir))
	open := func(p string) *os.File {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	fa := open(a)
	if !sameBlocks(fa, open(a)) {
		t.Fatal("a file opened twice: not the same blocks")
	}
	var st unix.Stat_t
	must(t, unix.Lstat(a, &st))
	must(t, cloneFile(a, filepath.Join(dir, "clone"), &st))
	fc := open(filepath.Join(dir, "clone"))
	if !sameBlocks(fa, fc) {
		t.Fatal("a clone: not the same blocks")
	}
	must(t, os.WriteFile(filepath.Join(dir, "copy"), data, 0o644))
	must(t, syncFS(dir))
	if sameBlocks(fa, open(filepath.Join(dir, "copy"))) {
		t.Fatal("a copy with equal bytes: the same blocks")
	}
	// Written in place, not yet written back.
	if _, err := fc.WriteAt([]byte("X"), 4096); err != nil {
		t.Fatal(err)
	}
	if sameBlocks(fa, fc) {
		t.Fatal("a clone written since: still the same blocks")
	}
}
