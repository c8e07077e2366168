package layers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fstree"
	"strata/layers/meta"
)

// materializeTo copies the whole of tr into a new directory and returns
// its path.
func materializeTo(t *testing.T, tr tree) string {
	t.Helper()
	parent := t.TempDir()
	pfd, err := openDirAt(unix.AT_FDCWD, parent)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pfd)
	if err := materialize(context.Background(), tr, "", pfd, "copy"); err != nil {
		t.Fatalf("materialize: %v", err)
	}
	return filepath.Join(parent, "copy")
}

// treeOfCheckpoint materializes checkpoint id from its layers.
func (h *harness) treeOfCheckpoint(id string) fstree.Tree {
	h.t.Helper()
	lt, _, _, err := h.store.checkpointTree(id)
	if err != nil {
		h.t.Fatalf("checkpointTree(%s): %v", id, err)
	}
	defer lt.Close()
	return fstree.MustSnapshot(h.t, materializeTo(h.t, lt))
}

// TestViewMaterializeEqualsRestore: every checkpoint's layered view,
// materialized, equals what a restore of it shows, after directory
// renames, opaque directories, type changes, xattrs and modes, before and
// after compaction; and the live view materializes to the live tree.
func TestViewMaterializeEqualsRestore(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		dir := h.mkdir("project", func(d string) { deepTree(t, d) })
		if err := unix.Lsetxattr(dir+"/top", "user.k", []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../top", dir+"/a1/link"); err != nil {
			t.Fatal(err)
		}
		cps := []savedCheckpoint{{h.capture(dir, "base").ID, fstree.MustSnapshot(t, dir)}}
		edits := []func(){
			func() { must(t, os.Rename(dir+"/a1/a2", dir+"/b1/moved")) },
			func() {
				must(t, os.RemoveAll(dir+"/c1"))
				must(t, os.Mkdir(dir+"/c1", 0o751))
				write(t, dir+"/c1/new", "new")
			},
			func() { must(t, os.RemoveAll(dir+"/b1/b2")); write(t, dir+"/b1/b2", "file now") },
			func() { must(t, os.Chmod(dir+"/top", 0o600)); must(t, os.Chmod(dir, 0o711)) },
			func() { must(t, os.Rename(dir+"/b1", dir+"/c1/b1")); must(t, os.Remove(dir+"/a1/link")) },
		}
		for i, e := range edits {
			e()
			cps = append(cps, savedCheckpoint{h.capture(dir, strings.Repeat("x", i+1)).ID, fstree.MustSnapshot(t, dir)})
		}
		check := func(stage string) {
			t.Helper()
			for i, cp := range cps {
				if d := fstree.Diff(cp.tree, h.treeOfCheckpoint(cp.id)); len(d) > 0 {
					t.Fatalf("%s: checkpoint %d's view differs:\n%s", stage, i, strings.Join(d, "\n"))
				}
			}
		}
		check("captured")
		if err := h.store.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		check("settled")
		write(t, dir+"/unsaved", "unsaved")
		live := fstree.MustSnapshot(t, dir)
		var root *Directory
		ds, err := h.store.Directories()
		if err != nil || len(ds) != 1 {
			t.Fatalf("Directories: %v %v", ds, err)
		}
		root = &ds[0]
		r, err := h.store.rootByPath(root.Path)
		if err != nil {
			t.Fatal(err)
		}
		lt, err := h.store.liveTree(r)
		if err != nil {
			t.Fatal(err)
		}
		defer lt.Close()
		if d := fstree.Diff(live, fstree.MustSnapshot(t, materializeTo(t, lt))); len(d) > 0 {
			t.Fatalf("the live view differs:\n%s", strings.Join(d, "\n"))
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// rootByPath (tests) returns the managed root at path, or nil and an error that
// says there is none.
func (s *Store) rootByPath(path string) (*meta.Root, error) {
	var root *meta.Root
	err := s.view(func(t meta.Tx) (err error) {
		root, err = t.RootByPath(path)
		return err
	})
	if err == nil && root == nil {
		err = fmt.Errorf("%s is not a managed directory", path)
	}
	return root, err
}
