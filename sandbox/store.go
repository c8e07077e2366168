package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"strata/vmm"
)

// The host's store holds every disk layer and memory state of every
// sandbox, in one directory (<Dir>/store, root's, 0711: no one else may
// list it): <id>.qcow2 and <id>.state (root's, 0600: QEMU gets them as
// descriptors), and the RAM files of templates, <id>.ram (root and the
// template's group, 0660 while the template's QEMU fills it, 0640 after:
// QEMU opens them by name, only the QEMUs given that group can, and a
// fork's only to read). A file is shared by reference: a sandbox's disk chain, a
// snapshot and a fork each name the files they need in their records,
// and a file no record names is garbage (collect). So deleting a source
// sandbox or a snapshot never breaks a fork, and nothing needs a counter
// that a crash could leave wrong.
//
// The rule that keeps a new file from being collected before a record
// names it: whoever makes a file holds storeMu for reading from before
// the file exists until the record naming it is written; collect holds it
// for writing. Work that takes long before its file can be named (a
// pause's save, up to 30 s) claims the file instead (claimFile) and lets
// the lock go at once: collect keeps claimed files too, and never waits
// for QEMU.

const (
	layerExt = ".qcow2"
	stateExt = ".state"
	ramExt   = ".ram"
)

func (m *Manager) storeDir() string { return StoreDir(m.cfg.Dir) }

// layerPath and statePath are the files of a layer and a memory state.
func (m *Manager) layerPath(id string) string {
	return filepath.Join(m.storeDir(), id+layerExt)
}

func (m *Manager) statePath(id string) string {
	return filepath.Join(m.storeDir(), id+stateExt)
}

// ramPath is the file of template RAM: a template's RAM file, or with
// an offset a memory snapshot's state (ramName).
func (m *Manager) ramPath(id string, offset int64) string {
	return filepath.Join(m.storeDir(), ramName(id, offset))
}

// ramName is the store file of template RAM: a snapshot's state, whose
// RAM starts at offset, or a RAM file of its own (no offset).
func ramName(id string, offset int64) string {
	if offset > 0 {
		return id + stateExt
	}
	return id + ramExt
}

// mkStore makes the store directory: traversable by the QEMUs (a
// template's RAM file is opened by name), listable by root alone.
func (m *Manager) mkStore() error {
	if err := os.Mkdir(m.storeDir(), 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return os.Chmod(m.storeDir(), 0o711)
}

// newFileID is a new store file id: 16 hex digits (the layer's QEMU node
// name is "l" and the id, under QEMU's 31 characters).
func newFileID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validFileID(id string) bool {
	if len(id) != 16 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// chain is a record's disk as QEMU gets it: its layers, top first, then
// the base.
func (m *Manager) chain(mach *Machine) []vmm.Layer {
	layers := make([]vmm.Layer, 0, len(mach.Disk)+1)
	for _, id := range mach.Disk {
		layers = append(layers, vmm.Layer{Node: "l" + id, Path: m.layerPath(id)})
	}
	return append(layers, vmm.Layer{Node: "base", Path: mach.BaseDisk})
}

// newLayer makes an empty qcow2 layer over below (a store layer id, or ""
// for the base) and returns its id. The caller holds storeMu for reading
// until a record names it.
func (m *Manager) newLayer(ctx context.Context, base, below string, sizeBytes int64) (string, error) {
	if err := m.mkStore(); err != nil {
		return "", err
	}
	id := newFileID()
	backing := base
	if below != "" {
		backing = m.layerPath(below)
	}
	tmp := m.layerPath(id) + ".tmp"
	// -u: the backing file is not opened (a running QEMU may hold it);
	// its name in the header is for tools only, QEMU gets the chain.
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-u",
		"-b", backing, "-F", "qcow2", tmp, strconv.FormatInt(sizeBytes, 10)).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("qemu-img create: %w: %s", err, bytes.TrimSpace(out))
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return "", err
	}
	if err := syncFile(tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, m.layerPath(id)); err != nil {
		return "", err
	}
	return id, syncDir(m.storeDir())
}

// newState makes an empty memory state file and returns it, open for
// writing, with its id.
func (m *Manager) newState() (string, *os.File, error) {
	if err := m.mkStore(); err != nil {
		return "", nil, err
	}
	id := newFileID()
	f, err := os.OpenFile(m.statePath(id), os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", nil, err
	}
	return id, f, nil
}

// diskBytes is the virtual size of a sandbox's disk.
func (m *Manager) diskBytes(diskGiB int) int64 {
	return max(int64(diskGiB)<<30, m.cfg.Image.DiskBytes)
}

// references are the store files the records name: disks of sandboxes,
// states to load, and what snapshots hold.
func references(records []Record) map[string]bool {
	refs := map[string]bool{}
	for _, r := range records {
		if r.Machine != nil {
			for _, id := range append(r.Machine.Disk, r.Machine.LoadDisk...) {
				refs[id+layerExt] = true
			}
			if r.Machine.Saved != "" {
				refs[r.Machine.Saved+stateExt] = true
			}
			if r.Machine.RAM != "" {
				refs[ramName(r.Machine.RAM, r.Machine.RAMOffset)] = true
			}
			if t := r.Machine.SavedTemplate; t != nil && t.RAM == r.Machine.Saved {
				refs[t.State+stateExt] = true
				if t.Scratch != "" {
					refs[t.Scratch+layerExt] = true
				}
			}
		}
		for _, s := range r.Snapshots {
			for _, id := range s.Disk {
				refs[id+layerExt] = true
			}
			if s.State != "" {
				refs[s.State+stateExt] = true
			}
			if t := s.Template; t != nil {
				refs[ramName(t.RAM, t.RAMOffset)] = true
				refs[t.State+stateExt] = true
				if t.Scratch != "" {
					refs[t.Scratch+layerExt] = true
				}
			}
		}
	}
	return refs
}

