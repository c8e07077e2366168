package layers

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testSeed is the seed of a randomized test: $STRATA_TEST_SEED, or the
// clock. It is logged first, so that a failure names the run that
// reproduces it.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("STRATA_TEST_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("STRATA_TEST_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("seed %d (STRATA_TEST_SEED=%d reproduces this run)", seed, seed)
	return seed
}

// deepTree fills dir with a tree five directories deep in several
// branches, so that renames have depths to choose from.
func deepTree(t *testing.T, dir string) {
	t.Helper()
	for _, b := range []string{"a", "b", "c"} {
		p := dir
		for depth := 1; depth <= 5; depth++ {
			p = filepath.Join(p, fmt.Sprintf("%s%d", b, depth))
			write(t, filepath.Join(p, "f"), p)
		}
	}
	write(t, filepath.Join(dir, "top"), "top")
}

// treeEditor makes random changes to a directory tree, of every kind a
// user makes, directory renames above all: within a parent and across
// parents, at every depth, of directories renamed before, onto empty
// directories; deletes and re-creates, type changes, rewrites, modes and
// xattrs. Names carry the step number, so no two changes pick the same.
type treeEditor struct {
	rng  *rand.Rand
	step int
	// exdev: the mount refuses to rename a directory that a lower layer
	// holds (redirect_dir=off), and such a rename is done as mv does it,
	// by copy and delete. Otherwise every rename must succeed.
	exdev bool
}

// tree lists the directories (the root as "") and the other entries of
// dir, as paths relative to it.
func (e *treeEditor) tree(dir string) (dirs, others []string, err error) {
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			rel = ""
		}
		if d.IsDir() {
			dirs = append(dirs, rel)
		} else {
			others = append(others, rel)
		}
		return nil
	})
	return dirs, others, err
}

// within reports whether p is d or under it.
func within(p, d string) bool { return p == d || strings.HasPrefix(p, d+"/") }

