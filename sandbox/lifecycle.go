package sandbox

import (
	"context"
	"errors"
	"net/http"
	"os"
	"slices"
	"time"

	"strata/internal/failpoint"
	"strata/internal/fault"
	"strata/vmm"
)

// Create records r (in state creating, with a uid of its own) and boots
// it in the background. r carries the id, account, name and size.
func (m *Manager) Create(ctx context.Context, r Record) (Record, error) {
	if taken, ok, err := m.takePooled(ctx, r); ok {
		return taken, err
	}
	return giveWay(ctx, m, func() (Record, error) { return m.bootNew(ctx, r) })
}

// bootNew is Create that boots: a new sandbox from the image.
func (m *Manager) bootNew(ctx context.Context, r Record) (Record, error) {
	if err := m.checkStorage(layerBytes); err != nil {
		return Record{}, err
	}
	if err := m.holdDisk(ctx, r.ID, r.DiskGiB, ""); err != nil {
		return Record{}, err
	}
	created, err := m.create(ctx, r, Machine{BaseDisk: m.cfg.Image.Disk, Image: m.cfg.Image.Key})
	if err != nil {
		m.unreserve(r.ID)
	}
	return created, err
}

// create records r with mach (given a uid of its own) and boots it in
// the background.
func (m *Manager) create(ctx context.Context, r Record, mach Machine) (Record, error) {
	m.creating.Lock()
	defer m.creating.Unlock()
	uid, err := m.freeUID(ctx)
	if err != nil {
		return Record{}, err
	}
	r.State = Creating
	mach.Uid, mach.Gid = uid, uid
	r.Machine = &mach
	done, err := m.begin(r.ID)
	if err != nil {
		return Record{}, err
	}
	if err := m.reserve(ctx, r.ID, r.MemoryMiB); err != nil {
		done()
		return Record{}, err
	}
	if err := m.cfg.Records.Insert(ctx, r); err != nil {
		m.unreserve(r.ID)
		done()
		return Record{}, err
	}
	m.log.Info("sandbox creating", "sandbox", r.ID, "memory_mib", r.MemoryMiB, "vcpus", r.VCPUs, "disk_gib", r.DiskGiB, "uid", uid, "load", mach.Saved != "")
	m.background(r.ID, done, func(ctx context.Context) { m.boot(ctx, r.ID, Creating) })
	return r, nil
}

// Start boots a stopped sandbox, or one in error, from its disk: a cold
// boot. A sandbox already creating or running is returned as it is.
func (m *Manager) Start(ctx context.Context, id string) (Record, error) {
	return giveWay(ctx, m, func() (Record, error) { return m.start(ctx, id) })
}

func (m *Manager) start(ctx context.Context, id string) (Record, error) {
	done, err := m.begin(id)
	if err != nil {
		return Record{}, err
	}
	// The disk is held once the operation is this one's (begin): a
	// refused begin must not drop another boot's hold.
	if r, err := m.cfg.Records.Get(ctx, id); err == nil && r.Machine != nil && m.machineOf(id) == nil && (r.State == Stopped || r.State == Error) {
		if err := m.holdDisk(ctx, id, r.DiskGiB, topOf(r)); err != nil {
			done()
			return Record{}, err
		}
	}
	return m.bootAs(ctx, id, done, Creating, func(r *Record) (bool, error) {
		switch {
		case r.Machine == nil:
			return false, ErrNotAMachine
		case r.State == Running || r.State == Creating || m.machineOf(id) != nil:
			return false, nil
		case r.State != Stopped && r.State != Error:
			return false, ErrWrongState.With("state", string(r.State))
		}
		// A start is a cold boot from the disk, whatever memory was
		// saved (an error may have come from loading it).
		r.Error, r.Machine.Saved, r.Machine.LoadDisk = "", "", nil
		r.Machine.dropRAM()
		r.Machine.FromTemplate = nil
		return true, nil
	})
}

