package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"strata/internal/fault"
	"strata/sandbox"
)

// These tests run the Manager over fakeDriver (fake_test.go): every
// lifecycle path without QEMU. States are read through Records, as
// hostproxy reads them, and waited for with a deadline.

// TestCreate follows one sandbox from creating to running: the record
// says creating until guestd answers (a boot held back by the fake), the
// run directory belongs to the sandbox's uid, and Dial reaches guestd.
func TestCreate(t *testing.T) {
	h := newHarness(t)
	m := h.manager(nil)
	gate := make(chan struct{})
	h.drv.setPlan(plan{gate: gate})
	h.create(m, "sb-1")
	fm := waitMachine(t, h.drv, "sb-1")
	// The machine runs and the host has asked guestd: still creating.
	waitHealthAsked(t, fm)
	if r := h.get("sb-1"); r.State != sandbox.Creating || h.booted.Load() != 0 {
		t.Fatalf("before guestd answers: state %q, booted %d", r.State, h.booted.Load())
	}
	close(gate)
	r := h.waitState("sb-1", sandbox.Running)
	if r.Error != "" || r.Machine.Process == nil || *r.Machine.Process != fm.proc || r.Machine.Image != "k" {
		t.Errorf("running record %+v, machine %+v; want the process %+v and image k", r, r.Machine, fm.proc)
	}
	if h.booted.Load() != 1 {
		t.Errorf("Booted called %d times, want once", h.booted.Load())
	}
	checkHealth(t, m, "sb-1")
	// The sandbox's directory is root's and the sandbox's uid owns only
	// the run directory; its disk is a layer in the store, root's: QEMU
	// gets it as a descriptor.
	r, _ = h.recs.Get(context.Background(), "sb-1")
	if len(r.Machine.Disk) != 1 {
		t.Fatalf("disk chain %v, want one layer", r.Machine.Disk)
	}
	top := filepath.Join(h.dir, "store", r.Machine.Disk[0]+".qcow2")
	for _, c := range []struct {
		path string
		uid  uint32
		mode os.FileMode
	}{
		{filepath.Join(h.dir, "sb-1"), 0, 0o711 | os.ModeDir},
		{filepath.Join(h.dir, "store"), 0, 0o711 | os.ModeDir},
		{top, 0, 0o600},
		{filepath.Join(h.dir, "sb-1", "run"), r.Machine.Uid, 0o700 | os.ModeDir},
		// The sockets the host dials and the logs it writes: root's alone.
		{filepath.Join(h.dir, "sb-1", "ctl"), 0, 0o700 | os.ModeDir},
	} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != c.uid || st.Gid != c.uid || fi.Mode() != c.mode {
			t.Errorf("%s is %v owned by %d:%d, want %v owned by %d:%d", fi.Name(), fi.Mode(), st.Uid, st.Gid, c.mode, c.uid, c.uid)
		}
	}
	if len(fm.cfg.Disk) != 2 || fm.cfg.Disk[0].Path != top || fm.cfg.Disk[1].Path != h.image.Disk || fm.cfg.Uid != r.Machine.Uid || fm.cfg.MemoryMiB != 256 || fm.cfg.Ctl != filepath.Join(h.dir, "sb-1", "ctl") {
		t.Errorf("QEMU started with %+v", fm.cfg)
	}
}

