package sandbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"strata/sandbox"
)

// TestPool: a Manager with a pool boots a sandbox of no account after
// Recover; a create of the pool's shape takes it (the pooled sandbox's
// id, running at once, the account's, its guest told its name), and the
// pool is filled again; a create of another shape boots; a create whose
// name the account has is refused and leaves the pooled sandbox pooled;
// a Manager without a pool drops the pooled sandbox.
func TestPool(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var n atomic.Int32
	shape := sandbox.Shape{MemoryMiB: 256, VCPUs: 1, DiskGiB: 1}
	m := h.manager(func(c *sandbox.Config) {
		c.Pool, c.PoolShape = 1, shape
		c.NewID = func() (string, error) { return fmt.Sprintf("sb-pool%d", n.Add(1)), nil }
	})
	if err := m.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	p := h.waitState("sb-pool1", sandbox.Running)
	if !p.Pooled || p.Account != "" || p.Name != "" || p.Guest != sandbox.GuestScheme+"://sb-pool1" || p.Machine == nil || p.Machine.Image != h.image.Key {
		t.Fatalf("pooled record %+v", p)
	}

	r := record("sb-new")
	r.Name = "web"
	got, err := m.Create(ctx, r)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if got.ID != "sb-pool1" || got.State != sandbox.Running || got.Pooled || got.Account != "acct" || got.Name != "web" || !got.CreatedAt.Equal(r.CreatedAt) {
		t.Fatalf("Create of the pool's shape answered %+v; want sb-pool1 running, the account's, named web", got)
	}
	if rec := h.get("sb-pool1"); rec.Pooled || rec.Account != "acct" || rec.Name != "web" {
		t.Fatalf("the taken sandbox's record: %+v", rec)
	}
	if _, err := h.recs.Get(ctx, "sb-new"); err == nil {
		t.Error("the id the create would have given was recorded too")
	}
	if name, _ := h.drv.last("sb-pool1").hostname.Load().(string); name != "web" {
		t.Errorf("the taken guest's hostname: %q, want web", name)
	}
	checkHealth(t, m, "sb-pool1")

	// Filled again.
	if p := h.waitState("sb-pool2", sandbox.Running); !p.Pooled || p.Account != "" {
		t.Fatalf("the pool's next sandbox: %+v", p)
	}

	// Another shape boots.
	other := record("sb-other")
	other.MemoryMiB = 512
	if got, err := m.Create(ctx, other); err != nil || got.ID != "sb-other" || got.State != sandbox.Creating {
		t.Fatalf("Create of another shape: %+v, %v; want sb-other creating", got, err)
	}
	h.waitState("sb-other", sandbox.Running)

	// The account's name again: refused, the pooled sandbox stays pooled.
	dup := record("sb-dup")
	dup.Name = "web"
	if got, err := m.Create(ctx, dup); err == nil {
		t.Fatalf("Create with a name the account has: %+v", got)
	}
	if p := h.get("sb-pool2"); !p.Pooled || p.Account != "" || p.State != sandbox.Running {
		t.Fatalf("after a refused take: %+v", p)
	}

	// Without a pool, the pooled sandbox is dropped; the others stay.
	m.Close()
	m2 := h.manager(nil)
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitFor)
	for {
		if _, err := h.recs.Get(ctx, "sb-pool2"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sb-pool2 still recorded %v after a Manager without a pool started: %+v", waitFor, h.get("sb-pool2"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, id := range []string{"sb-pool1", "sb-other"} {
		if r := h.get(id); r.State != sandbox.Running {
			t.Errorf("%s: %s after the pool was dropped", id, r.State)
		}
	}
}
