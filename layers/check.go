package layers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/moby/sys/mountinfo"
	bolt "go.etcd.io/bbolt"

	"strata/layers/meta"
	"strata/layers/overlay"
)

// Report is what Check found in a store that no guestd has open.
type Report struct {
	Roots       []string // managed root paths
	Checkpoints int
	Layers      int // layer records
	Spans       int // span records
	Dirs        int // layer dirs on disk
	Problems    []string
}

// Check inspects the store at dir read-only (guestd must not be running:
// the metadata is locked while it is) and lists every inconsistency: a
// layer dir the metadata does not know, a record without its dir, a chain
// that does not end, a root still enrolling, leftovers in tmp/ or trash/.
func Check(dir string) (*Report, error) {
	db, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("open metadata (is guestd still running?): %w", err)
	}
	defer db.Close()
	return check(db, dir)
}

// Check inspects the open store as the function Check does a closed one,
// once background compaction has settled. An operation under way at the
// same time may show up as a problem (its temporary dirs): call it when
// none runs, as tests and support tools do.
func (s *Store) Check(ctx context.Context) (*Report, error) {
	if err := s.Settle(ctx); err != nil {
		return nil, err
	}
	return check(s.db, s.dir)
}

func check(db *bolt.DB, dir string) (*Report, error) {
	rep := &Report{}
	known := map[uint64]string{}
	err := db.View(func(btx *bolt.Tx) error {
		t := meta.Tx{Tx: btx}
		rs, err := t.Roots()
		if err != nil {
			return err
		}
		ls, err := t.Layers()
		if err != nil {
			return err
		}
		sps, err := t.Spans()
		if err != nil {
			return err
		}
		cps, err := t.Checkpoints()
		if err != nil {
			return err
		}
		rep.Layers, rep.Spans, rep.Checkpoints = len(ls), len(sps), len(cps)
		for id := range ls {
			known[id] = "layer"
		}
		for _, sp := range sps {
			known[sp.ID] = "span"
			if ls[sp.Top] == nil || ls[sp.Bottom] == nil {
				rep.Problems = append(rep.Problems, fmt.Sprintf("span %d covers missing layers", sp.ID))
			}
		}
		for _, r := range rs {
			rep.Roots = append(rep.Roots, r.Path)
			if r.State != meta.RootReady {
				rep.Problems = append(rep.Problems, fmt.Sprintf("root %s is %s", r.Path, r.State))
			}
			if _, err := t.Chain(r.Active); err != nil {
				rep.Problems = append(rep.Problems, fmt.Sprintf("root %s: %v", r.Path, err))
			}
			for _, d := range r.Mounted.Dirs() {
				if known[d] == "" {
					known[d] = "mounted"
				}
			}
		}
		for _, c := range cps {
			if _, err := t.Chain(c.Layer); err != nil {
				rep.Problems = append(rep.Problems, fmt.Sprintf("checkpoint %s: %v", c.ID, err))
			}
		}
		zs, err := t.Zombies()
		if err != nil {
			return err
		}
		for _, z := range zs {
			for _, d := range z.Layers {
				if known[d] == "" {
					known[d] = "detached"
				}
			}
		}
		table, err := mountinfo.GetMounts(nil)
		if err != nil {
			return err
		}
		probe := &Store{layers: filepath.Join(dir, "layers"), source: sourceTag(meta.ReadStoreID(db))}
		rep.Problems = append(rep.Problems, probe.mountProblems(rs, table)...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(rep.Roots)
	ents, err := os.ReadDir(filepath.Join(dir, "layers"))
	if err != nil {
		return nil, err
	}
	onDisk := map[uint64]bool{}
	for _, e := range ents {
		id, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil || known[id] == "" {
			rep.Problems = append(rep.Problems, "orphan layer dir "+e.Name())
			continue
		}
		onDisk[id] = true
	}
	rep.Dirs = len(onDisk)
	for id, kind := range known {
		if !onDisk[id] {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s %d has no dir", kind, id))
		}
	}
	// A capture's intent outlives it only while its capture is
	// unfinished: a stopped store has none.
	for _, sub := range []string{"tmp", "trash", "captures"} {
		if ents, err := os.ReadDir(filepath.Join(dir, sub)); err == nil && len(ents) > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%d leftovers in %s/", len(ents), sub))
		}
	}
	slices.Sort(rep.Problems)
	return rep, nil
}

// CheckMounts lists what is wrong with the live mounts of an open store
// (see mountProblems); nil when nothing is.
func (s *Store) CheckMounts() ([]string, error) {
	rs, err := s.rootRecords()
	if err != nil {
		return nil, err
	}
	table, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, err
	}
	return s.mountProblems(rs, table), nil
}

// mountProblems checks the invariant that keeps sealed layers sealed: an
// upper layer is the upper of at most one writable overlay superblock
// (bind mounts of one superblock count once), and each ready root has
// exactly one writable overlay of this store, on top at its path, with
// the recorded stack.
func (s *Store) mountProblems(roots []*meta.Root, table []*mountinfo.Info) []string {
	var out []string
	writers := map[uint64]map[uint64]string{} // upper -> superblock -> a mountpoint
	for _, m := range table {
		up, ok := s.upperOf(m)
		if !ok || overlay.Frozen(m.Options, m.VFSOptions) {
			continue
		}
		if writers[up] == nil {
			writers[up] = map[uint64]string{}
		}
		writers[up][mountDev(m)] = m.Mountpoint
	}
	for up, sbs := range writers {
		if len(sbs) > 1 {
			var at []string
			for _, mp := range sbs {
				at = append(at, mp)
			}
			slices.Sort(at)
			out = append(out, fmt.Sprintf("layer %d is the upper of %d writable overlays (%v)", up, len(sbs), at))
		}
	}
	for _, r := range roots {
		if r.State != meta.RootReady {
			continue
		}
		sbs := writers[r.Mounted.Upper]
		if len(sbs) == 0 {
			out = append(out, fmt.Sprintf("root %s: no writable overlay has its upper layer %d", r.Path, r.Mounted.Upper))
			continue
		}
		stack := stackAt(table, r.Path)
		if len(stack) == 0 || !r.Mounted.Matches(stack[0].VFSOptions) {
			out = append(out, fmt.Sprintf("root %s: the overlay on top of it is not the recorded stack", r.Path))
		}
	}
	return out
}