// TestLifecycle runs each operation from a running sandbox and checks the
// states the record goes through, what the machine saw, and the answers.
func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		plan plan
		run  func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine)
	}{
		{name: "pause_resume", run: func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine) {
			r, err := m.Pause(ctx, "sb-1")
			if err != nil || r.State != sandbox.Pausing {
				t.Fatalf("Pause: %+v, %v; want pausing", r, err)
			}
			h.waitState("sb-1", sandbox.Paused)
			// The pause frees the host's memory: the guest's memory is
			// in the store and its QEMU has exited.
			if how := waitExit(t, fm); how != "quit" {
				t.Errorf("paused machine %s; want it to quit once its memory is saved", how)
			}
			paused := h.get("sb-1")
			if paused.Machine.Saved == "" || paused.Machine.Process != nil {
				t.Fatalf("paused record %+v: want a saved state and no process", paused.Machine)
			}
			saved := filepath.Join(h.dir, "store", paused.Machine.Saved+".state")
			if _, err := os.Stat(saved); err != nil {
				t.Fatal(err)
			}
			// Already paused: answered as it is, nothing done.
			if r, err := m.Pause(ctx, "sb-1"); err != nil || r.State != sandbox.Paused {
				t.Fatalf("second Pause: %+v, %v; want paused", r, err)
			}
			r, err = m.Resume(ctx, "sb-1")
			if err != nil || r.State != sandbox.Resuming {
				t.Fatalf("Resume: %+v, %v; want resuming", r, err)
			}
			h.waitState("sb-1", sandbox.Running)
			back := h.drv.last("sb-1")
			if back == fm || back.loaded.Load() != "sb-1" {
				t.Fatalf("resumed without loading the saved memory into a new machine")
			}
			if running, _ := back.Running(ctx); !running {
				t.Error("resumed, but the machine's CPUs do not run")
			}
			if r := h.get("sb-1"); r.Machine.Saved != "" {
				t.Errorf("running record still names a state to load: %+v", r.Machine)
			}
			// The store is collected in the background once the state is
			// loaded.
			for deadline := time.Now().Add(waitFor); ; time.Sleep(5 * time.Millisecond) {
				_, err := os.Stat(saved)
				if errors.Is(err, os.ErrNotExist) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the loaded state is still in the store: %v", err)
				}
			}
			if r, err := m.Resume(ctx, "sb-1"); err != nil || r.State != sandbox.Running {
				t.Fatalf("second Resume: %+v, %v; want running", r, err)
			}
			checkHealth(t, m, "sb-1")
		}},
		{name: "pause_or_resume_stopped", run: func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine) {
			if _, err := m.Stop(ctx, "sb-1"); err != nil {
				t.Fatal(err)
			}
			_, err := m.Pause(ctx, "sb-1")
			wantFault(t, "Pause", err, "sandbox_not_running", sandbox.Stopped)
			_, err = m.Resume(ctx, "sb-1")
			wantFault(t, "Resume", err, "sandbox_not_running", sandbox.Stopped)
			if r := h.get("sb-1"); r.State != sandbox.Stopped {
				t.Errorf("state %q after refused operations, want stopped", r.State)
			}
		}},
		{name: "stop_clean", run: func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine) {
			r, err := m.Stop(ctx, "sb-1")
			if err != nil || r.State != sandbox.Stopped || r.Machine.Process != nil {
				t.Fatalf("Stop: %+v, %v; want stopped without a process", r, err)
			}
			if how := waitExit(t, fm); how != "powered off" || fm.shutdowns.Load() != 1 {
				t.Errorf("machine %s after %d shutdown requests; want a clean power-off", how, fm.shutdowns.Load())
			}
			if _, err := m.Dial(ctx, "sb-1"); err == nil {
				t.Error("Dial reached a stopped sandbox")
			}
			// Stopping a stopped sandbox does nothing.
			if r, err := m.Stop(ctx, "sb-1"); err != nil || r.State != sandbox.Stopped {
				t.Fatalf("second Stop: %+v, %v", r, err)
			}
		}},
		// A paused sandbox has no QEMU: stopping it drops its saved
		// memory, and the next start is a cold boot.
		{name: "stop_paused", run: func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine) {
			if _, err := m.Pause(ctx, "sb-1"); err != nil {
				t.Fatal(err)
			}
			h.waitState("sb-1", sandbox.Paused)
			saved := filepath.Join(h.dir, "store", h.get("sb-1").Machine.Saved+".state")
			r, err := m.Stop(ctx, "sb-1")
			if err != nil || r.State != sandbox.Stopped || r.Machine.Saved != "" {
				t.Fatalf("Stop: %+v, %v; want stopped with no saved memory", r, err)
			}
			if _, err := os.Stat(saved); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the dropped state is still in the store: %v", err)
			}
			if _, err := m.Start(ctx, "sb-1"); err != nil {
				t.Fatal(err)
			}
			h.waitState("sb-1", sandbox.Running)
			if h.drv.last("sb-1").cfg.Incoming {
				t.Error("a start after a stop loaded memory")
			}
		}},
		// Regression: the shutdown request to a guest that never
		// answered was not ended at StopTimeout (closing a yamux stream
		// does not end a Read waiting on it), so Stop took yamux's
		// 5-minute stream close timeout instead of StopTimeout.
		{name: "stop_killed_after_timeout", plan: plan{stuckShutdown: true}, run: func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine) {
			r, took, err := stopWithin(t, m, "sb-1")
			if err != nil || r.State != sandbox.Stopped {
				t.Fatalf("Stop: %+v, %v", r, err)
			}
			if how := waitExit(t, fm); how != "killed" || fm.shutdowns.Load() != 1 {
				t.Errorf("machine %s after %d shutdown requests; want asked, then killed", how, fm.shutdowns.Load())
			}
			if took < stopTimeout {
				t.Errorf("killed after %v, before StopTimeout (%v)", took, stopTimeout)
			}
		}},
		{name: "start_from_stopped", run: func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine) {
			if _, err := m.Stop(ctx, "sb-1"); err != nil {
				t.Fatal(err)
			}
			r, err := m.Start(ctx, "sb-1")
			if err != nil || r.State != sandbox.Creating {
				t.Fatalf("Start: %+v, %v; want creating", r, err)
			}
			r = h.waitState("sb-1", sandbox.Running)
			if n := h.drv.starts("sb-1"); n != 2 || r.Machine.Process == nil || *r.Machine.Process != h.drv.last("sb-1").proc {
				t.Errorf("%d machines started, record's process %+v; want a second boot recorded", n, r.Machine.Process)
			}
			checkHealth(t, m, "sb-1")
		}},
		{name: "start_running_unchanged", run: func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine) {
			before := h.get("sb-1")
			r, err := m.Start(ctx, "sb-1")
			if err != nil || r.State != sandbox.Running || *r.Machine.Process != *before.Machine.Process {
				t.Fatalf("Start: %+v, %v; want the running record unchanged", r, err)
			}
			if n := h.drv.starts("sb-1"); n != 1 || fm.exited() {
				t.Errorf("%d machines started (first exited: %v); want the first untouched", n, fm.exited())
			}
		}},
		{name: "unexpected_exit_then_start", run: func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine) {
			fm.Kill() // from outside: nobody asked the Manager
			r := h.waitState("sb-1", sandbox.Error)
			if !strings.Contains(r.Error, "stopped unexpectedly") || r.Machine.Process != nil {
				t.Errorf("error record %q, process %+v; want a sentence and no process", r.Error, r.Machine.Process)
			}
			if _, err := m.Dial(ctx, "sb-1"); err == nil {
				t.Error("Dial reached a sandbox whose machine exited")
			}
			if r, err := m.Start(ctx, "sb-1"); err != nil || r.State != sandbox.Creating || r.Error != "" {
				t.Fatalf("Start: %+v, %v; want creating without the error", r, err)
			}
			h.waitState("sb-1", sandbox.Running)
			checkHealth(t, m, "sb-1")
		}},
		{name: "delete_running", run: func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine) {
			if err := m.Delete(ctx, "sb-1"); err != nil {
				t.Fatal(err)
			}
			checkDeleted(t, h, "sb-1")
			if !fm.exited() {
				t.Error("deleted, but its machine runs")
			}
			wantFault(t, "second Delete", m.Delete(ctx, "sb-1"), "sandbox_not_found", "")
		}},
		{name: "delete_stopped", run: func(t *testing.T, h *harness, m *sandbox.Manager, fm *fakeMachine) {
			if _, err := m.Stop(ctx, "sb-1"); err != nil {
				t.Fatal(err)
			}
			if err := m.Delete(ctx, "sb-1"); err != nil {
				t.Fatal(err)
			}
			checkDeleted(t, h, "sb-1")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			m := h.manager(nil)
			h.drv.setPlan(tc.plan)
			h.running(m, "sb-1")
			checkHealth(t, m, "sb-1")
			tc.run(t, h, m, h.drv.last("sb-1"))
		})
	}
}

