package sandbox

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"strata/vmm"
)

// Recover adopts the QEMUs an earlier process left running, kills QEMUs
// of this state directory that no record claims, and then settles the
// transitions the earlier process left half-done. A sandbox that cannot
// be settled is put in error; it does not keep the others, or the host
// service, from starting.
func (m *Manager) Recover(ctx context.Context) error {
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return err
	}
	for _, r := range records {
		if r.Machine != nil {
			if err := m.adoptLegacyDisk(ctx, r); err != nil {
				m.log.Error("sandbox disk not moved into the store", "sandbox", r.ID, "err", err)
			}
		}
	}
	if records, err = m.cfg.Records.List(ctx); err != nil {
		return err
	}
	// Adopt first: whatever is adopted is claimed, and only then are the
	// unclaimed QEMUs killed, before any boot below starts a new one.
	claimed := map[int]bool{}
	adopted := map[string]vmm.Machine{}
	for _, r := range records {
		if r.Machine == nil || r.Machine.Process == nil {
			continue
		}
		p := r.Machine.Process
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		vm, err := m.cfg.Driver.Attach(actx, m.vmConfig(r), *p)
		cancel()
		if err != nil {
			m.log.Warn("sandbox's QEMU is gone", "sandbox", r.ID, "err", err)
			continue
		}
		claimed[p.Pid] = true
		adopted[r.ID] = vm
	}
	m.killStrays(claimed)
	// The directories of template QEMUs made ahead that a crash left
	// (their QEMUs were strays).
	if dirs, err := filepath.Glob(filepath.Join(m.cfg.Dir, "*"+templateDirSuffix)); err == nil {
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	for _, r := range records {
		m.failUnfinished(ctx, r, adopted[r.ID])
		m.failTorn(ctx, r)
		m.dropUnfinishedTemplates(ctx, r)
		m.dropUnfinishedPauseTemplate(ctx, r)
	}
	for _, r := range records {
		if r.Machine == nil {
			continue
		}
		if err := m.settle(ctx, r, adopted[r.ID], m.vmConfig(r)); err != nil {
			m.log.Error("sandbox could not be settled", "sandbox", r.ID, "err", err)
			m.setState(r.ID, Error, errStartFailedOnHost)
		}
	}
	if err := m.collect(ctx); err != nil {
		m.log.Error("store not collected", "err", err)
	}
	// Chains left long (by an earlier hostproxy, or a compaction a stop
	// interrupted) are shortened in the background.
	for _, r := range records {
		if r.Machine != nil {
			m.compactLater(r.ID)
		}
	}
	m.poolLater()
	// Those left are dropped, whatever Config.ForksAhead says: no
	// snapshot wants one yet.
	m.goAfter(func() { m.dropForksAhead(m.ctx) })
	return ctx.Err()
}

// dropUnfinishedTemplates forgets the templates a crash left half-made
// (their files are collected); the next fork makes them again.
func (m *Manager) dropUnfinishedTemplates(ctx context.Context, r Record) {
	if !slices.ContainsFunc(r.Snapshots, func(s Snapshot) bool { return s.Template != nil && s.Template.Building }) {
		return
	}
	for _, s := range r.Snapshots {
		if t := s.Template; t != nil && t.Building && t.RAMOffset > 0 {
			// The snapshot's state may have been given the template's
			// group already: root's alone again.
			p := m.ramPath(t.RAM, t.RAMOffset)
			if err := errors.Join(os.Lchown(p, 0, 0), os.Chmod(p, 0o600)); err != nil && !errors.Is(err, os.ErrNotExist) {
				m.log.Warn("a dropped template's group stays on the snapshot's state", "sandbox", r.ID, "snapshot", s.ID, "err", err)
			}
		}
	}
	m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		for i := range rec.Snapshots {
			if t := rec.Snapshots[i].Template; t != nil && t.Building {
				rec.Snapshots[i].Template = nil
			}
		}
		return nil
	})
}

