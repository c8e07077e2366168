package layers

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"strata/holders"
	"strata/internal/fault"
	"strata/internal/fstree"
	"strata/internal/testenv"
	"strata/layers/meta"
	"strata/layers/overlay"
	"strata/pathpolicy"
)

// mounters are the implementations every store test runs against.
// mounters are the implementations the conformance suite runs against:
// each overlay.Mounter on the test's own filesystem (ext4 here and in CI),
// and the new mount API on XFS with reflink, the guest's filesystem.
var mounters = []struct {
	name   string
	legacy bool
	xfs    bool
}{{"fsmount", false, false}, {"mount2", true, false}, {"xfs", false, true}}

// forEachMounter runs fn once per overlay.Mounter implementation and
// filesystem: the conformance suite of the store.
func forEachMounter(t *testing.T, fn func(t *testing.T, h *harness)) {
	for _, m := range mounters {
		t.Run(m.name, func(t *testing.T) {
			testenv.RequiresRootMounts(t)
			if m.xfs {
				fn(t, newHarnessIn(t, xfsDir(t), m.legacy))
				return
			}
			fn(t, newHarness(t, m.legacy))
		})
	}
}

type harness struct {
	t      *testing.T
	legacy bool
	dir    string // store dir
	work   string // where managed directories live
	store  *Store
	cfg    Config
}

func newHarness(t *testing.T, legacy bool) *harness {
	t.Helper()
	return newHarnessIn(t, t.TempDir(), legacy)
}

// newHarnessIn is newHarness in base, an empty directory on the
// filesystem to test; one on a mount of its own (xfsDir) is allowed to
// hold managed directories.
func newHarnessIn(t *testing.T, base string, legacy bool) *harness {
	t.Helper()
	h := &harness{t: t, legacy: legacy, dir: filepath.Join(base, "store"), work: filepath.Join(base, "work")}
	if err := os.MkdirAll(h.work, 0o755); err != nil {
		t.Fatal(err)
	}
	policy := &pathpolicy.Policy{}
	if xfs.mnt != "" && strings.HasPrefix(base, xfs.mnt+"/") {
		policy.AllowedMounts = append(slices.Clone(pathpolicy.DefaultAllowedMounts), xfs.mnt)
	}
	h.cfg = Config{Dir: h.dir, LegacyMount: legacy, Policy: policy, Scanner: holders.NewScanner("/proc")}
	if os.Getenv("STRATA_TEST_LOG") != "" {
		h.cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	t.Cleanup(h.teardown)
	h.open()
	return h
}

func (h *harness) open() {
	h.t.Helper()
	s, err := Open(context.Background(), h.cfg)
	if err != nil {
		h.t.Fatalf("Open: %v", err)
	}
	h.store = s
}

// reopen closes the store and opens it again, as a guestd restart does.
func (h *harness) reopen() {
	h.t.Helper()
	h.store.Close()
	h.open()
}

// teardown unmounts every managed root and clears immutable flags so
// that t.TempDir can be removed.
func (h *harness) teardown() {
	if h.store != nil {
		h.store.Close()
	}
	for i := 0; i < 8; i++ {
		if unix.Unmount(h.work, unix.MNT_DETACH) != nil {
			break
		}
	}
	filepath.WalkDir(h.work, func(p string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			for unix.Unmount(p, unix.MNT_DETACH) == nil {
			}
			overlay.SetImmutable(p, false)
		}
		return nil
	})
}

// mkdir makes a directory to be managed, filled by fill.
func (h *harness) mkdir(name string, fill func(dir string)) string {
	h.t.Helper()
	d := filepath.Join(h.work, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		h.t.Fatal(err)
	}
	if fill != nil {
		fill(d)
	}
	return d
}

func (h *harness) capture(path, name string) Checkpoint {
	h.t.Helper()
	cp, err := h.store.Capture(context.Background(), path, name)
	if err != nil {
		h.t.Fatalf("Capture(%s): %v", path, err)
	}
	return cp
}

func (h *harness) restore(id string) {
	h.t.Helper()
	if _, err := h.store.Restore(context.Background(), id); err != nil {
		h.t.Fatalf("Restore(%s): %v", id, err)
	}
}