// TestBootThatNeverAnswers: a guest that never answers puts its sandbox in
// error after BootTimeout, with a sentence, and its machine is killed; a
// start boots it again.
//
// Regression: the health request of the boot was not ended at its
// deadline (closing a yamux stream does not end a Read waiting on it),
// so such a boot outlived BootTimeout by yamux's 5-minute stream close
// timeout, holding the sandbox in creating and every other operation on
// it refused.
func TestBootThatNeverAnswers(t *testing.T) {
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.BootTimeout = 300 * time.Millisecond })
	h.drv.setPlan(plan{hang: true})
	t0 := time.Now()
	h.create(m, "sb-1")
	r := h.waitState("sb-1", sandbox.Error)
	if took := time.Since(t0); took < 300*time.Millisecond {
		t.Errorf("gave up after %v, before BootTimeout", took)
	}
	if !strings.Contains(r.Error, "did not boot") || r.Machine.Process != nil {
		t.Errorf("error %q, process %+v; want a sentence and no process", r.Error, r.Machine.Process)
	}
	if how := waitExit(t, h.drv.last("sb-1")); how != "killed" {
		t.Errorf("the machine that never booted %s; want killed", how)
	}
	if h.booted.Load() != 0 {
		t.Error("Booted called for a guest that never answered")
	}
	h.drv.setPlan(plan{})
	if _, err := m.Start(context.Background(), "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Running)
	checkHealth(t, m, "sb-1")
}