// bootAs records a boot that allow lets go ahead (false: the sandbox is
// already where the boot leads, or on its way), in state via, with the
// memory it needs reserved, and runs it in the background. The record is
// written in the registry's transaction, so allow may look at m.live
// (lock order: registry, then m.mu).
func (m *Manager) bootAs(ctx context.Context, id string, done func(), via State, allow func(*Record) (bool, error)) (Record, error) {
	boots := false
	r, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
		ok, err := allow(r)
		if err != nil || !ok {
			return err
		}
		if err := m.reserve(ctx, id, r.MemoryMiB); err != nil {
			return err
		}
		r.State, boots = via, true
		return nil
	})
	if err != nil || !boots {
		m.unreserve(id) // none, or one a failed write left
		done()
		return r, err
	}
	m.log.Info("sandbox booting", "sandbox", id, "as", via, "load", r.Machine.Saved != "")
	m.background(id, done, func(ctx context.Context) { m.boot(ctx, id, via) })
	return r, nil
}

// Pause saves a running sandbox's memory to the host's store and ends its
// QEMU, freeing the host's memory: 202-style, the record says pausing
// until it is paused. Resume loads it back, processes as they were. A
// paused sandbox is returned as it is.
func (m *Manager) Pause(ctx context.Context, id string) (Record, error) {
	// The store must hold the guest's memory: refused now, not after a
	// 202 that a failed save would take back.
	r, err := m.cfg.Records.Get(ctx, id)
	if err != nil {
		return Record{}, err
	}
	if r.Machine != nil && r.State == Running {
		if err := m.checkStorage(int64(r.MemoryMiB) << 20); err != nil {
			return Record{}, err
		}
	}
	return m.transition(ctx, id, Running, Pausing, Paused, m.saveAndQuit)
}

// saveAndQuit writes the guest's memory to a new state, names it in the
// record (the commit point: from there the sandbox's memory is the file),
// and ends QEMU. Before the commit a failure leaves the guest running.
// The store's lock is held only to make the state file, which is claimed
// until the record names it: a collection never waits for the save.
func (m *Manager) saveAndQuit(ctx context.Context, mc *machine) error {
	m.storeMu.RLock()
	sid, f, err := m.newState()
	err = m.storageFault(err)
	release := func() {}
	if err == nil {
		release = m.claimFile(sid + stateExt)
	}
	m.storeMu.RUnlock()
	if err != nil {
		return err
	}
	defer release()
	defer f.Close()
	st, err := mc.vm.Save(ctx, f, vmm.SaveOptions{})
	if err == nil {
		err = f.Sync()
	}
	failpoint.Hit(FailpointPauseSaved)
	if err == nil {
		_, err = m.cfg.Records.Update(ctx, mc.id, func(r *Record) error {
			// The whole memory is in the state now: the next boot needs
			// no template.
			r.Machine.Saved = sid
			r.Machine.dropRAM()
			r.Machine.LoadDisk = slices.Clone(r.Machine.Disk)
			return nil
		})
	}
	if err != nil {
		// The save stopped the guest; it runs on as if never paused.
		mc.vm.Resume(context.WithoutCancel(ctx))
		os.Remove(m.statePath(sid))
		return m.saveFault(err, int64(mc.memoryMiB)<<20)
	}
	m.log.Debug("sandbox memory saved", "sandbox", mc.id, "took", st.Total.Round(time.Millisecond), "bytes", allocated(m.statePath(sid)))
	mc.expectExit()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := mc.vm.Quit(qctx); err != nil {
		mc.vm.Kill()
	}
	m.teardown(mc.id)
	return nil
}

// Resume brings a paused sandbox back: from its saved memory (a pause
// that freed it), or by starting the CPUs of a QEMU that kept it.
func (m *Manager) Resume(ctx context.Context, id string) (Record, error) {
	return giveWay(ctx, m, func() (Record, error) { return m.resume(ctx, id) })
}

func (m *Manager) resume(ctx context.Context, id string) (Record, error) {
	r, err := m.cfg.Records.Get(ctx, id)
	if err != nil {
		return Record{}, err
	}
	if r.Machine == nil || r.Machine.Saved == "" || r.State != Paused {
		return m.transition(ctx, id, Paused, Resuming, Running, func(ctx context.Context, mc *machine) error { return mc.vm.Resume(ctx) })
	}
	// The load runs on a new top (loadTop).
	if err := m.checkStorage(layerBytes); err != nil {
		return Record{}, err
	}
	done, err := m.begin(id)
	if err != nil {
		return Record{}, err
	}
	// A pause template still being made is not waited for.
	m.stopPauseTemplate(id, false)
	return m.bootAs(ctx, id, done, Resuming, func(r *Record) (bool, error) {
		switch {
		case r.State == Running:
			return false, nil
		case r.State != Paused || r.Machine.Saved == "":
			return false, ErrWrongState.With("state", string(r.State))
		}
		if t := r.Machine.savedTemplate(); t != nil && m.haveFiles(m.ramPath(t.RAM, t.RAMOffset), m.statePath(t.State)) {
			// Through the pause's template, as a fork: the paused
			// state's RAM mapped where it is, its devices alone loaded.
			// SavedTemplate stays, for a failure to undo (unmapResume).
			r.Machine.Saved = t.State
			r.Machine.RAM, r.Machine.RAMGid, r.Machine.RAMOffset = t.RAM, t.Gid, t.RAMOffset
		} else {
			r.Machine.SavedTemplate = nil
		}
		return true, nil
	})
}

