package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"strata/vmm"
)

// Templates: the first fork of a memory snapshot turns it into a template
// (VMM.md, "Forks"). A QEMU that never runs loads the snapshot's state
// into a RAM file (shared), and saves only its devices; every fork then
// maps that file privately and loads only the devices, so a fork starts
// in tens of milliseconds and costs the host only the memory it writes:
// the pages forks only read are the file's, once, in the page cache.
//
// The template QEMU runs as the fork's uid (before the fork's own QEMU,
// in its run directory) with the template's group, the only one besides
// root's that may open the RAM file; it writes the file (0660) while it
// fills it. Once filled, the file is 0640: every fork of the template
// gets the group, to read it, and its QEMU opens it read-only
// (vmm.RAMFile, readonly=on), so that no fork can change the pages the
// other forks of the same snapshot have not written yet.

// templateLocks serializes the making of one snapshot's template: ten
// forks at once make it once.
type templateLocks struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (t *templateLocks) lock(key string) func() {
	t.mu.Lock()
	if t.locks == nil {
		t.locks = map[string]*sync.Mutex{}
	}
	l := t.locks[key]
	if l == nil {
		l = &sync.Mutex{}
		t.locks[key] = l
	}
	t.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// startFromTemplate points a fork's record at its snapshot's template,
// making the template first if the snapshot has none. On failure the
// fork loads the snapshot's whole state instead.
func (m *Manager) startFromTemplate(ctx context.Context, r Record) (Record, error) {
	from := *r.Machine.FromTemplate
	unlock := m.templates.lock(from.Sandbox + "/" + from.Snapshot)
	defer unlock()
	tpl, err := m.template(ctx, r, from)
	if err != nil {
		m.log.Warn("no template: the fork loads the snapshot's whole state", "sandbox", r.ID, "err", err)
	}
	// Named by the fork before the lock goes: collect keeps them.
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	if err == nil && !m.haveFiles(m.ramPath(tpl.RAM), m.statePath(tpl.State)) {
		// The snapshot was deleted while its template was made.
		err = errors.New("the template's files are gone")
	}
	return m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		rec.Machine.FromTemplate = nil
		if err == nil {
			rec.Machine.Saved, rec.Machine.RAM, rec.Machine.RAMGid = tpl.State, tpl.RAM, tpl.Gid
		}
		return nil
	})
}

func (m *Manager) haveFiles(paths ...string) bool {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}

// template is the snapshot's template, made now if it has none. The
// caller holds the snapshot's template lock. Its files are named in the
// snapshot's record (the template building) before they are filled, so
// collect keeps them, and nothing holds the store while QEMU works.
func (m *Manager) template(ctx context.Context, r Record, from From) (Template, error) {
	src, err := m.cfg.Records.Get(ctx, from.Sandbox)
	if err != nil {
		return Template{}, err
	}
	snap, ok := src.Snapshot(from.Snapshot)
	if !ok || snap.Status != SnapshotReady || !snap.Memory {
		return Template{}, fmt.Errorf("snapshot %s of %s is no ready memory snapshot", from.Snapshot, from.Sandbox)
	}
	if snap.Template != nil && !snap.Template.Building {
		return *snap.Template, nil
	}
	// The template QEMU holds the snapshot's whole memory while it fills
	// the RAM file: admitted as a boot is (refused, the fork loads the
	// whole state itself instead).
	key := "template:" + from.Sandbox + "/" + from.Snapshot
	if err := m.reserve(ctx, key, snap.MemoryMiB); err != nil {
		return Template{}, err
	}
	defer m.unreserve(key)
	t0 := time.Now()
	tpl, ram, dev, err := m.newTemplate(ctx, from, *snap)
	if err != nil {
		return Template{}, err
	}
	defer ram.Close()
	defer dev.Close()
	done := func(keep bool) {
		m.cfg.Records.Update(context.WithoutCancel(ctx), from.Sandbox, func(rec *Record) error {
			if s, ok := rec.Snapshot(from.Snapshot); ok && s.Template != nil && s.Template.RAM == tpl.RAM {
				if keep {
					s.Template.Building, s.Template.Scratch = false, ""
				} else {
					s.Template = nil
				}
			}
			return nil
		})
		m.collectLater()
	}
	if err := m.fillTemplate(ctx, r, *snap, tpl, ram, dev); err != nil {
		done(false)
		return Template{}, err
	}
	// Filled: from here on the forks only read it (their QEMUs open it
	// read-only), and even their group cannot write it.
	if err := ram.Chmod(0o640); err != nil {
		done(false)
		return Template{}, err
	}
	done(true)
	tpl.Building, tpl.Scratch = false, ""
	m.log.Info("template made", "sandbox", from.Sandbox, "snapshot", from.Snapshot, "took", time.Since(t0).Round(time.Millisecond), "ram_bytes", allocated(m.ramPath(tpl.RAM)), "devices_bytes", allocated(m.statePath(tpl.State)))
	return tpl, nil
}

