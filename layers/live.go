package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"strata/pathpolicy"
)

// topMount returns the mount on top of path, or nil when nothing is
// mounted exactly there. Mounts stacked on one mountpoint are chained by
// parent id; a mount moved beneath sits between the old top and its parent.
func topMount(path string) (*mountinfo.Info, error) {
	top, _, err := mountsAt(path)
	return top, err
}

// mountsAt returns the mount on top of path and the one right under it
// at the same path (nil when there is none).
func mountsAt(path string) (top, under *mountinfo.Info, err error) {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		return nil, nil, fmt.Errorf("read mountinfo: %w", err)
	}
	if len(ms) == 0 {
		return nil, nil, nil
	}
	parents := map[int]bool{}
	byID := map[int]*mountinfo.Info{}
	for _, m := range ms {
		parents[m.Parent] = true
		byID[m.ID] = m
	}
	top = ms[len(ms)-1]
	for _, m := range ms {
		if !parents[m.ID] {
			top = m
			break
		}
	}
	return top, byID[top.Parent], nil
}

func superReadOnly(vfsOpts string) bool {
	return vfsOpts == "ro" || strings.HasPrefix(vfsOpts, "ro,")
}

// ours reports whether a mount is an overlay whose upper layer lives in
// this store: only those may be frozen, replaced or unmounted by us.
func (s *Store) ours(m *mountinfo.Info) bool {
	if m.FSType != "overlay" {
		return false
	}
	upper, _ := parseOverlayOptions(m.VFSOptions, s.layers)
	return strings.HasPrefix(upper, s.layers+"/")
}

// ensureMounted makes the live mount at root.Path the one the metadata
// says: kept when it already is (a guestd restart must not disturb the
// directory's users), thawed if a crash left it frozen, mounted when
// missing (cold boot), swapped when another of our stacks is on top.
func (s *Store) ensureMounted(ctx context.Context, root *rootRecord) error {
	m, under, err := mountsAt(root.Path)
	if err != nil {
		return err
	}
	if m == nil {
		if err := setImmutable(root.Path, true); err != nil {
			return err
		}
		return s.mounter.Mount(ctx, root.Path, root.Mounted)
	}
	if !s.ours(m) {
		return fmt.Errorf("managed root %s is covered by a %s mount that is not strata's", root.Path, m.FSType)
	}
	if root.Mounted.Matches(m.VFSOptions) {
		if superReadOnly(m.VFSOptions) {
			return thaw(root.Path)
		}
		return nil
	}
	// A stack from before a crash: freeze it (it may share its upper with
	// the stack we want) and swap.
	if !superReadOnly(m.VFSOptions) {
		if err := s.freezeOrBusy(ctx, root); err != nil {
			return err
		}
	}
	if under != nil && s.ours(under) && root.Mounted.Matches(under.VFSOptions) {
		// A crash between sliding the recorded stack beneath and
		// unmounting the old one: finish that swap rather than mount a
		// second copy of the same upper.
		dev, err := statDev(root.Path)
		if err != nil {
			return err
		}
		lazy, err := unmountTop(root.Path)
		if err != nil {
			return err
		}
		if lazy {
			s.recordZombie(root.Path, dev, stackOf(s.layers, m))
		}
		if superReadOnly(under.VFSOptions) {
			return thaw(root.Path)
		}
		return nil
	}
	old := *root
	old.Mounted = stackOf(s.layers, m)
	return s.swap(ctx, &old, root)
}

// stackOf describes a mounted overlay of ours as a read-only Stack (its
// upper listed first among the lowers: what matters is the dirs it uses).
func stackOf(layers string, m *mountinfo.Info) Stack {
	upper, lowers := parseOverlayOptions(m.VFSOptions, layers)
	st := Stack{Layers: layers}
	for _, d := range append([]string{upper}, lowers...) {
		if id, ok := layerIDOf(layers, d); ok {
			st.Lowers = append(st.Lowers, id)
		}
	}
	return st
}

// layerIDOf parses "<layers>/<id>/fs".
func layerIDOf(layers, dir string) (uint64, bool) {
	rest, ok := strings.CutPrefix(dir, layers+"/")
	if !ok {
		return 0, false
	}
	name, ok := strings.CutSuffix(rest, "/fs")
	if !ok {
		return 0, false
	}
	var id uint64
	if _, err := fmt.Sscanf(name, "%d", &id); err != nil {
		return 0, false
	}
	return id, true
}