func (m *Manager) transition(ctx context.Context, id string, from, via, to State, do func(context.Context, *machine) error) (Record, error) {
	done, err := m.begin(id)
	if err != nil {
		return Record{}, err
	}
	r, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
		switch {
		case r.Machine == nil:
			return ErrNotAMachine
		case r.State == to:
			return nil
		case r.State != from:
			return ErrNotRunning.With("state", string(r.State))
		}
		r.State = via
		return nil
	})
	if err != nil || r.State == to {
		done()
		return r, err
	}
	m.background(id, done, func(ctx context.Context) {
		mc := m.machineOf(id)
		if mc == nil {
			m.setState(id, Error, errUnexpectedExit)
			return
		}
		qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := do(qctx, mc)
		cancel()
		op := map[State]string{Pausing: "pause", Resuming: "resume"}[via]
		if err != nil {
			// Answered 202 already: the record says why it is back.
			m.log.Error("sandbox "+string(via)+" failed", "sandbox", id, "err", err)
			failed := &OpError{Operation: op, Message: "the operation failed on the host; the sandbox is as it was", At: time.Now().UTC()}
			if fe := fault.As(err); fe != nil {
				failed.Code, failed.Message = fe.Code, fe.Message
			}
			m.setStateWith(id, from, "", func(r *Record) { r.LastError = failed }, via)
			return
		}
		m.setStateWith(id, to, "", func(r *Record) {
			if r.LastError != nil && r.LastError.Operation == op {
				r.LastError = nil
			}
		}, via)
		m.log.Info("sandbox "+string(to), "sandbox", id)
		if to == Paused {
			m.pauseTemplateLater(id)
		}
	})
	return r, nil
}

// Stop shuts a sandbox down cleanly: guestd syncs, init unmounts and
// powers off; QEMU is killed if it has not exited within StopTimeout.
func (m *Manager) Stop(ctx context.Context, id string) (Record, error) {
	done, err := m.begin(id)
	if err != nil {
		return Record{}, err
	}
	defer done()
	m.stopPauseTemplate(id, false)
	r, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
		switch {
		case r.Machine == nil:
			return ErrNotAMachine
		case r.State == Stopped:
			return nil
		case r.State == Destroying || r.State == Destroyed:
			return ErrWrongState.With("state", string(r.State))
		}
		r.State = Stopping
		// A stopped sandbox boots cold: memory a pause saved goes.
		r.Machine.Saved, r.Machine.FromTemplate, r.Machine.SavedTemplate = "", nil, nil
		r.Machine.dropRAM()
		r.Machine.LoadDisk = nil
		return nil
	})
	if err != nil || r.State == Stopped {
		return r, err
	}
	m.shutdown(id)
	r, err = m.setState(id, Stopped, "", Stopping)
	if cerr := m.collect(ctx); cerr != nil {
		m.log.Warn("store not collected after a stop", "sandbox", id, "err", cerr)
	}
	m.compactLater(id) // the disk a pause saved may have gone
	return r, err
}

// shutdown ends the sandbox's QEMU, cleanly if it can.
func (m *Manager) shutdown(id string) {
	mc := m.machineOf(id)
	if mc == nil {
		return
	}
	mc.expectExit()
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.StopTimeout)
	defer cancel()
	if running, err := mc.vm.Running(ctx); err == nil && !running {
		mc.vm.Resume(ctx)
	}
	clean := m.askShutdown(ctx, mc) == nil
	select {
	case <-mc.vm.Done():
	case <-ctx.Done():
		clean = false
		mc.vm.Kill()
		<-mc.vm.Done()
	}
	m.teardown(id)
	m.log.Info("sandbox stopped", "sandbox", id, "clean", clean, "took", time.Since(t0).Round(time.Millisecond))
}

