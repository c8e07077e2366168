package layers

// Regression tests for the defects of issue 6 (an outside review of the
// engine). Each failed on the code before the fix.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"strata/holders"
	"strata/internal/fault"
	"strata/internal/testenv"
	"strata/layers/meta"
	"strata/layers/overlay"
	"strata/pathpolicy"
)

// assertOneWriter fails when the live mounts break the invariant that an
// upper layer is the upper of at most one writable overlay superblock.
// Problems listed in allow (substrings) are expected by the caller.
func (h *harness) assertOneWriter(allow ...string) {
	h.t.Helper()
	probs, err := h.store.CheckMounts()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, p := range probs {
		ok := false
		for _, a := range allow {
			ok = ok || strings.Contains(p, a)
		}
		if !ok {
			h.t.Fatalf("mount check: %s (all: %v)", p, probs)
		}
	}
}

func readString(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Defect 1: renaming the parent of a managed root and recreating the path
// made the next operation (and recovery) mount the recorded stack a second
// time at the old path, so two writable overlays shared one upper and a
// checkpoint sealed later held writes made after it was taken.
func TestMovedRootIsNeverMountedTwice(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		ws := h.mkdir("ws", nil)
		dir := h.mkdir("ws/project", func(d string) { write(t, d+"/f", "v1") })
		first := h.capture(dir, "1")
		// Every mount says whose it is: layer paths alone cannot (mount(2)
		// stacks name their layers relative to their store).
		if st := stackAt(mustMounts(t), dir); len(st) != 1 || st[0].Source != h.store.source || !strings.HasPrefix(st[0].Source, sourcePrefix) {
			t.Fatalf("mounts at the root: %+v, want one with source %q", st, h.store.source)
		}
		if err := os.Rename(ws, ws+".old"); err != nil {
			t.Fatal(err)
		}
		h.mkdir("ws/project", nil)
		moved := filepath.Join(ws+".old", "project")
		write(t, moved+"/f", "v2") // the live mount, at its new place

		_, err := h.store.Capture(context.Background(), dir, "2")
		fe := wantCode(t, err, "directory_moved")
		if fe.Fields["now_at"] != moved {
			t.Fatalf("now_at %v, want %s", fe.Fields["now_at"], moved)
		}
		_, err = h.store.Restore(context.Background(), first.ID)
		wantCode(t, err, "directory_moved")
		ds, err := h.store.Directories()
		if err != nil || len(ds) != 1 || ds[0].State != DirMoved || ds[0].NowAt != moved {
			t.Fatalf("Directories: %+v, %v", ds, err)
		}
		// A restart must not mount it again either, nor collect the
		// layers the moved mount uses.
		h.reopen()
		if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(dir)); len(ms) != 0 {
			t.Fatalf("recovery mounted the moved root again at %s", dir)
		}
		h.assertOneWriter("not the recorded stack")
		write(t, moved+"/g", "written while moved")
		if got := readString(t, moved+"/f"); got != "v2" {
			t.Fatalf("moved root shows f=%q", got)
		}
		// Moved back, it works again, and the first checkpoint is what
		// it was when it was taken.
		if err := os.RemoveAll(ws); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(ws+".old", ws); err != nil {
			t.Fatal(err)
		}
		h.capture(dir, "2")
		h.restore(first.ID)
		if got := readString(t, dir+"/f"); got != "v1" {
			t.Fatalf("checkpoint 1 shows f=%q, want v1", got)
		}
		if _, err := os.Stat(dir + "/g"); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("checkpoint 1 shows a file written after it: %v", err)
		}
		h.assertOneWriter()
	})
}