// newTemplate makes a template's files (an empty RAM file of the group it
// is given, a state file for the devices, a scratch top for the disk the
// template QEMU opens) and names them in the snapshot, building.
func (m *Manager) newTemplate(ctx context.Context, from From, snap Snapshot) (Template, *os.File, *os.File, error) {
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	gid, release, err := m.allocGid(ctx)
	if err != nil {
		return Template{}, nil, nil, err
	}
	defer release()
	tpl := Template{RAM: newFileID(), Gid: gid, Building: true}
	ram, err := os.OpenFile(m.ramPath(tpl.RAM), os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o660)
	if err != nil {
		return Template{}, nil, nil, err
	}
	state, dev, err := m.newState()
	if err == nil {
		tpl.State = state
		err = errors.Join(ram.Chown(0, int(gid)), ram.Chmod(0o660), ram.Truncate(int64(snap.MemoryMiB)<<20))
	}
	if err == nil {
		tpl.Scratch, err = m.newLayer(ctx, snap.BaseDisk, snap.Disk[0], m.diskBytes(snap.DiskGiB))
	}
	if err == nil {
		_, err = m.cfg.Records.Update(ctx, from.Sandbox, func(rec *Record) error {
			s, ok := rec.Snapshot(from.Snapshot)
			if !ok {
				return ErrSnapshotNotFound.With("snapshot_id", from.Snapshot)
			}
			t := tpl
			s.Template = &t
			return nil
		})
	}
	if err != nil {
		ram.Close()
		if dev != nil {
			dev.Close()
		}
		return Template{}, nil, nil, err // the files are collected
	}
	return tpl, ram, dev, nil
}

// fillTemplate runs the template QEMU: it never runs the guest, loads the
// snapshot's whole state into the RAM file (shared) and saves the devices.
func (m *Manager) fillTemplate(ctx context.Context, r Record, snap Snapshot, tpl Template, ram, dev *os.File) error {
	if _, err := m.prepare(ctx, r); err != nil {
		return err
	}
	mach := Machine{BaseDisk: snap.BaseDisk, Disk: append([]string{tpl.Scratch}, snap.Disk...), Uid: r.Machine.Uid, Gid: r.Machine.Gid}
	cfg := m.vmConfig(Record{ID: r.ID, Name: r.Name, MemoryMiB: snap.MemoryMiB, VCPUs: snap.VCPUs, Machine: &mach})
	cfg.Incoming = true
	cfg.RAM = &vmm.RAMFile{Path: m.ramPath(tpl.RAM), Shared: true}
	cfg.Groups = []uint32{tpl.Gid}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	vm, err := m.cfg.Driver.Start(sctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		vm.Kill()
		<-vm.Done()
		vm.Close()
	}()
	started := time.Now()
	full, err := os.Open(m.statePath(snap.State))
	if err != nil {
		return err
	}
	defer full.Close()
	if err := vm.Load(sctx, full); err != nil {
		return fmt.Errorf("template: loading the snapshot: %w", err)
	}
	loaded := time.Now()
	if _, err := vm.Save(sctx, dev, vmm.SaveOptions{}); err != nil {
		return fmt.Errorf("template: saving its devices: %w", err)
	}
	saved := time.Now()
	err = errors.Join(dev.Sync(), ram.Sync())
	m.log.Debug("template filled", "sandbox", r.ID, "qemu", started.Sub(t0).Round(time.Millisecond), "load", loaded.Sub(started).Round(time.Millisecond),
		"devices", saved.Sub(loaded).Round(time.Millisecond), "sync", time.Since(saved).Round(time.Millisecond))
	return err
}

// allocGid is a template group of the deployment's range (IDRange.GIDs)
// that no record, live machine or template being made holds;
// release ends its reservation once a record names it.
func (m *Manager) allocGid(ctx context.Context) (uint32, func(), error) {
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return 0, nil, err
	}
	used := map[uint32]bool{}
	for _, r := range records {
		if r.Machine != nil && r.Machine.RAMGid != 0 {
			used[r.Machine.RAMGid] = true
		}
		for _, s := range r.Snapshots {
			if s.Template != nil {
				used[s.Template.Gid] = true
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for gid := range m.gids {
		used[gid] = true
	}
	for _, mc := range m.live {
		for _, g := range mc.groups {
			used[g] = true
		}
	}
	gid, end := m.ids.GIDs()
	for used[gid] {
		if gid++; gid >= end {
			return 0, nil, ErrHostCapacity.With("gids", m.ids.String())
		}
	}
	m.gids[gid] = true
	return gid, func() {
		m.mu.Lock()
		delete(m.gids, gid)
		m.mu.Unlock()
	}, nil
}