func (m *Manager) askShutdown(ctx context.Context, mc *machine) error {
	_, err := guestCall(ctx, mc, http.MethodPost, "/v1/shutdown", nil)
	return err
}

// teardown kills the sandbox's QEMU if it still runs and forgets it.
func (m *Manager) teardown(id string) {
	m.mu.Lock()
	mc := m.live[id]
	delete(m.live, id)
	m.mu.Unlock()
	if mc == nil {
		return
	}
	mc.expectExit()
	mc.vm.Kill()
	<-mc.vm.Done()
	mc.guestLn.Close()
	mc.ch.Close()
	mc.vm.Close()
}

// Delete ends the sandbox's QEMU, deletes its disk and run directory, and
// then its record.
func (m *Manager) Delete(ctx context.Context, id string) error {
	return m.deleteIf(ctx, id, func(*Record) error { return nil })
}

// deleteIf is Delete of a sandbox whose record check lets it, checked in
// the transaction that marks it destroying.
func (m *Manager) deleteIf(ctx context.Context, id string, check func(*Record) error) error {
	done, err := m.begin(id)
	if errors.Is(err, ErrInProgress) {
		// A boot, pause or resume in the background gives way to a
		// delete; a stop or another delete (in the foreground) does not.
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		m.cancelRunning(wctx, id)
		cancel()
		done, err = m.begin(id)
	}
	if err != nil {
		return err
	}
	defer done()
	m.stopPauseTemplate(id, false)
	if _, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
		if r.Machine == nil {
			return ErrNotAMachine
		}
		if err := check(r); err != nil {
			return err
		}
		r.State = Destroying
		return nil
	}); err != nil {
		return err
	}
	// Recorded as destroying: the rest runs to its end even if the
	// caller hangs up.
	return m.destroy(context.WithoutCancel(ctx), id)
}

func (m *Manager) destroy(ctx context.Context, id string) error {
	m.teardown(id)
	m.setForkAheadStopped(id, false)
	if err := os.RemoveAll(m.dir(id)); err != nil {
		return err
	}
	if err := syncDir(m.cfg.Dir); err != nil {
		return err
	}
	if err := m.cfg.Records.Delete(ctx, id); err != nil {
		return err
	}
	m.log.Info("sandbox destroyed", "sandbox", id)
	// Its disk and snapshots go, except what forks still name.
	if err := m.collect(ctx); err != nil {
		m.log.Warn("store not collected after a delete", "sandbox", id, "err", err)
	}
	return nil
}

// setState writes a final state (and its error sentence) and returns the
// record; with from given, only over one of those states (a watcher that
// saw the QEMU die has written error meanwhile: that stands). A running
// QEMU's process stays recorded; a stopped one's is dropped. The
// operation's busy mark is released in the same transaction, so that a
// client that reads the final state can act on it at once.
//
// Lock order: the registry's transaction, then m.mu; never the reverse
// (nothing calls Records while holding m.mu).
func (m *Manager) setState(id string, s State, sentence string, from ...State) (Record, error) {
	return m.setStateWith(id, s, sentence, nil, from...)
}

// setStateWith is setState that also applies edit (when not nil) to the
// record it moves.
func (m *Manager) setStateWith(id string, s State, sentence string, edit func(*Record), from ...State) (Record, error) {
	r, err := m.cfg.Records.Update(context.Background(), id, func(r *Record) error {
		m.mu.Lock()
		delete(m.busy, id)
		m.mu.Unlock()
		if len(from) > 0 && !slices.Contains(from, r.State) {
			m.log.Info("sandbox state kept", "sandbox", id, "state", r.State, "not", s)
			return nil
		}
		r.State, r.Error = s, sentence
		if edit != nil {
			edit(r)
		}
		if r.Machine != nil && (s == Stopped || s == Error || s == Paused && r.Machine.Saved != "") {
			// No QEMU runs for it (a pause that saved its memory
			// ended its QEMU).
			r.Machine.Process = nil
		}
		return nil
	})
	if err != nil {
		m.log.Error("sandbox state not recorded", "sandbox", id, "state", s, "err", err)
	}
	return r, err
}
