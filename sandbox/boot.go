package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"strata/channel"
	"strata/internal/failpoint"
	"strata/internal/guestclient"
	"strata/vmm"
)

// boot brings a sandbox in state via (creating, or resuming from a pause
// that freed its memory) to running: disk, QEMU, its saved memory if it
// has one, channel, guestd answering, credentials. On failure the sandbox
// is in error and no QEMU of it runs.
//
// The boot is bootSteps, run in order, each logged with its time; the
// first that fails ends it with its step's sentence (bootStep.fail),
// unless it has dealt with its failure itself (errBootEnded).
func (m *Manager) boot(ctx context.Context, id string, via State) {
	// Once the guest has booted, the host's available memory shows what
	// it takes; until then its reservation stands for it.
	defer m.unreserve(id)
	b := &bootRun{m: m, id: id, via: via, t0: time.Now(), booted: make(chan error, 1)}
	var err error
	if b.r, err = m.cfg.Records.Get(ctx, id); err != nil {
		m.log.Error("sandbox boot: no record", "sandbox", id, "err", err)
		return
	}
	// A boot that fails ends the credentials' call rather than wait
	// for it (a guest that never answers would hold it to its timeout).
	var endCredentials context.CancelFunc
	b.bctx, endCredentials = context.WithCancel(ctx)
	defer endCredentials()
	for _, st := range bootSteps() {
		t := time.Now()
		err := st.run(b, ctx)
		m.log.Debug("boot step", "sandbox", id, "step", st.name, "took", time.Since(t).Round(time.Microsecond), "ok", err == nil)
		if err == nil {
			continue
		}
		if b.credentials {
			// Sent beside the guest's first call: ended, and its
			// answer awaited, before the sandbox is failed.
			endCredentials()
			<-b.booted
		}
		if !errors.Is(err, errBootEnded) {
			b.fail(ctx, st.fail, err)
		}
		return
	}
	m.setState(id, Running, "", via)
	m.compactLater(id)
	if b.cfg.RAM != nil && b.cfg.RAM.Path != "" {
		m.warmRAM(b.cfg.RAM.Path, b.cfg.RAM.Offset, int64(b.cfg.MemoryMiB)<<20)
	}
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	m.log.Info("sandbox running", "sandbox", id, "boot", ms(time.Since(b.t0)), "loaded", b.cfg.Incoming, "loaded_in", ms(b.loadedIn),
		"answered_in", ms(b.answeredIn), "credentials_in", ms(b.credentialsIn))
}

// bootStep is one named step of a boot; fail is the sentence the sandbox
// is in error with when the step fails.
type bootStep struct {
	name string
	fail string
	run  func(b *bootRun, ctx context.Context) error
}

// bootSteps are a boot's steps, in order (a function: the steps reach
// boot again through forks made ahead, which a variable could not).
func bootSteps() []bootStep {
	return []bootStep{
		{"base", errBaseDiskMissing, (*bootRun).checkBase},
		{"prepare", errStartFailedOnHost, (*bootRun).prepare},
		{"template", errStartFailedOnHost, (*bootRun).template},
		{"load.top", errStartFailedOnHost, (*bootRun).loadTop},
		{"start", errStartFailedOnHost, (*bootRun).start},
		{"record", errStartFailedOnHost, (*bootRun).record},
		{"load", errLoadFailed, (*bootRun).load},
		{"adopt", errStartFailedOnHost, (*bootRun).adopt},
		{"wait", errBootFailed, (*bootRun).wait},
		{"loaded", errStartFailedOnHost, (*bootRun).loaded},
		{"credentials", errBootFailed, (*bootRun).awaitCredentials},
	}
}

// errBootEnded is a step's error when the step has ended the boot itself
// (a resume whose memory did not load leaves the sandbox paused).
var errBootEnded = errors.New("boot ended by its step")

// bootRun is one boot's state, from step to step.
type bootRun struct {
	m   *Manager
	id  string
	via State
	t0  time.Time
	r   Record
	cfg vmm.Config
	vm  vmm.Machine
	mc  *machine
	// credentials is set once the guest's credentials are on their way
	// (Config.Booted, in bctx); booted has their answer.
	credentials bool
	bctx        context.Context
	booted      chan error
	// What the running line logs.
	loadedIn, answeredIn, credentialsIn time.Duration
}

