package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"strata/holders"
	"strata/layers"
	"strata/pathpolicy"
)

var beyondOnly = flag.Bool("beyond-only", false, "measure only the rows of the operations beyond the seed's four")

// beyondRows measures the operations beyond the seed's four on a
// directory of -big-files files of its own: restore with and without an
// automatic safety checkpoint, and the restore of one file.
func beyondRows(ctx context.Context, base string) ([]row, error) {
	dir := filepath.Join(base, "beyond-tree")
	size := fmt.Sprintf("%d files / %s", *bigFiles, human(*bigBytes))
	fmt.Fprintf(os.Stderr, "writing %s for the rows beyond the seed…\n", size)
	if err := makeTree(dir, *bigFiles, *bigBytes); err != nil {
		return nil, err
	}
	unix.Sync()
	open := func(autos int) (*layers.Store, error) {
		return layers.Open(ctx, layers.Config{Dir: filepath.Join(base, "beyond-store"), Policy: &pathpolicy.Policy{},
			Scanner: holders.NewScanner("/proc"), AutoCheckpoints: autos})
	}
	var rows []row
	// Restore with one unsaved file, on the same store opened without and
	// with automatic checkpoints.
	var first layers.Checkpoint
	for _, c := range []struct {
		autos int
		what  string
	}{{0, "restore with one unsaved file, automatic checkpoints off, "}, {layers.DefaultAutoCheckpoints, "restore with one unsaved file kept as an automatic checkpoint, "}} {
		store, err := open(c.autos)
		if err != nil {
			return nil, err
		}
		if first.ID == "" {
			if first, err = store.Capture(ctx, dir, "first"); err != nil {
				store.Close()
				return nil, err
			}
		}
		made := 0
		t := timeN(*rounds, func(i int) error {
			if err := os.WriteFile(filepath.Join(dir, "unsaved"), []byte(fmt.Sprint(i)), 0o644); err != nil {
				return err
			}
			r, err := store.Restore(ctx, first.ID)
			if r.SafetyCheckpointID != "" {
				made++
			}
			return err
		})
		store.Close()
		rows = append(rows, row{c.what + size, dur(median(t)), dur(p99(t)), fmt.Sprintf("%d runs; %d safety checkpoints made", len(t), made), "", ""})
	}
	store, err := open(layers.DefaultAutoCheckpoints)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	// One file back from a checkpoint, the rest untouched.
	cp, err := store.Capture(ctx, dir, "one file")
	if err != nil {
		return nil, err
	}
	one := "d0/f0"
	t := timeN(*rounds, func(i int) error {
		if err := os.WriteFile(filepath.Join(dir, one), []byte(strings.Repeat("x", i+1)), 0o644); err != nil {
			return err
		}
		_, err := store.RestorePaths(ctx, cp.ID, []string{one})
		return err
	})
	// The same with nothing unsaved: the edit captured first, untimed.
	var alone []time.Duration
	for i := range *rounds {
		if err := os.WriteFile(filepath.Join(dir, one), []byte(strings.Repeat("y", i+1)), 0o644); err != nil {
			return nil, err
		}
		if _, err := store.Capture(ctx, dir, ""); err != nil {
			return nil, err
		}
		t0 := time.Now()
		if _, err := store.RestorePaths(ctx, cp.ID, []string{one}); err != nil {
			return nil, err
		}
		alone = append(alone, time.Since(t0))
	}
	rows = append(rows, row{"restore of one file (restore-paths), nothing unsaved, " + size, dur(median(alone)), dur(p99(alone)), fmt.Sprintf("%d runs, the file edited and captured (untimed) before each", len(alone)), "", ""})
	rows = append(rows, row{"restore of one file (restore-paths), " + size, dur(median(t)), dur(p99(t)), fmt.Sprintf("%d runs, the file edited before each (so each keeps the edit as an automatic checkpoint first: a capture)", len(t)), "", ""})

	// What a checkpoint that touched 10 files changed (changes.go).
	cr, ten, err := changesRow(ctx, store, dir, size)
	if err != nil {
		return nil, err
	}
	rows = append(rows, cr)

	// Clones of that checkpoint, each a new managed directory.
	t = timeN(*rounds, func(i int) error {
		return store.Clone(ctx, ten.ID, filepath.Join(base, fmt.Sprintf("clone-%d", i)))
	})
	rows = append(rows, row{"clone of a checkpoint, " + size, dur(median(t)), dur(p99(t)), fmt.Sprintf("%d runs; shares the checkpoint's layers (no copy)", len(t)), "", ""})
	return rows, nil
}