// TestOneOperationAtATime: while a lifecycle operation is under way on a
// sandbox (a boot held back, a stop waiting for a stuck guest), every
// other one is refused with operation_in_progress and changes nothing;
// but a delete cancels a boot (TestDeleteDuringABoot).
func TestOneOperationAtATime(t *testing.T) {
	ctx := context.Background()
	ops := []struct {
		name string
		do   func(m *sandbox.Manager) error
	}{
		{"pause", func(m *sandbox.Manager) error { _, err := m.Pause(ctx, "sb-1"); return err }},
		{"resume", func(m *sandbox.Manager) error { _, err := m.Resume(ctx, "sb-1"); return err }},
		{"stop", func(m *sandbox.Manager) error { _, err := m.Stop(ctx, "sb-1"); return err }},
		{"start", func(m *sandbox.Manager) error { _, err := m.Start(ctx, "sb-1"); return err }},
		{"delete", func(m *sandbox.Manager) error { return m.Delete(ctx, "sb-1") }},
	}
	t.Run("while_booting", func(t *testing.T) {
		h := newHarness(t)
		m := h.manager(nil)
		gate := make(chan struct{})
		h.drv.setPlan(plan{gate: gate})
		h.create(m, "sb-1")
		for _, op := range ops {
			if op.name == "delete" {
				continue
			}
			wantFault(t, op.name, op.do(m), "operation_in_progress", "")
		}
		if r := h.get("sb-1"); r.State != sandbox.Creating {
			t.Errorf("state %q, want still creating", r.State)
		}
		close(gate)
		h.waitState("sb-1", sandbox.Running)
		if n := h.drv.starts("sb-1"); n != 1 {
			t.Errorf("%d machines started, want 1", n)
		}
	})
	t.Run("while_stopping", func(t *testing.T) {
		h := newHarness(t)
		m := h.manager(func(c *sandbox.Config) { c.StopTimeout = 2 * time.Second })
		h.drv.setPlan(plan{stuckShutdown: true})
		h.running(m, "sb-1")
		fm := h.drv.last("sb-1")
		stopped := make(chan error, 1)
		go func() { _, err := m.Stop(ctx, "sb-1"); stopped <- err }()
		h.waitState("sb-1", sandbox.Stopping)
		for _, op := range ops {
			wantFault(t, op.name, op.do(m), "operation_in_progress", "")
		}
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
		h.waitState("sb-1", sandbox.Stopped)
		if fm.howExited() != "killed" {
			t.Errorf("machine %q, want killed after StopTimeout", fm.howExited())
		}
	})
}

