package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/moby/sys/mountinfo"

	"strata/holders"
	"strata/layers/meta"
	"strata/layers/overlay"
)

// collect deletes layer dirs that nothing needs: not a layer record, not
// in a root's mounted stack, not used by a lazily detached stack that
// still has users, not pinned by an operation in flight.
func (s *Store) collect(ctx context.Context) {
	// One at a time: a teardown's collection may meet an operation's.
	s.collectMu.Lock()
	defer s.collectMu.Unlock()
	// Drop the dead zombies first; the ones kept are read again below.
	s.liveZombies(ctx)
	s.mu.Lock()
	keep := map[uint64]bool{}
	// Pins first, then everything else: an operation hands a dir over
	// from its pin to a record, a root's stack or a zombie before it
	// unpins, so whatever is read after the pins sees the handover.
	for id := range s.pins {
		keep[id] = true
	}
	err := s.view(func(t meta.Tx) error {
		ls, err := t.Layers()
		if err != nil {
			return err
		}
		for id := range ls {
			keep[id] = true
		}
		sps, err := t.Spans()
		if err != nil {
			return err
		}
		for _, sp := range sps {
			keep[sp.ID] = true
		}
		rs, err := t.Roots()
		if err != nil {
			return err
		}
		for _, r := range rs {
			for _, id := range r.Mounted.Dirs() {
				keep[id] = true
			}
		}
		zs, err := t.Zombies()
		for _, z := range zs {
			for _, id := range z.Layers {
				keep[id] = true
			}
		}
		return err
	})
	if err == nil {
		// A capture interrupted between its swap and its commit (a
		// failed seal, a swap that failed half way) is finished by the
		// root's next operation, which mounts the intent's stack: its
		// dirs stay until the intent goes.
		var ins []*captureIntent
		ins, err = s.readIntents()
		for _, in := range ins {
			keep[in.Next] = true
			for _, id := range in.Stack.Dirs() {
				keep[id] = true
			}
		}
	}
	if err == nil {
		// A stack still mounted at a root that is not the recorded one (a
		// crash between a commit and its swap, a swap that failed) is in
		// use: keep its dirs until it is replaced.
		var ids []uint64
		ids, err = s.mountedDirs()
		for _, id := range ids {
			keep[id] = true
		}
	}
	var doomed []uint64
	if err == nil {
		ents, rerr := os.ReadDir(s.layers)
		err = rerr
		for _, e := range ents {
			id, perr := strconv.ParseUint(e.Name(), 10, 64)
			if perr != nil || !keep[id] {
				doomed = append(doomed, id)
				if perr != nil {
					s.log.Warn("unknown entry in layers dir", "name", e.Name())
				}
			}
		}
	}
	s.mu.Unlock()
	if err != nil {
		s.log.Error("collect layers", "err", err)
		return
	}
	for _, id := range doomed {
		if id == 0 {
			continue
		}
		if err := s.removeLayerDir(id); err != nil {
			s.log.Error("remove layer", "layer", id, "err", err)
		} else {
			s.log.Debug("layer freed", "layer", id)
		}
	}
	_ = clearDir(s.trash)
}

// mountedDirs returns the layer dirs of every overlay mount of ours in
// the mount table, wherever it is mounted: a root whose parent was
// renamed keeps using its layers at its new place.
func (s *Store) mountedDirs() ([]uint64, error) {
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.FSType != "overlay", false
	})
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var out []uint64
	for _, m := range ms {
		if !s.ours(m) {
			continue
		}
		upper, lowers := overlay.ParseOptions(m.VFSOptions, s.layers)
		for _, d := range append([]string{upper}, lowers...) {
			if id, ok := overlay.LayerIDOf(s.layers, d); ok {
				out = append(out, id)
			}
		}
	}
	return out, nil
}

