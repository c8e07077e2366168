package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"strata/holders"
	"strata/layers/meta"
	"strata/layers/overlay"
)

// ours reports whether a mount is an overlay of this store: only those
// may be frozen, replaced or unmounted by us. Every mount the store makes
// carries its source tag ("strata-<store id>" in mountinfo's source
// field): layer paths alone cannot tell, since mount(2) stacks name their
// layers relative to the store they came from. An untagged overlay (made
// before stores tagged their mounts) is ours when its upper layer is an
// absolute path in this store.
func (s *Store) ours(m *mountinfo.Info) bool {
	if m.FSType != "overlay" {
		return false
	}
	if m.Source == s.source {
		return true
	}
	if strings.HasPrefix(m.Source, sourcePrefix) {
		return false
	}
	upper, _ := overlay.ParseOptions(m.VFSOptions, s.layers)
	return filepath.IsAbs(upper) && strings.HasPrefix(upper, s.layers+"/")
}

// sourcePrefix starts the source tag of every overlay a store mounts.
const sourcePrefix = "strata-"

// sourceTag is the source tag of the mounts of the store with this id; ""
// for a store without one (never opened read-write since ids exist).
func sourceTag(id string) string {
	if id == "" {
		return ""
	}
	return sourcePrefix + id
}

// tagged is st with this store's source tag, as it is mounted.
func (s *Store) tagged(st overlay.Stack) overlay.Stack {
	st.Source = s.source
	return st
}

// ensureMounted opens root by identity and makes its live mount the one
// the metadata says (see settle).
func (s *Store) ensureMounted(ctx context.Context, root *meta.Root) error {
	h, err := s.openSettled(ctx, root)
	if err != nil {
		return err
	}
	h.Close()
	return nil
}

// settle makes the live mount at the open root h the one the metadata
// says: kept when it already is (a guestd restart must not disturb the
// directory's users), thawed if a crash left it frozen, mounted when
// missing (cold boot), swapped when another of our stacks is on top, and
// a half-done swap (the recorded stack slid beneath a frozen old one)
// finished. changed reports that the mounts at the root are not what h
// saw any more: the caller reopens it.
func (s *Store) settle(ctx context.Context, root *meta.Root, h *rootHandle) (changed bool, err error) {
	m := h.top()
	if m == nil {
		if err := s.checkOneWriter(root.Path, h.table, root.Mounted.Upper, nil); err != nil {
			return false, err
		}
		if err := s.immutableAt(root, h); err != nil {
			return false, err
		}
		return true, s.mounter.Mount(ctx, h.target(), s.tagged(root.Mounted))
	}
	if !s.ours(m) {
		return false, fmt.Errorf("managed root %s is covered by a %s mount that is not strata's", root.Path, m.FSType)
	}
	if root.Mounted.Matches(m.VFSOptions) {
		if overlay.Frozen(m.Options, m.VFSOptions) {
			return false, overlay.Thaw(h.target())
		}
		return false, nil
	}
	// A stack from before a crash: freeze it (it may share its upper with
	// the stack we want) and swap.
	if !overlay.Frozen(m.Options, m.VFSOptions) {
		if err := s.freezeOrBusy(ctx, root, h, nil); err != nil {
			return false, err
		}
	}
	if len(h.stack) > 1 && s.ours(h.stack[1]) && root.Mounted.Matches(h.stack[1].VFSOptions) {
		// A crash between sliding the recorded stack beneath and
		// unmounting the old one: finish that swap rather than mount a
		// second copy of the same upper.
		under := h.stack[1]
		lazy, err := overlay.UnmountTop(h.target())
		if err != nil {
			return false, err
		}
		if lazy {
			s.recordZombie(root.Path, mountDev(m), overlay.StackOf(s.layers, m.VFSOptions))
		}
		if overlay.Frozen(under.Options, under.VFSOptions) {
			return true, overlay.Thaw(h.target())
		}
		return true, nil
	}
	old := *root
	old.Mounted = overlay.StackOf(s.layers, m.VFSOptions)
	return true, s.swap(ctx, h, &old, root)
}

