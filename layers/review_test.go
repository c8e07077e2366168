package layers

// Regression tests for bugs found in review. Each asserts the correct
// behaviour and failed while the bug was there.

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"strata/internal/testenv"
	"strata/layers/overlay"
)

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// A request whose context ends after the exchange (the client hung up)
// must not leave the directory emptied: its contents sit in the store
// and the path is a plain writable empty directory until guestd restarts.
func TestReviewCancelAfterExchange(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/f", "data") })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.store.cfg.StepHook = func(op, step string, d time.Duration, err error) {
		if op == "enroll" && step == "busy.gate" {
			cancel()
		}
	}
	_, err := h.store.Capture(ctx, dir, "")
	h.store.cfg.StepHook = nil
	t.Logf("Capture: %v", err)
	got := names(t, dir)
	if err != nil && len(got) == 0 {
		// A write now lands in the empty mountpoint and is hidden by the
		// mount that recovery puts over it.
		werr := os.WriteFile(dir+"/written-meanwhile", []byte("x"), 0o644)
		h.reopen()
		t.Fatalf("failed enrollment left %s empty (write meanwhile: %v); after restart it shows %v", dir, werr, names(t, dir))
	}
}

// Same after a capture's commit: the step after it is skipped, the
// directory stays frozen read-only although the checkpoint exists.
func TestReviewCancelAfterCaptureCommit(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/f", "data") })
	h.capture(dir, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.store.cfg.StepHook = func(op, step string, d time.Duration, err error) {
		if op == "capture" && step == "commit" {
			cancel()
		}
	}
	_, err := h.store.Capture(ctx, dir, "")
	h.store.cfg.StepHook = nil
	cps := mustList(t, h)
	werr := os.WriteFile(dir+"/g", []byte("x"), 0o644)
	if err != nil || werr != nil {
		t.Fatalf("Capture: %v, checkpoints now %d, write after it: %v", err, len(cps), werr)
	}
}

// A merged layer must not keep a whiteout under an ancestor that the merge
// made opaque: that directory then lives in one layer only, overlayfs lists
// it straight from that layer, and the whiteout shows as a name that
// cannot be looked up.
func TestReviewMergeWhiteoutUnderOpaqueAncestor(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/a/b/c", "base") })
	h.capture(dir, "1")
	if err := os.RemoveAll(dir + "/a"); err != nil {
		t.Fatal(err)
	}
	write(t, dir+"/a/b/c", "new") // a/ is opaque in this layer
	h.capture(dir, "2")
	if err := os.Remove(dir + "/a/b/c"); err != nil { // whiteout a/b/c
		t.Fatal(err)
	}
	h.capture(dir, "3")
	if got := names(t, dir+"/a/b"); len(got) != 0 {
		t.Fatalf("before compaction a/b lists %v", got)
	}
	if err := h.store.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	cp := h.capture(dir, "4") // mounts the compacted stack
	if r := h.rootOf(dir); len(r.Mounted.Lowers) != 3 {
		t.Logf("stack %v (expected a span)", r.Mounted)
	}
	if got := names(t, dir+"/a/b"); len(got) != 0 {
		_, serr := os.Lstat(dir + "/a/b/" + got[0])
		t.Fatalf("after compaction a/b lists %v (lstat: %v); checkpoint %s", got, serr, cp.ID)
	}
}

// Restoring a checkpoint whose layer was squashed must give the root its
// attributes at capture time; merge leaves the merged root's mtime at the
// time of the merge.
func TestReviewSquashKeepsRootTimes(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/f", "0") })
	h.capture(dir, "1")
	write(t, dir+"/g", "1")
	two := h.capture(dir, "2")
	write(t, dir+"/h", "2")
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(dir, old, old); err != nil {
		t.Fatal(err)
	}
	three := h.capture(dir, "3")
	if err := h.store.Delete(context.Background(), two.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.store.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.restore(three.ID)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().Equal(old) {
		t.Fatalf("root mtime after restoring a squashed checkpoint: %v, want %v", fi.ModTime(), old)
	}
}

// Two enrollments of nested directories that run together both pass the
// nesting check (neither is recorded yet). The outer one then moves the
// inner root's mountpoint, mount and all, into its base layer.
func TestReviewNestedEnrollRace(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	base := filepath.Dir(h.dir)
	t.Cleanup(func() { detachAllUnder(base) })
	outer := h.mkdir("outer", func(d string) { write(t, d+"/inner/f", "inner data") })
	inner := outer + "/inner"
	var once sync.Once
	entered, release := make(chan struct{}), make(chan struct{})
	h.store.cfg.StepHook = func(op, step string, d time.Duration, err error) {
		if op == "enroll" && step == "validate.path" {
			first := false
			once.Do(func() { first = true })
			if first {
				close(entered)
				<-release
			}
		}
	}
	outerErr := make(chan error, 1)
	go func() {
		_, err := h.store.Capture(context.Background(), outer, "")
		outerErr <- err
	}()
	<-entered
	innerErrc := make(chan error, 1)
	go func() {
		_, err := h.store.Capture(context.Background(), inner, "")
		innerErrc <- err
	}()
	// Let the inner enrollment run to its end while the outer one waits
	// between its checks and its intent (or block, if they exclude).
	select {
	case err := <-innerErrc:
		innerErrc <- err
	case <-time.After(500 * time.Millisecond):
	}
	close(release)
	oerr := <-outerErr
	innerErr := <-innerErrc
	h.store.cfg.StepHook = nil
	t.Logf("inner: %v, outer: %v", innerErr, oerr)
	if innerErr == nil && oerr == nil {
		ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(base))
		var where []string
		for _, m := range ms {
			where = append(where, m.Mountpoint)
		}
		roots, _ := h.store.Roots()
		t.Fatalf("nested roots %v both enrolled; mounts now at %v; %s lists %v", roots, where, inner, names(t, inner))
	}
}

func detachAllUnder(base string) {
	for i := 0; i < 8; i++ {
		ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(base))
		if len(ms) == 0 {
			break
		}
		for _, m := range ms {
			unix.Unmount(m.Mountpoint, unix.MNT_DETACH)
		}
	}
	filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			overlay.SetImmutable(p, false)
		}
		return nil
	})
}

