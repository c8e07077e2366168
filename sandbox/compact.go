package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/failpoint"
	"strata/vmm"
)

// Compaction keeps a sandbox's disk chains short. Every snapshot, pause
// and resume puts a new layer on top of the disk, and a layer stays as
// long as a chain names it; without merging, a chain grows by one layer
// per snapshot for good (QEMU's descriptor and nesting limits end boots
// at about a thousand). Store files are never changed once frozen: a
// merge writes either the running top (which only its own QEMU reads) or
// a new file, and the records then name a chain that reads the same
// disk with fewer layers.
//
// The vocabulary: a chain is a list of layers, top first, over the base
// image: a sandbox's disk (its live chain), a saved state's disk
// (LoadDisk), a snapshot's disk, a template's scratch layer over its
// snapshot's disk. A layer is pinned when it is the top of some chain,
// or when two chains part under it (different layers right above it):
// it is then kept, shared, rather than copied into both.
//
// Two moves, planned by planCompaction (a pure function of the records):
//   - merge: a pinned layer A of a snapshot's chain with the run of
//     unpinned layers right under it becomes one new layer A' (a copy of
//     A, rebased with qemu-img in safe mode onto what is under the run,
//     which copies the run's data into it), and every chain of the
//     sandbox's snapshots that reads A names A' instead; so does the
//     live chain when it reads A over the run ([T…, A, run…, below…]
//     becomes [T…, A', below…]). A and the run are then named by nothing
//     and collected: the disk's data is stored once. Only when every
//     chain that reads A or the run is such a snapshot chain or the
//     sandbox's live chain (no other sandbox's, saved state's or
//     template's, no snapshot not yet ready), and the live chain can
//     move now: where no QEMU reads it, in its record alone (a boot
//     spells the chain out from the record), and a running QEMU switches
//     to A' first (vmm RebaseDisk: A' added read-only, the layer above A
//     reopened over it, A and the run dropped). A sandbox whose QEMU can
//     do neither (unresponsive) keeps its merge for a later compaction:
//     merged while the live chain went on reading A and the run, their
//     data would be stored twice, and a stream would then copy it into
//     the live top once more (issue 30).
//   - stream: the live chain [T, L1 … Ln] becomes [T, Lk … Ln], Lk the
//     first pinned layer under T (another chain holds it and what is
//     under it), or [T] over the base image when there is none. A
//     running sandbox's QEMU streams L1 … Lk-1 into T (vmm StreamDisk:
//     block-stream with base-node Lk); a stopped one's T is rebased
//     offline with qemu-img (safe mode). Only T is written, and only with
//     what its backing layers give it already.
//
// Bound (docs/design.md): each layer has one layer under it in every
// chain that reads it, so a sandbox's chains form a tree whose leaves
// are chain tops. Once compaction has run (with the sandbox's QEMU
// running or gone: a merge the live chain reads waits otherwise), every
// layer of a chain below its top is pinned (merges leave no unpinned
// layer under a pinned one in a snapshot's chain or the live chain, a
// stream none under the live top): a top or a branch point of the tree.
// A tree with C leaves has at most C-1 branch points, so with C chains
// (S snapshots, the live disk, and the layers of a saved state's disk,
// which no move rewrites until the resume) no chain holds more than 2C-1
// layers over the base image; a linear history (no restore to an older
// snapshot) has no branch point and holds at most 1+S. Layers shared
// with another sandbox (a fork's chains read its source's snapshot) are
// never rewritten and add their own depth.
//
// Races: compaction holds the sandbox like an operation (no lifecycle
// operation begins while it runs; one that wants to waits a bounded time,
// then cancels it: begin), but not snapshot deletes, forks of its
// snapshots or other sandboxes, which change records under it. Each
// record update therefore checks that the chains it rewrites are still
// the ones planned, and changes nothing otherwise. A crash between the
// work and the record update leaves the old chains, which read the same
// disk: QEMU's chains are spelled out at each boot (never taken from the
// files' backing names), and a stream only adds data that the top's
// backing layers give it already.
//
// Crashes and a running QEMU: collect deletes every file no record
// names, and knows nothing of QEMUs; so a file a running QEMU reads is
// named by a record at every step. A stream names the short chain only
// once QEMU has dropped the streamed layers. A merge that moves a
// running sandbox's live chain names A' in the snapshots' chains first
// (vm.compact.merged: the QEMU reads A and the run, which the live chain
// still names), then has the QEMU switch (vm.compact.switched: it reads
// A', which the snapshots name; A and the run are still named), and
// only then takes A and the run out of the live chain. A crash between
// the two updates leaves the live chain naming A and the run: the disk
// it reads is the same as over A' (the adopted QEMU reads either), and
// nothing a QEMU reads is collected; but the next compaction finds A and
// the run read by the live chain alone and streams them into its top
// (a QEMU already on A' streams A' instead), and their data is stored
// twice until the snapshots that read A' go. A switch that fails leaves
// the same. A sandbox with no QEMU has its live chain moved in the same
// update as the snapshots'.