// TestHostCapacity: a create or a start that would leave the host less
// than ReserveMiB (512 by default) beyond the sandbox's memory is refused
// with host_capacity, and records nothing.
func TestHostCapacity(t *testing.T) {
	cases := []struct {
		name      string
		available int
		memory    int
		code      string
	}{
		{"fits_exactly", 1024, 512, ""},
		{"one_mib_short", 1023, 512, "host_capacity"},
		{"no_memory", 0, 128, "host_capacity"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			m := h.manager(nil)
			h.mem.Store(int64(tc.available))
			r := record("sb-1")
			r.MemoryMiB = tc.memory
			_, err := m.Create(context.Background(), r)
			if tc.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				h.waitState("sb-1", sandbox.Running)
				return
			}
			wantFault(t, "Create", err, tc.code, "")
			if _, err := h.recs.Get(context.Background(), "sb-1"); fault.CodeOf(err) != "sandbox_not_found" {
				t.Errorf("a refused create was recorded: %v", err)
			}
			if h.drv.starts("sb-1") != 0 {
				t.Error("a refused create started a machine")
			}
		})
	}
	t.Run("start", func(t *testing.T) {
		h := newHarness(t)
		m := h.manager(nil)
		h.running(m, "sb-1")
		if _, err := m.Stop(context.Background(), "sb-1"); err != nil {
			t.Fatal(err)
		}
		h.mem.Store(600)
		_, err := m.Start(context.Background(), "sb-1")
		wantFault(t, "Start", err, "host_capacity", "")
		if r := h.get("sb-1"); r.State != sandbox.Stopped {
			t.Errorf("state %q after a refused start, want stopped", r.State)
		}
	})
}

// TestBootsUnderWayReserveMemory: the host's available memory does not yet
// show a guest that is still booting, so two creates at once must not both
// count on the same free memory: the second is refused while the first
// boots, and fits once it has booted and its reservation is gone.
func TestBootsUnderWayReserveMemory(t *testing.T) {
	h := newHarness(t)
	m := h.manager(nil)
	h.mem.Store(1500) // one 700 MiB guest and the 512 MiB reserve fit, not two
	gate := make(chan struct{})
	h.drv.setPlan(plan{gate: gate})
	a := record("sb-a")
	a.MemoryMiB = 700
	if _, err := m.Create(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	b := record("sb-b")
	b.MemoryMiB = 700
	_, err := m.Create(context.Background(), b)
	wantFault(t, "Create beside a boot under way", err, "host_capacity", "")
	close(gate)
	h.waitState("sb-a", sandbox.Running)
	h.drv.setPlan(plan{})
	if _, err := m.Create(context.Background(), b); err != nil {
		t.Fatalf("Create once the first boot is done: %v", err)
	}
	h.waitState("sb-b", sandbox.Running)
}

// TestConcurrentCreatesGetTheirOwnUIDs: creates at once each get a uid
// of their own.
//
// Regression: Create chose the lowest uid no record held, then inserted
// its record; two creates between those steps ran their QEMUs as one
// uid, each able to open the other's disk.
func TestConcurrentCreatesGetTheirOwnUIDs(t *testing.T) {
	h := newHarness(t)
	m := h.manager(nil)
	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, n)
	ready := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ready
			_, err := m.Create(context.Background(), record(fmt.Sprintf("sb-%d", i)))
			errs <- err
		}()
	}
	close(ready)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	uids := map[uint32]string{}
	for i := range n {
		id := fmt.Sprintf("sb-%d", i)
		r := h.waitState(id, sandbox.Running)
		if other, ok := uids[r.Machine.Uid]; ok {
			t.Errorf("%s and %s both run as uid %d", id, other, r.Machine.Uid)
		}
		uids[r.Machine.Uid] = id
	}
}