// layerDirs lists the layer dirs on disk.
func (h *harness) layerDirs() []uint64 {
	ents, err := os.ReadDir(filepath.Join(h.dir, "layers"))
	if err != nil {
		h.t.Fatal(err)
	}
	var out []uint64
	for _, e := range ents {
		id, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil {
			h.t.Fatalf("stray entry %q in layers dir", e.Name())
		}
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// assertNoOrphans checks that every layer dir on disk is known to the
// metadata and every layer record has its dir.
func (h *harness) assertNoOrphans() {
	h.t.Helper()
	if err := h.store.Settle(context.Background()); err != nil {
		h.t.Fatal(err)
	}
	var known []uint64
	if err := h.store.db.View(func(btx *bolt.Tx) error {
		ls, err := meta.Tx{Tx: btx}.Layers()
		for id := range ls {
			known = append(known, id)
		}
		if err != nil {
			return err
		}
		sps, err := meta.Tx{Tx: btx}.Spans()
		for _, sp := range sps {
			known = append(known, sp.ID)
		}
		if err != nil {
			return err
		}
		// The live mounts may still use dirs whose records are gone.
		rs, err := meta.Tx{Tx: btx}.Roots()
		for _, r := range rs {
			for _, d := range r.Mounted.Dirs() {
				if !slices.Contains(known, d) {
					known = append(known, d)
				}
			}
		}
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
	slices.Sort(known)
	if got := h.layerDirs(); !slices.Equal(got, known) {
		h.t.Fatalf("layer dirs on disk %v, layer records %v", got, known)
	}
}

func (h *harness) layerRecords() int {
	h.t.Helper()
	n := 0
	if err := h.store.db.View(func(btx *bolt.Tx) error {
		ls, err := meta.Tx{Tx: btx}.Layers()
		n = len(ls)
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
	return n
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, err error, code string) *fault.Error {
	t.Helper()
	fe := fault.As(err)
	if fe == nil || fe.Code != code {
		t.Fatalf("error %v, want code %s", err, code)
	}
	return fe
}

func assertTree(t *testing.T, dir string, want fstree.Tree) {
	t.Helper()
	if d := fstree.Diff(want, fstree.MustSnapshot(t, dir)); len(d) > 0 {
		t.Fatalf("%s differs from the checkpoint:\n%s", dir, strings.Join(d, "\n"))
	}
}

// richTree fills dir with every kind of entry a checkpoint must keep.
func richTree(t *testing.T, dir string) {
	write(t, dir+"/a.txt", "alpha")
	write(t, dir+"/empty", "")
	write(t, dir+"/sub/deep/b.txt", "beta")
	if err := os.MkdirAll(dir+"/emptydir", 0o700); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if err := os.WriteFile(dir+"/big.bin", big, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../outside/target", dir+"/link"); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir+"/sub", 0o2751); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir+"/a.txt", 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(dir+"/a.txt", "user.note", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)
	if err := os.Chtimes(dir+"/sub/deep/b.txt", old, old); err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { richTree(t, d) })
		before := fstree.MustSnapshot(t, dir)
		a := h.capture(dir, "A")
		assertTree(t, dir, before)
		if a.ParentID != "" {
			t.Errorf("first checkpoint has parent %q", a.ParentID)
		}

		// Change everything that can change.
		write(t, dir+"/a.txt", "changed")
		write(t, dir+"/new.txt", "new")
		os.Remove(dir + "/empty")
		os.RemoveAll(dir + "/sub")
		os.Chmod(dir+"/big.bin", 0o644)
		os.Chmod(dir, 0o711)
		unix.Setxattr(dir+"/emptydir", "user.x", []byte("1"), 0)
		os.Remove(dir + "/link")
		os.Symlink("elsewhere", dir+"/link")
		changed := fstree.MustSnapshot(t, dir)
		b := h.capture(dir, "B")
		if b.ParentID != a.ID {
			t.Errorf("B.parent = %q, want %q", b.ParentID, a.ID)
		}
		assertTree(t, dir, changed)

		write(t, dir+"/unsaved.txt", "lost on restore")
		h.restore(a.ID)
		assertTree(t, dir, before)
		h.restore(b.ID)
		assertTree(t, dir, changed)
		h.assertNoOrphans()
		// Only the active layer keeps an overlay work dir.
		if err := h.store.db.View(func(btx *bolt.Tx) error {
			ls, err := meta.Tx{Tx: btx}.Layers()
			for id, l := range ls {
				_, serr := os.Stat(filepath.Join(h.dir, "layers", overlay.RelWork(id)))
				if l.Sealed && serr == nil {
					t.Errorf("sealed layer %d still has a work dir", id)
				}
				if !l.Sealed && serr != nil {
					t.Errorf("active layer %d has no work dir: %v", id, serr)
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLineage is the seed document's example: A, B, C; restore B; D has
// parent B and C stays restorable; deleting B keeps C and D intact.
func TestLineage(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "A") })
		a := h.capture(dir, "A")
		write(t, dir+"/f", "B")
		b := h.capture(dir, "B")
		snapB := fstree.MustSnapshot(t, dir)
		write(t, dir+"/f", "C")
		write(t, dir+"/c-only", "c")
		c := h.capture(dir, "C")
		snapC := fstree.MustSnapshot(t, dir)
		h.restore(b.ID)
		assertTree(t, dir, snapB)
		write(t, dir+"/d-only", "d")
		d := h.capture(dir, "D")
		snapD := fstree.MustSnapshot(t, dir)
		if d.ParentID != b.ID {
			t.Fatalf("D.parent = %q, want B %q", d.ParentID, b.ID)
		}
		if c.ParentID != b.ID || b.ParentID != a.ID {
			t.Fatalf("parents: B->%q C->%q", b.ParentID, c.ParentID)
		}
		if err := h.store.Delete(context.Background(), b.ID); err != nil {
			t.Fatal(err)
		}
		h.assertNoOrphans()
		h.restore(c.ID)
		assertTree(t, dir, snapC)
		h.restore(d.ID)
		assertTree(t, dir, snapD)
		list, err := h.store.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, cp := range list {
			ids = append(ids, cp.ID)
		}
		if want := []string{a.ID, c.ID, d.ID}; !slices.Equal(ids, want) {
			t.Fatalf("List = %v, want %v (oldest first)", ids, want)
		}
		_, err = h.store.Restore(context.Background(), b.ID)
		wantCode(t, err, "checkpoint_not_found")
		wantCode(t, h.store.Delete(context.Background(), b.ID), "checkpoint_not_found")
	})
}

// TestDeleteFreesLayers: deleting every checkpoint leaves only the live
// chain's layers, and the directory is untouched.
func TestDeleteFreesLayers(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "0") })
		var ids []string
		for i := 1; i <= 5; i++ {
			ids = append(ids, h.capture(dir, "").ID)
			write(t, dir+"/f", strconv.Itoa(i))
		}
		h.restore(ids[1])
		live := fstree.MustSnapshot(t, dir)
		for _, id := range ids {
			if err := h.store.Delete(context.Background(), id); err != nil {
				t.Fatal(err)
			}
		}
		assertTree(t, dir, live)
		h.assertNoOrphans()
		// The base and the layer of ids[1], squashed into one, and the
		// active upper.
		if n := h.layerRecords(); n != 2 {
			t.Fatalf("%d layers left after deleting every checkpoint, want 2 (the live chain, squashed)", n)
		}
		again := h.capture(dir, "again")
		h.restore(again.ID)
		assertTree(t, dir, live)
		h.assertNoOrphans()
		// "again"'s layer absorbs the unreferenced base below it (the
		// mount keeps using the old dirs until its next swap).
		if n := h.layerRecords(); n != 2 {
			t.Fatalf("%d layers after one more capture and restore, want 2", n)
		}
	})
}

func TestRestartKeepsLiveChanges(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "saved") })
		h.capture(dir, "")
		write(t, dir+"/f", "unsaved")
		live := fstree.MustSnapshot(t, dir)
		h.reopen() // warm restart: the mount stays and is adopted
		assertTree(t, dir, live)
		h.store.Close()
		// Cold boot: no mounts survive.
		if err := unix.Unmount(dir, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dir+"/stray", nil, 0o644); !errors.Is(err, unix.EPERM) {
			t.Fatalf("write under the unmounted root: %v, want EPERM (immutable mountpoint)", err)
		}
		h.open()
		assertTree(t, dir, live)
		h.capture(dir, "after boot")
		h.assertNoOrphans()
	})
}

