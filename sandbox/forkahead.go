package sandbox

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"strata/internal/failpoint"
	"strata/internal/fault"
)

// Forks made ahead: for the snapshots forked last (Config.ForksAhead of
// them, host-wide), one fork is made in the background, run until its
// guest answers, and stopped (its CPUs; QEMU keeps it); the next fork of
// that snapshot takes it instead of starting a QEMU.
//
// Why: under TCG a new QEMU translates every guest instruction it runs
// for the first time. A fork's QEMU starts in tens of milliseconds, but
// its guest then spends some 400 ms of CPU time on translation before
// guestd answers the resync (docs/performance.md). A fork made ahead has
// run that path once: a take is its CPUs started again, one resync
// through the channel (its clock, its RNG reseeded again, its name) and
// one transaction. Its guest's time is stopped while it waits, so what
// runs in it at the take is the snapshot's moment plus the fork's own
// start, as in any fork; its RNG was seeded for it alone.
//
// A fork made ahead is an ordinary sandbox of no account (Record.Ahead
// names the snapshot; it is not Pooled, so that no create, nor an older
// hostproxy's pool, ever takes it): forked and admitted as any fork, its
// own uid, disk top and QEMU, counted in the host's memory and disk. The
// take is Records.Take: the account, name and creation time in one
// transaction that also checks the name and the create's claim; the fork
// keeps its id. A create, fork, start, resume or restore that admission
// refuses (host_capacity, or insufficient_storage: the disks' growth
// counts theirs) drops every fork made ahead, forgets which snapshots
// wanted one, makes none for aheadHold, and tries again (giveWay): a fork
// made ahead never keeps a user's sandbox from the host.
//
// One is dropped (dropForkAhead: deleted, unless a take made it the
// account's meanwhile) when its snapshot is no longer ready (deleted, or
// its sandbox), when its snapshot is no longer among the last forked, and
// at Recover whatever Config.ForksAhead says (which snapshots want one is
// not recorded: the next fork says again).

// MaxForksAhead bounds Config.ForksAhead.
const MaxForksAhead = 16

// aheadHold is how long no fork is made ahead after the host needed the
// room of those there were (giveWay): a batch of forks near the host's
// capacity does not make and drop one per fork.
const aheadHold = time.Minute

// takeForkAhead gives r's account the fork made ahead of key, if one is
// stopped and ready: ok false means none (the caller forks).
func (m *Manager) takeForkAhead(ctx context.Context, key From, r Record) (Record, bool, error) {
	if m.cfg.ForksAhead <= 0 {
		return Record{}, false, nil
	}
	m.forkAheadTake.Lock()
	defer m.forkAheadTake.Unlock()
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return Record{}, false, err
	}
	if !snapshotReady(records, key) {
		return Record{}, false, nil // the fork answers why
	}
	for _, p := range records {
		if p.Ahead == nil || *p.Ahead != key || p.State != Running || !m.forkAheadStopped(p.ID) {
			continue
		}
		taken, err := m.takeFork(ctx, p, r)
		if errors.Is(err, errPoolMiss) {
			continue
		}
		return taken, true, err
	}
	return Record{}, false, nil
}

// takeFork gives fork p, made ahead, to r's account.
func (m *Manager) takeFork(ctx context.Context, p, r Record) (Record, error) {
	done, err := m.begin(p.ID)
	if err != nil {
		return Record{}, errPoolMiss // being stopped, or dropped
	}
	defer done()
	mc := m.machineOf(p.ID)
	if mc == nil {
		return Record{}, errPoolMiss
	}
	t0 := time.Now()
	m.setForkAheadStopped(p.ID, false)
	named := p
	named.Name = r.Name
	err = mc.vm.Resume(ctx)
	if err == nil {
		err = m.resync(ctx, mc, named, false)
	}
	if err != nil {
		// It may run now: the filling stops it again, or drops it.
		if ctx.Err() != nil {
			m.forksAheadLater()
			return Record{}, ctx.Err()
		}
		m.log.Warn("fork made ahead not answering: dropped", "sandbox", p.ID, "err", err)
		m.goAfter(func() { m.dropForkAhead(m.ctx, p.ID) })
		return Record{}, errPoolMiss
	}
	failpoint.Hit(FailpointForkAheadResynced)
	taken, err := m.cfg.Records.Take(ctx, p.ID, func(rec *Record) error {
		if rec.Ahead == nil || rec.Account != "" || rec.State != Running {
			return errPoolMiss
		}
		rec.Ahead = nil
		rec.Account, rec.Name, rec.CreatedAt = r.Account, r.Name, r.CreatedAt
		return nil
	})
	if err != nil {
		// Refused (the name, the claim): it runs now; the filling
		// stops it again.
		m.forksAheadLater()
		return Record{}, err
	}
	m.RefreshNetwork(taken.ID)
	m.log.Info("sandbox forked", "sandbox", taken.ID, "account", taken.Account, "from", taken.From.Sandbox, "snapshot", taken.From.Snapshot, "ahead", true, "took", time.Since(t0).Round(time.Millisecond))
	return taken, nil
}