// The crash points of a merge that moves a running sandbox's live chain.
const (
	FailpointMergeNamed    = "vm.compact.merged"   // the snapshots (and a stopped sandbox's live chain) name the merged layer
	FailpointMergeSwitched = "vm.compact.switched" // the running QEMU reads the merged layer, its record not yet
)

// compactYield is how long an operation on a sandbox waits for its
// compaction to finish before it cancels it.
const compactYield = 10 * time.Second

// maxCompactSteps bounds the moves of one compaction (each re-plans from
// the records).
const maxCompactSteps = 16

// compaction is one move on a sandbox's chains, or none.
type compaction struct {
	Merge  *merge
	Stream *stream
}

// merge replaces Top and the layers of Run (unpinned, right under Top)
// with one new layer over Below (a chain, top first; empty: the base
// image) in the chains of Snapshots, which all read Top over Run and
// Below, and in the live chain when Live (it reads them so too, under
// a layer of its own).
type merge struct {
	Snapshot  string // the snapshot whose top Top is, if one's
	Top       string
	Run       []string
	Below     []string
	Snapshots []string
	Live      bool
}

// stream shortens the live chain Chain to Chain[0] over Chain[Keep:]
// (the base image alone when Keep is len(Chain)).
type stream struct {
	Chain []string
	Keep  int
}

// Result is the live chain after the stream.
func (s stream) Result() []string {
	return append([]string{s.Chain[0]}, s.Chain[s.Keep:]...)
}

// heldChain is a chain a record names.
type heldChain struct {
	Sandbox  string
	Snapshot string // the snapshot's id, for a snapshot's disk
	Live     bool   // the sandbox's own disk
	// Fixed chains are never rewritten: saved states' disks, templates'
	// scratch chains, and snapshots not ready or with a template. (One
	// not yet synced may be: its new layer is written to disk before the
	// record names it, and the record keeps its mark.)
	Fixed  bool
	Layers []string
}

// heldChains lists every chain the records name.
func heldChains(records []Record) []heldChain {
	var cs []heldChain
	for _, r := range records {
		if r.Machine != nil {
			if len(r.Machine.Disk) > 0 {
				cs = append(cs, heldChain{Sandbox: r.ID, Live: true, Layers: r.Machine.Disk})
			}
			if len(r.Machine.LoadDisk) > 0 {
				cs = append(cs, heldChain{Sandbox: r.ID, Fixed: true, Layers: r.Machine.LoadDisk})
			}
		}
		for _, s := range r.Snapshots {
			if len(s.Disk) == 0 {
				continue
			}
			fixed := s.Status != SnapshotReady || s.Template != nil
			cs = append(cs, heldChain{Sandbox: r.ID, Snapshot: s.ID, Fixed: fixed, Layers: s.Disk})
			if t := s.Template; t != nil && t.Scratch != "" {
				cs = append(cs, heldChain{Sandbox: r.ID, Fixed: true, Layers: append([]string{t.Scratch}, s.Disk...)})
			}
		}
	}
	return cs
}

