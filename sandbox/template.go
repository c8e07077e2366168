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
// root's that may open the RAM file. Every fork of the template gets the
// group too: a fork's QEMU could write the file (QEMU opens it read-write
// even to map it privately), which would change the pages the other
// forks of the same snapshot have not written yet. They are forks of one
// snapshot of one account.

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
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	tpl, err := m.template(ctx, r, from)
	return m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		rec.Machine.FromTemplate = nil
		if err == nil {
			rec.Machine.Saved, rec.Machine.RAM, rec.Machine.RAMGid = tpl.State, tpl.RAM, tpl.Gid
		}
		return nil
	})
}

// template is the snapshot's template, made now if it has none. The
// caller holds storeMu for reading and the snapshot's template lock.
func (m *Manager) template(ctx context.Context, r Record, from From) (Template, error) {
	src, err := m.cfg.Records.Get(ctx, from.Sandbox)
	if err != nil {
		return Template{}, err
	}
	snap, ok := src.Snapshot(from.Snapshot)
	if !ok || snap.Status != SnapshotReady || !snap.Memory {
		return Template{}, fmt.Errorf("snapshot %s of %s is no ready memory snapshot", from.Snapshot, from.Sandbox)
	}
	if snap.Template != nil {
		return *snap.Template, nil
	}
	t0 := time.Now()
	gid, err := m.templateGid(ctx)
	if err != nil {
		return Template{}, err
	}
	tpl := Template{RAM: newFileID(), Gid: gid}
	ram, err := os.OpenFile(m.ramPath(tpl.RAM), os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o660)
	if err != nil {
		return Template{}, err
	}
	defer ram.Close()
	if err := ram.Chown(0, int(gid)); err != nil {
		return Template{}, err
	}
	if err := ram.Chmod(0o660); err != nil {
		return Template{}, err
	}
	if err := ram.Truncate(int64(snap.MemoryMiB) << 20); err != nil {
		return Template{}, err
	}
	state, dev, err := m.newState()
	if err != nil {
		return Template{}, err
	}
	defer dev.Close()
	tpl.State = state
	// A top of its own over the snapshot's disk: the template QEMU opens
	// its disk read-write, and never runs.
	top, err := m.newLayer(ctx, snap.BaseDisk, snap.Disk[0], m.diskBytes(snap.DiskGiB))
	if err != nil {
		return Template{}, err
	}
	defer os.Remove(m.layerPath(top))
	if _, err := m.prepare(ctx, r); err != nil {
		return Template{}, err
	}
	mach := Machine{BaseDisk: snap.BaseDisk, Disk: append([]string{top}, snap.Disk...), Uid: r.Machine.Uid, Gid: r.Machine.Gid}
	cfg := m.vmConfig(Record{ID: r.ID, Name: r.Name, MemoryMiB: snap.MemoryMiB, VCPUs: snap.VCPUs, Machine: &mach})
	cfg.Incoming = true
	cfg.RAM = &vmm.RAMFile{Path: m.ramPath(tpl.RAM), Shared: true}
	cfg.Groups = []uint32{gid}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	vm, err := m.cfg.Driver.Start(sctx, cfg)
	if err != nil {
		return Template{}, err
	}
	defer func() {
		vm.Kill()
		<-vm.Done()
		vm.Close()
	}()
	full, err := os.Open(m.statePath(snap.State))
	if err != nil {
		return Template{}, err
	}
	defer full.Close()
	if err := vm.Load(sctx, full); err != nil {
		return Template{}, fmt.Errorf("template: loading the snapshot: %w", err)
	}
	if _, err := vm.Save(sctx, dev, vmm.SaveOptions{}); err != nil {
		return Template{}, fmt.Errorf("template: saving its devices: %w", err)
	}
	if err := errors.Join(dev.Sync(), ram.Sync()); err != nil {
		return Template{}, err
	}
	if _, err := m.cfg.Records.Update(ctx, from.Sandbox, func(rec *Record) error {
		if s, ok := rec.Snapshot(from.Snapshot); ok && s.Template == nil {
			t := tpl
			s.Template = &t
		}
		return nil
	}); err != nil && !errors.Is(err, ErrNotFound) {
		return Template{}, err
	}
	m.log.Info("template made", "sandbox", from.Sandbox, "snapshot", from.Snapshot, "took", time.Since(t0).Round(time.Millisecond), "ram_bytes", allocated(m.ramPath(tpl.RAM)), "devices_bytes", allocated(m.statePath(tpl.State)))
	return tpl, nil
}

// templateGid is the lowest template group no record holds (from
// UIDBase + 100000: sandbox uids count up from UIDBase).
func (m *Manager) templateGid(ctx context.Context) (uint32, error) {
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return 0, err
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
	for gid := m.cfg.UIDBase + 100000; ; gid++ {
		if !used[gid] {
			return gid, nil
		}
	}
}