func TestCaptureRules(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "x") })
		h.capture(dir, "")

		// A hardlink made in the live directory must not be sealed.
		if err := os.Link(dir+"/f", dir+"/g"); err != nil {
			t.Fatal(err)
		}
		_, err := h.store.Capture(context.Background(), dir, "")
		wantCode(t, err, "path_hardlink")
		os.Remove(dir + "/g")

		if err := unix.Mkfifo(dir+"/fifo", 0o644); err != nil {
			t.Fatal(err)
		}
		_, err = h.store.Capture(context.Background(), dir, "")
		wantCode(t, err, "path_special_file")
		os.Remove(dir + "/fifo")

		// After a refused capture the directory is writable again.
		write(t, dir+"/after", "ok")
		h.capture(dir, "")

		// Nested directories.
		sub := dir + "/sub"
		os.Mkdir(sub, 0o755)
		_, err = h.store.Capture(context.Background(), sub, "")
		wantCode(t, err, "path_nested")
		_, err = h.store.Capture(context.Background(), h.work, "")
		wantCode(t, err, "path_nested")
		_, err = h.store.Capture(context.Background(), h.dir, "")
		wantCode(t, err, "path_protected")
		h.assertNoOrphans()
	})
}

func TestBusy(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "x") })
		// Enrollment refuses a directory somebody works in.
		cmd := exec.Command("sleep", "60")
		cmd.Dir = dir
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		_, err := h.store.Capture(context.Background(), dir, "")
		fe := wantCode(t, err, "directory_busy")
		holders, _ := fe.Fields["holders"].([]holders.Holder)
		if len(holders) == 0 || holders[0].PID != cmd.Process.Pid || holders[0].Kind != "cwd" {
			t.Fatalf("holders %+v, want sleep's cwd", fe.Fields["holders"])
		}
		cmd.Process.Kill()
		cmd.Wait()
		assertTree(t, dir, fstree.Tree{".": fstree.MustSnapshot(t, dir)["."], "f": fstree.MustSnapshot(t, dir)["f"]})
		h.capture(dir, "")
		h.assertNoOrphans()
	})
}

