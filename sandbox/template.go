package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/failpoint"
	"strata/vmm"
)

// Templates: the first fork of a memory snapshot turns it into a template
// (VMM.md, "Forks"): the snapshot's RAM as a file that every fork maps
// privately, and a state of the devices alone, so that a fork loads only
// the devices, starts in tens of milliseconds, and costs the host only
// the memory it writes: the pages forks only read are the file's, once,
// in the page cache.
//
// The RAM file is the snapshot's own state when it is mapped-ram (every
// state strata writes now): its RAM pages are at a fixed offset of it
// (vmm.RAMRegionOf), so the template writes no RAM at all. A template
// QEMU that never runs loads the whole state into RAM in memory (a memfd,
// shared) and saves the devices alone; the state's pages whose bit is
// clear in its bitmap (written by a live save, then found zero) are
// punched first (vmm.ClearUnwritten: a load reads them as zero, and so
// must a mapping), which changes nothing a restore of the snapshot reads.
// A state of QEMU's classic format (written before mapped-ram) has no
// such offsets: its template QEMU loads it into a RAM file of its own
// (<id>.ram, shared), written as the QEMU fills it.
//
// Either way the template QEMU runs as the fork's uid (before the fork's
// own QEMU, in its run directory). The RAM file gets the template's
// group, the only one besides root's that may open it, once it is filled
// (0640: a RAM file of its own is 0660 while its QEMU fills it through
// the group): every fork of the template gets the group, to read it, and
// its QEMU opens it read-only (vmm.RAMFile, readonly=on), so that no fork
// can change the pages the other forks of the same snapshot have not
// written yet. A template dropped before it is done takes the group off
// the snapshot's state again, and allocGid never gives a group that a
// file of the store still has.

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

// templateLater makes a memory snapshot's template in the background as
// soon as the snapshot is taken, so that its first fork starts as fast
// as the next ones: the template adds no RAM file, only the devices'
// state, and its QEMU (admitted like any other, and skipped when the
// host has no room: the first fork makes it then) holds the snapshot's
// memory for the second or two of its load. Its QEMU runs as the source
// sandbox's uid, whose QEMU wrote the state it loads, in directories of
// its own (<dir>/<sandbox>+template), gone when it is done; one left by a
// crash is a stray QEMU to the next Recover.
func (m *Manager) templateLater(id string, snap Snapshot) {
	if m.cfg.LazyTemplates || !snap.Memory || snap.Auto || snap.Status != SnapshotReady {
		return
	}
	m.mu.Lock()
	m.aheadLatest[id] = snap.ID
	m.mu.Unlock()
	m.goAfter(func() {
		ctx := background(m.ctx)
		// One template QEMU made ahead at a time on the host, for the
		// latest memory snapshot of each sandbox: a burst of snapshots
		// costs one load, and the snapshots it skips get theirs at
		// their first fork.
		select {
		case m.aheadSlot <- struct{}{}:
			defer func() { <-m.aheadSlot }()
		case <-ctx.Done():
			return
		}
		m.mu.Lock()
		latest := m.aheadLatest[id] == snap.ID
		if latest {
			delete(m.aheadLatest, id)
		}
		m.mu.Unlock()
		if !latest {
			return
		}
		from := From{Sandbox: id, Snapshot: snap.ID}
		unlock := m.templates.lock(id + "/" + snap.ID)
		defer unlock()
		src, err := m.cfg.Records.Get(ctx, id)
		if err != nil || src.Machine == nil {
			return
		}
		r := Record{ID: id + templateDirSuffix, Name: src.Name, Machine: &Machine{Uid: src.Machine.Uid, Gid: src.Machine.Gid, Disk: []string{"-"}}}
		uid := r.Machine.Uid
		m.mu.Lock()
		m.templateUIDs[uid]++
		m.mu.Unlock()
		defer func() {
			os.RemoveAll(m.dir(r.ID))
			m.mu.Lock()
			if m.templateUIDs[uid]--; m.templateUIDs[uid] <= 0 {
				delete(m.templateUIDs, uid)
			}
			m.mu.Unlock()
		}()
		// Held now; still the source's (a uid no record names may have
		// gone to a new sandbox before it was held).
		if again, err := m.cfg.Records.Get(ctx, id); err != nil || again.Machine == nil || again.Machine.Uid != uid {
			return
		}
		if _, err := m.template(ctx, r, from); err != nil && ctx.Err() == nil {
			m.log.Info("template not made ahead; the first fork makes it", "sandbox", id, "snapshot", snap.ID, "err", err)
		}
	})
}