// liveZombies drops the records of lazily detached stacks that nothing
// uses any more (or that belong to an earlier boot) and returns the rest.
func (s *Store) liveZombies(ctx context.Context) []*meta.Zombie {
	var zs []*meta.Zombie
	if err := s.view(func(t meta.Tx) (err error) {
		zs, err = t.Zombies()
		return err
	}); err != nil {
		s.log.Error("read zombies", "err", err)
		return nil
	}
	var live, dead []*meta.Zombie
	for _, z := range zs {
		if z.Boot == s.boot {
			// A process that cannot be inspected may be the user: keep the
			// layers (a leak until reboot) rather than pull them away.
			holders, err := s.cfg.Scanner.Holders(ctx, holders.Target{Path: "/", Dev: z.Dev, WholeDev: true})
			if err != nil || len(holders) > 0 {
				live = append(live, z)
				continue
			}
		}
		dead = append(dead, z)
	}
	if len(dead) > 0 {
		err := s.update(func(t meta.Tx) error {
			for _, z := range dead {
				if err := (t).DeleteZombie(z.ID); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			s.log.Error("drop zombies", "err", err)
		}
	}
	return live
}

// recover runs at Open, before anything is served: it finishes or undoes
// interrupted enrollments, forgets layers nothing needs, deletes every
// layer dir the metadata does not know, and mounts every managed root.
func (s *Store) recover(ctx context.Context) error {
	if err := clearDir(s.trash); err != nil {
		return err
	}
	var roots []*meta.Root
	err := s.update(func(t meta.Tx) error {
		var err error
		if roots, err = t.Roots(); err != nil {
			return err
		}
		ls, err := t.Layers()
		if err != nil {
			return err
		}
		zs, err := t.Zombies()
		if err != nil {
			return err
		}
		for id := range ls {
			s.nextID = max(s.nextID, id)
		}
		for _, r := range roots {
			s.nextID = max(s.nextID, r.ID)
		}
		for _, z := range zs {
			s.nextID = max(s.nextID, z.ID)
		}
		sps, err := t.Spans()
		for _, sp := range sps {
			s.nextID = max(s.nextID, sp.ID)
		}
		return err
	})
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(s.layers)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if id, err := strconv.ParseUint(e.Name(), 10, 64); err == nil {
			s.nextID = max(s.nextID, id)
		}
	}
	for _, r := range roots {
		// An enrollment (clone, release) that cannot be finished is
		// reported for its root and never keeps the others from being
		// served.
		if err := s.resolvePending(ctx, r); err != nil {
			s.log.Error("interrupted operation could not be finished", "path", r.Path, "state", r.State, "err", err)
		}
	}
	// A release's staging that no intent names is half-done work.
	s.clearReleaseStaging()
	if err := s.update(func(t meta.Tx) error { return t.Sweep() }); err != nil {
		return err
	}
	if err := s.view(func(t meta.Tx) (err error) {
		roots, err = t.Roots()
		return err
	}); err != nil {
		return err
	}
	for _, r := range roots {
		if r.State != meta.RootReady {
			continue // an enrollment left alone above is not mounted
		}
		if err := s.ensureMounted(ctx, r); err != nil {
			// One broken root must not keep the others from being served;
			// operations on it retry and report the failure.
			s.log.Error("remount managed root", "path", r.Path, "err", err)
		} else {
			s.log.Info("managed root ready", "path", r.Path, "layers", len(r.Mounted.Dirs()))
		}
	}
	for _, r := range roots {
		if r.State == meta.RootReady && r.Paths != nil {
			if err := s.finishPaths(ctx, r); err != nil {
				s.log.Error("clear an interrupted restore of paths", "path", r.Path, "err", err)
			}
		}
	}
	// Intents left: of roots gone, or not ready (their captures never
	// froze anything), or moved on.
	if err := s.dropStaleIntents(); err != nil {
		return err
	}
	// After the mounts: a stack left on top by a crash is in use until it
	// is swapped out (and recorded as a zombie if still held).
	s.collect(ctx)
	return nil
}

// dropStaleIntents removes the intents whose root is gone or no longer on
// the layer they seal.
func (s *Store) dropStaleIntents() error {
	all, err := s.readIntents()
	if err != nil || len(all) == 0 {
		return err
	}
	return s.view(func(t meta.Tx) error {
		for _, in := range all {
			r, err := t.Root(in.Root)
			if err != nil {
				return err
			}
			if r == nil || r.State != meta.RootReady || r.Active != in.Sealed {
				s.removeIntent(in.Next)
			}
		}
		return nil
	})
}

// resolvePending finishes or undoes the interrupted operation a root
// record is in the middle of: an enrollment, a clone or a release.
func (s *Store) resolvePending(ctx context.Context, r *meta.Root) error {
	switch r.State {
	case meta.RootEnrolling:
		return s.resolveEnroll(ctx, r)
	case meta.RootCloning:
		return s.resolveClone(ctx, r)
	case meta.RootReleasing:
		return s.resolveRelease(ctx, r)
	}
	return nil
}

// resolveEnroll finishes an enrollment whose exchange happened (the
// user's directory is in the store) and undoes one whose did not. When it
// cannot tell, it touches nothing and says so.
func (s *Store) resolveEnroll(ctx context.Context, r *meta.Root) error {
	in := r.Enroll
	ino, err := lstatIno(filepath.Join(s.layers, overlay.RelFS(in.Base)))
	switch {
	case err == nil && ino == in.OrigIno:
		s.log.Info("finishing interrupted enrollment", "path", r.Path)
		o := s.newOp(context.WithoutCancel(ctx), opRecoverEnroll, r.Path)
		_, err := s.finishEnroll(o, r, nil)
		o.done(err)
		return err
	case errors.Is(err, os.ErrNotExist) || (err == nil && ino == in.MountpointIno):
		s.log.Info("undoing interrupted enrollment", "path", r.Path)
		return s.abandonEnroll(r)
	default:
		return fmt.Errorf("interrupted enrollment of %s left alone: the store's copy is neither the user's directory nor the prepared one (%v)", r.Path, err)
	}
}
