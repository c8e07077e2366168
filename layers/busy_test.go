package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"strata/holders"
	"strata/internal/fault"
	"strata/layers/overlay"
)

// emptyProc is a /proc with no process in it: a scan of it finds nobody,
// the way a scan misses a process of another PID namespace.
func emptyProc(t *testing.T) *holders.Scanner {
	t.Helper()
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "self", "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ns, filepath.Join(proc, "self", "ns", "mnt")); err != nil {
		t.Fatal(err)
	}
	return holders.NewScanner(proc)
}

// TestBusyNeverEmpty: when the kernel's gate refuses and no scan can name
// the process, the 409 still lists a holder (kind unseen, pid 0) and its
// message says what the gate saw; capture and restore alike, and the
// directory stays writable and unchanged.
func TestBusyNeverEmpty(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "x") })
		first := h.capture(dir, "")
		h.store.cfg.Scanner = emptyProc(t)
		cmd := exec.Command("sh", "-c", "exec 3>>"+dir+"/f; echo ready; exec sleep 60")
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		if n, err := out.Read(make([]byte, 8)); err != nil || n == 0 {
			t.Fatalf("writer did not start: %v", err)
		}
		for _, op := range []string{"capture", "restore"} {
			var err error
			if op == "capture" {
				_, err = h.store.Capture(context.Background(), dir, "")
			} else {
				_, err = h.store.Restore(context.Background(), first.ID)
			}
			fe := wantCode(t, err, "directory_busy")
			hs, _ := fe.Fields["holders"].([]holders.Holder)
			if len(hs) != 1 || hs[0].Kind != holders.KindUnseen || hs[0].PID != 0 {
				t.Fatalf("%s: holders %+v, want one unseen holder", op, hs)
			}
			if !strings.Contains(fe.Message, "no process") {
				t.Fatalf("%s: message %q does not say that no process was found", op, fe.Message)
			}
		}
		write(t, dir+"/g", "still writable")
		if got := readString(t, dir+"/f"); got != "x" {
			t.Fatalf("f = %q", got)
		}
		if got := len(mustList(t, h)); got != 1 {
			t.Fatalf("%d checkpoints after refusals, want 1", got)
		}
		cmd.Process.Kill()
		cmd.Wait()
		h.capture(dir, "free again")
		h.assertNoOrphans()
	})
}

// TestBusyBindMount: a bind mount of a managed directory elsewhere is a
// use the in-use probe of the root's own mount does not count; it is
// refused with a message naming where, and once unmounted the capture
// goes through.
func TestBusyBindMount(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "x") })
		h.capture(dir, "")
		elsewhere := h.mkdir("elsewhere", nil)
		if err := unix.Mount(dir, elsewhere, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		_, err := h.store.Capture(context.Background(), dir, "")
		fe := wantCode(t, err, "directory_busy")
		if hs, _ := fe.Fields["holders"].([]holders.Holder); len(hs) == 0 {
			t.Fatalf("no holders in %+v", fe.Fields)
		}
		if !strings.Contains(fe.Message, elsewhere) {
			t.Fatalf("message %q does not name %s", fe.Message, elsewhere)
		}
		if err := unix.Unmount(elsewhere, 0); err != nil {
			t.Fatal(err)
		}
		h.capture(dir, "")
		h.assertNoOrphans()
	})
}

// TestInUseProbe: the probe answers busy for a working directory inside,
// idle otherwise, and probing an idle mount again and again never
// unmounts it (the expiry mark it sets is cleared each time).
func TestInUseProbe(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "x") })
		h.capture(dir, "")
		parent, err := unix.Open(filepath.Dir(dir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(parent)
		target := overlay.Target{Dir: parent, Name: filepath.Base(dir)}
		for i := range 5 {
			busy, err := overlay.InUse(target)
			if err != nil || busy {
				t.Fatalf("probe %d of an idle mount: busy %v, %v", i, busy, err)
			}
		}
		cmd := exec.Command("sleep", "60")
		cmd.Dir = dir
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		busy, err := overlay.InUse(target)
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil || !busy {
			t.Fatalf("probe with a working directory inside: busy %v, %v", busy, err)
		}
		if got := readString(t, dir+"/f"); got != "x" {
			t.Fatalf("after the probes f = %q", got)
		}
		h.capture(dir, "")
	})
}