// snapshotReady tells whether key's snapshot is ready in records.
func snapshotReady(records []Record, key From) bool {
	for _, r := range records {
		if r.ID != key.Sandbox {
			continue
		}
		if r.State == Destroying || r.State == Destroyed {
			return false
		}
		s, ok := r.Snapshot(key.Snapshot)
		return ok && s.Status == SnapshotReady
	}
	return false
}

// ForksAheadReady is how many forks made ahead are stopped, ready for a
// fork of their snapshot to take.
func (m *Manager) ForksAheadReady() int {
	m.forkAheadMu.Lock()
	ids := slices.Collect(maps.Keys(m.stoppedAhead))
	m.forkAheadMu.Unlock()
	n := 0
	for _, id := range ids {
		if m.machineOf(id) != nil {
			n++
		}
	}
	return n
}

// staleForksAhead tells whether records have a fork made ahead whose
// snapshot is no longer ready.
func staleForksAhead(records []Record) bool {
	for _, p := range records {
		if p.Ahead != nil && p.State != Destroying && p.State != Destroyed && !snapshotReady(records, *p.Ahead) {
			return true
		}
	}
	return false
}

func (m *Manager) forkAheadStopped(id string) bool {
	m.forkAheadMu.Lock()
	defer m.forkAheadMu.Unlock()
	return m.stoppedAhead[id]
}

func (m *Manager) setForkAheadStopped(id string, stopped bool) {
	m.forkAheadMu.Lock()
	defer m.forkAheadMu.Unlock()
	if stopped {
		m.stoppedAhead[id] = true
	} else {
		delete(m.stoppedAhead, id)
	}
}

// forksAheadLater makes keys the snapshots forked last (the last key the
// most recent) and fills the forks made ahead in the background
// (fillForksAhead), once at a time.
func (m *Manager) forksAheadLater(keys ...From) {
	if m.cfg.ForksAhead <= 0 {
		return
	}
	m.forkAheadMu.Lock()
	for _, k := range keys {
		m.forksWanted = slices.DeleteFunc(m.forksWanted, func(w From) bool { return w == k })
		m.forksWanted = append(m.forksWanted, k)
	}
	if n := len(m.forksWanted) - m.cfg.ForksAhead; n > 0 {
		m.forksWanted = slices.Delete(m.forksWanted, 0, n)
	}
	m.forkAheadMu.Unlock()
	m.forksAheadFill.later(m, m.fillForksAhead)
}

// fillForksAhead drops the forks made ahead that may not stay, stops the
// CPUs of those that run, and makes one for each wanted snapshot that
// has none. A fork that admission refuses ends the filling (logged).
func (m *Manager) fillForksAhead(ctx context.Context) {
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		m.log.Warn("forks ahead not made", "err", err)
		return
	}
	want := m.wantedAhead()
	has := map[From]bool{}
	for _, p := range records {
		if p.Ahead == nil || p.State == Destroyed {
			continue
		}
		key := *p.Ahead
		if !has[key] && slices.Contains(want, key) && snapshotReady(records, key) && (p.State == Creating || p.State == Running) {
			has[key] = true
			if p.State == Running && !m.forkAheadStopped(p.ID) {
				m.stopForkAhead(ctx, p.ID)
			}
			continue
		}
		m.log.Info("fork made ahead dropped", "sandbox", p.ID, "from", key.Sandbox, "snapshot", key.Snapshot, "state", p.State)
		m.dropForkAhead(ctx, p.ID)
	}
	for ctx.Err() == nil {
		// The wish as it is now: a giveWay may have cleared it.
		var key From
		found := false
		for _, k := range slices.Backward(m.wantedAhead()) {
			if !has[k] && snapshotReady(records, k) {
				key, found = k, true
				break
			}
		}
		if !found {
			return
		}
		has[key] = true
		id, err := m.cfg.NewID()
		if err != nil {
			m.log.Warn("forks ahead not made", "err", err)
			return
		}
		r := Record{ID: id, Guest: GuestScheme + "://" + id, Ahead: &key, CreatedAt: time.Now().UTC().Truncate(time.Second)}
		t0 := time.Now()
		if _, err := m.forkNew(ctx, key.Sandbox, key.Snapshot, r); err != nil {
			m.log.Info("fork not made ahead", "from", key.Sandbox, "snapshot", key.Snapshot, "err", err)
			return
		}
		if !m.waitBooted(ctx, id) {
			continue // in error, or dropped: the next fork tries again
		}
		if m.stopForkAhead(ctx, id) {
			m.log.Info("fork made ahead", "sandbox", id, "from", key.Sandbox, "snapshot", key.Snapshot, "took", time.Since(t0).Round(time.Millisecond))
		}
	}
}