// planCompaction is the next move on sandbox id's chains: a merge first,
// then a stream, which only when streamable (a running or stopped
// sandbox with no saved state waiting on its disk). A merge whose layers
// the live chain reads moves the live chain too, and waits unless
// movable (no QEMU reads the chain, or a running one that can switch).
func planCompaction(records []Record, id string, streamable, movable bool) compaction {
	i := slices.IndexFunc(records, func(r Record) bool { return r.ID == id })
	if i < 0 || records[i].Machine == nil {
		return compaction{}
	}
	r := records[i]
	chains := heldChains(records)
	pinned := pinnedLayers(chains)
	for _, c := range chains {
		if c.Sandbox != id || c.Snapshot == "" || c.Fixed || hasDuplicates(c.Layers) {
			continue
		}
		// Each pinned layer of the chain with unpinned ones right under it.
		for p := 0; p < len(c.Layers)-1; p++ {
			n := p + 1
			for n < len(c.Layers) && !pinned[c.Layers[n]] {
				n++
			}
			if n == p+1 {
				continue
			}
			if mg, ok := planMerge(chains, id, c.Layers[p:], n-p, movable); ok {
				return compaction{Merge: &mg}
			}
			p = n - 1
		}
	}
	if !streamable {
		return compaction{}
	}
	live := r.Machine.Disk
	if len(live) < 2 || hasDuplicates(live) {
		return compaction{}
	}
	for _, c := range chains {
		if !c.Live || c.Sandbox != id {
			if slices.Contains(c.Layers, live[0]) {
				return compaction{} // the top is read elsewhere: never written here
			}
		}
	}
	// A pinned layer is another chain's: it and what is under it stay.
	keep := 1
	for keep < len(live) && !pinned[live[keep]] {
		keep++
	}
	if keep < 2 {
		return compaction{}
	}
	return compaction{Stream: &stream{Chain: slices.Clone(live), Keep: keep}}
}

// planMerge plans the merge of the first layer of chain (a suffix of a
// snapshot's chain, its first layer pinned) with the n-1 unpinned layers
// under it, if every chain that reads any of them is a rewritable
// snapshot chain of the sandbox reading them the same way, or its live
// chain reading them so under its own top, and movable: a merge that
// left the live chain on the old layers would store them twice (merged,
// and where the live chain reads them, which a stream then copies into
// its top once more).
func planMerge(chains []heldChain, id string, chain []string, n int, movable bool) (merge, bool) {
	mg := merge{Top: chain[0], Run: slices.Clone(chain[1:n]), Below: slices.Clone(chain[n:])}
	for _, o := range chains {
		if !slices.ContainsFunc(chain[:n], func(l string) bool { return slices.Contains(o.Layers, l) }) {
			continue
		}
		at := slices.Index(o.Layers, mg.Top)
		if o.Live && o.Sandbox == id {
			if !movable || at < 1 || !slices.Equal(o.Layers[at:], chain) || hasDuplicates(o.Layers) {
				return merge{}, false
			}
			mg.Live = true
			continue
		}
		if o.Sandbox != id || o.Snapshot == "" || o.Fixed || at < 0 || !slices.Equal(o.Layers[at:], chain) {
			return merge{}, false
		}
		if at == 0 {
			mg.Snapshot = o.Snapshot
		}
		mg.Snapshots = append(mg.Snapshots, o.Snapshot)
	}
	return mg, len(mg.Snapshots) > 0
}

// pinnedLayers are the layers a merge or a stream keeps: the top of a
// chain, and a layer under two different ones (the chains part there:
// merging it into both would copy it twice and end its sharing).
func pinnedLayers(chains []heldChain) map[string]bool {
	pinned := map[string]bool{}
	above := map[string]string{}
	for _, c := range chains {
		pinned[c.Layers[0]] = true
		for i := 1; i < len(c.Layers); i++ {
			if a, ok := above[c.Layers[i]]; ok && a != c.Layers[i-1] {
				pinned[c.Layers[i]] = true
			}
			above[c.Layers[i]] = c.Layers[i-1]
		}
	}
	return pinned
}

func hasDuplicates(layers []string) bool {
	seen := map[string]bool{}
	for _, l := range layers {
		if seen[l] {
			return true
		}
		seen[l] = true
	}
	return false
}

