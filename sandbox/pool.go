package sandbox

import (
	"context"
	"errors"
	"sync"
	"time"
)

// The pool: sandboxes booted ahead, so that a create takes one instead of
// booting. A boot under TCG takes about 5 s (docs/performance.md), most of
// it the guest kernel's own; a take is one call through the channel (the
// guest's hostname, clock and RNG) and one transaction.
//
// A pooled sandbox is an ordinary sandbox of no account (Record.Pooled,
// Account ""): it is booted as a create boots one (admission, its own uid,
// disk and QEMU), no account sees it, and it is counted in the host's
// memory and disk like any other. A create whose resources are exactly
// the pool's (Config.PoolShape) takes a running one: Records.Take gives it
// the account, name and creation time in one transaction that also checks
// the name and the create's claim; the sandbox keeps its id (the id the
// create would have given is not used). The pool is filled again in the
// background after each take, after Recover, and never while a take is
// refused for lack of host room.
//
// A pooled sandbox is dropped (deleted as any sandbox) when it is of
// another image than the Manager's, of another shape than the pool's, in
// a state other than creating or running, or beyond Config.Pool.
//
// Each guest was booted for itself: no memory, RNG or kernel layout is
// shared between pooled sandboxes (unlike forks of one snapshot).

// MaxPool bounds Config.Pool.
const MaxPool = 16

// Shape is the resources of a sandbox that a pooled one must have for a
// create to take it.
type Shape struct {
	MemoryMiB, VCPUs, DiskGiB int
}

func shapeOf(r Record) Shape { return Shape{r.MemoryMiB, r.VCPUs, r.DiskGiB} }

// errPoolMiss: the pooled sandbox was taken or left running in between.
var errPoolMiss = errors.New("the pooled sandbox is no longer free")

// takePooled gives r's account a running pooled sandbox of r's shape, if
// there is one: ok false means none (the caller boots one). The answer is
// the taken record, running, under the pooled sandbox's id.
func (m *Manager) takePooled(ctx context.Context, r Record) (Record, bool, error) {
	if m.cfg.Pool <= 0 || shapeOf(r) != m.cfg.PoolShape {
		return Record{}, false, nil
	}
	// One take at a time: two would tell one guest two hostnames.
	m.poolTake.Lock()
	defer m.poolTake.Unlock()
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return Record{}, false, err
	}
	for _, p := range records {
		if !p.Pooled || p.State != Running || !m.poolable(p) {
			continue
		}
		taken, err := m.take(ctx, p, r)
		if errors.Is(err, errPoolMiss) {
			continue
		}
		if err != nil {
			return Record{}, true, err
		}
		m.poolLater()
		return taken, true, nil
	}
	return Record{}, false, nil
}

// take gives pooled sandbox p to r's account.
func (m *Manager) take(ctx context.Context, p, r Record) (Record, error) {
	done, err := m.begin(p.ID)
	if err != nil {
		return Record{}, errPoolMiss // a delete of the pool's own is under way
	}
	defer done()
	mc := m.machineOf(p.ID)
	if mc == nil {
		return Record{}, errPoolMiss
	}
	t0 := time.Now()
	// The guest learns its name (its hostname) first: a take refused
	// after this leaves the sandbox pooled, and the next take names it
	// again.
	named := p
	named.Name = r.Name
	if err := m.resync(ctx, mc, named, false); err != nil {
		if ctx.Err() != nil {
			return Record{}, ctx.Err()
		}
		m.log.Warn("pooled sandbox not answering: not taken", "sandbox", p.ID, "err", err)
		return Record{}, errPoolMiss
	}
	taken, err := m.cfg.Records.Take(ctx, p.ID, func(rec *Record) error {
		if !rec.Pooled || rec.State != Running {
			return errPoolMiss
		}
		rec.Pooled = false
		rec.Account, rec.Name, rec.CreatedAt = r.Account, r.Name, r.CreatedAt
		return nil
	})
	if err != nil {
		return Record{}, err
	}
	m.RefreshNetwork(taken.ID)
	m.log.Info("sandbox created from the pool", "sandbox", taken.ID, "account", taken.Account, "took", time.Since(t0).Round(time.Millisecond))
	return taken, nil
}

// poolable tells whether pooled sandbox p may stay in the pool: of the
// Manager's image and the pool's shape, booting or running.
func (m *Manager) poolable(p Record) bool {
	return p.Machine != nil && p.Machine.Image == m.cfg.Image.Key && shapeOf(p) == m.cfg.PoolShape &&
		(p.State == Creating || p.State == Running)
}

// poolLater fills the pool in the background (fillPool), once at a time.
func (m *Manager) poolLater() { m.poolFill.later(m, m.fillPool) }

// refill runs a filling in the background once at a time: a call while
// it runs makes it run once more after (the pool's, the forks made
// ahead's).
type refill struct {
	mu             sync.Mutex
	running, again bool
}

func (f *refill) later(m *Manager, fill func(context.Context)) {
	f.mu.Lock()
	if f.running {
		f.again = true
		f.mu.Unlock()
		return
	}
	f.running = true
	f.mu.Unlock()
	run := func() {
		for {
			fill(m.ctx)
			f.mu.Lock()
			if !f.again || m.ctx.Err() != nil {
				f.running = false
				f.mu.Unlock()
				return
			}
			f.again = false
			f.mu.Unlock()
		}
	}
	if !m.goAfter(run) {
		f.mu.Lock()
		f.running = false
		f.mu.Unlock()
	}
}

// fillPool drops the pooled sandboxes that may not stay, and boots new
// ones until Config.Pool are booting or running. A boot that admission
// refuses ends the filling (logged): the next take or Recover tries
// again.
func (m *Manager) fillPool(ctx context.Context) {
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		m.log.Warn("pool not filled", "err", err)
		return
	}
	keep := 0
	for _, p := range records {
		if !p.Pooled || p.State == Destroyed {
			continue
		}
		if keep < m.cfg.Pool && m.poolable(p) {
			keep++
			continue
		}
		m.log.Info("pooled sandbox dropped", "sandbox", p.ID, "state", p.State, "image", imageOf(p))
		if err := m.Delete(ctx, p.ID); err != nil && ctx.Err() == nil {
			m.log.Warn("pooled sandbox not dropped", "sandbox", p.ID, "err", err)
		}
	}
	for ; keep < m.cfg.Pool && ctx.Err() == nil; keep++ {
		id, err := m.cfg.NewID()
		if err != nil {
			m.log.Warn("pool not filled", "err", err)
			return
		}
		s := m.cfg.PoolShape
		r := Record{ID: id, Guest: GuestScheme + "://" + id, Pooled: true, MemoryMiB: s.MemoryMiB, VCPUs: s.VCPUs, DiskGiB: s.DiskGiB, CreatedAt: time.Now().UTC().Truncate(time.Second)}
		if _, err := m.bootNew(ctx, r); err != nil {
			m.log.Info("pool not filled: the host has no room for another sandbox", "pool", m.cfg.Pool, "pooled", keep, "err", err)
			return
		}
		m.log.Info("pooled sandbox booting", "sandbox", id)
	}
}

func imageOf(r Record) string {
	if r.Machine == nil {
		return ""
	}
	return r.Machine.Image
}

// PoolReady is how many pooled sandboxes run, ready for a create to take.
func (m *Manager) PoolReady(ctx context.Context) (int, error) {
	records, err := m.cfg.Records.List(ctx)
	n := 0
	for _, p := range records {
		if p.Pooled && p.State == Running && m.poolable(p) {
			n++
		}
	}
	return n, err
}