// wantedAhead is the snapshots that want a fork made ahead, the most
// recent last; none during aheadHold after a giveWay.
func (m *Manager) wantedAhead() []From {
	m.forkAheadMu.Lock()
	defer m.forkAheadMu.Unlock()
	if time.Now().Before(m.aheadHeld) {
		return nil
	}
	return slices.Clone(m.forksWanted)
}

// waitBooted waits until sandbox id is no longer creating, and tells
// whether it runs.
func (m *Manager) waitBooted(ctx context.Context, id string) bool {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		r, err := m.cfg.Records.Get(ctx, id)
		if err != nil || r.State != Creating {
			return err == nil && r.State == Running
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// stopForkAhead stops the CPUs of fork id, made ahead and running: from
// then on a fork may take it. It waits a moment for the busy mark a boot
// releases just after it recorded the sandbox running; it tells whether
// the fork is stopped.
func (m *Manager) stopForkAhead(ctx context.Context, id string) bool {
	done, err := m.begin(id)
	for i := 0; errors.Is(err, ErrInProgress) && i < 250 && ctx.Err() == nil; i++ {
		time.Sleep(20 * time.Millisecond)
		done, err = m.begin(id)
	}
	if err != nil {
		m.log.Warn("fork made ahead not stopped", "sandbox", id, "err", err)
		return false
	}
	defer done()
	mc := m.machineOf(id)
	r, err := m.cfg.Records.Get(ctx, id)
	if mc == nil || err != nil || r.Ahead == nil || r.State != Running {
		return false
	}
	if err := mc.vm.Pause(ctx); err != nil {
		m.log.Warn("fork made ahead not stopped", "sandbox", id, "err", err)
		return false
	}
	m.setForkAheadStopped(id, true)
	return true
}

// errNotAhead: the sandbox a drop was for is no longer a fork made ahead
// (a take gave it to an account).
var errNotAhead = errors.New("no longer a fork made ahead")

// dropForkAhead deletes sandbox id if it is still a fork made ahead,
// checked in the transaction that marks it destroying: a take that made
// it an account's first is never undone. It tells whether it was
// dropped.
func (m *Manager) dropForkAhead(ctx context.Context, id string) bool {
	err := m.deleteIf(ctx, id, func(r *Record) error {
		if r.Ahead == nil || r.Account != "" {
			return errNotAhead
		}
		return nil
	})
	if err != nil && !errors.Is(err, errNotAhead) && fault.CodeOf(err) != "sandbox_not_found" && ctx.Err() == nil {
		m.log.Warn("fork made ahead not dropped", "sandbox", id, "err", err)
	}
	return err == nil
}

// dropForksAhead drops every fork made ahead there is, and tells whether
// there was one.
func (m *Manager) dropForksAhead(ctx context.Context) bool {
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return false
	}
	found := false
	for _, p := range records {
		if p.Ahead == nil || p.State == Destroyed {
			continue
		}
		found = true
		if m.dropForkAhead(ctx, p.ID) {
			m.log.Info("fork made ahead dropped", "sandbox", p.ID, "state", p.State)
		}
	}
	return found
}

// giveWay runs f, an operation that admits a sandbox's memory and disk (a
// create, fork, start, resume or restore); when the host has no room for
// it and there are forks made ahead, it drops them all, forgets which
// snapshots wanted one, holds the making of others for aheadHold, and
// runs f again.
func giveWay[T any](ctx context.Context, m *Manager, f func() (T, error)) (T, error) {
	r, err := f()
	if code := fault.CodeOf(err); code != ErrHostCapacity.Code && code != ErrInsufficientStorage.Code {
		return r, err
	}
	m.forkAheadMu.Lock()
	m.forksWanted, m.aheadHeld = nil, time.Now().Add(aheadHold)
	m.forkAheadMu.Unlock()
	if !m.dropForksAhead(ctx) {
		return r, err
	}
	m.log.Info("forks made ahead dropped: the host needs their room")
	return f()
}