// fail ends a boot that failed: the sandbox in error with sentence and
// no QEMU, unless the Manager is closing (the next Recover finishes the
// boot) or a delete cancelled it (the delete takes it from here).
func (b *bootRun) fail(ctx context.Context, sentence string, err error) {
	m := b.m
	if m.ctx.Err() != nil {
		m.leaveBoot(b.id, err)
		return
	}
	if ctx.Err() != nil {
		m.log.Info("sandbox boot cancelled", "sandbox", b.id)
		m.teardown(b.id)
		return
	}
	m.log.Error("sandbox boot failed", "sandbox", b.id, "err", err, "console_start", consoleHead(b.cfg))
	m.teardown(b.id)
	m.setState(b.id, Error, sentence, b.via)
}

// checkBase: the image's base disk the sandbox's disk was made over.
func (b *bootRun) checkBase(ctx context.Context) error {
	_, err := os.Stat(b.r.Machine.BaseDisk)
	return err
}

func (b *bootRun) prepare(ctx context.Context) (err error) {
	b.r, err = b.m.prepare(ctx, b.r)
	return err
}

// template: a fork's snapshot's template (made now if it has none), or
// the whole state when there can be none.
func (b *bootRun) template(ctx context.Context) error {
	if b.r.Machine.FromTemplate == nil {
		return nil
	}
	tr, err := b.m.startFromTemplate(ctx, b.r)
	if err != nil {
		return err
	}
	if tr.Machine.RAM == "" {
		b.m.log.Warn("fork loads the snapshot's whole state: no template", "sandbox", b.id)
	}
	b.r = tr
	return nil
}

func (b *bootRun) loadTop(ctx context.Context) (err error) {
	if b.r.Machine.Saved != "" {
		b.r, err = b.m.loadTop(ctx, b.r)
	}
	return err
}

// start starts QEMU. A resume through the pause's template whose QEMU
// did not start (its state lost the group, say) loads the whole state
// instead.
func (b *bootRun) start(ctx context.Context) error {
	m := b.m
	b.cfg = m.vmConfig(b.r)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	vm, err := m.cfg.Driver.Start(sctx, b.cfg)
	cancel()
	if err != nil && b.via == Resuming && b.r.Machine.SavedTemplate != nil && b.r.Machine.RAM != "" && ctx.Err() == nil {
		m.log.Warn("resume through the pause template failed to start; the whole state loads", "sandbox", b.id, "err", err)
		if b.r, err = m.unmapResume(ctx, b.id); err == nil {
			b.cfg = m.vmConfig(b.r)
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			vm, err = m.cfg.Driver.Start(sctx, b.cfg)
			cancel()
		}
	}
	b.vm = vm
	return err
}

// record names the QEMU in the record: from here a restart adopts it.
func (b *bootRun) record(ctx context.Context) error {
	p := b.vm.Process()
	if _, err := b.m.cfg.Records.Update(ctx, b.id, func(r *Record) error {
		r.Machine.Process = &p
		r.Machine.Image = b.m.cfg.Image.Key
		r.Machine.Handshake = true
		return nil
	}); err != nil {
		b.vm.Kill()
		return err
	}
	return nil
}

// load reads the saved memory into a QEMU started to take it. A resume
// whose memory does not load stays paused, its memory kept (it may be
// tried again, or a stop drops it); any other boot drops the state.
func (b *bootRun) load(ctx context.Context) error {
	if !b.cfg.Incoming {
		return nil
	}
	m := b.m
	if err := m.load(ctx, b.vm, b.r.Machine.Saved); err != nil {
		b.vm.Kill()
		<-b.vm.Done()
		if b.via == Resuming && m.ctx.Err() == nil && ctx.Err() == nil {
			m.log.Error("saved memory not loaded; the sandbox stays paused", "sandbox", b.id, "err", err)
			m.teardown(b.id)
			if b.r.Machine.SavedTemplate != nil && b.r.Machine.RAM != "" {
				m.unmapResume(context.WithoutCancel(ctx), b.id)
			}
			m.setState(b.id, Paused, errResumeFailed, Resuming)
			return errBootEnded
		}
		m.dropSaved(b.id)
		return err
	}
	b.loadedIn = time.Since(b.t0)
	failpoint.Hit(FailpointBootLoaded)
	return nil
}

// adopt makes the QEMU the sandbox's live machine (watched, its channel
// dialled).
func (b *bootRun) adopt(ctx context.Context) error {
	b.mc = b.m.adopt(b.id, b.vm, b.cfg, true)
	return nil
}

// sendCredentials sends the guest its credentials (Config.Booted) in the
// background; awaitCredentials takes the answer.
func (b *bootRun) sendCredentials() {
	b.credentials = true
	if b.m.cfg.Booted == nil {
		b.booted <- nil
		return
	}
	go func() {
		err := b.m.cfg.Booted(b.bctx, b.r)
		b.credentialsIn = time.Since(b.t0)
		b.booted <- err
	}()
}