// apply is the merge's rewrite of one chain: Top, Run go, made the new
// layer; a chain that no longer reads them as planned is left.
func (mg merge) apply(chain []string, made string) ([]string, bool) {
	at := slices.Index(chain, mg.Top)
	old := append(append([]string{mg.Top}, mg.Run...), mg.Below...)
	if at < 0 || !slices.Equal(chain[at:], old) {
		return chain, false
	}
	return append(append(slices.Clone(chain[:at]), made), mg.Below...), true
}

// compactRun is the compaction of one sandbox: at most one runs, and a
// request while it runs makes it go round once more.
type compactRun struct {
	again  bool
	active bool // holds the sandbox: no operation begins
	cancel context.CancelFunc
	done   chan struct{} // closed when the active spell ends
	ended  chan struct{} // closed when the run leaves m.compacts
}

// compactLater compacts a sandbox's chains in the background, once no
// operation holds it.
func (m *Manager) compactLater(id string) {
	m.mu.Lock()
	if c := m.compacts[id]; c != nil {
		c.again = true
		m.mu.Unlock()
		return
	}
	c := &compactRun{ended: make(chan struct{})}
	m.compacts[id] = c
	m.mu.Unlock()
	if !m.goAfter(func() { m.runCompaction(id, c) }) {
		m.mu.Lock()
		m.endCompaction(id, c)
		m.mu.Unlock()
	}
}

// endCompaction takes a run out of m.compacts; m.mu is held.
func (m *Manager) endCompaction(id string, c *compactRun) {
	delete(m.compacts, id)
	close(c.ended)
}

// Compacted waits until no compaction of any sandbox is asked for or
// running: the chains are as short as the records let them be, until
// the next boot, snapshot, delete or stop. (A compaction waits for an
// operation that holds its sandbox, and so does Compacted.)
func (m *Manager) Compacted() {
	for {
		m.mu.Lock()
		var ended chan struct{}
		for _, c := range m.compacts {
			ended = c.ended
			break
		}
		m.mu.Unlock()
		if ended == nil {
			return
		}
		<-ended
	}
}