// immutableAt sets the immutable flag on the unmounted mountpoint of the
// open root h, checking that the directory it opened is the root's.
func (s *Store) immutableAt(root *meta.Root, h *rootHandle) error {
	fd, err := openDirAt(h.parent, h.name)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Ino != root.Ino || st.Dev != root.Dev {
		return ErrDirectoryMoved.With("path", root.Path)
	}
	return overlay.SetImmutableFD(fd, true)
}

// swap replaces the (frozen) stack of old at the open root h with
// newRoot's. An old stack still in use is detached lazily and recorded as
// a zombie, so that its layer dirs outlive it. The old stack's superblock
// is let go in the background (teardown): its last unmount writes back
// the upper's whole filesystem, which is no business of the operation.
func (s *Store) swap(ctx context.Context, h *rootHandle, old, newRoot *meta.Root) error {
	top := h.top()
	if top == nil {
		return fmt.Errorf("managed root %s: nothing mounted to swap", old.Path)
	}
	if err := s.checkOneWriter(old.Path, h.table, newRoot.Mounted.Upper, top); err != nil {
		return err
	}
	hold, herr := overlay.Hold(h.target())
	if herr != nil {
		// No clone to end it through later: make the old superblock
		// read-only now, as the teardown would (with its write-back).
		s.log.Warn("old stack not held; made read-only in the swap", "path", old.Path, "err", herr)
		if err := overlay.FreezeSuperAt(h.target()); err != nil {
			s.log.Error("old stack not made read-only: a process may still write into its layers through another mount of it", "path", old.Path, "err", err)
		}
	}
	lazy, err := s.mounter.Replace(ctx, h.target(), s.tagged(newRoot.Mounted))
	if lazy {
		s.recordZombie(old.Path, mountDev(top), old.Mounted)
	}
	var work string
	if err == nil && !lazy && old.Mounted.Upper != 0 && old.Mounted.Upper != newRoot.Mounted.Upper {
		// The old upper is no mount's upper any more: its overlay work
		// dir is scratch space nobody will use again.
		work = filepath.Join(s.layers, overlay.RelWork(old.Mounted.Upper))
	}
	s.teardown(hold, work, old.Mounted.Dirs())
	return err
}

// teardown ends, in the background, an old stack the swap let go: hold
// is a clone of its mount (overlay.Hold; -1 for none), work its old work
// dir ("" for none), dirs its layers, pinned until it is done (then
// collected, when one of them has no record any more: a restore's
// discarded upper, which the restore's own collection had to leave, or a
// lower layer a squash replaced while the stack used it). The
// superblock is made read-only through the clone first: a mount of it
// that the busy checks could not see (a bind mount or a mount namespace
// made during the operation) then cannot write into what is now a sealed
// layer. That, and the write-back of the upper's filesystem that comes
// with it, run outside the operation.
func (s *Store) teardown(hold int, work string, dirs []uint64) {
	if hold < 0 && work == "" {
		return
	}
	unpin := s.pin(dirs...)
	s.teardowns.add()
	go func() {
		defer s.teardowns.done()
		defer func() {
			unpin()
			// A layer the pin kept from a collection (a restore's
			// discarded upper) goes now.
			if len(dirs) == 0 {
				return
			}
			gone := false
			s.view(func(t meta.Tx) error {
				sps, err := t.Spans()
				if err != nil {
					return err
				}
				spans := make(map[uint64]bool, len(sps))
				for _, sp := range sps {
					spans[sp.ID] = true
				}
				// The old upper, or a lower that a squash replaced while
				// this stack used it (a clone's source layer too).
				for _, d := range dirs {
					if _, err := t.Layer(d); errors.Is(err, meta.ErrInconsistent) && !spans[d] {
						gone = true
						break
					}
				}
				return nil
			})
			if gone {
				s.collect(context.Background())
			}
		}()
		if hold >= 0 {
			if err := overlay.FreezeSuper(hold); err != nil {
				s.log.Error("old stack not made read-only: a process may still write into its layers through another mount of it", "layers", dirs, "err", err)
			}
			unix.Close(hold)
		}
		if work != "" {
			if err := os.RemoveAll(work); err != nil {
				s.log.Warn("remove work dir of a sealed layer", "dir", work, "err", err)
			}
		}
	}()
}