// TestBusyKinds: each way of using a managed directory is named in the
// 409: a working directory, an open fd, a memory mapping with no fd, and
// a mount namespace made after the mount.
func TestBusyKinds(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "content") })
		h.capture(dir, "")
		self, _ := os.Executable()
		tests := []struct {
			kind string
			cmd  func() *exec.Cmd
		}{
			{"cwd", func() *exec.Cmd { c := exec.Command("sleep", "60"); c.Dir = dir + "/."; return c }},
			{"fd", func() *exec.Cmd { return exec.Command("sh", "-c", "exec 3<"+dir+"/f; echo ready; exec sleep 60") }},
			{"mmap", func() *exec.Cmd {
				c := exec.Command(self)
				c.Env = append(os.Environ(), "STRATA_TEST_MMAP="+dir+"/f")
				return c
			}},
			{"mount-namespace", func() *exec.Cmd { return exec.Command("unshare", "--mount", "sh", "-c", "echo ready; exec sleep 60") }},
		}
		for _, tc := range tests {
			t.Run(tc.kind, func(t *testing.T) {
				cmd := tc.cmd()
				out, _ := cmd.StdoutPipe()
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				defer func() { cmd.Process.Kill(); cmd.Wait() }()
				if tc.kind != "cwd" {
					buf := make([]byte, 16)
					if n, err := out.Read(buf); err != nil || n == 0 {
						t.Fatalf("helper did not start: %v", err)
					}
				}
				pid := cmd.Process.Pid
				_, err := h.store.Capture(context.Background(), dir, "")
				fe := wantCode(t, err, "directory_busy")
				holders, _ := fe.Fields["holders"].([]holders.Holder)
				found := false
				for _, ho := range holders {
					found = found || (ho.PID == pid && ho.Kind == tc.kind)
				}
				if !found {
					t.Fatalf("holders %+v do not name pid %d as %s", holders, pid, tc.kind)
				}
				_, err = h.store.Restore(context.Background(), mustList(t, h)[0].ID)
				wantCode(t, err, "directory_busy")
			})
		}
		h.capture(dir, "free again")
		h.assertNoOrphans()
	})
}