// wait waits for guestd's first answer. A loaded guest's first call is
// its resync, which must come before anything else it is asked: its
// memory is another moment's (or another sandbox's), and its clock and
// RNG are told so before it is running (forks of one snapshot must not
// run with one RNG state). The credentials go to the guest beside that
// first call, not after it: calls in flight together on the channel cost
// one round trip, and the credentials use neither the guest's clock nor
// its RNG. A cold boot's wait their turn: its guest answers seconds
// later.
func (b *bootRun) wait(ctx context.Context) error {
	mc := b.mc
	probe, what := func(ctx context.Context) error { return guestHealth(ctx, mc) }, "health"
	if b.cfg.Incoming {
		// A resume of the sandbox's own pause continues its run; a
		// restore or a fork is another moment's.
		continues := b.via == Resuming
		probe, what = func(ctx context.Context) error { return b.m.resync(ctx, mc, b.r, continues) }, "resync"
		b.sendCredentials()
	}
	if err := b.m.waitGuest(ctx, mc, what, probe); err != nil {
		if b.cfg.Incoming {
			err = fmt.Errorf("the guest's clock and RNG were not resynced: %w", err)
		}
		return fmt.Errorf("%w%s", err, consoleTail(b.cfg.ConsoleLog()))
	}
	b.answeredIn = time.Since(b.t0)
	b.m.log.Debug("guestd answered", "sandbox", b.id, "after", b.answeredIn.Round(time.Millisecond), "call", what)
	if !b.cfg.Incoming {
		b.sendCredentials()
	}
	return nil
}

// loaded forgets the memory a loaded guest came from: the state goes
// unless a snapshot or a fork names it.
func (b *bootRun) loaded(ctx context.Context) error {
	if !b.cfg.Incoming {
		return nil
	}
	if _, err := b.m.cfg.Records.Update(ctx, b.id, func(r *Record) error {
		r.Machine.Saved, r.Machine.LoadDisk, r.Machine.SavedTemplate = "", nil, nil
		return nil
	}); err != nil {
		return err
	}
	b.m.collectLater()
	return nil
}

// awaitCredentials takes the credentials' answer: a guest that did not
// take them still runs (they are owed to it), unless the boot was
// cancelled meanwhile.
func (b *bootRun) awaitCredentials(ctx context.Context) error {
	b.credentials = false
	if err := <-b.booted; err != nil {
		if ctx.Err() != nil {
			return err
		}
		b.m.log.Warn("sandbox booted, but its guest did not take its credentials", "sandbox", b.id, "err", err)
	}
	return nil
}

// unmapResume undoes a resume's choice of the pause template, which did
// not work: the record names the paused state as the memory to load
// again, whole, and forgets the template.
func (m *Manager) unmapResume(ctx context.Context, id string) (Record, error) {
	return m.cfg.Records.Update(ctx, id, func(r *Record) error {
		if t := r.Machine.SavedTemplate; t != nil && r.Machine.RAM == t.RAM && r.Machine.Saved == t.State {
			r.Machine.Saved, r.Machine.SavedTemplate = t.RAM, nil
			r.Machine.dropRAM()
		}
		return nil
	})
}

// loadTop puts a new, empty top over the disk a saved state goes with
// (LoadDisk), unless the current top is one already, never run on: a load
// that starts over after a crash must not find the writes of the guest it
// loaded the first time.
func (m *Manager) loadTop(ctx context.Context, r Record) (Record, error) {
	load := r.Machine.LoadDisk
	if len(load) == 0 {
		load = r.Machine.Disk // recorded before LoadDisk existed
	}
	if r.Machine.FreshTop {
		return m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
			rec.Machine.FreshTop, rec.Machine.LoadDisk = false, slices.Clone(load)
			return nil
		})
	}
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	top, err := m.newLayer(ctx, r.Machine.BaseDisk, load[0], m.diskBytes(r.DiskGiB))
	if err != nil {
		return r, err
	}
	return m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		rec.Machine.Disk = append([]string{top}, load...)
		rec.Machine.LoadDisk = slices.Clone(load)
		return nil
	})
}

// leaveBoot leaves a boot that the Manager's Close interrupted as it is:
// the sandbox stays creating and its QEMU, if it has one, runs on; the
// next Manager's Recover finishes the boot. (Close is a restart of the
// host service, which must never cost a sandbox its boot.)
func (m *Manager) leaveBoot(id string, err error) {
	m.log.Warn("sandbox boot interrupted by the host service stopping; the next start finishes it", "sandbox", id, "err", err)
}