// TestNextOperationOnceStateIsFinal: as soon as the record shows an
// operation's final state, the next operation is accepted. Clients wait
// for a state (X-Poll-After) and then act.
//
// Regression: an operation in the background wrote its final state and
// only then released its mark, so a client quick enough to act on the
// state was refused with operation_in_progress.
func TestNextOperationOnceStateIsFinal(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m := h.manager(nil)
	h.running(m, "sb-1")
	// spin reads the record without pause until it is in state s.
	spin := func(s sandbox.State) {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for h.get("sb-1").State != s {
			if time.Now().After(deadline) {
				t.Fatalf("state %q after %v, want %q", h.get("sb-1").State, waitFor, s)
			}
		}
	}
	for i := 0; i < 40; i++ {
		if _, err := m.Pause(ctx, "sb-1"); err != nil {
			t.Fatalf("round %d: Pause right after running: %v", i, err)
		}
		spin(sandbox.Paused)
		if _, err := m.Resume(ctx, "sb-1"); err != nil {
			t.Fatalf("round %d: Resume right after paused: %v", i, err)
		}
		spin(sandbox.Running)
	}
	if _, err := m.Stop(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	spin(sandbox.Running)
	if _, err := m.Stop(ctx, "sb-1"); err != nil {
		t.Fatalf("Stop right after a boot: %v", err)
	}
}

// TestNotAMachine: a sandbox whose guest runs elsewhere (no Machine in its
// record) and an unknown one are refused by every lifecycle operation.
func TestNotAMachine(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m := h.manager(nil)
	if err := h.recs.Insert(ctx, sandbox.Record{ID: "sb-configured", Account: "acct", Guest: "unix:///run/guest.sock", State: sandbox.Running}); err != nil {
		t.Fatal(err)
	}
	ops := []struct {
		name string
		do   func(id string) error
	}{
		{"pause", func(id string) error { _, err := m.Pause(ctx, id); return err }},
		{"resume", func(id string) error { _, err := m.Resume(ctx, id); return err }},
		{"stop", func(id string) error { _, err := m.Stop(ctx, id); return err }},
		{"start", func(id string) error { _, err := m.Start(ctx, id); return err }},
		{"delete", func(id string) error { return m.Delete(ctx, id) }},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			wantFault(t, op.name, op.do("sb-configured"), "sandbox_not_a_vm", "")
			wantFault(t, op.name, op.do("sb-nope"), "sandbox_not_found", "")
		})
	}
	if r := h.get("sb-configured"); r.State != sandbox.Running || r.Machine != nil {
		t.Errorf("record changed: %+v", r)
	}
	if _, err := m.Dial(ctx, "sb-configured"); err == nil {
		t.Error("Dial reached a sandbox that has no machine here")
	}
}

// TestDeleteDuringABoot: a delete does not wait for a boot that may hang
// until BootTimeout, nor answer operation_in_progress: it cancels the
// boot, and the machine and the sandbox are gone.
func TestDeleteDuringABoot(t *testing.T) {
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.BootTimeout = time.Hour })
	gate := make(chan struct{})
	defer close(gate)
	h.drv.setPlan(plan{gate: gate})
	h.create(m, "sb-1")
	fm := waitMachine(t, h.drv, "sb-1")
	waitHealthAsked(t, fm)
	t0 := time.Now()
	if err := m.Delete(context.Background(), "sb-1"); err != nil {
		t.Fatalf("Delete during a boot: %v", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("Delete took %v", d)
	}
	waitExit(t, fm)
	checkDeleted(t, h, "sb-1")
}