// failTorn fails the ready snapshots whose files had not reached the disk
// when the host went down (a boot id not this boot's), and writes back
// the others' (a restart of the host service only).
func (m *Manager) failTorn(ctx context.Context, r Record) {
	boot := bootID()
	var torn []string
	for _, s := range r.Snapshots {
		switch {
		case s.Unsynced == "" || s.Status != SnapshotReady:
		case s.Unsynced == boot:
			m.syncLater(r.ID, s)
		default:
			torn = append(torn, s.ID)
		}
	}
	if len(torn) == 0 {
		return
	}
	m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		for i := range rec.Snapshots {
			if s := &rec.Snapshots[i]; slices.Contains(torn, s.ID) {
				s.Status, s.State, s.Disk, s.SizeBytes, s.Template, s.Unsynced = SnapshotFailed, "", nil, 0, nil, ""
				m.log.Warn("snapshot not on disk when the host went down: failed", "sandbox", r.ID, "snapshot", s.ID)
			}
		}
		return nil
	})
}

// failUnfinished marks the snapshots a crash interrupted as failed (their
// state may be half-written; their files are collected) and lets a guest
// the save had stopped run again. The sandbox's disk needs nothing: its
// record names the new top from before the save began (snapshot).
//
// A restore's automatic snapshot whose memory was being written in the
// background (saveLater) is the state the restore replaced, and it is
// never lost: its disk is frozen (the sandbox's chain no longer names
// it), so it is kept as a disk-only snapshot (keepDisk).
func (m *Manager) failUnfinished(ctx context.Context, r Record, vm vmm.Machine) {
	for _, s := range r.Snapshots {
		if s.Status == SnapshotProcessing && replaced(r, s) {
			m.keepDisk(ctx, r.ID, s.ID, "", memoryLost(nil))
		}
	}
	if rr, err := m.cfg.Records.Get(ctx, r.ID); err == nil {
		r = rr
	}
	unfinished := false
	for _, s := range r.Snapshots {
		unfinished = unfinished || s.Status == SnapshotProcessing
	}
	if !unfinished {
		return
	}
	if vm != nil {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := vm.CancelSave(qctx); err != nil {
			m.log.Warn("interrupted save not cancelled", "sandbox", r.ID, "err", err)
		}
		if r.State == Running {
			if err := vm.Resume(qctx); err != nil {
				m.log.Warn("guest stopped by an interrupted save not resumed", "sandbox", r.ID, "err", err)
			}
		}
		cancel()
	}
	if _, err := m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		for i := range rec.Snapshots {
			if s := &rec.Snapshots[i]; s.Status == SnapshotProcessing {
				s.Status, s.State, s.Disk, s.SizeBytes = SnapshotFailed, "", nil, 0
				m.log.Warn("snapshot interrupted by the host service stopping: failed", "sandbox", r.ID, "snapshot", s.ID)
			}
		}
		return nil
	}); err != nil {
		m.log.Error("interrupted snapshots not recorded as failed", "sandbox", r.ID, "err", err)
	}
}