// Defect 1, every step: a parent renamed between any two steps of a
// capture or a restore never yields a second writable mount of one upper,
// and a checkpoint never changes after it was taken.
func TestParentRenamedAtEveryStep(t *testing.T) {
	testenv.RequiresRootMounts(t)
	for _, op := range []string{opCapture, opRestore} {
		steps := []string{stepMountCheck, stepValidateMounts, stepBusyCheck, stepSpaceCheck, stepPrepare, stepFreeze, stepCommit, stepMountSwap}
		if op == opCapture {
			steps = append(steps, stepValidateLayer, stepSeal)
		}
		for _, step := range steps {
			t.Run(op+"/"+step, func(t *testing.T) {
				h := newHarness(t, false)
				ws := h.mkdir("ws", nil)
				dir := h.mkdir("ws/project", func(d string) { write(t, d+"/f", "v1") })
				first := h.capture(dir, "1")
				write(t, dir+"/f", "v2")
				renamed := false
				h.store.cfg.StepHook = func(o, s string, d time.Duration, err error) {
					if o == op && s == step && !renamed {
						renamed = true
						if err := os.Rename(ws, ws+".old"); err != nil {
							t.Error(err)
						}
						h.mkdir("ws/project", nil)
					}
				}
				var err error
				if op == opCapture {
					_, err = h.store.Capture(context.Background(), dir, "2")
				} else {
					_, err = h.store.Restore(context.Background(), first.ID)
				}
				h.store.cfg.StepHook = nil
				if !renamed {
					t.Fatalf("step %s of %s never ran (err %v)", step, op, err)
				}
				if err != nil && fault.CodeOf(err) != "directory_moved" {
					t.Fatalf("%s: %v, want success or directory_moved", op, err)
				}
				h.assertOneWriter("not the recorded stack", "no writable overlay")
				h.reopen()
				h.assertOneWriter("not the recorded stack", "no writable overlay")
				// Back at its path, the root works and checkpoint 1 is intact.
				if err := os.RemoveAll(ws); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(ws+".old", ws); err != nil {
					t.Fatal(err)
				}
				write(t, dir+"/late", "after")
				h.capture(dir, "3")
				h.restore(first.ID)
				if got := readString(t, dir+"/f"); got != "v1" {
					t.Fatalf("checkpoint 1 shows f=%q", got)
				}
				if _, err := os.Stat(dir + "/late"); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("checkpoint 1 shows a later file: %v", err)
				}
				h.assertOneWriter()
			})
		}
	}
}

// Defect 2: the path rules were checked by name and every later step of an
// enrollment resolved the path again, so a parent swapped for a symlink in
// between got another directory moved into the store and covered.
func TestSymlinkSwapDuringEnrollNeverCoversAnotherDirectory(t *testing.T) {
	testenv.RequiresRootMounts(t)
	steps := []string{stepValidatePath, stepBusyCheck, stepSpaceCheck, stepPrepare, stepIntent, stepExchange, stepBusyGate, stepImmutable, stepSync, stepCommit}
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			h := newHarness(t, false)
			a := h.mkdir("a", nil)
			dir := h.mkdir("a/project", func(d string) { write(t, d+"/mine", "mine") })
			victim := h.mkdir("victim/project", func(d string) { write(t, d+"/theirs", "theirs") })
			var vst unix.Stat_t
			if err := unix.Stat(victim, &vst); err != nil {
				t.Fatal(err)
			}
			swapped := false
			h.store.cfg.StepHook = func(o, s string, d time.Duration, err error) {
				if s == step && !swapped {
					swapped = true
					if err := os.Rename(a, a+".real"); err != nil {
						t.Error(err)
					}
					if err := os.Symlink(filepath.Dir(victim), a); err != nil {
						t.Error(err)
					}
				}
			}
			_, err := h.store.Capture(context.Background(), dir, "")
			h.store.cfg.StepHook = nil
			if !swapped {
				t.Fatalf("step %s never ran: %v", step, err)
			}
			t.Logf("Capture after a swap at %s: %v", step, err)
			// The victim is untouched: same inode, same content, nothing
			// mounted on it.
			var now unix.Stat_t
			if err := unix.Stat(victim, &now); err != nil || now.Ino != vst.Ino {
				t.Fatalf("victim directory replaced (ino %d, was %d): %v", now.Ino, vst.Ino, err)
			}
			if got := names(t, victim); !slices.Equal(got, []string{"theirs"}) {
				t.Fatalf("victim lists %v", got)
			}
			if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(victim)); len(ms) != 0 {
				t.Fatalf("an overlay covers the victim directory")
			}
			// The user's directory is intact where it now is.
			if got := readString(t, filepath.Join(a+".real", "project", "mine")); got != "mine" {
				t.Fatalf("user's file: %q", got)
			}
			h.assertOneWriter("not the recorded stack", "no writable overlay")
			h.reopen()
			if got := names(t, victim); !slices.Equal(got, []string{"theirs"}) {
				t.Fatalf("after a restart the victim lists %v", got)
			}
			if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(victim)); len(ms) != 0 {
				t.Fatalf("after a restart an overlay covers the victim directory")
			}
		})
	}
}

// beneathOnly slides the new stack beneath the old one and stops there, as
// a crash between move_mount(BENEATH) and the unmount would.
type beneathOnly struct{ overlay.Mounter }

