package sandbox

import (
	"context"
	"errors"
	"os"
	"time"

	"strata/internal/failpoint"
)

// Pause templates: a pause writes the guest's whole memory as a mapped-ram
// state, and a resume that loaded it read every page the guest had
// written (hundreds of MiB) before the guest ran again. As soon as a
// sandbox is paused, its state is made a template in the background, as a
// memory snapshot's is (template.go): a QEMU that never runs loads the
// state into RAM in memory and saves the devices alone. A resume then
// maps the state's RAM where it is, copy-on-write, and loads only the
// devices, as a fork does; the state stays in the store while that QEMU
// runs (Machine.RAM), and goes once it has ended.
//
// The template QEMU runs as the paused sandbox's uid, which no QEMU of
// its own uses while it is paused, in the directory templates made ahead
// use (<dir>/<id>+template), one template QEMU at a time on the host
// (aheadSlot). The state gets a template group of its own once filled
// (0640), which the resumed QEMU gets to open it read-only; a template
// dropped before it is done makes the state root's alone again, as a
// snapshot's does, and so does Recover for one a crash left building.
//
// A resume, stop or delete end a template still being made first and
// wait for it to be dropped: the resume then loads the whole state, as
// before. A memory snapshot of the paused sandbox shares its state: it
// waits for the template to be made and shares it too (it is the
// snapshot's template then, and the state never gets another group).

// pauseTemplate is a pause template being made.
type pauseTemplate struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// pauseTemplateLater makes the template of paused sandbox id's state in
// the background.
func (m *Manager) pauseTemplateLater(id string) {
	if m.cfg.LazyTemplates {
		return
	}
	ctx, cancel := context.WithCancel(m.ctx)
	pt := &pauseTemplate{cancel: cancel, done: make(chan struct{})}
	m.mu.Lock()
	if m.pauseTemplates[id] != nil {
		m.mu.Unlock()
		cancel()
		return
	}
	m.pauseTemplates[id] = pt
	m.mu.Unlock()
	end := func() {
		m.mu.Lock()
		delete(m.pauseTemplates, id)
		m.mu.Unlock()
		cancel()
		close(pt.done)
	}
	if !m.goAfter(func() {
		defer end()
		if err := m.makePauseTemplate(background(ctx), id); err != nil && ctx.Err() == nil {
			m.log.Info("pause template not made; the resume loads the whole state", "sandbox", id, "err", err)
		}
	}) {
		end()
	}
}

// stopPauseTemplate ends the making of sandbox id's pause template, if
// one is under way, and waits until it is dropped; with wait alone, it
// waits for it to end by itself.
func (m *Manager) stopPauseTemplate(id string, wait bool) {
	m.mu.Lock()
	pt := m.pauseTemplates[id]
	m.mu.Unlock()
	if pt == nil {
		return
	}
	if !wait {
		pt.cancel()
	}
	<-pt.done
}

// errPauseTemplateMoot says the sandbox is no longer paused on the state
// the template was for.
var errPauseTemplateMoot = errors.New("the sandbox is no longer paused on that state")

// pausedOn tells whether r is paused on a state whose template may be
// made: mapped where it is, shared with no snapshot.
func pausedOn(r Record, state string) bool {
	if r.State != Paused || r.Machine == nil || r.Machine.Saved == "" || (state != "" && r.Machine.Saved != state) {
		return false
	}
	for _, s := range r.Snapshots {
		if s.State == r.Machine.Saved {
			return false
		}
	}
	return true
}