// TestDeploymentsGetDisjointIDs: two deployments on one host (two
// Managers on two directories, one claims file) get disjoint ranges of
// uids and template groups, and their sandboxes' QEMUs and forks' groups
// come from their own; a deployment configured on a range another holds
// refuses to start and names the holder; a second Manager on the same
// directory refuses; and a deployment whose directory is gone gives its
// range back.
//
// Regression: both counted from 200000 (uids) and 300000 (groups): the
// second deployment's QEMUs could open the first's sockets and template
// RAM.
func TestDeploymentsGetDisjointIDs(t *testing.T) {
	ctx := context.Background()
	h1, h2 := newHarness(t), newHarness(t)
	h2.claims = h1.claims
	auto := func(c *sandbox.Config) { c.UIDBase, c.QEMUVersion = 0, qemuVersion }
	m1, m2 := h1.manager(auto), h2.manager(auto)
	r1, r2 := m1.IDs(), m2.IDs()
	if r1.Base != sandbox.DefaultUIDBase || r2.Base < r1.Base+r1.Size && r1.Base < r2.Base+r2.Size {
		t.Fatalf("ranges %+v and %+v: want the first at %d and disjoint", r1, r2, sandbox.DefaultUIDBase)
	}
	inRange := func(id uint32, first, end uint32) bool { return id >= first && id < end }
	for _, d := range []struct {
		h *harness
		m *sandbox.Manager
		r sandbox.IDRange
	}{{h1, m1, r1}, {h2, m2, r2}} {
		if _, err := d.m.Create(ctx, record("sb-1")); err != nil {
			t.Fatal(err)
		}
		d.h.waitState("sb-1", sandbox.Running)
		takeSnapshot(t, d.m, "sb-1", sandbox.SnapshotRequest{Memory: true})
		if _, err := d.m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-2", Account: "acct"}); err != nil {
			t.Fatal(err)
		}
		fork := d.h.waitState("sb-2", sandbox.Running)
		uf, ue := d.r.UIDs()
		gf, ge := d.r.GIDs()
		for _, id := range []string{"sb-1", "sb-2"} {
			if mach := d.h.get(id).Machine; !inRange(mach.Uid, uf, ue) || mach.Gid != mach.Uid {
				t.Errorf("%s of %s: uid %d gid %d, want in %d-%d", id, d.h.dir, mach.Uid, mach.Gid, uf, ue-1)
			}
		}
		if !inRange(fork.Machine.RAMGid, gf, ge) {
			t.Errorf("fork of %s: template group %d, want in %d-%d", d.h.dir, fork.Machine.RAMGid, gf, ge-1)
		}
	}
	h3 := newHarness(t)
	h3.claims = h1.claims
	_, err := h3.newManager(func(c *sandbox.Config) { c.UIDBase = r1.Base })
	if err == nil || !strings.Contains(err.Error(), h1.dir) {
		t.Errorf("a third deployment on %d: %v, want a refusal naming %s", r1.Base, err, h1.dir)
	}
	_, err = h1.newManager(nil)
	if err == nil || !strings.Contains(err.Error(), "another hostproxy") {
		t.Errorf("a second Manager on %s: %v, want refused", h1.dir, err)
	}
	m1.Close()
	if err := os.RemoveAll(h1.dir); err != nil {
		t.Fatal(err)
	}
	m3, err := h3.newManager(func(c *sandbox.Config) { c.UIDBase = r1.Base })
	if err != nil {
		t.Fatalf("a deployment on the range of one whose directory is gone: %v", err)
	}
	if m3.IDs() != r1 {
		t.Errorf("range %+v, want %+v", m3.IDs(), r1)
	}
}
