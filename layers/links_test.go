package layers

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLinkCounts: on a filesystem that clones (XFS with reflink), every
// file of a managed directory has the link count a plain directory would
// give it (1: the suite's trees have no hard links), in the live
// directory and in every restored checkpoint, after compaction has merged
// layers into spans and after a restart. Elsewhere spans hard-link the
// store's files (a documented difference): only the content is checked.
func TestLinkCounts(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) {
			for i := range 5 {
				write(t, fmt.Sprintf("%s/f%d", d, i), "v0")
			}
		})
		var ids []string
		ids = append(ids, h.capture(dir, "").ID)
		for round := 1; round <= 12; round++ {
			write(t, fmt.Sprintf("%s/f%d", dir, round%5), fmt.Sprintf("v%d", round))
			write(t, fmt.Sprintf("%s/new%d", dir, round), "new")
			ids = append(ids, h.capture(dir, "").ID)
		}
		if err := h.store.Settle(context.Background()); err != nil {
			t.Fatal(err)
		}
		h.capture(dir, "") // mounts the compacted stack
		if lowers := len(h.rootOf(dir).Mounted.Lowers); lowers >= len(ids) {
			t.Fatalf("%d lower layers for %d checkpoints: nothing was merged", lowers, len(ids))
		}
		check := func(when string) {
			t.Helper()
			n := 0
			err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return err
				}
				n++
				var st unix.Stat_t
				if err := unix.Stat(p, &st); err != nil {
					return err
				}
				if h.store.clone && st.Nlink != 1 {
					t.Errorf("%s: %s has %d links, want 1", when, p, st.Nlink)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Fatalf("%s: no files", when)
			}
		}
		// The suite's ext4 cannot clone, its XFS can.
		if onXFS := xfs.mnt != "" && strings.HasPrefix(h.dir, xfs.mnt+"/"); h.store.clone != onXFS {
			t.Fatalf("store clones: %v, on XFS: %v", h.store.clone, onXFS)
		}
		check("live")
		h.reopen()
		check("live after a restart")
		for i, id := range ids {
			h.restore(id)
			check(fmt.Sprintf("checkpoint %d", i))
			if got := readString(t, fmt.Sprintf("%s/f%d", dir, i%5)); i > 0 && got != fmt.Sprintf("v%d", i) {
				t.Fatalf("checkpoint %d: f%d = %q", i, i%5, got)
			}
		}
		h.assertNoOrphans()
	})
}