func (b *beneathOnly) Replace(ctx context.Context, t overlay.Target, s overlay.Stack) (bool, error) {
	mfd, err := overlay.Detached(s)
	if err != nil {
		return false, err
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", t.Dir, t.Name, unix.MOVE_MOUNT_F_EMPTY_PATH|overlay.MoveMountBeneath); err != nil {
		return false, err
	}
	return false, errors.New("simulated crash after move_mount beneath")
}

// Defect 3: the mount below the top was never found (the mount table
// filter stopped at the first match), so recovery of a swap interrupted
// between move_mount(BENEATH) and the unmount slid in a third stack and
// left the first one hidden, writable, on an upper about to be sealed.
func TestRecoveryFinishesHalfDoneSwap(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/f", "v1") })
	h.capture(dir, "1")
	write(t, dir+"/g", "v2")
	h.store.cfg.StepHook = func(o, s string, d time.Duration, err error) {
		if o == opCapture && s == stepValidateLayer {
			h.store.mounter = &beneathOnly{overlay.FSMounter()}
		}
	}
	// A capture whose swap failed half way finishes as recovery would:
	// that is the code under test, in process.
	_, err := h.store.Capture(context.Background(), dir, "2")
	h.store.cfg.StepHook = nil
	h.store.mounter = overlay.FSMounter()
	if err != nil {
		t.Fatalf("capture whose swap stopped half way: %v", err)
	}
	if n := len(stackAt(mustMounts(t), dir)); n != 1 {
		t.Fatalf("%d mounts at the root after finishing a half-done swap, want 1", n)
	}
	h.assertOneWriter()
	// The same state found by a restart.
	h.store.mounter = &beneathOnly{overlay.FSMounter()}
	write(t, dir+"/h", "v3")
	_, err = h.store.Capture(context.Background(), dir, "3")
	h.store.mounter = overlay.FSMounter()
	t.Logf("capture 3: %v", err)
	h.reopen()
	if n := len(stackAt(mustMounts(t), dir)); n != 1 {
		t.Fatalf("%d mounts at the root after recovery, want 1", n)
	}
	h.assertOneWriter()
	for _, f := range []string{"f", "g", "h"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("after recovery: %v", err)
		}
	}
}

func mustMounts(t *testing.T) []*mountinfo.Info {
	t.Helper()
	ms, err := mountinfo.GetMounts(nil)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// Defect 5: a second store opened on the same directory cleared the first
// one's staging area and mounted a probe there before it took the lock.
func TestSecondOpenOfAStoreChangesNothing(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/f", "v1") })
	h.capture(dir, "1")
	staged := filepath.Join(h.dir, "tmp", "staged-by-the-first")
	write(t, staged+"/fs/file", "x")
	_, err := Open(context.Background(), h.cfg)
	if err == nil {
		t.Fatal("a second Open of a held store succeeded")
	}
	if !strings.Contains(err.Error(), h.dir) || !strings.Contains(err.Error(), "pid") {
		t.Fatalf("error %q does not name the store and its holder", err)
	}
	if _, serr := os.Stat(staged + "/fs/file"); serr != nil {
		t.Fatalf("the second Open touched the first one's staging area: %v", serr)
	}
	if ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Join(h.dir, "tmp"))); len(ms) != 0 {
		t.Fatalf("the second Open mounted in the first one's staging area")
	}
	os.RemoveAll(staged)
	h.capture(dir, "2")
}

// Defect 9: a probe mount a crash left in tmp/ made the next Open fail.
func TestOpenSurvivesAProbeMountLeftInTmp(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	h.store.Close()
	h.store = nil
	left := filepath.Join(h.dir, "tmp", "probe", "m")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", left, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(left, unix.MNT_DETACH)
	h.open()
}

