package sandbox

import (
	"context"
	"fmt"
	"time"
)

// A guest whose guestd restarts comes back by itself. The channel's
// heartbeat (channel.HostConfig) tells the manager when a guest whose CPUs
// run stops answering (answering false: its session is reset and the host
// dials again) and when a session's first ping is answered (true). The
// manager then:
//   - records the sandbox unresponsive, with since, when it was running;
//   - heals it when it answers again: resync (the clock and RNG, as after
//     a load: harmless to a guest that only lost its daemon) and its
//     credentials (Config.Booted), then records it running;
//   - stops its QEMU and puts it in error when it is still unresponsive
//     after UnresponsiveLimit.
//
// These writes change only running ↔ unresponsive (and unresponsive →
// error), never the busy mark of an operation under way: a pause or a
// snapshot that stops the CPUs is not a stalled guest (Stalled asks QEMU).
// Races: an answer and a failure of two sessions may cross. The word of
// a session older than the newest one that told is ignored, and a
// failure is written only if its session is still the newest when the
// record changes: an old session's failure never lands after the next
// session's answer healed the sandbox (each session tells its answer
// once, so nothing would heal it again). Each write checks the state it
// changes, and a heal runs one at a time per machine (again: once more
// after it).

// answering is the channel's word on mc's guest: n counts its sessions.
func (m *Manager) answering(mc *machine, n uint64, up bool) {
	if m.ctx.Err() != nil || !mc.tells(n) {
		return
	}
	if !up {
		since := time.Now().UTC().Truncate(time.Second)
		r, err := m.cfg.Records.Update(m.ctx, mc.id, func(r *Record) error {
			if r.State == Running && mc.newest(n) {
				r.State, r.UnresponsiveSince, r.UnresponsiveReason = Unresponsive, since, stuckReason(mc)
			}
			return nil
		})
		if err == nil && r.State == Unresponsive && r.UnresponsiveSince.Equal(since) {
			m.log.Warn("sandbox unresponsive: its guest did not answer; the channel is reset", "sandbox", mc.id)
			m.goAfter(func() { m.expireUnresponsive(mc, since) })
		}
		return
	}
	if n == 1 {
		// The first session's: a boot's own steps take it from here,
		// unless the sandbox was marked meanwhile.
		if r, err := m.cfg.Records.Get(m.ctx, mc.id); err != nil || r.State != Unresponsive {
			return
		}
	}
	mc.mu.Lock()
	if mc.healing {
		mc.again = true
		mc.mu.Unlock()
		return
	}
	mc.healing = true
	mc.mu.Unlock()
	m.goAfter(func() { m.heal(mc) })
}

// tells records that session n told, and reports false when a newer
// session already did (n's word is stale).
func (mc *machine) tells(n uint64) bool {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if n < mc.session {
		return false
	}
	mc.session = n
	return true
}

// newest reports whether no session after n told.
func (mc *machine) newest(n uint64) bool {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	return mc.session == n
}

// heal gives a guest that answers again what its new guestd lacks, and
// records the sandbox running.
func (m *Manager) heal(mc *machine) {
	for {
		m.healOnce(mc)
		mc.mu.Lock()
		if !mc.again {
			mc.healing = false
			mc.mu.Unlock()
			return
		}
		mc.again = false
		mc.mu.Unlock()
	}
}

func (m *Manager) healOnce(mc *machine) {
	ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	defer cancel()
	r, err := m.cfg.Records.Get(ctx, mc.id)
	if err != nil || (r.State != Running && r.State != Unresponsive) || m.machineOf(mc.id) != mc {
		return
	}
	if err := m.resync(ctx, mc, r, true); err != nil {
		m.log.Warn("guest answering again, but not resynced", "sandbox", mc.id, "err", err)
		return
	}
	if m.cfg.Booted != nil {
		if err := m.cfg.Booted(ctx, r); err != nil {
			m.log.Warn("guest answering again, but its credentials were not delivered", "sandbox", mc.id, "err", err)
		}
	}
	r, err = m.cfg.Records.Update(ctx, mc.id, func(r *Record) error {
		if r.State == Unresponsive {
			r.State, r.UnresponsiveSince, r.UnresponsiveReason = Running, time.Time{}, ""
		}
		return nil
	})
	if err == nil && r.State == Running {
		m.log.Info("sandbox answering again", "sandbox", mc.id)
	}
}

// expireUnresponsive puts a sandbox still unresponsive since since, after
// UnresponsiveLimit, in error, and stops its QEMU.
func (m *Manager) expireUnresponsive(mc *machine, since time.Time) {
	select {
	case <-m.ctx.Done():
		return
	case <-mc.vm.Done():
		return
	case <-time.After(time.Until(since.Add(m.cfg.UnresponsiveLimit))):
	}
	var done func()
	for {
		var err error
		if done, err = m.begin(mc.id); err == nil {
			break
		}
		// An operation is under way (a stop, a delete): it may settle
		// the sandbox; if not, its end is waited for.
		select {
		case <-m.ctx.Done():
			return
		case <-mc.vm.Done():
			return
		case <-time.After(time.Second):
		}
	}
	defer done()
	expired := false
	m.cfg.Records.Update(m.ctx, mc.id, func(r *Record) error {
		expired = r.State == Unresponsive && r.UnresponsiveSince.Equal(since)
		return nil
	})
	if !expired || m.machineOf(mc.id) != mc {
		return
	}
	m.log.Error("sandbox unresponsive past its limit: its QEMU is stopped", "sandbox", mc.id, "since", since, "limit", m.cfg.UnresponsiveLimit)
	m.teardown(mc.id)
	m.cfg.Records.Update(context.Background(), mc.id, func(r *Record) error {
		if r.State == Unresponsive {
			r.State, r.Error, r.UnresponsiveSince = Error, fmt.Sprintf(errUnresponsive, m.cfg.UnresponsiveLimit), time.Time{}
			if r.UnresponsiveReason != "" {
				r.Error += " (" + r.UnresponsiveReason + ")"
			}
			r.UnresponsiveReason = ""
			if r.Machine != nil {
				r.Machine.Process = nil
			}
		}
		return nil
	})
}

// stuckReason says why mc's guest cannot answer when its QEMU stopped it
// on a fault (the heartbeat's last look), "" otherwise.
func stuckReason(mc *machine) string {
	status, _ := mc.stuck.Load().(string)
	switch status {
	case "":
		return ""
	case "io-error":
		return "QEMU stopped the guest on a failed disk write (io-error): the host's store is full"
	}
	return "QEMU stopped the guest (" + status + ")"
}