// prepare makes the sandbox's directories and, on the first boot, its
// disk: an empty top layer in the store over the base (a create copies
// nothing). It returns the record as the boot must use it.
func (m *Manager) prepare(ctx context.Context, r Record) (Record, error) {
	uid, gid := int(r.Machine.Uid), int(r.Machine.Gid)
	dir := m.dir(r.ID)
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return r, err
	}
	if err := os.Lchown(dir, 0, 0); err != nil {
		return r, err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return r, err
	}
	run := m.runDir(r.ID)
	if err := os.Mkdir(run, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return r, err
	}
	if err := os.Lchown(run, uid, gid); err != nil {
		return r, err
	}
	// Root's alone; vmm checks it (not a link, root's, 0700) before use.
	if err := os.Mkdir(m.ctlDir(r.ID), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return r, err
	}
	if len(r.Machine.Disk) > 0 {
		return r, nil
	}
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	top, err := m.newLayer(ctx, r.Machine.BaseDisk, "", m.diskBytes(r.DiskGiB))
	if err != nil {
		return r, err
	}
	return m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		if len(rec.Machine.Disk) == 0 {
			rec.Machine.Disk = []string{top}
		}
		return nil
	})
}

// adopt connects the channel of a running QEMU, serves the guest's calls
// and watches for its exit.
func (m *Manager) adopt(id string, vm vmm.Machine, cfg vmm.Config, handshake bool) *machine {
	mc := &machine{id: id, vm: vm, groups: cfg.Groups, memoryMiB: cfg.MemoryMiB}
	mc.ch = channel.Dial(cfg.ChannelSocket(), channel.HostConfig{
		Log:         m.log.With("sandbox", id),
		Plain:       !handshake,
		Heartbeat:   m.cfg.Heartbeat,
		PingTimeout: m.cfg.PingTimeout,
		Stalled: func(ctx context.Context) (bool, error) {
			// A guest whose CPUs are stopped (paused, or being saved)
			// cannot answer; one whose CPUs run should have. One that
			// QEMU stopped on a fault (io-error: its disk found the
			// store full) will not answer either, and nobody will
			// resume it: it counts as not answering, and says why. A
			// failed look is the channel's to count (maxUnsure).
			st, err := vm.State(ctx)
			if err != nil {
				return false, err
			}
			if st.Stuck() {
				mc.stuck.Store(st.Status)
				return true, nil
			}
			mc.stuck.Store("")
			return st.Running, nil
		},
		Answering: func(n uint64, up bool) { m.answering(mc, n, up) },
	})
	mc.guest = guestclient.New(mc.ch.Open, guestCallLimits, guestclient.NewBudget(guestCallBudget))
	mc.guestLn = mc.ch.Listener()
	m.mu.Lock()
	m.live[id] = mc
	m.mu.Unlock()
	if m.cfg.ServeGuest != nil {
		go m.cfg.ServeGuest(id, mc.guestLn)
	}
	m.startNetwork(mc, cfg.NetSocket())
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-vm.Done():
		case <-m.ctx.Done():
			if n := mc.network(); n != nil {
				n.Close()
			}
			return
		}
		m.mu.Lock()
		if m.live[id] == mc {
			delete(m.live, id)
		}
		m.mu.Unlock()
		mc.guestLn.Close()
		mc.ch.Close()
		if n := mc.network(); n != nil {
			n.Close()
		}
		vm.Close()
		if mc.exitExpected() {
			return
		}
		m.log.Error("sandbox's QEMU exited unexpectedly", "sandbox", id, "console", consoleTail(cfg.ConsoleLog()))
		m.cfg.Records.Update(context.Background(), id, func(r *Record) error {
			if r.State == Destroying || r.State == Stopped {
				return nil
			}
			r.State, r.Error = Error, errUnexpectedExit
			if r.Machine != nil {
				r.Machine.Process = nil
			}
			return nil
		})
	}()
	return mc
}

