package sandbox_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"strata/sandbox"
	"strata/vmm"
)

// TestRecover plays a hostproxy restart: a first Manager leaves sandboxes
// in every state a crash can leave them, a second one on the same records
// and directory settles each.
func TestRecover(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m1 := h.manager(nil)
	for _, id := range []string{"sb-run", "sb-paused", "sb-gone", "sb-stopping", "sb-destroying"} {
		h.running(m1, id)
	}
	if _, err := m1.Pause(ctx, "sb-paused"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-paused", sandbox.Paused)
	m1.Close()

	// What the crash left: machines gone under two records, a delete and
	// a stop half done, a create recorded but never started.
	h.drv.last("sb-gone").Kill()
	h.drv.last("sb-stopping").Kill()
	setState(t, h, "sb-stopping", sandbox.Stopping)
	setState(t, h, "sb-destroying", sandbox.Destroying)
	creating := record("sb-creating")
	creating.State = sandbox.Creating
	creating.Machine = &sandbox.Machine{Uid: uidBase + 50, Gid: uidBase + 50, BaseDisk: h.image.Disk, Image: h.image.Key}
	if err := h.recs.Insert(ctx, creating); err != nil {
		t.Fatal(err)
	}
	adopted := h.drv.last("sb-run")

	m2 := h.manager(nil)
	if err := m2.Recover(ctx); err != nil {
		t.Fatalf("Recover: %v", err)
	}

	t.Run("running_adopted", func(t *testing.T) {
		r := h.get("sb-run")
		if r.State != sandbox.Running || *r.Machine.Process != adopted.proc || adopted.exited() || h.drv.starts("sb-run") != 1 {
			t.Errorf("record %+v (process %+v), machine exited %v, %d starts; want the same machine running", r, r.Machine.Process, adopted.exited(), h.drv.starts("sb-run"))
		}
		checkHealth(t, m2, "sb-run")
	})
	t.Run("paused_adopted", func(t *testing.T) {
		if r := h.get("sb-paused"); r.State != sandbox.Paused {
			t.Errorf("state %q, want paused", r.State)
		}
		if _, err := m2.Resume(ctx, "sb-paused"); err != nil {
			t.Fatal(err)
		}
		h.waitState("sb-paused", sandbox.Running)
		checkHealth(t, m2, "sb-paused")
	})
	t.Run("gone_is_error", func(t *testing.T) {
		r := h.get("sb-gone")
		if r.State != sandbox.Error || !strings.Contains(r.Error, "while the host service was down") || r.Machine.Process != nil {
			t.Errorf("record %+v; want error with a sentence, no process", r)
		}
	})
	t.Run("stopping_is_stopped", func(t *testing.T) {
		if r := h.get("sb-stopping"); r.State != sandbox.Stopped || r.Error != "" || r.Machine.Process != nil {
			t.Errorf("record %+v; want stopped", r)
		}
	})
	t.Run("destroying_finished", func(t *testing.T) {
		checkDeleted(t, h, "sb-destroying")
		if !h.drv.last("sb-destroying").exited() {
			t.Error("its machine still runs")
		}
	})
	t.Run("creating_booted", func(t *testing.T) {
		h.waitState("sb-creating", sandbox.Running)
		if n := h.drv.starts("sb-creating"); n != 1 {
			t.Errorf("%d machines started, want 1", n)
		}
		checkHealth(t, m2, "sb-creating")
	})
	t.Run("lifecycle_after_adoption", func(t *testing.T) {
		// The adopted machine is watched: a stop is clean, an exit is seen.
		if _, err := m2.Stop(ctx, "sb-run"); err != nil {
			t.Fatal(err)
		}
		if how := waitExit(t, adopted); how != "powered off" {
			t.Errorf("adopted machine %s on stop; want powered off", how)
		}
		h.drv.last("sb-creating").Kill()
		h.waitState("sb-creating", sandbox.Error)
	})
}

// TestCloseDuringBoot: closing the Manager (a hostproxy restart) while a
// sandbox boots leaves its machine running and its record creating; the
// next Manager adopts the machine and finishes the boot, and so on across
// a restart during that Manager's own wait.
//
// Regression: Close cancelled the boot's wait on guestd, which was taken
// for a failed boot: the machine was killed and the sandbox put in error.
func TestCloseDuringBoot(t *testing.T) {
	h := newHarness(t)
	m1 := h.manager(nil)
	gate := make(chan struct{})
	h.drv.setPlan(plan{gate: gate})
	h.create(m1, "sb-1")
	fm := waitMachine(t, h.drv, "sb-1")
	waitHealthAsked(t, fm)
	m1.Close()
	if r := h.get("sb-1"); r.State != sandbox.Creating || r.Machine.Process == nil || fm.exited() {
		t.Fatalf("after Close: record %+v (process %v), machine %q; want creating, its machine running", r, r.Machine.Process, fm.howExited())
	}
	m2 := h.manager(nil)
	if err := m2.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Recover waits on guestd again; close that Manager too.
	m2.Close()
	if r := h.get("sb-1"); r.State != sandbox.Creating || r.Machine.Process == nil || fm.exited() {
		t.Fatalf("after a second Close: record %+v (process %v), machine %q; want creating, its machine running", r, r.Machine.Process, fm.howExited())
	}
	m3 := h.manager(nil)
	if err := m3.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(gate)
	h.waitState("sb-1", sandbox.Running)
	if n := h.drv.starts("sb-1"); n != 1 {
		t.Errorf("%d machines started, want the first adopted", n)
	}
	checkHealth(t, m3, "sb-1")
}

// TestRecoverFailsUnfinishedSnapshot plays a crash in the middle of a
// memory snapshot: the record names the snapshot (processing, its state
// half-written) and the sandbox's new top, and the guest is stopped for
// the switch-over. The next Manager adopts the machine, lets the guest
// run again, marks the snapshot failed with no files, and collects its
// half-written state; a snapshot of a sandbox whose machine is gone is
// failed the same way. The new top is kept; once the failed snapshot no
// longer names the frozen top, compaction merges that layer into it.
//
// Regression: the test read the record while the compaction Recover
// starts could still shorten the chain, and failed now and then.
func TestRecoverFailsUnfinishedSnapshot(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		crash func(t *testing.T, h *harness, fm *fakeMachine) // what else the crash left
		state sandbox.State
	}{
		{name: "guest_stopped_for_the_switch", state: sandbox.Running, crash: func(t *testing.T, h *harness, fm *fakeMachine) {
			fm.Pause(ctx)
		}},
		{name: "guest_running", state: sandbox.Running},
		{name: "machine_gone", state: sandbox.Error, crash: func(t *testing.T, h *harness, fm *fakeMachine) {
			fm.Kill()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, m1 := snapshotHarness(t)
			takeSnapshot(t, m1, "sb-1", sandbox.SnapshotRequest{Memory: true})
			m1.Close()
			fm := h.drv.last("sb-1")

			// What the snapshot had done when the host service died: a
			// new top over the frozen disk, the snapshot recorded
			// (processing), half its state written.
			frozen := h.get("sb-1").Machine.Disk
			top, state := "00000000000000a1", "00000000000000b2"
			qemuImg(t, "create", "-q", "-f", "qcow2", "-u", "-b", h.layerPath(frozen[0]), "-F", "qcow2", h.layerPath(top), "64M")
			if err := os.WriteFile(h.statePath(state), []byte(`{"machine":"sb-`), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := h.recs.Update(ctx, "sb-1", func(r *sandbox.Record) error {
				r.SnapshotSeq++
				r.Snapshots = append(r.Snapshots, sandbox.Snapshot{
					ID: "v2", Memory: true, Status: sandbox.SnapshotProcessing, CreatedAt: time.Now().UTC(),
					Disk: frozen, BaseDisk: r.Machine.BaseDisk, State: state,
					Needs:     &sandbox.Needs{QEMU: qemuVersion, DeviceSet: vmm.DeviceSet, Accel: vmm.TCG, Image: h.image.Key},
					MemoryMiB: r.MemoryMiB, VCPUs: r.VCPUs, DiskGiB: r.DiskGiB,
				})
				r.Machine.Disk = append([]string{top}, frozen...)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if tc.crash != nil {
				tc.crash(t, h, fm)
			}

			m2 := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
			if err := m2.Recover(ctx); err != nil {
				t.Fatalf("Recover: %v", err)
			}
			m2.Compacted()
			r := h.get("sb-1")
			v2, _ := r.Snapshot("v2")
			if v2.Status != sandbox.SnapshotFailed || v2.State != "" || v2.Disk != nil || v2.SizeBytes != 0 {
				t.Errorf("interrupted snapshot %+v; want failed, naming no files", v2)
			}
			if exists(h.statePath(state)) {
				t.Error("the half-written state is still in the store")
			}
			v1, _ := r.Snapshot("v1")
			if v1.Status != sandbox.SnapshotReady || !exists(h.statePath(v1.State)) {
				t.Errorf("the snapshot before it %+v lost its state", v1)
			}
			// frozen is [the top v2 froze, v1's disk...]: only v2 named
			// its top, which the compaction merges into the new one.
			if want := append([]string{top}, v1.Disk...); !slices.Equal(r.Machine.Disk, want) || !slices.Equal(frozen[1:], v1.Disk) || !exists(h.layerPath(top)) {
				t.Errorf("disk %v after Recover (frozen %v, v1's %v); want the new top %s kept over %v", r.Machine.Disk, frozen, v1.Disk, top, want)
			}
			if r.State != tc.state {
				t.Fatalf("state %q after Recover, want %q", r.State, tc.state)
			}
			checkStore(t, m2)
			if tc.state == sandbox.Running {
				running, _ := fm.Running(ctx)
				if h.drv.starts("sb-1") != 1 || fm.exited() || !running || *r.Machine.Process != fm.proc {
					t.Errorf("%d machines started, exited %v, CPUs running %v; want the first adopted and running", h.drv.starts("sb-1"), fm.exited(), running)
				}
				checkHealth(t, m2, "sb-1")
			}
			// The failed one is deleted as any other; the next is v3.
			if err := m2.DeleteSnapshot(ctx, "sb-1", "v2"); err != nil {
				t.Fatal(err)
			}
			if tc.state == sandbox.Running {
				if s := takeSnapshot(t, m2, "sb-1", sandbox.SnapshotRequest{Memory: true}); s.ID != "v3" {
					t.Errorf("next snapshot %s, want v3", s.ID)
				}
			}
			checkStore(t, m2)
		})
	}
}

// TestRecoverFailsTornSnapshots: a ready snapshot whose files were still
// being written back when the host went down (its mark is another boot's)
// is failed at the next start, and its files go; one marked with this
// boot (only the host service restarted) is written back and stays ready.
func TestRecoverFailsTornSnapshots(t *testing.T) {
	ctx := context.Background()
	h, m1 := snapshotHarness(t)
	takeSnapshot(t, m1, "sb-1", sandbox.SnapshotRequest{Memory: true})
	takeSnapshot(t, m1, "sb-1", sandbox.SnapshotRequest{Memory: true})
	m1.Close()
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	editSnapshot(t, h, "sb-1", "v1", func(s *sandbox.Snapshot) { s.Unsynced = "a-boot-before-a-power-cut" })
	editSnapshot(t, h, "sb-1", "v2", func(s *sandbox.Snapshot) { s.Unsynced = strings.TrimSpace(string(boot)) })
	m2 := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	m2.Synced()
	r := h.get("sb-1")
	v1, _ := r.Snapshot("v1")
	v2, _ := r.Snapshot("v2")
	if v1.Status != sandbox.SnapshotFailed || v1.State != "" || len(v1.Disk) != 0 {
		t.Errorf("torn v1 after Recover: %+v", v1)
	}
	if v2.Status != sandbox.SnapshotReady || v2.Unsynced != "" {
		t.Errorf("v2 after Recover: %+v; want ready and written back", v2)
	}
	if r.State != sandbox.Running {
		t.Errorf("sandbox %s after Recover", r.State)
	}
	checkStore(t, m2)
}

// TestGuestdRestartHeals pins issue 17's lost guest: after its guestd
// was killed and started again, the host's session stayed up with a dead
// peer, every call timed out and the record said running. The heartbeat
// now marks the sandbox unresponsive (with since), resets the channel,
// and once the new guestd answers resyncs it, hands it its credentials
// again and records it running; a guest whose CPUs are stopped is never
// called unresponsive.
func TestGuestdRestartHeals(t *testing.T) {
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) {
		c.Heartbeat, c.PingTimeout = 20*time.Millisecond, 150*time.Millisecond
	})
	h.running(m, "sb-1")
	fm := waitMachine(t, h.drv, "sb-1")
	for i := range 3 {
		booted, resyncs := h.booted.Load(), fm.resyncs.Load()
		_, writes := h.recs.wrote("sb-1", 0)
		go fm.killGuestd(h.drv.log, true)
		// Unresponsive may last only moments: the new guestd is up
		// 100 ms after the kill.
		r := h.waitWritten("sb-1", sandbox.Unresponsive, writes)
		if r.UnresponsiveSince.IsZero() {
			t.Fatalf("round %d: unresponsive without since", i)
		}
		h.waitState("sb-1", sandbox.Running)
		if h.get("sb-1").UnresponsiveSince != (time.Time{}) {
			t.Fatalf("round %d: running with unresponsive_since", i)
		}
		if h.booted.Load() <= booted || fm.resyncs.Load() <= resyncs {
			t.Fatalf("round %d: answering again without credentials (%d → %d) or a resync (%d → %d)", i, booted, h.booted.Load(), resyncs, fm.resyncs.Load())
		}
		checkHealth(t, m, "sb-1")
	}
	// Paused CPUs do not answer either, and are not unresponsive.
	fm.Pause(context.Background())
	time.Sleep(500 * time.Millisecond)
	if s := h.get("sb-1").State; s != sandbox.Running {
		t.Fatalf("a guest with stopped CPUs is %s", s)
	}
	fm.Resume(context.Background())
	if fm.exited() {
		t.Fatal("a healed machine exited")
	}
}

// TestUnresponsivePastItsLimit: a guest that never answers again is put
// in error with a sentence after UnresponsiveLimit, and its QEMU stopped.
func TestUnresponsivePastItsLimit(t *testing.T) {
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) {
		c.Heartbeat, c.PingTimeout, c.UnresponsiveLimit = 20*time.Millisecond, 150*time.Millisecond, time.Second
	})
	h.running(m, "sb-1")
	fm := waitMachine(t, h.drv, "sb-1")
	fm.killGuestd(h.drv.log, false)
	h.waitState("sb-1", sandbox.Unresponsive)
	r := h.waitState("sb-1", sandbox.Error)
	if !strings.Contains(r.Error, "stopped answering") || r.Machine.Process != nil {
		t.Fatalf("error %q, process %+v", r.Error, r.Machine.Process)
	}
	if how := waitExit(t, fm); how != "killed" {
		t.Fatalf("machine %s", how)
	}
	if _, err := m.Start(context.Background(), "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Running)
}