// inflight counts background work that Settle and Close wait for. Unlike
// a sync.WaitGroup, it may be added to while someone waits.
type inflight struct {
	mu   sync.Mutex
	cond *sync.Cond
	n    int
}

func (f *inflight) add() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

func (f *inflight) done() {
	f.mu.Lock()
	f.n--
	if f.n == 0 && f.cond != nil {
		f.cond.Broadcast()
	}
	f.mu.Unlock()
}

// wait returns once nothing is in flight.
func (f *inflight) wait() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cond == nil {
		f.cond = sync.NewCond(&f.mu)
	}
	for f.n > 0 {
		f.cond.Wait()
	}
}

// recordZombie records a stack detached lazily because it was in use: its
// layer dirs stay until nothing uses its superblock.
func (s *Store) recordZombie(path string, dev uint64, st overlay.Stack) {
	z := &meta.Zombie{ID: s.newLayerID(), Boot: s.boot, Dev: dev, Layers: st.Dirs()}
	s.unpin(z.ID)
	s.log.Warn("old stack still in use, detached lazily", "path", path, "dev", dev)
	if err := s.update(func(t meta.Tx) error { return t.PutZombie(z) }); err != nil {
		s.log.Error("record detached stack", "path", path, "err", err)
	}
}

// freezeOrBusy runs the kernel's gates on the live mount of the open root
// h and freezes it: the answer of busyCheckMounted's namespace scan
// (pending, when there is one), then the in-use probe (EBUSY while anything uses the
// mount: a working directory, a root, an open file, a mapping), then the
// freeze (read-only: EBUSY while a file is open for writing). A refusal
// becomes 409 directory_busy with the holders a scan finds, and the mount
// stays writable. The probe goes first so that a directory in use is
// refused without freezing it: writers never see it read-only for
// nothing. It is not repeated after the freeze: every open that fails
// there with EROFS holds the mount for an instant, so a writer in a loop
// would make it refuse almost every time; whoever comes in between is
// caught by the swap, whose unmount then detaches the old stack lazily.
func (s *Store) freezeOrBusy(ctx context.Context, root *meta.Root, h *rootHandle, pending func() error) error {
	if pending != nil {
		if err := pending(); err != nil {
			return err
		}
	}
	if busy, err := overlay.InUse(h.target()); err != nil || busy {
		if err != nil {
			return s.afterProbe(ctx, root, err)
		}
		return s.kernelBusy(ctx, root, h, inUseWhy)
	}
	err := overlay.Freeze(h.target())
	if errors.Is(err, unix.EBUSY) {
		return s.kernelBusy(ctx, root, h, "A process holds a file in the directory open for writing")
	}
	return err
}

// afterProbe handles an in-use probe that failed: one that unmounted the
// live mount (an expiry mark left by a crash) has the recorded stack
// mounted again at once; the operation fails either way, and a retry
// goes through.
func (s *Store) afterProbe(ctx context.Context, root *meta.Root, err error) error {
	if errors.Is(err, overlay.ErrExpiredUnmount) {
		s.log.Error("the in-use probe unmounted the directory; mounting it again", "path", root.Path)
		if merr := s.ensureMounted(ctx, root); merr != nil {
			return errors.Join(err, merr)
		}
	}
	return err
}

// inUseWhy is what the in-use probe's refusal says.
const inUseWhy = "A process uses the directory (its working directory, an open file or a mapping is there)"

// kernelBusy is the 409 for a kernel gate's refusal: the holders a full
// scan finds, and never an empty list. why says what the gate saw.
func (s *Store) kernelBusy(ctx context.Context, root *meta.Root, h *rootHandle, why string) error {
	found, err := s.holdersMounted(ctx, root, h)
	if err != nil {
		return err
	}
	if err := s.busyFrom(root.Path, found); err != nil {
		return err
	}
	return busyUnseen(root.Path, found, why)
}