// TestOneOperationPerDirectory: a second operation on a directory while
// one is under way fails at once with 409 operation_in_progress; another
// directory is not held up.
func TestOneOperationPerDirectory(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "x") })
		other := h.mkdir("other", func(d string) { write(t, d+"/f", "y") })
		first := h.capture(dir, "")
		h.capture(other, "")
		inside, release := make(chan struct{}), make(chan struct{})
		var held atomic.Bool
		h.store.cfg.StepHook = func(op, step string, d time.Duration, err error) {
			// Only the first capture to get here waits: the slow one. (A
			// non-blocking send raced with the receive below once
			// busy.check became fast.)
			if op == "capture" && step == "busy.check" && held.CompareAndSwap(false, true) {
				inside <- struct{}{}
				<-release
			}
		}
		done := make(chan error, 1)
		go func() {
			_, err := h.store.Capture(context.Background(), dir, "slow")
			done <- err
		}()
		<-inside
		_, err := h.store.Capture(context.Background(), dir, "")
		wantCode(t, err, "operation_in_progress")
		_, err = h.store.Restore(context.Background(), first.ID)
		wantCode(t, err, "operation_in_progress")
		wantCode(t, h.store.Delete(context.Background(), first.ID), "operation_in_progress")
		if _, err := h.store.Capture(context.Background(), other, ""); err != nil {
			t.Fatalf("another directory waits for this one: %v", err)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		h.store.cfg.StepHook = nil
		h.assertNoOrphans()
	})
}

// TestEnrollGate pins the enrollment's gate: a process that opens a file
// in the directory after the first scan (here: from the step hook, right
// after busy.check) is found by the rescan after the exchange; the
// exchange is undone, the answer is 409, and the directory is as it was,
// not enrolled, and can be enrolled once the process is gone.
func TestEnrollGate(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "content") })
		before := fstree.MustSnapshot(t, dir)
		var late *exec.Cmd
		h.store.cfg.StepHook = func(op, step string, d time.Duration, err error) {
			if op == "enroll" && step == "busy.check" && late == nil {
				late = exec.Command("sh", "-c", "exec 3>>"+dir+"/f; echo ready; exec sleep 60")
				out, _ := late.StdoutPipe()
				if err := late.Start(); err != nil {
					t.Error(err)
					return
				}
				out.Read(make([]byte, 8))
			}
		}
		_, err := h.store.Capture(context.Background(), dir, "")
		h.store.cfg.StepHook = nil
		if late == nil {
			t.Fatal("the hook did not run")
		}
		defer func() { late.Process.Kill(); late.Wait() }()
		fe := wantCode(t, err, "directory_busy")
		if hs, _ := fe.Fields["holders"].([]holders.Holder); len(hs) == 0 || hs[0].PID != late.Process.Pid {
			t.Fatalf("holders %+v, want the late writer %d", fe.Fields["holders"], late.Process.Pid)
		}
		assertTree(t, dir, before)
		if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(dir)); len(ms) != 0 {
			t.Fatalf("%s is mounted after a refused enrollment", dir)
		}
		if roots, _ := h.store.Roots(); len(roots) != 0 {
			t.Fatalf("roots after a refused enrollment: %v", roots)
		}
		h.assertNoOrphans()
		late.Process.Kill()
		late.Wait()
		h.capture(dir, "")
		assertTree(t, dir, before)
	})
}

// TestWriterAfterScanGetsBusy pins the atomic gate: a writer the advisory
// scan does not see (here: a scanner of an empty /proc) still makes the
// capture fail with 409, and nothing is sealed or lost.
func TestWriterAfterScanGetsBusy(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "x") })
		h.capture(dir, "")
		blind := t.TempDir() // a /proc with no processes in it
		os.MkdirAll(blind+"/self/ns", 0o755)
		os.Symlink("mnt:[1]", blind+"/self/ns/mnt")
		h.store.cfg.Scanner = holders.NewScanner(blind)
		f, err := os.OpenFile(dir+"/f", os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = h.store.Capture(context.Background(), dir, "")
		wantCode(t, err, "directory_busy")
		if _, err := f.WriteString("-still-writable"); err != nil {
			t.Fatalf("writer after refused capture: %v", err)
		}
		f.Close()
		_, err = h.store.Restore(context.Background(), mustList(t, h)[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		h.assertNoOrphans()
	})
}

func mustList(t *testing.T, h *harness) []Checkpoint {
	t.Helper()
	l, err := h.store.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return l
}