func (m *Manager) makePauseTemplate(ctx context.Context, id string) error {
	select {
	case m.aheadSlot <- struct{}{}:
		defer func() { <-m.aheadSlot }()
	case <-ctx.Done():
		return ctx.Err()
	}
	r, err := m.cfg.Records.Get(ctx, id)
	if err != nil {
		return err
	}
	if !pausedOn(r, "") || r.Machine.savedTemplate() != nil {
		return nil
	}
	state := r.Machine.Saved
	// The paused state as a snapshot would have it: what fillTemplate
	// loads, and the disk it goes with.
	snap := Snapshot{ID: "pause", State: state, Memory: true, BaseDisk: r.Machine.BaseDisk, Disk: r.Machine.LoadDisk, MemoryMiB: r.MemoryMiB, VCPUs: r.VCPUs, DiskGiB: r.DiskGiB}
	if len(snap.Disk) == 0 {
		return errors.New("the paused state names no disk")
	}
	key := "template:" + id + "/pause"
	if err := m.reserve(ctx, key, snap.MemoryMiB); err != nil {
		return err
	}
	defer m.unreserve(key)
	t0 := time.Now()
	// Made only where the state is mapped (no classic RAM file: the
	// resume would load the whole state anyway).
	tpl, ram, dev, err := m.newTemplate(ctx, snap, false, func(tpl Template) error {
		_, err := m.cfg.Records.Update(ctx, id, func(rec *Record) error {
			if !pausedOn(*rec, snap.State) {
				return errPauseTemplateMoot
			}
			rec.Machine.SavedTemplate = &tpl
			return nil
		})
		return err
	})
	if err != nil {
		return err
	}
	defer ram.Close()
	defer dev.Close()
	done := func(keep bool) {
		if !keep {
			if err := errors.Join(ram.Chown(0, 0), ram.Chmod(0o600)); err != nil {
				m.log.Warn("pause template dropped: its group stays on the paused state until it goes", "sandbox", id, "err", err)
			}
		}
		m.cfg.Records.Update(context.WithoutCancel(ctx), id, func(rec *Record) error {
			if rec.Machine != nil && rec.Machine.SavedTemplate != nil && rec.Machine.SavedTemplate.State == tpl.State {
				if keep {
					rec.Machine.SavedTemplate.Building, rec.Machine.SavedTemplate.Scratch = false, ""
				} else {
					rec.Machine.SavedTemplate = nil
				}
			}
			return nil
		})
		m.collectLater()
	}
	qr := Record{ID: id + templateDirSuffix, Name: r.Name, Machine: &Machine{Uid: r.Machine.Uid, Gid: r.Machine.Gid, Disk: []string{"-"}}}
	defer os.RemoveAll(m.dir(qr.ID))
	if err := m.fillTemplate(ctx, qr, snap, tpl, ram, dev); err != nil {
		done(false)
		return err
	}
	failpoint.Hit(FailpointPauseTemplateFilled)
	// Still paused on it (a resume waits for this one to end, but a
	// stop may have dropped the state meanwhile): given the group, for
	// the resumed QEMU alone to read it.
	if r, err := m.cfg.Records.Get(ctx, id); err != nil || !pausedOn(r, state) {
		done(false)
		return errors.Join(err, errPauseTemplateMoot)
	}
	if err := errors.Join(ram.Chown(0, int(tpl.Gid)), ram.Chmod(0o640)); err != nil {
		done(false)
		return err
	}
	done(true)
	m.log.Info("pause template made", "sandbox", id, "took", time.Since(t0).Round(time.Millisecond), "devices_bytes", allocated(m.statePath(tpl.State)))
	return nil
}

// dropUnfinishedPauseTemplate forgets a pause template a crash left
// half-made, its state root's alone again (its files are collected).
func (m *Manager) dropUnfinishedPauseTemplate(ctx context.Context, r Record) {
	t := (*Template)(nil)
	if r.Machine != nil {
		t = r.Machine.SavedTemplate
	}
	if t == nil || !t.Building {
		return
	}
	p := m.ramPath(t.RAM, t.RAMOffset)
	if err := errors.Join(os.Lchown(p, 0, 0), os.Chmod(p, 0o600)); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Warn("a dropped pause template's group stays on the paused state", "sandbox", r.ID, "err", err)
	}
	m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		if rec.Machine != nil && rec.Machine.SavedTemplate != nil && rec.Machine.SavedTemplate.Building {
			rec.Machine.SavedTemplate = nil
		}
		return nil
	})
}