// busyUnseen is directory_busy when a gate refused but the scan named no
// process it could inspect: the ones it could not inspect (kind unknown),
// or else one holder of kind unseen (pid 0), with a message saying what
// the gate saw and what to do.
func busyUnseen(path string, uninspected []holders.Holder, why string) error {
	if len(uninspected) > 0 {
		return holders.BusyErrorWith(path, uninspected, why+"; no process could be named, and those listed could not be inspected: one of them holds it.")
	}
	return holders.BusyErrorWith(path, []holders.Holder{{Kind: holders.KindUnseen}},
		why+", but no process in this PID namespace shows it (it may run in another one, or have just exited); stop it and retry.")
}

// busyTarget is the scan target of a mounted root: any use of the
// overlay's device, or of its layer directories.
func (s *Store) busyTarget(root *meta.Root, h *rootHandle) (holders.Target, error) {
	top := h.top()
	if top == nil {
		return holders.Target{}, fmt.Errorf("managed root %s is not mounted", root.Path)
	}
	t := holders.Target{Path: root.Path, Dev: mountDev(top), WholeDev: true}
	for _, id := range root.Mounted.Dirs() {
		t.BackingDirs = append(t.BackingDirs, s.fsDir(id))
	}
	return t, nil
}

func (s *Store) holdersMounted(ctx context.Context, root *meta.Root, h *rootHandle) ([]holders.Holder, error) {
	t, err := s.busyTarget(root, h)
	if err != nil {
		return nil, err
	}
	return s.cfg.Scanner.Holders(ctx, t)
}

// busyCheckMounted is the busy rule that the kernel's gates in this mount
// namespace cannot decide, checked before a capture or a restore: another
// mount of the overlay's superblock here (a bind mount, which the in-use
// probe of the root's mount does not count), or a mount namespace holding
// a copy of it. Either keeps the old superblock alive after the swap,
// under users who would see it frozen. Everything else (working
// directories, open files, mappings) is the gates' (the in-use probe,
// here and again in freezeOrBusy), and the full /proc scan runs only to
// name the holders when one refuses: it is off the critical path of every
// capture that goes through.
//
// The namespace scan reads a link per process: it runs in the background,
// beside the operation's sync, and pending is its answer, which the
// freeze waits for before it freezes anything.
func (s *Store) busyCheckMounted(ctx context.Context, root *meta.Root, h *rootHandle) (pending func() error, err error) {
	t, err := s.busyTarget(root, h)
	if err != nil {
		return nil, err
	}
	top := h.top()
	for _, m := range h.table {
		if m != top && mountDev(m) == t.Dev {
			return nil, s.kernelBusy(ctx, root, h, "The directory is also mounted at "+m.Mountpoint+"; unmount it")
		}
	}
	// The in-use probe now too, not only at the freeze: a directory in
	// use is refused before the sync, which can be long when the
	// filesystem has much dirty data.
	if busy, err := overlay.InUse(h.target()); err != nil || busy {
		if err != nil {
			return nil, s.afterProbe(ctx, root, err)
		}
		return nil, s.kernelBusy(ctx, root, h, inUseWhy)
	}
	done := make(chan error, 1)
	go func() {
		found, err := s.cfg.Scanner.MountNamespaces(ctx, t)
		if err == nil {
			err = s.busyFrom(root.Path, found)
		}
		done <- err
	}()
	return func() error { return <-done }, nil
}

// busyError scans for holders of t and returns directory_busy if any.
func (s *Store) busyError(ctx context.Context, t holders.Target) error {
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
func (s *Store) busyFrom(path string, found []holders.Holder) error {
	known := found[:0:0]
	for _, h := range found {
		if h.Kind == holders.KindUnknown {
			s.log.Debug("process could not be inspected", "path", path, "pid", h.PID)
			continue
		}
		known = append(known, h)
	}
	if len(known) > 0 {
		return holders.BusyError(path, known)
	}
	return nil
}