// templateDirSuffix names the directory of a template QEMU made ahead:
// no sandbox id has a '+' (the API's ids and the configuration file's
// allow letters, digits, '.', '_' and '-'), so Recover's removal of these
// directories never takes a sandbox's.
const templateDirSuffix = "+template"

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
	if err == nil && !m.haveFiles(m.ramPath(tpl.RAM, tpl.RAMOffset), m.statePath(tpl.State)) {
		// The snapshot was deleted while its template was made.
		err = errors.New("the template's files are gone")
	}
	return m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		rec.Machine.FromTemplate = nil
		if err == nil {
			rec.Machine.Saved, rec.Machine.RAM, rec.Machine.RAMGid, rec.Machine.RAMOffset = tpl.State, tpl.RAM, tpl.Gid, tpl.RAMOffset
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
	tpl, ram, dev, err := m.newTemplate(ctx, *snap, true, func(tpl Template) error {
		_, err := m.cfg.Records.Update(ctx, from.Sandbox, func(rec *Record) error {
			s, ok := rec.Snapshot(from.Snapshot)
			if !ok {
				return ErrSnapshotNotFound.With("snapshot_id", from.Snapshot)
			}
			s.Template = &tpl
			return nil
		})
		return err
	})
	if err != nil {
		return Template{}, err
	}
	defer ram.Close()
	defer dev.Close()
	done := func(keep bool) {
		if !keep && tpl.RAMOffset > 0 {
			// The snapshot's state is root's alone again before the
			// record lets its group go.
			if err := errors.Join(ram.Chown(0, 0), ram.Chmod(0o600)); err != nil {
				m.log.Warn("template dropped: its group stays on the snapshot's state until it is deleted", "snapshot", from.Snapshot, "err", err)
			}
		}
		m.cfg.Records.Update(context.WithoutCancel(ctx), from.Sandbox, func(rec *Record) error {
			if s, ok := rec.Snapshot(from.Snapshot); ok && s.Template != nil && s.Template.State == tpl.State {
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
	failpoint.Hit(FailpointTemplateFilled)
	// Filled: from here on the forks only read it (their QEMUs open it
	// read-only), and even their group cannot write it.
	if err := errors.Join(ram.Chown(0, int(tpl.Gid)), ram.Chmod(0o640)); err != nil {
		done(false)
		return Template{}, err
	}
	failpoint.Hit(FailpointTemplateShared)
	done(true)
	tpl.Building, tpl.Scratch = false, ""
	m.log.Info("template made", "sandbox", from.Sandbox, "snapshot", from.Snapshot, "took", time.Since(t0).Round(time.Millisecond),
		"maps_state", tpl.RAMOffset > 0, "ram_bytes", allocated(m.ramPath(tpl.RAM, tpl.RAMOffset)), "devices_bytes", allocated(m.statePath(tpl.State)))
	return tpl, nil
}

// newTemplate makes the files of snap's template and has name record it,
// building: its RAM (snap's state, opened to punch and later to give it
// the template's group; or, for a state of QEMU's classic format and
// with classic, an empty RAM file of the template's group), a state file
// for the devices, and a scratch top for the disk the template QEMU
// opens. A snapshot's template and a pause's (pausetemplate.go) are made
// so.
func (m *Manager) newTemplate(ctx context.Context, snap Snapshot, classic bool, name func(Template) error) (Template, *os.File, *os.File, error) {
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	gid, release, err := m.allocGid(ctx)
	if err != nil {
		return Template{}, nil, nil, err
	}
	defer release()
	tpl := Template{Gid: gid, Building: true}
	ram, err := m.mappedRAM(snap)
	if err == nil {
		tpl.RAM, tpl.RAMOffset = snap.State, ram.offset
	} else if classic {
		m.log.Debug("template: the snapshot's RAM is not mapped where it is", "snapshot", snap.ID, "why", err)
		tpl.RAM = newFileID()
		ram.f, err = os.OpenFile(m.ramPath(tpl.RAM, 0), os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o660)
		if err == nil {
			err = errors.Join(ram.f.Chown(0, int(gid)), ram.f.Chmod(0o660), ram.f.Truncate(int64(snap.MemoryMiB)<<20))
		}
	}
	var dev *os.File
	if err == nil {
		tpl.State, dev, err = m.newState()
	}
	if err == nil {
		tpl.Scratch, err = m.newLayer(ctx, snap.BaseDisk, snap.Disk[0], m.diskBytes(snap.DiskGiB))
	}
	if err == nil {
		err = name(tpl)
	}
	if err != nil {
		if ram.f != nil {
			ram.f.Close()
		}
		if dev != nil {
			dev.Close()
		}
		return Template{}, nil, nil, err // the files are collected
	}
	return tpl, ram.f, dev, nil
}

// templateRAM is a template's RAM file, open, and where its RAM starts.
type templateRAM struct {
	f      *os.File
	offset int64
}

// mappedRAM opens a memory snapshot's state to map its RAM where it is:
// where its RAM's pages start, once the pages a load would not read are
// punched and that is on disk. An error says the state cannot be mapped
// (a classic stream, another layout): its template gets a RAM file.
func (m *Manager) mappedRAM(snap Snapshot) (ram templateRAM, err error) {
	f, err := os.OpenFile(m.statePath(snap.State), os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return ram, err
	}
	fi, err := f.Stat()
	var region vmm.RAMRegion
	if err == nil {
		region, err = vmm.RAMRegionOf(f, fi.Size(), vmm.RAMID, int64(snap.MemoryMiB)<<20)
	}
	if err == nil {
		_, err = vmm.ClearUnwritten(f, region)
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		return ram, err
	}
	ram.f, ram.offset = f, region.Offset
	return ram, nil
}

// fillTemplate runs the template QEMU: it never runs the guest, loads the
// snapshot's whole state (into RAM in memory, or into the template's RAM
// file, shared) and saves the devices.
func (m *Manager) fillTemplate(ctx context.Context, r Record, snap Snapshot, tpl Template, ram, dev *os.File) error {
	if _, err := m.prepare(ctx, r); err != nil {
		return err
	}
	mach := Machine{BaseDisk: snap.BaseDisk, Disk: append([]string{tpl.Scratch}, snap.Disk...), Uid: r.Machine.Uid, Gid: r.Machine.Gid}
	cfg := m.vmConfig(Record{ID: r.ID, Name: r.Name, MemoryMiB: snap.MemoryMiB, VCPUs: snap.VCPUs, Machine: &mach})
	cfg.Incoming = true
	if tpl.RAMOffset > 0 {
		cfg.RAM = &vmm.RAMFile{InMemory: true, Shared: true}
	} else {
		cfg.RAM = &vmm.RAMFile{Path: m.ramPath(tpl.RAM, 0), Shared: true}
		cfg.Groups = []uint32{tpl.Gid}
	}
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
	if inBackground(ctx) {
		// Made ahead: a restore or a fork begun meanwhile goes first.
		if err := vm.Background(); err != nil {
			m.log.Debug("template QEMU not lowered", "sandbox", r.ID, "err", err)
		}
	}
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
	err = dev.Sync()
	if tpl.RAMOffset == 0 {
		err = errors.Join(err, ram.Sync())
	}
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
	// A group a live process still holds (a template QEMU, a fork that
	// outlived its record) is not free either (procids.go).
	used := liveProcessIDs("/proc").gids
	for _, r := range records {
		if r.Machine != nil && r.Machine.RAMGid != 0 {
			used[r.Machine.RAMGid] = true
		}
		if r.Machine != nil && r.Machine.SavedTemplate != nil {
			used[r.Machine.SavedTemplate.Gid] = true
		}
		for _, s := range r.Snapshots {
			if s.Template != nil {
				used[s.Template.Gid] = true
			}
		}
	}
	// A file of the store may keep a group no record names (a template
	// dropped by a crash, a snapshot deleted and not yet collected):
	// that group is never given again while the file is there.
	for gid := range m.storeGroups() {
		used[gid] = true
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

// storeGroups are the groups other than root's that the store's RAM files
// and states have.
func (m *Manager) storeGroups() map[uint32]bool {
	groups := map[uint32]bool{}
	entries, _ := os.ReadDir(m.storeDir())
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); ext != ramExt && ext != stateExt {
			continue
		}
		if fi, err := e.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Gid != 0 {
				groups[st.Gid] = true
			}
		}
	}
	return groups
}

// devicesBytes bounds a state of the devices alone: microvm's devices
// and its firmware's RAM blocks, under 1 MiB as measured.
const devicesBytes = 16 << 20

// templateBytes is what making snap's template writes to the store: the
// devices' state, and a RAM file unless its state is mapped-ram (then
// forks map the state itself).
func (m *Manager) templateBytes(snap Snapshot) int64 {
	need := int64(devicesBytes + layerBytes)
	f, err := os.Open(m.statePath(snap.State))
	if err == nil {
		defer f.Close()
		if format, err := vmm.StateFormatOf(f); err == nil && format == vmm.FormatMappedRAM {
			return need
		}
	}
	return need + int64(snap.MemoryMiB)<<20
}

// backgroundKey marks a context whose work is the host's own (a template
// made ahead, a pause's template): its QEMU is lowered (vmm.Background).
type backgroundKey struct{}

func background(ctx context.Context) context.Context {
	return context.WithValue(ctx, backgroundKey{}, true)
}

func inBackground(ctx context.Context) bool {
	b, _ := ctx.Value(backgroundKey{}).(bool)
	return b
}