// Defect 9: an enrollment recovery cannot finish stopped guestd from
// starting at all, and recovery then mounted an enrollment it said it
// left alone.
func TestUnfinishableEnrollmentIsReportedNotFatal(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	good := h.mkdir("good", func(d string) { write(t, d+"/f", "v1") })
	h.capture(good, "1")
	bad := h.mkdir("bad", func(d string) { write(t, d+"/f", "kept") })
	h.store.Close()
	h.store = nil
	// An enrollment whose store copy is neither the user's directory nor
	// the prepared one: recovery cannot tell which side it is on.
	if err := os.MkdirAll(filepath.Join(h.dir, "layers", "9000", "fs"), 0o755); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(h.dir, "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(btx *bolt.Tx) error {
		t := meta.Tx{Tx: btx}
		if err := t.PutLayer(&meta.Layer{ID: 9000, Root: 9002, Sealed: true}); err != nil {
			return err
		}
		if err := t.PutLayer(&meta.Layer{ID: 9001, Root: 9002, Parent: 9000}); err != nil {
			return err
		}
		return t.PutRoot(&meta.Root{ID: 9002, Path: bad, State: meta.RootEnrolling, Active: 9001,
			Enroll:  &meta.EnrollIntent{OrigIno: 1, MountpointIno: 2, Base: 9000, Checkpoint: "cp_x"},
			Mounted: overlay.Stack{Layers: filepath.Join(h.dir, "layers"), Upper: 9001, Lowers: []uint64{9000}}})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	h.open()
	if got := readString(t, good+"/f"); got != "v1" {
		t.Fatalf("the other root: %q", got)
	}
	if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(bad)); len(ms) != 0 {
		t.Fatalf("recovery mounted an enrollment it left alone")
	}
	if got := readString(t, bad+"/f"); got != "kept" {
		t.Fatalf("the directory of the unfinished enrollment: %q", got)
	}
	ds, err := h.store.Directories()
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, d := range ds {
		states[d.Path] = d.State
	}
	if states[good] != DirReady || states[bad] != DirUnavailable {
		t.Fatalf("Directories: %+v", ds)
	}
}

// Defect 6: running out of inodes was a 500 and guestd then refused to
// start; a full disk refused even a restore that would free space, and
// the 64 MiB reserve kept small filesystems from ever being checkpointed.
func TestFullFilesystemIs507AndNeverATrap(t *testing.T) {
	testenv.RequiresRootMounts(t)
	base := t.TempDir()
	small := filepath.Join(base, "small")
	if err := os.Mkdir(small, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=8m,nr_inodes=400"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detachAllUnder(small) })
	cfg := Config{Dir: filepath.Join(small, "store"), Policy: &pathpolicy.Policy{AllowedMounts: []string{small}}, Scanner: holders.NewScanner("/proc")}
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	dir := filepath.Join(small, "project")
	write(t, dir+"/f", "v1")
	first, err := s.Capture(context.Background(), dir, "1")
	if err != nil {
		t.Fatalf("a capture on an 8 MiB filesystem: %v", err)
	}
	write(t, dir+"/g", "v2")
	// Use up every inode.
	fill := filepath.Join(small, "fill")
	if err := os.Mkdir(fill, 0o755); err != nil {
		t.Fatal(err)
	}
	var filled []string
	for i := 0; ; i++ {
		p := filepath.Join(fill, strings.Repeat("x", 1)+itoa(i))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
		filled = append(filled, p)
	}
	_, err = s.Capture(context.Background(), dir, "2")
	wantCode(t, err, "insufficient_storage")
	if got := readString(t, dir+"/g"); got != "v2" {
		t.Fatalf("after a refused capture g=%q", got)
	}
	// A restart on a full filesystem serves the directory.
	s.Close()
	if s, err = Open(context.Background(), cfg); err != nil {
		t.Fatalf("Open on a filesystem with no free inode: %v", err)
	}
	if got := readString(t, dir+"/f"); got != "v1" {
		t.Fatalf("after a restart f=%q", got)
	}
	// A few inodes back: not enough for the reserve, enough for a
	// restore, which may free space.
	for _, p := range filled[len(filled)-10:] {
		os.Remove(p)
	}
	_, err = s.Capture(context.Background(), dir, "2")
	wantCode(t, err, "insufficient_storage")
	if _, err := s.Restore(context.Background(), first.ID); err != nil {
		t.Fatalf("a restore with little space left: %v", err)
	}
	if _, err := os.Stat(dir + "/g"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("restore did not discard g: %v", err)
	}
}

// Defect 9 ("a 500 after a commit makes the client's retry create a
// duplicate"): a create or restore with an Idempotency-Key answers a
// retry with its first answer, across a restart, and refuses the key
// with another request.
func TestIdempotencyKey(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/f", "v1") })
	ctx := context.Background()
	a, err := h.store.Capture(ctx, dir, "first", WithIdempotencyKey("k1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.store.Capture(ctx, dir, "first", WithIdempotencyKey("k1"))
	if err != nil || b != a {
		t.Fatalf("retry of the enrollment: %+v, %v; want %+v", b, err, a)
	}
	write(t, dir+"/g", "v2")
	c, err := h.store.Capture(ctx, dir, "second", WithIdempotencyKey("k2"))
	if err != nil {
		t.Fatal(err)
	}
	h.reopen()
	d, err := h.store.Capture(ctx, dir, "second", WithIdempotencyKey("k2"))
	if err != nil || d != c {
		t.Fatalf("retry after a restart: %+v, %v; want %+v", d, err, c)
	}
	if n := len(mustList(t, h)); n != 2 {
		t.Fatalf("%d checkpoints after retries, want 2", n)
	}
	_, err = h.store.Capture(ctx, dir, "other", WithIdempotencyKey("k2"))
	wantCode(t, err, "idempotency_key_reused")
	_, err = h.store.Restore(ctx, a.ID, WithIdempotencyKey("k2"))
	wantCode(t, err, "idempotency_key_reused")
	if _, err := h.store.Restore(ctx, a.ID, WithIdempotencyKey("r1")); err != nil {
		t.Fatal(err)
	}
	write(t, dir+"/after-restore", "x")
	if _, err := h.store.Restore(ctx, a.ID, WithIdempotencyKey("r1")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir + "/after-restore"); err != nil {
		t.Fatalf("a retried restore ran again: %v", err)
	}
}

// forgetIdentity clears the recorded identity of every root, as records
// written before roots kept one are.
func (h *harness) forgetIdentity() {
	h.t.Helper()
	h.store.Close()
	h.store = nil
	db, err := bolt.Open(filepath.Join(h.dir, "meta.db"), 0o600, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(btx *bolt.Tx) error {
		t := meta.Tx{Tx: btx}
		rs, err := t.Roots()
		for _, r := range rs {
			r.Dev, r.Ino = 0, 0
			if err == nil {
				err = t.PutRoot(r)
			}
		}
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
}

// A root recorded before roots kept their identity adopts the inode at
// its path only when that evidently is the root: its mount is on it, or
// it is the empty immutable mountpoint after a reboot. A directory
// someone put at the path of a moved root is never adopted and covered.
func TestRecordWithoutIdentity(t *testing.T) {
	testenv.RequiresRootMounts(t)
	t.Run("mounted", func(t *testing.T) {
		h := newHarness(t, false)
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "v1") })
		h.capture(dir, "1")
		h.forgetIdentity()
		h.open()
		if r := h.rootOf(dir); r.Ino == 0 {
			t.Fatal("identity not adopted")
		}
		h.capture(dir, "2")
	})
	t.Run("cold boot", func(t *testing.T) {
		h := newHarness(t, false)
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "v1") })
		h.capture(dir, "1")
		h.forgetIdentity()
		detachUnder(dir)
		h.open()
		if got := readString(t, dir+"/f"); got != "v1" {
			t.Fatalf("after a cold boot f=%q", got)
		}
	})
	t.Run("moved", func(t *testing.T) {
		h := newHarness(t, false)
		ws := h.mkdir("ws", nil)
		dir := h.mkdir("ws/project", func(d string) { write(t, d+"/f", "v1") })
		h.capture(dir, "1")
		h.forgetIdentity()
		if err := os.Rename(ws, ws+".old"); err != nil {
			t.Fatal(err)
		}
		h.mkdir("ws/project", func(d string) { write(t, d+"/other", "not the root") })
		h.open()
		if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(dir)); len(ms) != 0 {
			t.Fatal("a directory at a moved root's path was covered")
		}
		_, err := h.store.Capture(context.Background(), dir, "2")
		wantCode(t, err, "directory_moved")
	})
}