// edit makes one random change under dir and describes it.
func (e *treeEditor) edit(dir string) (string, error) {
	e.step++
	dirs, others, err := e.tree(dir)
	if err != nil {
		return "", err
	}
	name := func(prefix string) string { return fmt.Sprintf("%s%d", prefix, e.step) }
	anyDir := func() string { return dirs[e.rng.IntN(len(dirs))] }
	abs := func(rel string) string { return filepath.Join(dir, rel) }
	subdirs := dirs[1:]
	op := e.rng.IntN(16)
	if len(subdirs) == 0 && (op >= 2 && op <= 6 || op == 9 || op == 10 || op >= 14) {
		op = 1 // the tree is flat: make a directory instead
	}
	if len(others) == 0 && (op == 7 || op == 8 || op == 12) {
		op = 0
	}
	switch op {
	case 0:
		p := path.Join(anyDir(), name("f"))
		return "create " + p, os.WriteFile(abs(p), []byte(p), 0o644)
	case 1:
		p := path.Join(anyDir(), name("d"))
		if err := os.Mkdir(abs(p), 0o755); err != nil {
			return "", err
		}
		return "mkdir " + p, os.WriteFile(abs(p+"/f"), []byte(p), 0o644)
	case 2, 3:
		// A directory renamed within its parent.
		src := subdirs[e.rng.IntN(len(subdirs))]
		return e.rename(dir, src, path.Join(path.Dir(src), name("r")))
	case 4, 5:
		// A directory moved to another parent, under its own name if free.
		src := subdirs[e.rng.IntN(len(subdirs))]
		var parents []string
		for _, d := range dirs {
			if !within(d, src) && d != path.Dir(src) {
				parents = append(parents, d)
			}
		}
		if len(parents) == 0 {
			return e.rename(dir, src, name("m"))
		}
		dst := path.Join(parents[e.rng.IntN(len(parents))], path.Base(src))
		if _, err := os.Lstat(abs(dst)); err == nil {
			dst = path.Join(path.Dir(dst), name("m"))
		}
		return e.rename(dir, src, dst)
	case 6:
		// A directory moved onto an empty directory, which it replaces.
		src := subdirs[e.rng.IntN(len(subdirs))]
		var empty []string
		for _, d := range subdirs {
			if ents, _ := os.ReadDir(abs(d)); len(ents) == 0 && !within(d, src) && !within(src, d) {
				empty = append(empty, d)
			}
		}
		if len(empty) == 0 {
			p := path.Join(anyDir(), name("e"))
			return "mkdir empty " + p, os.Mkdir(abs(p), 0o755)
		}
		return e.rename(dir, src, empty[e.rng.IntN(len(empty))])
	case 7:
		src := others[e.rng.IntN(len(others))]
		dst := path.Join(anyDir(), name("g"))
		return "rename file " + src + " -> " + dst, os.Rename(abs(src), abs(dst))
	case 8:
		p := others[e.rng.IntN(len(others))]
		return "remove " + p, os.Remove(abs(p))
	case 9:
		p := subdirs[e.rng.IntN(len(subdirs))]
		return "remove dir " + p, os.RemoveAll(abs(p))
	case 10:
		// Deleted and made again: the new directory hides the old one.
		p := subdirs[e.rng.IntN(len(subdirs))]
		if err := os.RemoveAll(abs(p)); err != nil {
			return "", err
		}
		if err := os.Mkdir(abs(p), 0o755); err != nil {
			return "", err
		}
		return "recreate dir " + p, os.WriteFile(abs(path.Join(p, name("f"))), []byte(p), 0o644)
	case 11:
		// A type change: a directory becomes a file or a symlink, a file
		// a directory.
		all := append(append([]string{}, subdirs...), others...)
		if len(all) == 0 {
			return "nothing", nil
		}
		p := all[e.rng.IntN(len(all))]
		fi, err := os.Lstat(abs(p))
		if err != nil {
			return "", err
		}
		if err := os.RemoveAll(abs(p)); err != nil {
			return "", err
		}
		switch {
		case fi.IsDir() && e.rng.IntN(2) == 0:
			return "dir to file " + p, os.WriteFile(abs(p), []byte("was a dir"), 0o644)
		case fi.IsDir():
			return "dir to symlink " + p, os.Symlink("target-"+name(""), abs(p))
		default:
			if err := os.Mkdir(abs(p), 0o755); err != nil {
				return "", err
			}
			return "file to dir " + p, os.WriteFile(abs(p+"/f"), []byte(p), 0o644)
		}
	case 12:
		p := others[e.rng.IntN(len(others))]
		fi, err := os.Lstat(abs(p))
		if err != nil || !fi.Mode().IsRegular() {
			return "nothing", err
		}
		switch e.rng.IntN(3) {
		case 0:
			return "rewrite " + p, os.WriteFile(abs(p), []byte(name("rewritten")), 0o644)
		case 1:
			return "chmod " + p, os.Chmod(abs(p), os.FileMode(0o600+e.rng.IntN(0o100)))
		default:
			return "xattr " + p, unix.Lsetxattr(abs(p), "user.step", []byte(name("")), 0)
		}
	case 13:
		p := anyDir()
		return "chmod dir " + p, os.Chmod(abs(p), os.FileMode(0o700+e.rng.IntN(0o60)))
	case 14:
		// A directory moved up to the root.
		return e.rename(dir, subdirs[e.rng.IntN(len(subdirs))], name("u"))
	default:
		// A directory moved down, deeper than it was.
		src := subdirs[e.rng.IntN(len(subdirs))]
		deepest := ""
		for _, d := range dirs {
			if !within(d, src) && strings.Count(d, "/") >= strings.Count(deepest, "/") {
				deepest = d
			}
		}
		return e.rename(dir, src, path.Join(deepest, name("w")))
	}
}

// rename renames the directory src to dst (paths under dir).
func (e *treeEditor) rename(dir, src, dst string) (string, error) {
	desc := "rename dir " + src + " -> " + dst
	if src == dst || within(dst, src) {
		return desc + " (skipped)", nil
	}
	// rename(2) itself: os.Rename refuses to replace a directory.
	err := unix.Rename(filepath.Join(dir, src), filepath.Join(dir, dst))
	if !errors.Is(err, unix.EXDEV) || !e.exdev {
		if err != nil {
			return desc, &os.LinkError{Op: "rename", Old: src, New: dst, Err: err}
		}
		return desc, nil
	}
	// mv's way: onto an empty directory, remove it first.
	if err := os.Remove(filepath.Join(dir, dst)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return desc, err
	}
	if out, err := exec.Command("cp", "-a", filepath.Join(dir, src), filepath.Join(dir, dst)).CombinedOutput(); err != nil {
		return desc, fmt.Errorf("cp -a: %v: %s", err, out)
	}
	return desc + " (copied: EXDEV)", os.RemoveAll(filepath.Join(dir, src))
}