// TestWritersDuringCaptures: a writer outside the directory rewrites one
// file in a loop while the directory is captured again and again. A write
// either goes through or fails with EROFS (the window between the freeze
// and the swap; with mount(2), also EPERM from the immutable mountpoint
// between the unmount and the mount), never with another error; every checkpoint holds a
// whole version of the file, the versions only grow from one checkpoint
// to the next, and the directory is writable after each capture. The
// number of failed writes is logged: make bench measures the window.
func TestWritersDuringCaptures(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "v0\n") })
		h.capture(dir, "")
		var (
			stop   atomic.Bool
			done   = make(chan struct{})
			erofs  int
			others []error
			last   atomic.Int64
		)
		go func() {
			defer close(done)
			for v := int64(1); !stop.Load(); v++ {
				err := os.WriteFile(dir+"/f", []byte(fmt.Sprintf("v%d\n", v)), 0o644)
				switch {
				case err == nil:
					last.Store(v)
				case errors.Is(err, unix.EROFS):
					erofs++
				case h.legacy && errors.Is(err, unix.EPERM):
					// mount(2) without MOVE_MOUNT_BENEATH: between the
					// unmount and the mount, the immutable mountpoint.
					erofs++
				default:
					others = append(others, err)
				}
				time.Sleep(100 * time.Microsecond)
			}
		}()
		var ids []string
		for busy := 0; len(ids) < 30 && busy < 10000; {
			cp, err := h.store.Capture(context.Background(), dir, "")
			if fault.CodeOf(err) == "directory_busy" {
				busy++
				continue
			}
			if err != nil {
				stop.Store(true)
				<-done
				t.Fatal(err)
			}
			ids = append(ids, cp.ID)
		}
		stop.Store(true)
		<-done
		if len(others) > 0 {
			t.Fatalf("writes failed with other errors than EROFS: %v", others)
		}
		if len(ids) < 30 {
			t.Fatalf("only %d captures went through beside the writer", len(ids))
		}
		t.Logf("%d captures; %d writes failed in the window, last version written v%d", len(ids), erofs, last.Load())
		write(t, dir+"/after", "writable")
		prev := -1
		for i, id := range ids {
			h.restore(id)
			var v int
			if _, err := fmt.Sscanf(readString(t, dir+"/f"), "v%d\n", &v); err != nil {
				t.Fatalf("checkpoint %d holds a torn file: %q", i, readString(t, dir+"/f"))
			}
			if v < prev {
				t.Fatalf("checkpoint %d holds v%d, after a checkpoint with v%d", i, v, prev)
			}
			prev = v
		}
		h.assertNoOrphans()
	})
}

// TestLateMountCannotChangeASealedLayer: a bind mount of the directory
// made while a capture is under way (after its busy checks) cannot write
// into the layer the capture sealed: once the capture's background
// teardown has made the old stack's superblock read-only, a write
// through the late mount fails with EROFS, and the checkpoint keeps what
// it had.
func TestLateMountCannotChangeASealedLayer(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		dir := h.mkdir("project", func(d string) { write(t, d+"/f", "v1") })
		h.capture(dir, "")
		write(t, dir+"/f", "v2") // in the upper the capture seals: no copy-up needed to write it
		late := h.mkdir("late", nil)
		mounted := false
		h.store.cfg.StepHook = func(op, step string, d time.Duration, err error) {
			if op == "capture" && step == "prepare" && !mounted {
				mounted = true
				if err := unix.Mount(dir, late, "", unix.MS_BIND, ""); err != nil {
					t.Error(err)
				}
			}
		}
		cp := h.capture(dir, "")
		h.store.cfg.StepHook = nil
		defer unix.Unmount(late, unix.MNT_DETACH)
		if err := h.store.Settle(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(late+"/f", []byte("through the late mount"), 0o644); !errors.Is(err, unix.EROFS) {
			t.Fatalf("write through a mount of the old stack: %v, want EROFS", err)
		}
		write(t, dir+"/f", "v3")
		h.restore(cp.ID)
		if got := readString(t, dir+"/f"); got != "v2" {
			t.Fatalf("the checkpoint holds f=%q, want v2", got)
		}
	})
}