// A guestd restart between a capture's commit and its swap (here: the
// swap fails, which leaves the same state as a kill would) leaves the old stack on top, in use. Recovery collects layer dirs
// before it swaps, so dirs that only that stack still uses (records gone
// to a squash) are deleted under it: a process holding the directory sees
// files vanish.
func TestReviewRecoverCollectsMountedStack(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/f0", "0") })
	h.capture(dir, "1")
	write(t, dir+"/f1", "1")
	two := h.capture(dir, "2")
	write(t, dir+"/f2", "2")
	h.capture(dir, "3")
	if err := h.store.Delete(context.Background(), two.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.store.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	held := "/proc/self/fd/" + itoa(fd)
	if got := strings.Join(names(t, held), " "); got != "f0 f1 f2" {
		t.Fatalf("held view %q", got)
	}
	// The swap fails after the commit: the state a kill between the two
	// leaves.
	h.store.cfg.StepHook = func(op, step string, d time.Duration, err error) {
		if op == "capture" && step == "commit" {
			h.store.mounter = failingMounter{}
		}
	}
	_, err = h.store.Capture(context.Background(), dir, "4")
	h.store.cfg.StepHook = nil
	if err == nil {
		t.Fatal("expected the capture to stop after its commit")
	}
	h.reopen()
	ents, err := os.ReadDir(held)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if err != nil || strings.Join(got, " ") != "f0 f1 f2" {
		t.Fatalf("a process holding the directory across a restart now lists %v (%v), want f0 f1 f2", got, err)
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

type failingMounter struct{}

func (failingMounter) Name() string             { return "failing" }
func (failingMounter) Options() overlay.Options { return overlay.DefaultOptions }
func (failingMounter) Mount(context.Context, overlay.Target, overlay.Stack) error {
	return errors.New("mount fails")
}
func (failingMounter) Replace(context.Context, overlay.Target, overlay.Stack) (bool, error) {
	return false, errors.New("replace fails")
}

// Between the exchange and the immutable flag the path is, for an
// instant, a plain empty writable directory. A file written there then
// must not be hidden under the mount: the enrollment is refused (409)
// and the file ends up in the user's directory with the rest.
func TestReviewWriteDuringEnrollIsHidden(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/f", "data") })
	h.store.cfg.StepHook = func(op, step string, d time.Duration, err error) {
		if op == "enroll" && step == "exchange" {
			write(t, dir+"/late", "written during enrollment")
		}
	}
	_, err := h.store.Capture(context.Background(), dir, "")
	h.store.cfg.StepHook = nil
	if fe := wantCode(t, err, "directory_busy"); fe == nil {
		t.Fatal("no error")
	}
	for _, f := range []string{"f", "late"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("%s is not in the directory after the refused enrollment: %v (now %v)", f, err, names(t, dir))
		}
	}
	h.capture(dir, "")
	if got := names(t, dir); len(got) != 2 {
		t.Fatalf("after enrolling: %v", got)
	}
	h.assertNoOrphans()
}

// ...and deleted with the prepared directory when the gate refuses.
func TestReviewWriteDuringRefusedEnrollIsLost(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	dir := h.mkdir("project", func(d string) { write(t, d+"/f", "data") })
	var holder *exec.Cmd
	h.store.cfg.StepHook = func(op, step string, d time.Duration, err error) {
		if op == "enroll" && step == "busy.check" {
			holder = exec.Command("sh", "-c", "echo ready; exec sleep 60")
			holder.Dir = dir
			out, _ := holder.StdoutPipe()
			if err := holder.Start(); err != nil {
				t.Error(err)
				return
			}
			out.Read(make([]byte, 8))
		}
		if op == "enroll" && step == "exchange" {
			write(t, dir+"/late", "written during enrollment")
		}
	}
	_, err := h.store.Capture(context.Background(), dir, "")
	h.store.cfg.StepHook = nil
	if holder != nil {
		holder.Process.Kill()
		holder.Wait()
	}
	t.Logf("Capture: %v", err)
	if _, serr := os.Stat(dir + "/late"); serr != nil {
		t.Fatalf("a file written during a refused enrollment is gone: %v (directory: %v)", serr, names(t, dir))
	}
}