// waitGuest waits for guestd's first answer through the channel: probe
// (its health route, or a loaded guest's resync) is sent at once and
// answered when guestd serves, and sent again while nothing answers. An
// answer that refuses (guestd's error) ends the wait with it.
func (m *Manager) waitGuest(ctx context.Context, mc *machine, what string, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	for {
		attempt, acancel := context.WithTimeout(ctx, 15*time.Second)
		err := probe(attempt)
		acancel()
		if err == nil {
			return nil
		}
		var refused *guestRefused
		if errors.As(err, &refused) {
			return fmt.Errorf("guestd refused its %s: %w", what, err)
		}
		m.log.Debug("guestd not answering yet", "sandbox", mc.id, "call", what, "err", err)
		select {
		case <-mc.vm.Done():
			return errors.New("QEMU exited during the boot")
		case <-ctx.Done():
			return fmt.Errorf("guestd did not answer its %s within %v: %w", what, m.cfg.BootTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// warmRAM reads the RAM a running machine maps from a file (a snapshot's
// state, a pause's, a template's RAM file) into the page cache, holes
// included, in the background. The machine reads only the pages it
// touches; but a save of its memory (a snapshot, a pause) reads every
// page, and a page not in the cache then waits on the disk, or, in a
// hole (a page the guest never wrote), on a page the kernel allocates and
// zeroes under the save: the pause of a 1 GiB guest took 1.5 to 3 s, and
// 0.8 s with the file cached. The pages are the page cache's, shared by
// every machine that maps the file, and the first to go when the host
// needs memory. (FADV_WILLNEED reads the data alone, not the holes.)
func (m *Manager) warmRAM(path string, offset, size int64) {
	m.mu.Lock()
	_, done := m.warmed[path]
	m.warmed[path] = struct{}{}
	others := slices.Collect(maps.Keys(m.warmed))
	m.mu.Unlock()
	if done {
		return // the forks of one snapshot read it once
	}
	for _, p := range others {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			m.mu.Lock()
			delete(m.warmed, p) // collected
			m.mu.Unlock()
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return
	}
	if !m.goAfter(func() {
		defer f.Close()
		t0 := time.Now()
		const chunk = 64 << 20
		for off := int64(0); off < size && m.ctx.Err() == nil; off += chunk {
			b, err := unix.Mmap(int(f.Fd()), offset+off, int(min(chunk, size-off)), unix.PROT_READ, unix.MAP_SHARED)
			if err == nil {
				err = unix.Madvise(b, unix.MADV_POPULATE_READ)
				unix.Munmap(b)
			}
			if err != nil {
				m.log.Debug("RAM file not read into the page cache", "path", path, "err", err)
				return
			}
		}
		m.log.Debug("RAM file in the page cache", "path", path, "bytes", size, "took", time.Since(t0).Round(time.Millisecond))
	}) {
		f.Close()
	}
}

// ramFile is the template RAM a machine maps, if any.
func (m *Manager) ramFile(mach *Machine) *vmm.RAMFile {
	if mach.RAM == "" {
		return nil
	}
	return &vmm.RAMFile{Path: m.ramPath(mach.RAM, mach.RAMOffset), Offset: mach.RAMOffset}
}

func ramGroups(mach *Machine) []uint32 {
	if mach.RAM == "" {
		return nil
	}
	return []uint32{mach.RAMGid}
}

func hostname(r Record) string {
	if r.Name != "" {
		return r.Name
	}
	return r.ID
}

// load reads a saved memory state into a QEMU started with Incoming and
// runs it.
func (m *Manager) load(ctx context.Context, vm vmm.Machine, state string) error {
	f, err := os.Open(m.statePath(state))
	if err != nil {
		return err
	}
	defer f.Close()
	lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := vm.Load(lctx, f); err != nil {
		return err
	}
	return vm.Resume(lctx)
}

// dropSaved forgets the memory a sandbox was to load (it did not load).
func (m *Manager) dropSaved(id string) {
	m.cfg.Records.Update(context.Background(), id, func(r *Record) error {
		r.Machine.Saved, r.Machine.LoadDisk = "", nil
		return nil
	})
}

// resync tells guestd that its memory is another moment's: it sets the
// guest's clock, reseeds its RNG (a fork's siblings share its state) and
// takes the sandbox's hostname.
func (m *Manager) resync(ctx context.Context, mc *machine, r Record, continues bool) error {
	seed := make([]byte, 64)
	rand.Read(seed)
	req := map[string]any{"time_unix_nano": time.Now().UnixNano(), "seed": seed}
	if continues {
		// Its own run goes on (a resume of its pause, a heal): its
		// sessions keep their generation, and a client attached before
		// attaches again where it was.
		req["continues"] = true
	}
	if h := hostname(r); hostLabel(h) {
		req["hostname"] = h // a fork takes its own name
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = guestCall(rctx, mc, http.MethodPost, "/v1/resync", body)
	if err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("guestd did not answer the resync: %w", err)
	}
	return err
}

// hostLabel tells whether h is a hostname guestd takes (one RFC 1123
// label): sandbox names always are; configured ids may not be.
func hostLabel(h string) bool {
	if len(h) == 0 || len(h) > 63 || h[0] == '-' || h[len(h)-1] == '-' {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