// claimFile keeps collect from deleting the store file name (id and
// extension) until release, without holding storeMu: the caller makes
// the file under storeMu's read lock, claims it, and may then let the
// lock go.
func (m *Manager) claimFile(name string) (release func()) {
	return m.leases.take(leaseFile, name)
}

// collect deletes the store files no record names nor an operation
// claims.
func (m *Manager) collect(ctx context.Context) error {
	m.storeMu.Lock()
	defer m.storeMu.Unlock()
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return err
	}
	if staleForksAhead(records) {
		m.forksAheadLater() // their snapshot is gone: dropped
	}
	refs := references(records)
	for _, name := range m.leases.keys(leaseFile) {
		refs[name] = true
	}
	entries, err := os.ReadDir(m.storeDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	removed := 0
	for _, e := range entries {
		if refs[e.Name()] || !isStoreName(strings.TrimSuffix(e.Name(), ".tmp")) || m.isWorking(filepath.Join(m.storeDir(), e.Name())) {
			continue // named, or not the store's to delete
		}
		if err := os.Remove(filepath.Join(m.storeDir(), e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("store file not collected", "file", e.Name(), "err", err)
			continue
		}
		removed++
	}
	if removed > 0 {
		m.log.Info("store collected", "files", removed)
		return syncDir(m.storeDir())
	}
	return nil
}

// StoreReport is what Check found in the host's store.
type StoreReport struct {
	// Files is the number of files in the store.
	Files int `json:"files"`
	// Missing are files a record needs that are not there (a ready
	// snapshot's, or a disk's).
	Missing []string `json:"missing"`
	// Orphans are files no record names (collect removes them).
	Orphans []string `json:"orphans"`
	// Unfinished are snapshots still processing, "<sandbox>/<snapshot>".
	Unfinished []string `json:"unfinished"`
}

// Clean tells whether the store holds exactly what the records name.
func (r StoreReport) Clean() bool {
	return len(r.Missing) == 0 && len(r.Orphans) == 0 && len(r.Unfinished) == 0
}

// Check compares the store with the records, changing nothing.
func (m *Manager) Check(ctx context.Context) (StoreReport, error) {
	m.storeMu.Lock()
	defer m.storeMu.Unlock()
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return StoreReport{}, err
	}
	return CheckStore(m.storeDir(), records)
}

// StoreDir is the store of the sandboxes of state directory dir.
func StoreDir(dir string) string { return filepath.Join(dir, "store") }

// CheckStore compares a store directory with the records that name its
// files (a Manager's, or a stopped hostproxy's registry's).
func CheckStore(storeDir string, records []Record) (StoreReport, error) {
	var rep StoreReport
	entries, err := os.ReadDir(storeDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return rep, err
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name()] = true
	}
	rep.Files = len(entries)
	refs := references(records)
	for name := range refs {
		if !have[name] {
			rep.Missing = append(rep.Missing, name)
		}
	}
	for name := range have {
		if !refs[name] {
			rep.Orphans = append(rep.Orphans, name)
		}
	}
	for _, r := range records {
		for _, s := range r.Snapshots {
			if s.Status == SnapshotProcessing {
				rep.Unfinished = append(rep.Unfinished, r.ID+"/"+s.ID)
			}
		}
	}
	slices.Sort(rep.Missing)
	slices.Sort(rep.Orphans)
	slices.Sort(rep.Unfinished)
	return rep, nil
}

// allocated is the space a store file takes on the host.
func allocated(path string) int64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// legacyDisk is where sandboxes made before the store kept their disk.
func (m *Manager) legacyDisk(id string) string { return filepath.Join(m.dir(id), "disk.qcow2") }

// adoptLegacyDisk moves a disk of the earlier layout into the store: the
// record names the store file first, then the file is moved, so that a
// crash in between is finished by the next Recover (the record names a
// missing store file and the legacy one is still there).
func (m *Manager) adoptLegacyDisk(ctx context.Context, r Record) error {
	legacy := m.legacyDisk(r.ID)
	if _, err := os.Lstat(legacy); err != nil {
		return nil
	}
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	if len(r.Machine.Disk) == 0 {
		id := newFileID()
		var err error
		r, err = m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
			if len(rec.Machine.Disk) == 0 {
				rec.Machine.Disk = []string{id}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	top := m.layerPath(r.Machine.Disk[0])
	if _, err := os.Lstat(top); err == nil {
		return nil
	}
	if err := m.mkStore(); err != nil {
		return err
	}
	if err := os.Rename(legacy, top); err != nil {
		return err
	}
	m.log.Info("sandbox disk moved into the store", "sandbox", r.ID, "layer", r.Machine.Disk[0])
	if err := os.Chown(top, 0, 0); err != nil {
		return err
	}
	return syncDir(m.storeDir())
}

// isStoreName tells whether a file name is one the store makes (collect
// deletes nothing else).
func isStoreName(name string) bool {
	id, ok := strings.CutSuffix(name, layerExt)
	if !ok {
		id, ok = strings.CutSuffix(name, stateExt)
	}
	if !ok {
		id, ok = strings.CutSuffix(name, ramExt)
	}
	return ok && validFileID(id)
}