// swap replaces the (frozen) stack of old with newRoot's. An old stack
// still in use is detached lazily and recorded as a zombie, so that its
// layer dirs outlive it.
func (s *Store) swap(ctx context.Context, old, newRoot *rootRecord) error {
	dev, err := statDev(old.Path)
	if err != nil {
		return err
	}
	lazy, err := s.mounter.Replace(ctx, old.Path, newRoot.Mounted)
	if lazy {
		s.recordZombie(old.Path, dev, old.Mounted)
	}
	if err == nil && !lazy && old.Mounted.Upper != 0 && old.Mounted.Upper != newRoot.Mounted.Upper {
		// The old upper is no mount's upper any more: its overlay work
		// dir is scratch space nobody will use again.
		if rerr := os.RemoveAll(filepath.Join(s.layers, relWork(old.Mounted.Upper))); rerr != nil {
			s.log.Warn("remove work dir of a sealed layer", "layer", old.Mounted.Upper, "err", rerr)
		}
	}
	return err
}

// recordZombie records a stack detached lazily because it was in use: its
// layer dirs stay until nothing uses its superblock.
func (s *Store) recordZombie(path string, dev uint64, st Stack) {
	z := &zombieRecord{ID: s.newLayerID(), Boot: s.boot, Dev: dev, Layers: st.Dirs()}
	s.unpin(z.ID)
	s.log.Warn("old stack still in use, detached lazily", "path", path, "dev", dev)
	if err := s.db.Update(func(btx *bolt.Tx) error { return tx{btx}.putZombie(z) }); err != nil {
		s.log.Error("record detached stack", "path", path, "err", err)
	}
}

// freezeOrBusy freezes the live mount, turning the kernel's EBUSY (a
// writer the advisory scan did not see) into 409 directory_busy.
func (s *Store) freezeOrBusy(ctx context.Context, root *rootRecord) error {
	err := freeze(root.Path)
	if err == nil || !errors.Is(err, unix.EBUSY) {
		return err
	}
	holders, _ := s.holdersMounted(ctx, root)
	if err := s.busyFrom(root.Path, holders); err != nil {
		return err
	}
	return pathpolicy.BusyError(root.Path, nil)
}

func (s *Store) holdersMounted(ctx context.Context, root *rootRecord) ([]pathpolicy.Holder, error) {
	dev, err := statDev(root.Path)
	if err != nil {
		return nil, err
	}
	t := pathpolicy.Target{Path: root.Path, Dev: dev, WholeDev: true}
	for _, id := range root.Mounted.Dirs() {
		t.BackingDirs = append(t.BackingDirs, s.fsDir(id))
	}
	return s.cfg.Scanner.Holders(ctx, t)
}

// busyCheckMounted is the advisory scan of a managed root.
func (s *Store) busyCheckMounted(ctx context.Context, root *rootRecord) error {
	holders, err := s.holdersMounted(ctx, root)
	if err != nil {
		return err
	}
	return s.busyFrom(root.Path, holders)
}

// busyError scans for holders of t and returns directory_busy if any.
func (s *Store) busyError(ctx context.Context, t pathpolicy.Target) error {
	holders, err := s.cfg.Scanner.Holders(ctx, t)
	if err != nil {
		return err
	}
	return s.busyFrom(t.Path, holders)
}

// busyFrom turns a scan into directory_busy. Processes whose /proc entries
// cannot be read (inside a sandbox: the platform's own init) are logged,
// not reported: nothing can be said of them, nothing they do can be
// stopped by the user, and the kernel's gates (EBUSY on freeze and
// umount) still catch them where it matters.
func (s *Store) busyFrom(path string, holders []pathpolicy.Holder) error {
	known := holders[:0:0]
	for _, h := range holders {
		if h.Kind == pathpolicy.KindUnknown {
			s.log.Debug("process could not be inspected", "path", path, "pid", h.PID)
			continue
		}
		known = append(known, h)
	}
	if len(known) > 0 {
		return pathpolicy.BusyError(path, known)
	}
	return nil
}
