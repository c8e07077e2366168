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
func (m *Manager) boot(ctx context.Context, id string, via State) {
	// Once the guest has booted, the host's available memory shows what
	// it takes; until then its reservation stands for it.
	defer m.unreserve(id)
	t0 := time.Now()
	r, err := m.cfg.Records.Get(ctx, id)
	if err != nil {
		m.log.Error("sandbox boot: no record", "sandbox", id, "err", err)
		return
	}
	fail := func(sentence string, err error) {
		if m.ctx.Err() != nil {
			m.leaveBoot(id, err)
			return
		}
		if ctx.Err() != nil {
			// Cancelled for a delete, which takes it from here.
			m.log.Info("sandbox boot cancelled", "sandbox", id)
			m.teardown(id)
			return
		}
		m.log.Error("sandbox boot failed", "sandbox", id, "err", err)
		m.teardown(id)
		m.setState(id, Error, sentence, via)
	}
	if _, err := os.Stat(r.Machine.BaseDisk); err != nil {
		fail(errBaseDiskMissing, err)
		return
	}
	if r, err = m.prepare(ctx, r); err != nil {
		fail(errStartFailedOnHost, err)
		return
	}
	if r.Machine.FromTemplate != nil {
		tr, err := m.startFromTemplate(ctx, r)
		if err != nil {
			fail(errStartFailedOnHost, err)
			return
		}
		if tr.Machine.RAM == "" {
			m.log.Warn("fork loads the snapshot's whole state: no template", "sandbox", id)
		}
		r = tr
	}
	if r.Machine.Saved != "" {
		if r, err = m.loadTop(ctx, r); err != nil {
			fail(errStartFailedOnHost, err)
			return
		}
	}
	cfg := m.vmConfig(r)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	vm, err := m.cfg.Driver.Start(sctx, cfg)
	cancel()
	if err != nil && via == Resuming && r.Machine.SavedTemplate != nil && r.Machine.RAM != "" && ctx.Err() == nil {
		// Through the pause's template, the QEMU did not start (its
		// state lost the group, say): the whole state loads instead.
		m.log.Warn("resume through the pause template failed to start; the whole state loads", "sandbox", id, "err", err)
		if r, err = m.unmapResume(ctx, id); err == nil {
			cfg = m.vmConfig(r)
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			vm, err = m.cfg.Driver.Start(sctx, cfg)
			cancel()
		}
	}
	if err != nil {
		fail(errStartFailedOnHost, err)
		return
	}
	p := vm.Process()
	if _, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
		r.Machine.Process = &p
		r.Machine.Image = m.cfg.Image.Key
		r.Machine.Handshake = true
		return nil
	}); err != nil {
		vm.Kill()
		fail(errStartFailedOnHost, err)
		return
	}
	var loadedIn time.Duration
	if cfg.Incoming {
		if err := m.load(ctx, vm, r.Machine.Saved); err != nil {
			vm.Kill()
			<-vm.Done()
			if via == Resuming && m.ctx.Err() == nil && ctx.Err() == nil {
				// A paused sandbox's memory is kept: resume may be
				// tried again, or a stop drops it.
				m.log.Error("saved memory not loaded; the sandbox stays paused", "sandbox", id, "err", err)
				m.teardown(id)
				if r.Machine.SavedTemplate != nil && r.Machine.RAM != "" {
					m.unmapResume(context.WithoutCancel(ctx), id)
				}
				m.setState(id, Paused, errResumeFailed, Resuming)
				return
			}
			m.dropSaved(id)
			fail(errLoadFailed, err)
			return
		}
	}
	if cfg.Incoming {
		loadedIn = time.Since(t0)
		failpoint.Hit(FailpointBootLoaded)
	}
	mc := m.adopt(id, vm, cfg, true)
	// The credentials go to the guest beside the first call, not after
	// it: calls in flight together on the channel cost one round trip,
	// and the credentials use neither the guest's clock nor its RNG. A
	// cold boot's wait their turn: its guest answers seconds later.
	booted := make(chan error, 1)
	var answeredIn, credentialsIn time.Duration
	// A boot that fails ends the credentials' call rather than wait
	// for it (a guest that never answers would hold it to its timeout).
	bctx, endCredentials := context.WithCancel(ctx)
	defer endCredentials()
	sendCredentials := func() {
		if m.cfg.Booted == nil {
			booted <- nil
			return
		}
		go func() {
			err := m.cfg.Booted(bctx, r)
			credentialsIn = time.Since(t0)
			booted <- err
		}()
	}
	// A loaded guest's first call is its resync, which must come before
	// anything else it is asked: its memory is another moment's (or
	// another sandbox's), and its clock and RNG are told so before it is
	// running. Forks of one snapshot must not run with one RNG state.
	probe, what := func(ctx context.Context) error { return guestHealth(ctx, mc) }, "health"
	if cfg.Incoming {
		probe, what = func(ctx context.Context) error { return m.resync(ctx, mc, r) }, "resync"
		sendCredentials()
	}
	if err := m.waitGuest(ctx, mc, what, probe); err != nil {
		if cfg.Incoming {
			endCredentials()
			<-booted
			err = fmt.Errorf("the guest's clock and RNG were not resynced: %w", err)
		}
		fail(errBootFailed, fmt.Errorf("%w%s", err, consoleTail(cfg.ConsoleLog())))
		return
	}
	answeredIn = time.Since(t0)
	m.log.Debug("guestd answered", "sandbox", id, "after", answeredIn.Round(time.Millisecond), "call", what)
	if !cfg.Incoming {
		sendCredentials()
	} else {
		if _, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
			r.Machine.Saved, r.Machine.LoadDisk, r.Machine.SavedTemplate = "", nil, nil
			return nil
		}); err != nil {
			endCredentials()
			<-booted
			fail(errStartFailedOnHost, err)
			return
		}
		// The state goes unless a snapshot or a fork names it; not on
		// the way to running.
		m.collectLater()
	}
	if err := <-booted; err != nil {
		if ctx.Err() != nil {
			fail(errBootFailed, err)
			return
		}
		m.log.Warn("sandbox booted, but its guest did not take its credentials", "sandbox", id, "err", err)
	}
	m.setState(id, Running, "", via)
	m.compactLater(id)
	if cfg.RAM != nil && cfg.RAM.Path != "" {
		m.warmRAM(cfg.RAM.Path, cfg.RAM.Offset, int64(cfg.MemoryMiB)<<20)
	}
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	m.log.Info("sandbox running", "sandbox", id, "boot", ms(time.Since(t0)), "loaded", cfg.Incoming, "loaded_in", ms(loadedIn),
		"answered_in", ms(answeredIn), "credentials_in", ms(credentialsIn))
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
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-vm.Done():
		case <-m.ctx.Done():
			return
		}
		m.mu.Lock()
		if m.live[id] == mc {
			delete(m.live, id)
		}
		m.mu.Unlock()
		mc.guestLn.Close()
		mc.ch.Close()
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
func (m *Manager) resync(ctx context.Context, mc *machine, r Record) error {
	seed := make([]byte, 64)
	rand.Read(seed)
	req := map[string]any{"time_unix_nano": time.Now().UnixNano(), "seed": seed}
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
