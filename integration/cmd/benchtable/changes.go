package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"strata/layers"
)

// changesRow measures what a checkpoint changed against its parent when
// it touched 10 files of the large directory dir: the walk of its own
// layer, whatever the directory's size (goal: under 5 ms). It returns
// that checkpoint.
func changesRow(ctx context.Context, store *layers.Store, dir, size string) (row, layers.Checkpoint, error) {
	before, err := store.Capture(ctx, dir, "before ten")
	if err != nil {
		return row{}, layers.Checkpoint{}, err
	}
	// Ten files spread over the tree (makeTree's layout: file i >= 100
	// is d<i%10>/s<i/10%100>/f<i>); the first ten for a small tree.
	for k := range 10 {
		i := k
		name := filepath.Join(dir, fmt.Sprintf("d%d", i), fmt.Sprintf("f%d", i))
		if *bigFiles >= 200 {
			i = 100 + k*(*bigFiles-100)/10
			name = filepath.Join(dir, fmt.Sprintf("d%d", i%10), fmt.Sprintf("s%d", i/10%100), fmt.Sprintf("f%d", i))
		}
		if err := os.WriteFile(name, []byte(fmt.Sprint("changed ", k)), 0o644); err != nil {
			return row{}, layers.Checkpoint{}, err
		}
	}
	cp, err := store.Capture(ctx, dir, "ten files")
	if err != nil {
		return row{}, layers.Checkpoint{}, err
	}
	var n int
	runs := max(*rounds, 100)
	t := timeN(runs, func(int) error {
		cs, err := store.Changes(ctx, cp.ID, "")
		n = len(cs)
		return err
	})
	if n != 10 {
		return row{}, layers.Checkpoint{}, fmt.Errorf("changes of a checkpoint that touched 10 files: %d changes, want 10", n)
	}
	// Against the live directory that goes on from it (its upper layer
	// walked), and against the checkpoint before it from the live
	// directory (two layers walked: the upper and the ten files').
	if err := os.WriteFile(filepath.Join(dir, "unsaved"), []byte("unsaved"), 0o644); err != nil {
		return row{}, layers.Checkpoint{}, err
	}
	onTop := timeN(runs, func(int) error {
		_, err := store.Changes(ctx, cp.ID, layers.AgainstLive)
		return err
	})
	older := timeN(runs, func(int) error {
		_, err := store.Changes(ctx, before.ID, layers.AgainstLive)
		return err
	})
	return row{"changes of a checkpoint that touched 10 files, " + size, dur(median(t)), dur(p99(t)), fmt.Sprintf("%d runs, against its parent: a walk of its own layer (10 changes listed). The live directory against it: median %s, p99 %s; against the checkpoint before it: median %s, p99 %s", len(t), dur(median(onTop)), dur(p99(onTop)), dur(median(older)), dur(p99(older))), "", ""},
		cp, nil
}
