package sandbox

import (
	"context"
	"net"
	"time"

	"strata/egress"
	"strata/egress/policy"
)

// NetworkPolicy is the policy a sandbox's network runs under: its
// record's network setting (the default, all, when it has none); none for
// a sandbox of no account (pooled, or a fork made ahead), until a create
// takes it; none for a setting that no longer parses (fail closed).
func NetworkPolicy(r Record) policy.Policy {
	if r.Pooled || r.Ahead != nil || r.Account == "" {
		return policy.Policy{Mode: policy.None}
	}
	if r.Network == nil {
		return policy.Default()
	}
	p, err := policy.Parse(*r.Network)
	if err != nil {
		return policy.Policy{Mode: policy.None}
	}
	return p
}

// startNetwork connects a running machine's NIC to a network of its own
// on this host (package egress). It starts under none and then takes its
// record's setting (applyNetwork), so that a record that cannot be read
// leaves it reaching nothing, and a change written meanwhile is not
// missed. Without Config.Egress, or for a machine without a NIC (one an
// earlier version started), the guest's NIC stays unconnected: it
// reaches nothing.
func (m *Manager) startNetwork(mc *machine, socket string) {
	if m.cfg.Egress == nil {
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		m.log.Warn("sandbox's network not started: no NIC socket", "sandbox", mc.id, "err", err)
		return
	}
	n, err := egress.Start(conn, policy.Policy{Mode: policy.None}, *m.cfg.Egress)
	if err != nil {
		conn.Close()
		m.log.Warn("sandbox's network not started", "sandbox", mc.id, "err", err)
		return
	}
	mc.mu.Lock()
	mc.net = n
	mc.mu.Unlock()
	m.applyNetwork(mc)
	go func() {
		if err := n.Err(); err != nil {
			m.log.Warn("sandbox's network ended", "sandbox", mc.id, "err", err)
		}
	}()
}

// network is a running machine's network, nil when it has none.
func (mc *machine) network() *egress.Net {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	return mc.net
}

// RefreshNetwork applies sandbox id's network setting, as its record has
// it now, to its running machine's network: for the connections and DNS
// questions after it. A sandbox not running has nothing to apply it to;
// it takes it at its next start.
func (m *Manager) RefreshNetwork(id string) {
	if mc := m.machineOf(id); mc != nil {
		m.applyNetwork(mc)
	}
}

// applyNetwork reads the machine's record and applies its setting, one
// at a time per machine, so that the last record read is the one that
// holds whatever the order of concurrent changes. A record that cannot
// be read leaves the policy as it was, and says so.
func (m *Manager) applyNetwork(mc *machine) {
	n := mc.network()
	if n == nil {
		return
	}
	mc.netMu.Lock()
	defer mc.netMu.Unlock()
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	r, err := m.cfg.Records.Get(ctx, mc.id)
	if err != nil {
		m.log.Warn("sandbox's network setting not applied: no record", "sandbox", mc.id, "err", err)
		return
	}
	n.SetPolicy(NetworkPolicy(r))
}

// NetworkUsage is the traffic of sandbox id's network since its machine
// started; false when it has no network running.
func (m *Manager) NetworkUsage(id string) (egress.Usage, bool) {
	if mc := m.machineOf(id); mc != nil {
		if n := mc.network(); n != nil {
			return n.Usage(), true
		}
	}
	return egress.Usage{}, false
}