func (m *Manager) runCompaction(id string, c *compactRun) {
	for round := 0; ; round++ {
		if round > 0 {
			// An operation that waited for the last round takes the
			// sandbox first.
			select {
			case <-m.ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		var ctx context.Context
		for {
			m.mu.Lock()
			if m.closed || m.ctx.Err() != nil {
				m.endCompaction(id, c)
				m.mu.Unlock()
				return
			}
			if m.busy[id] == 0 {
				ctx, c.cancel = context.WithCancel(m.ctx)
				c.active, c.again, c.done = true, false, make(chan struct{})
				m.mu.Unlock()
				break
			}
			m.mu.Unlock()
			select {
			case <-m.ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		err := m.compact(ctx, id)
		if err != nil && ctx.Err() == nil {
			m.log.Warn("disk chain not compacted", "sandbox", id, "err", err)
		}
		m.mu.Lock()
		c.cancel()
		c.active = false
		close(c.done)
		if !c.again {
			m.endCompaction(id, c)
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
	}
}

// yieldCompaction is called by begin, with m.mu held, and returns with it
// held again: it waits for an active compaction of the sandbox to end,
// cancelling it after compactYield. It reports whether it waited.
func (m *Manager) yieldCompaction(id string) bool {
	c := m.compacts[id]
	if c == nil || !c.active {
		return false
	}
	done, cancel := c.done, c.cancel
	m.mu.Unlock()
	select {
	case <-done:
	case <-time.After(compactYield):
		m.log.Info("compaction cancelled for an operation", "sandbox", id)
		cancel()
		<-done
	}
	m.mu.Lock()
	return true
}

// compact moves until the plan is empty.
func (m *Manager) compact(ctx context.Context, id string) error {
	for range maxCompactSteps {
		records, err := m.cfg.Records.List(ctx)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(records, func(r Record) bool { return r.ID == id })
		if i < 0 {
			return nil
		}
		r := records[i]
		mc := m.machineOf(id)
		running := mc != nil && r.State == Running
		stopped := mc == nil && (r.State == Stopped || r.State == Error)
		streamable := r.Machine != nil && r.Machine.Saved == "" && !r.Machine.FreshTop && (running || stopped)
		// The live chain moves onto a merged layer in the record alone
		// where no QEMU reads it (the next boot spells out the record's
		// chain), or with its QEMU where one runs (RebaseDisk).
		movable := running || mc == nil && r.Machine != nil && r.Machine.Process == nil
		plan := planCompaction(records, id, streamable, movable)
		switch {
		case plan.Merge != nil && running:
			err = m.merge(ctx, r, *plan.Merge, mc)
		case plan.Merge != nil:
			err = m.merge(ctx, r, *plan.Merge, nil)
		case plan.Stream != nil && running:
			err = m.streamLive(ctx, mc, r, *plan.Stream)
		case plan.Stream != nil:
			err = m.rebaseStopped(ctx, r, *plan.Stream)
		default:
			return nil
		}
		if err != nil {
			return err
		}
		if err := m.collect(ctx); err != nil {
			return err
		}
	}
	return nil
}

// merge makes the merged layer (outside the records, a work file collect
// leaves alone while it is made), then names it in the snapshots' chains
// and, when the merge moves it, the live chain: in the same update where
// no QEMU runs (mc nil), else after mc's QEMU has switched to it.
func (m *Manager) merge(ctx context.Context, r Record, mg merge, mc *machine) error {
	t0 := time.Now()
	id := newFileID()
	work := m.layerPath(id) + ".tmp"
	m.working(work, true)
	defer m.working(work, false)
	defer os.Remove(work) // gone once renamed
	if err := copyFile(m.layerPath(mg.Top), work); err != nil {
		return err
	}
	old := append(append([]string{mg.Top}, mg.Run...), mg.Below...)
	newBase := r.Machine.BaseDisk
	if len(mg.Below) > 0 {
		newBase = m.layerPath(mg.Below[0])
	}
	if err := m.rebase(ctx, work, m.layerFiles(old[1:], r.Machine.BaseDisk), newBase); err != nil {
		return err
	}
	if err := syncFile(work); err != nil {
		return err
	}
	n, live, moved, err := m.nameMerged(ctx, r.ID, mg, id, work, mc == nil)
	if err != nil {
		return err
	}
	failpoint.Hit(FailpointMergeNamed)
	m.log.Info("snapshot layers merged", "sandbox", r.ID, "snapshot", mg.Snapshot, "layers", 1+len(mg.Run), "into", id, "snapshots", n, "live", moved, "took", time.Since(t0).Round(time.Millisecond))
	switch {
	case moved:
		m.nameInHeader(ctx, r.ID, live, mg, id)
	case mc != nil && live != nil:
		return m.switchLive(ctx, mc, r, mg, live, id)
	}
	return nil
}

// nameMerged renames the work file into the store as layer id and names
// it in the chains of the merge's snapshots, and in the live chain too
// when withLive (no QEMU reads it: moved says it did). It returns how
// many snapshot chains it rewrote and the live chain as it was, when the
// merge moves it and it reads the merged layers as planned (else nil).
func (m *Manager) nameMerged(ctx context.Context, sandboxID string, mg merge, id, work string, withLive bool) (n int, live []string, moved bool, err error) {
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	if err := os.Rename(work, m.layerPath(id)); err != nil {
		return 0, nil, false, err
	}
	if err := syncDir(m.storeDir()); err != nil {
		return 0, nil, false, err
	}
	size := allocated(m.layerPath(id))
	_, err = m.cfg.Records.Update(context.WithoutCancel(ctx), sandboxID, func(rec *Record) error {
		n, live, moved = 0, nil, false
		for i := range rec.Snapshots {
			s := &rec.Snapshots[i]
			if !slices.Contains(mg.Snapshots, s.ID) || s.Status != SnapshotReady || s.Template != nil {
				continue
			}
			if d, ok := mg.apply(s.Disk, id); ok {
				s.Disk = d
				if s.ID == mg.Snapshot {
					// Its own layer is the merged one now: the run's
					// data with its own.
					s.SizeBytes += size - allocated(m.layerPath(mg.Top))
				}
				n++
			}
		}
		if n == 0 || !mg.Live || rec.Machine == nil {
			return nil
		}
		if d, ok := mg.apply(rec.Machine.Disk, id); ok {
			live = slices.Clone(rec.Machine.Disk)
			if withLive && rec.Machine.Process == nil {
				rec.Machine.Disk, moved = d, true
			}
		}
		return nil
	})
	if err != nil {
		return 0, nil, false, err // the file goes with the next collect, if no record names it
	}
	if n == 0 {
		os.Remove(m.layerPath(id)) // named nowhere (storeMu still held)
		return 0, nil, false, fmt.Errorf("merge of %s: the snapshots' chains changed under it", mg.Top)
	}
	return n, live, moved, nil
}

// switchLive moves a running sandbox's live chain onto the merged layer
// id: its QEMU first (RebaseDisk: the merged layer, which the snapshots
// name already, under the layer above Top), then the record, if its live
// chain is still live. Until the record says so the old layers stay
// named, so collect keeps every file the QEMU reads whatever the step a
// crash ends.
func (m *Manager) switchLive(ctx context.Context, mc *machine, r Record, mg merge, live []string, id string) error {
	t0 := time.Now()
	full := m.chain(&Machine{Disk: live, BaseDisk: r.Machine.BaseDisk})
	at := slices.Index(live, mg.Top)
	end := at + 1 + len(mg.Run)
	var drop []string
	for _, l := range full[at:end] {
		drop = append(drop, l.Node)
	}
	next, _ := mg.apply(live, id)
	onto := vmm.Layer{Node: "l" + id, Path: m.layerPath(id)}
	// Not cancelled half-way (QEMU may have switched when a cancel
	// ends the wait for its answer): a reopen takes no time to speak of.
	if err := mc.vm.RebaseDisk(context.WithoutCancel(ctx), full[at-1].Node, onto, full[end].Node, drop); errors.Is(err, vmm.ErrNotDropped) {
		m.log.Warn("disk chain switched to a merged layer, replaced layers left open", "sandbox", r.ID, "err", err)
	} else if err != nil {
		return fmt.Errorf("live chain left on the layers merged into %s: %w", id, err)
	}
	failpoint.Hit(FailpointMergeSwitched)
	moved := false
	if _, err := m.cfg.Records.Update(context.WithoutCancel(ctx), r.ID, func(rec *Record) error {
		moved = false
		if rec.Machine != nil && slices.Equal(rec.Machine.Disk, live) {
			rec.Machine.Disk, moved = next, true
		}
		return nil
	}); err != nil {
		return err
	}
	if !moved {
		return fmt.Errorf("merge of %s: the live chain changed while its QEMU switched", mg.Top)
	}
	m.log.Info("disk chain switched to a merged layer", "sandbox", r.ID, "layer", id, "replaced", len(drop), "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// nameInHeader writes the merged layer's path as the backing file into
// the header of the live chain's top, when the top is the layer above
// the merged one (the record moved the chain; no QEMU runs): only tools
// reading the file alone follow it. A frozen layer's header is left.
func (m *Manager) nameInHeader(ctx context.Context, sandboxID string, live []string, mg merge, id string) {
	if slices.Index(live, mg.Top) != 1 {
		return
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-b", m.layerPath(id), "-F", "qcow2", m.layerPath(live[0])).CombinedOutput()
	if err != nil {
		m.log.Warn("the top's header still names a merged layer", "sandbox", sandboxID, "top", live[0], "err", err, "out", string(bytes.TrimSpace(out)))
	}
}

// streamLive has the running QEMU merge the live chain's dropped layers
// into its top; the record names the short chain only once QEMU says the
// job completed.
func (m *Manager) streamLive(ctx context.Context, mc *machine, r Record, st stream) error {
	t0 := time.Now()
	full := m.chain(&Machine{Disk: st.Chain, BaseDisk: r.Machine.BaseDisk})
	base := full[st.Keep]
	var drop []string
	for _, l := range full[1:st.Keep] {
		drop = append(drop, l.Node)
	}
	if err := mc.vm.StreamDisk(ctx, base, drop); errors.Is(err, vmm.ErrNotDropped) {
		// The top reads the short chain: the record says so; the
		// files stay open until QEMU ends.
		m.log.Warn("disk chain streamed, merged layers left open", "sandbox", r.ID, "err", err)
	} else if err != nil {
		return err
	}
	if err := m.nameLive(ctx, r.ID, st); err != nil {
		return err
	}
	m.log.Info("disk chain streamed", "sandbox", r.ID, "merged", st.Keep-1, "layers", len(st.Result()), "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// rebaseStopped merges the live chain's dropped layers into the top of a
// sandbox no QEMU runs for (qemu-img rebase, safe mode).
func (m *Manager) rebaseStopped(ctx context.Context, r Record, st stream) error {
	t0 := time.Now()
	newBase := r.Machine.BaseDisk
	if st.Keep < len(st.Chain) {
		newBase = m.layerPath(st.Chain[st.Keep])
	}
	if err := m.rebase(ctx, m.layerPath(st.Chain[0]), m.layerFiles(st.Chain[1:], r.Machine.BaseDisk), newBase); err != nil {
		return err
	}
	if err := syncFile(m.layerPath(st.Chain[0])); err != nil {
		return err
	}
	if err := m.nameLive(ctx, r.ID, st); err != nil {
		return err
	}
	m.log.Info("disk chain rebased", "sandbox", r.ID, "merged", st.Keep-1, "layers", len(st.Result()), "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// nameLive records the stream's short chain, if the live chain is still
// the one planned.
func (m *Manager) nameLive(ctx context.Context, id string, st stream) error {
	_, err := m.cfg.Records.Update(context.WithoutCancel(ctx), id, func(rec *Record) error {
		if rec.Machine != nil && slices.Equal(rec.Machine.Disk, st.Chain) {
			rec.Machine.Disk = st.Result()
		}
		return nil
	})
	return err
}

// layerFiles are the files of a chain of store layers over base.
func (m *Manager) layerFiles(layers []string, base string) []string {
	files := make([]string, 0, len(layers)+1)
	for _, l := range layers {
		files = append(files, m.layerPath(l))
	}
	return append(files, base)
}

// rebase makes file read the same disk over newBase as it does over
// below (its backing chain, top first, every one qcow2): qemu-img rebase
// in safe mode copies into it what differs. The old chain is spelled
// out, as QEMU gets it, not taken from the backing names in the files.
func (m *Manager) rebase(ctx context.Context, file string, below []string, newBase string) error {
	spec, err := rebaseSpec(file, below)
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "rebase", "-q", "-b", newBase, "-F", "qcow2", spec).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img rebase: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// rebaseSpec is the json: description of file over the chain below (top
// first), every layer qcow2. Its length grows with the chain's; the
// --image-opts form it replaced spelled each layer's options with a
// prefix as long as its depth ("backing.backing.…"), which grew with the
// chain's square and passed the kernel's 128 KiB bound on one argument
// (E2BIG) past a hundred-odd layers: a chain that had grown long once
// could never be compacted again.
func rebaseSpec(file string, below []string) (string, error) {
	var node map[string]any
	all := append([]string{file}, below...)
	for i := len(all) - 1; i >= 0; i-- {
		n := map[string]any{"driver": "qcow2", "file": map[string]any{"driver": "file", "filename": all[i]}}
		if node != nil {
			n["backing"] = node
		}
		node = n
	}
	b, err := json.Marshal(node)
	if err != nil {
		return "", err
	}
	return "json:" + string(b), nil
}

// working marks a work file of the store as in use (collect leaves it).
func (m *Manager) working(path string, on bool) {
	if on {
		m.leases.set(leaseWork, path, 0)
	} else {
		m.leases.end(leaseWork, path)
	}
}

func (m *Manager) isWorking(path string) bool { return m.leases.has(leaseWork, path) }

// copyFile copies a store layer into a new file (copy_file_range: shared
// blocks where the filesystem can).
func copyFile(from, to string) error {
	src, err := os.OpenFile(from, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return errors.Join(dst.Sync(), dst.Close())
}
