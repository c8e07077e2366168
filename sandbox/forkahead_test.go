package sandbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"strata/internal/fault"
	"strata/sandbox"
)

// TestForksAhead: after a fork of a snapshot, a fork of it is made ahead
// (of no account, stopped once its guest answered); the next fork takes
// it (its id, running at once, the account's, its guest told its name
// and resynced again, its CPUs started) and another is made; a fork
// refused for its name leaves the fork made ahead to a later one;
// deleting the snapshot drops it; a create the host has room for only
// without the forks made ahead drops them and boots; a restart drops
// those left.
func TestForksAhead(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	var n atomic.Int32
	var total atomic.Int64
	total.Store(1 << 20)
	newID := func() (string, error) { return fmt.Sprintf("sb-ahead%d", n.Add(1)), nil }
	config := func(c *sandbox.Config) {
		c.QEMUVersion = qemuVersion
		c.ForksAhead, c.NewID = 1, newID
		c.ReserveMiB = 100
		c.MemTotal = func() (int, error) { return int(total.Load()), nil }
	}
	m := h.manager(config)
	h.running(m, "sb-1")
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})

	// The first fork boots; one is made ahead of it.
	if f, err := m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-f1", Account: "acct"}); err != nil || f.ID != "sb-f1" || f.State != sandbox.Creating {
		t.Fatalf("first Fork: %+v, %v; want sb-f1 creating", f, err)
	}
	h.waitState("sb-f1", sandbox.Running)
	a := waitStopped(t, h, "sb-ahead1")
	if want := (sandbox.From{Sandbox: "sb-1", Snapshot: "v1"}); a.Pooled || a.Account != "" || a.Ahead == nil || *a.Ahead != want || a.From == nil || *a.From != want {
		t.Fatalf("fork made ahead: %+v", a)
	}
	if fm := h.drv.last("sb-ahead1"); fm.loaded.Load() != "sb-1" || fm.resyncs.Load() != 1 {
		t.Errorf("fork made ahead loaded %v, %d resyncs; want sb-1's memory, resynced once", fm.loaded.Load(), fm.resyncs.Load())
	}
	if n := m.ForksAheadReady(); n != 1 {
		t.Errorf("ForksAheadReady %d, want 1", n)
	}
	// A create never takes it, whatever its shape.
	if p, err := m.PoolReady(ctx); err != nil || p != 0 {
		t.Errorf("PoolReady %d, %v: a fork made ahead counts as pooled", p, err)
	}

	// The next fork takes it.
	r := sandbox.Record{ID: "sb-f2", Account: "acct", Name: "second", CreatedAt: time.Now().UTC().Truncate(time.Second)}
	got, err := m.Fork(ctx, "sb-1", "v1", r)
	if err != nil {
		t.Fatalf("second Fork: %v", err)
	}
	if got.ID != "sb-ahead1" || got.State != sandbox.Running || got.Pooled || got.Ahead != nil || got.Account != "acct" || got.Name != "second" || !got.CreatedAt.Equal(r.CreatedAt) {
		t.Fatalf("second Fork answered %+v; want sb-ahead1 running, the account's, named second", got)
	}
	if rec := h.get("sb-ahead1"); rec.Pooled || rec.Ahead != nil || rec.Account != "acct" || rec.From == nil || rec.From.Snapshot != "v1" {
		t.Fatalf("the taken fork's record: %+v", rec)
	}
	if _, err := h.recs.Get(ctx, "sb-f2"); err == nil {
		t.Error("the id the fork would have given was recorded too")
	}
	fm := h.drv.last("sb-ahead1")
	if name, _ := fm.hostname.Load().(string); name != "second" || fm.resyncs.Load() != 2 || fm.paused.Load() {
		t.Errorf("the taken guest: hostname %q, %d resyncs, CPUs stopped %v; want second, resynced again, running", name, fm.resyncs.Load(), fm.paused.Load())
	}
	if h.drv.starts("sb-ahead1") != 1 {
		t.Errorf("the taken fork started %d QEMUs, want 1", h.drv.starts("sb-ahead1"))
	}
	checkHealth(t, m, "sb-ahead1")

	// Made again; a fork refused for its name leaves it to the next.
	waitStopped(t, h, "sb-ahead2")
	dup := sandbox.Record{ID: "sb-f3", Account: "acct", Name: "second"}
	if f, err := m.Fork(ctx, "sb-1", "v1", dup); err == nil {
		t.Fatalf("Fork with a name the account has: %+v", f)
	}
	if p := waitStopped(t, h, "sb-ahead2"); p.Account != "" || p.Ahead == nil {
		t.Fatalf("after a refused take: %+v", p)
	}
	if fm := h.drv.last("sb-ahead2"); fm.resyncs.Load() != 2 {
		t.Errorf("the fork made ahead was resynced %d times; want 2 (its boot, the refused take)", fm.resyncs.Load())
	}

	// Its snapshot deleted: dropped; the taken fork runs on.
	if err := m.DeleteSnapshot(ctx, "sb-1", "v1"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, h, "sb-ahead2")
	if n := m.ForksAheadReady(); n != 0 {
		t.Errorf("ForksAheadReady %d once the only one is dropped, want 0", n)
	}
	if r := h.get("sb-ahead1"); r.State != sandbox.Running {
		t.Errorf("the taken fork is %s once its snapshot is deleted", r.State)
	}
	checkStore(t, m)

	// A create the host has room for only without the fork made ahead.
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	if _, err := m.Fork(ctx, "sb-1", "v2", sandbox.Record{ID: "sb-f4", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-f4", sandbox.Running)
	waitStopped(t, h, "sb-ahead3")
	// sb-1, sb-f1, sb-ahead1, sb-f4 and sb-ahead3 run, 256 MiB each and 64
	// for each QEMU: one more fits only without sb-ahead3.
	total.Store(100 + 5*(256+64) + 64)
	if _, err := m.Create(ctx, record("sb-2")); err != nil {
		t.Fatalf("Create with the host's room held by a fork made ahead: %v", err)
	}
	waitGone(t, h, "sb-ahead3")
	h.waitState("sb-2", sandbox.Running)
	// None is made again while the host needed the room (aheadHold),
	// though v2 is forked again.
	total.Store(1 << 20)
	if _, err := m.Fork(ctx, "sb-1", "v2", sandbox.Record{ID: "sb-f5", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-f5", sandbox.Running)
	time.Sleep(300 * time.Millisecond)
	if _, err := h.recs.Get(ctx, "sb-ahead4"); err == nil {
		t.Error("a fork was made ahead again right after the host needed the room")
	}

	// After a restart, a fork makes one again; a restart without forks
	// ahead drops it.
	m.Close()
	m2 := h.manager(config)
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Fork(ctx, "sb-1", "v2", sandbox.Record{ID: "sb-f6", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, h, "sb-ahead4")
	m2.Close()
	m3 := h.manager(func(c *sandbox.Config) {
		config(c)
		c.ForksAhead = 0
	})
	if err := m3.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	waitGone(t, h, "sb-ahead4")
	for _, id := range []string{"sb-1", "sb-f1", "sb-ahead1", "sb-f4", "sb-2", "sb-f5", "sb-f6"} {
		if r := h.get(id); r.State != sandbox.Running {
			t.Errorf("%s is %s after the restart", id, r.State)
		}
	}
	checkStore(t, m3)
}

// waitStopped waits until sandbox id is a fork made ahead whose CPUs
// are stopped.
func waitStopped(t *testing.T, h *harness, id string) sandbox.Record {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		r, err := h.recs.Get(context.Background(), id)
		if err == nil && r.State == sandbox.Running && r.Ahead != nil {
			if fm := h.drv.last(id); fm != nil && fm.paused.Load() {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not a stopped fork made ahead after %v: %+v, %v", id, waitFor, r, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitGone waits until sandbox id is deleted and its QEMU gone.
func waitGone(t *testing.T, h *harness, id string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		_, err := h.recs.Get(context.Background(), id)
		if fault.CodeOf(err) == "sandbox_not_found" && h.drv.last(id).exited() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not deleted after %v: %v", id, waitFor, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