// settle finishes what a crash interrupted for one sandbox.
func (m *Manager) settle(ctx context.Context, r Record, vm vmm.Machine, cfg vmm.Config) error {
	id := r.ID
	if vm == nil {
		switch r.State {
		case Destroying, Destroyed:
			return m.destroy(ctx, id)
		case Stopping, Stopped:
			_, err := m.setState(id, Stopped, "")
			return err
		case Creating, Resuming:
			if r.State == Resuming && r.Machine.Saved == "" {
				break
			}
			done, err := m.begin(id)
			if err != nil {
				return err
			}
			// The boot was admitted before the crash: its memory is
			// leased again, not admitted again (the boot ends the lease).
			m.leases.set(leaseMemory, id, int64(r.MemoryMiB))
			m.background(id, done, func(ctx context.Context) { m.boot(ctx, id, r.State) })
			return nil
		case Paused:
			if r.Machine.Saved != "" {
				return nil // its memory is in the store
			}
		case Error:
			return nil
		}
		_, err := m.setState(id, Error, errGoneWhileAway)
		return err
	}
	if (r.State == Creating || r.State == Resuming) && r.Machine.Saved != "" {
		// A load the crash interrupted: the QEMU waiting for (or
		// holding half of) the state is of no use; the load starts over.
		vm.Kill()
		<-vm.Done()
		vm.Close()
		return m.settle(ctx, r, nil, cfg)
	}
	mc := m.adopt(id, vm, cfg, r.Machine.Handshake)
	switch r.State {
	case Destroying, Destroyed:
		return m.destroy(ctx, id)
	case Stopping:
		m.shutdown(id)
		_, err := m.setState(id, Stopped, "")
		return err
	case Creating:
		done, err := m.begin(id)
		if err != nil {
			return err
		}
		m.background(id, done, func(ctx context.Context) {
			if err := m.waitGuest(ctx, mc, "health", func(ctx context.Context) error { return guestHealth(ctx, mc) }); err != nil {
				if m.ctx.Err() != nil {
					m.leaveBoot(id, err)
					return
				}
				m.teardown(id)
				if ctx.Err() != nil {
					return // cancelled for a delete
				}
				m.setState(id, Error, errBootFailed, Creating)
				return
			}
			if m.cfg.Booted != nil {
				m.cfg.Booted(ctx, r)
			}
			m.setState(id, Running, "", Creating)
		})
		return nil
	}
	if (r.State == Pausing || r.State == Paused) && r.Machine.Saved != "" {
		// A pause whose memory is saved and named, and whose QEMU had not
		// ended yet: it ends now.
		mc.expectExit()
		m.teardown(id)
		_, err := m.setState(id, Paused, "")
		return err
	}
	// Running, paused, or half-way between: the CPUs say which.
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	running, err := vm.Running(qctx)
	if err == nil && !running && (r.State == Running || r.State == Pausing) {
		// Stopped by a save that the crash interrupted (a snapshot, a
		// restore's automatic one, a pause not yet named): a paused
		// sandbox's memory is never kept in QEMU, so it runs on.
		m.log.Info("guest stopped by an interrupted save: it runs on", "sandbox", id)
		vm.CancelSave(qctx)
		if err = vm.Resume(qctx); err == nil {
			running = true
		}
	}
	cancel()
	if err != nil {
		// One machine that does not answer must not keep hostproxy from
		// starting: it keeps its recorded state.
		m.log.Warn("adopted sandbox's QEMU does not say whether it runs", "sandbox", id, "err", err)
		return nil
	}
	s := Paused
	if running {
		s = Running
	}
	if s != r.State {
		_, err = m.setState(id, s, "")
	}
	m.log.Info("sandbox adopted", "sandbox", id, "state", s, "pid", vm.Process().Pid)
	return err
}

// killStrays kills QEMUs whose command line names a run directory of this
// manager but that no record claims (a crash between starting QEMU and
// recording it), and waits for them to exit, so that none still holds the
// disk a boot is about to open.
func (m *Manager) killStrays(claimed map[int]bool) {
	procs, _ := os.ReadDir("/proc")
	prefix := []byte(m.cfg.Dir + "/")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || claimed[pid] {
			continue
		}
		// The pidfd first: the pid cannot be reused under the check.
		pidfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		// A machine's QEMU runs in its run directory (its command line
		// names no path of the machines directory).
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		cwd, cerr := vmm.RunDirOf(pid)
		if err != nil || cerr != nil || !bytes.Contains(cmdline, []byte("qemu-system")) || !strings.HasPrefix(cwd, string(prefix)) {
			unix.Close(pidfd)
			continue
		}
		m.log.Warn("killing a QEMU that no sandbox record claims", "pid", pid)
		if unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0) == nil {
			unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, 5000)
		}
		unix.Close(pidfd)
	}
}