// The one-writer check itself: when a root's upper layer is already the
// upper of a writable overlay somewhere else (here mounted by hand, after
// a reboot-like unmount of the root), neither recovery nor an operation
// mounts it a second time; they answer directory_moved with where it is.
func TestUpperMountedElsewhereIsNeverMountedAgain(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/f", "v1") })
	h.capture(dir, "1")
	r := h.rootOf(dir)
	elsewhere := h.mkdir("elsewhere", nil)
	h.store.Close()
	h.store = nil
	detachUnder(dir)
	pfd, err := openDirAt(unix.AT_FDCWD, h.work)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pfd)
	st := r.Mounted
	if err := overlay.FSMounter().Mount(context.Background(), overlay.Target{Dir: pfd, Name: "elsewhere"}, st); err != nil {
		t.Fatal(err)
	}
	h.open()
	if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(dir)); len(ms) != 0 {
		t.Fatal("recovery mounted an upper layer that is already mounted elsewhere")
	}
	_, err = h.store.Capture(context.Background(), dir, "2")
	fe := wantCode(t, err, "directory_moved")
	if fe.Fields["now_at"] != elsewhere {
		t.Fatalf("now_at %v, want %s", fe.Fields["now_at"], elsewhere)
	}
	h.assertOneWriter("not the recorded stack")
}
