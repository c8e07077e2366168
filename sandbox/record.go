package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"strata/egress/policy"
	"strata/internal/fault"
	"strata/vmm"
)

// State is where a sandbox is in its lifecycle.
type State string

// The states of a sandbox.
const (
	Creating State = "creating"
	Running  State = "running"
	// Unresponsive is a running sandbox whose guest stopped answering
	// the host's heartbeat (its guestd died, or its channel did); the
	// host keeps dialling, and it is running again once the guest
	// answers, or error past Config.UnresponsiveLimit.
	Unresponsive State = "unresponsive"
	Pausing      State = "pausing"
	Paused       State = "paused"
	Resuming     State = "resuming"
	Stopping     State = "stopping"
	Stopped      State = "stopped"
	Error        State = "error"
	Destroying   State = "destroying"
	Destroyed    State = "destroyed"
)

// Valid tells whether s is one of the states.
func (s State) Valid() bool {
	switch s {
	case Creating, Running, Unresponsive, Pausing, Paused, Resuming, Stopping, Stopped, Error, Destroying, Destroyed:
		return true
	}
	return false
}

// Record is a sandbox as the registry keeps it. A sandbox whose guest runs
// elsewhere (a configured guest address) has no Machine.
type Record struct {
	ID        string    `json:"id"`
	Account   string    `json:"account"`
	Name      string    `json:"name,omitempty"`
	Guest     string    `json:"guest,omitempty"`
	State     State     `json:"state"`
	MemoryMiB int       `json:"memory_mib,omitempty"`
	VCPUs     int       `json:"vcpus,omitempty"`
	DiskGiB   int       `json:"disk_gib,omitempty"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	// Pooled marks a sandbox booted ahead for the pool (pool.go): of no
	// account, until a create takes it.
	Pooled bool `json:"pooled,omitempty"`
	// Ahead is the snapshot a sandbox of no account is a fork made ahead
	// of (forkahead.go), for the next fork of it to take; such a sandbox
	// is never Pooled.
	Ahead *From `json:"ahead,omitempty"`
	// Error says what went wrong, in state error.
	Error string `json:"error,omitempty"`
	// UnresponsiveSince is when the guest stopped answering, in state
	// unresponsive.
	UnresponsiveSince time.Time `json:"unresponsive_since,omitzero"`
	// UnresponsiveReason says why the guest cannot answer when the host
	// knows (QEMU stopped it on a fault), in state unresponsive.
	UnresponsiveReason string `json:"unresponsive_reason,omitempty"`
	// LastError is the last operation that failed after it was answered
	// (a pause whose save failed: the sandbox runs on), until the same
	// operation succeeds.
	LastError *OpError `json:"last_error,omitempty"`
	Machine   *Machine `json:"machine,omitempty"`
	// From is the snapshot a fork was made from.
	From *From `json:"from,omitempty"`
	// Access is the sandbox's access setting, as hostproxy writes and
	// reads it (api.Access's String: "none", or the scopes of the key its
	// guest is handed, joined by commas); empty is the default. This
	// package only keeps it.
	Access string `json:"access,omitempty"`
	// Env is the environment of every exec and session of the sandbox,
	// under each call's own, and Labels its labels: both given by the
	// create or fork, as hostproxy writes and reads them. This package
	// only keeps them (and never logs Env).
	Env    map[string]string `json:"env,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Network is the sandbox's network setting in its canonical form
	// (policy.Spec), as hostproxy writes it; nil is the default.
	// NetworkPolicy reads it.
	Network *policy.Spec `json:"network,omitempty"`
	// Snapshots are the sandbox's VM snapshots, oldest first.
	Snapshots []Snapshot `json:"snapshots,omitempty"`
	// SnapshotSeq and AutoSeq are the numbers of the last snapshot ids
	// given (v<N>, auto-<N>): ids are never reused.
	SnapshotSeq int `json:"snapshot_seq,omitempty"`
	AutoSeq     int `json:"auto_seq,omitempty"`
}

// OpError is an operation that failed in the background.
type OpError struct {
	Operation string    `json:"operation"`
	Code      string    `json:"code,omitempty"`
	Message   string    `json:"message"`
	At        time.Time `json:"at"`
}

// From names a snapshot of a sandbox.
type From struct {
	Sandbox  string `json:"sandbox"`
	Snapshot string `json:"snapshot"`
}

// SnapshotNamed returns the snapshot of r named name.
func (r *Record) SnapshotNamed(name string) (*Snapshot, bool) {
	for i := range r.Snapshots {
		if r.Snapshots[i].Name == name {
			return &r.Snapshots[i], true
		}
	}
	return nil, false
}

// Snapshot finds a snapshot of the record by id.
func (r *Record) Snapshot(id string) (*Snapshot, bool) {
	for i := range r.Snapshots {
		if r.Snapshots[i].ID == id {
			return &r.Snapshots[i], true
		}
	}
	return nil, false
}

// Machine is what the host keeps of a sandbox's microVM.
type Machine struct {
	Uid uint32 `json:"uid"`
	Gid uint32 `json:"gid"`
	// BaseDisk is the read-only base under the sandbox's disk.
	BaseDisk string `json:"base_disk"`
	// Image is the key of the image last booted.
	Image string `json:"image,omitempty"`
	// Process is the QEMU while one runs for the sandbox.
	Process *vmm.Process `json:"process,omitempty"`
	// Handshake says the running guest's channel starts its sessions
	// with the handshake (every boot since it exists); a sandbox adopted
	// running from an earlier hostproxy has a plain one until it boots.
	Handshake bool `json:"handshake,omitempty"`
	// Disk is the disk's layers above BaseDisk, top first: files of the
	// host's store (Store). Layers below the top may be shared with
	// snapshots and forks; only the top is ever written.
	Disk []string `json:"disk,omitempty"`
	// Saved is a memory state in the store that the next boot loads
	// instead of booting the kernel: a pause that freed the host's
	// memory, or a restore or fork of a memory snapshot.
	Saved string `json:"saved,omitempty"`
	// LoadDisk is the disk Saved goes with (layers, top first): a load
	// runs on a new, empty top over it, so that a load that starts over
	// after a crash never finds a disk the loaded guest already wrote to.
	// FreshTop says the current top is such a top, never run on yet.
	LoadDisk []string `json:"load_disk,omitempty"`
	FreshTop bool     `json:"fresh_top,omitempty"`
	// FromTemplate asks the next boot to start from the template of this
	// snapshot (making it first if the snapshot has none): a fork.
	FromTemplate *From `json:"from_template,omitempty"`
	// RAM is the template RAM file the running QEMU maps (privately),
	// and RAMGid the group that may open it. With RAMOffset, RAM is a
	// memory snapshot's own state (<id>.state), whose RAM pages start
	// there; without, a template's RAM file (<id>.ram).
	RAM       string `json:"ram,omitempty"`
	RAMGid    uint32 `json:"ram_gid,omitempty"`
	RAMOffset int64  `json:"ram_offset,omitempty"`
	// SavedTemplate is the template of a pause's Saved state, made in the
	// background while the sandbox is paused: a resume maps Saved's RAM
	// where it is and loads its devices alone (SavedTemplate.State). It
	// counts only while its RAM is Saved (savedTemplate).
	SavedTemplate *Template `json:"saved_template,omitempty"`
}

// savedTemplate is the ready template of the state the machine is to
// load, if it has one.
func (mach *Machine) savedTemplate() *Template {
	if t := mach.SavedTemplate; t != nil && !t.Building && mach.Saved != "" && t.RAM == mach.Saved && t.RAMOffset > 0 {
		return t
	}
	return nil
}

// dropRAM forgets the template RAM a machine mapped: its next QEMU
// has memory of its own.
func (mach *Machine) dropRAM() {
	mach.RAM, mach.RAMGid, mach.RAMOffset = "", 0, 0
}

// Template is a memory snapshot made ready for fast forks: its RAM as a
// file that forks map copy-on-write (they share the pages they only
// read), and the device state that goes with it. The RAM is the
// snapshot's own mapped-ram state when RAMOffset is set (RAM is then the
// snapshot's State, its pages from RAMOffset on); a RAM file of its own
// (<RAM>.ram) for a state of QEMU's classic format.
type Template struct {
	RAM       string `json:"ram"`
	RAMOffset int64  `json:"ram_offset,omitempty"`
	State     string `json:"state"`
	// Gid is the group of the RAM file: the forks' QEMUs get it.
	Gid uint32 `json:"gid"`
	// Building is set while the files are filled, with the scratch top
	// layer the template QEMU opens; a Recover drops a template still
	// building.
	Building bool   `json:"building,omitempty"`
	Scratch  string `json:"scratch,omitempty"`
}

// SnapshotStatus is where a snapshot is in its making.
type SnapshotStatus string

// The statuses of a snapshot.
const (
	SnapshotProcessing SnapshotStatus = "processing"
	SnapshotReady      SnapshotStatus = "ready"
	SnapshotFailed     SnapshotStatus = "failed"
)

// Snapshot is a VM snapshot as its sandbox's record keeps it.
type Snapshot struct {
	ID string `json:"id"`
	// Ref names the snapshot on the whole deployment ("sn-…"): the
	// records' keeper (hostproxy's registry) gives it when the snapshot
	// is first recorded, and keeps it; this package only keeps it.
	Ref       string         `json:"ref,omitempty"`
	Name      string         `json:"name,omitempty"`
	Comment   string         `json:"comment,omitempty"`
	Memory    bool           `json:"memory"`
	Auto      bool           `json:"auto,omitempty"`
	Pinned    bool           `json:"pinned,omitempty"`
	Status    SnapshotStatus `json:"status"`
	SizeBytes int64          `json:"size_bytes"`
	CreatedAt time.Time      `json:"created_at"`
	// Disk is the frozen disk: layer files of the store, top first,
	// over BaseDisk. Never written again.
	Disk     []string `json:"disk"`
	BaseDisk string   `json:"base_disk"`
	// State is the memory state file (memory snapshots).
	State string `json:"state,omitempty"`
	// Needs is what loading State needs of the host.
	Needs *Needs `json:"needs,omitempty"`
	// Template is made at the first fork of a memory snapshot.
	Template *Template `json:"template,omitempty"`
	// MemoryLost says why a restore's automatic snapshot taken with its
	// memory has only its disk (Memory is false): the memory could not
	// be written (a full store, a QEMU error, the time limit, the host
	// service stopping), and the frozen disk is what it keeps.
	MemoryLost string `json:"memory_lost,omitempty"`
	// Unsynced is the host's boot id while a ready snapshot's files are
	// still being written to disk: after a reboot it may be torn.
	Unsynced string `json:"unsynced,omitempty"`
	// PauseMs is how long the guest was stopped for a memory snapshot,
	// as the host measured it (under TCG the guest's clock stops with
	// it); Live tells whether its memory was copied while it ran.
	PauseMs float64 `json:"pause_ms,omitempty"`
	Live    bool    `json:"live,omitempty"`
	// MemoryMiB, VCPUs and DiskGiB are the sandbox's size when it was
	// taken: a fork gets them.
	MemoryMiB int `json:"memory_mib"`
	VCPUs     int `json:"vcpus"`
	DiskGiB   int `json:"disk_gib"`
}

// Needs is what a memory state can be loaded into: the same QEMU, machine
// type, device set, accelerator and memory size (VMM.md: a migration
// stream loads only into an identical machine), and the same guest image.
type Needs struct {
	QEMU      string    `json:"qemu"`
	DeviceSet string    `json:"device_set"`
	Accel     vmm.Accel `json:"accel"`
	Image     string    `json:"image"`
}

// Differs lists what differs between n (what a state needs) and have
// (this host), as "what": "needed, have" pairs; empty when it loads.
func (n Needs) Differs(have Needs) map[string]string {
	d := map[string]string{}
	pair := func(what, a, b string) {
		if a != b {
			d[what] = fmt.Sprintf("snapshot needs %q, host has %q", a, b)
		}
	}
	pair("qemu", n.QEMU, have.QEMU)
	pair("device_set", n.DeviceSet, have.DeviceSet)
	pair("accel", string(n.Accel), string(have.Accel))
	pair("image", n.Image, have.Image)
	return d
}

// GuestScheme is the guest address scheme of microVM sandboxes:
// vm://<sandbox id>, dialled through Manager.Dial.
const GuestScheme = "vm"

// Records keeps sandbox records (hostproxy's registry). Update applies fn
// to the record in one transaction, and fails with sandbox_not_found when
// there is none. Take is the Update that gives a pooled sandbox to an
// account (pool.go): in the same transaction it checks what Insert checks
// of a new record (the name unique among the account's sandboxes, and
// whatever ctx claims for the create: hostproxy's Idempotency-Key).
type Records interface {
	Insert(ctx context.Context, r Record) error
	Update(ctx context.Context, id string, fn func(*Record) error) (Record, error)
	Take(ctx context.Context, id string, fn func(*Record) error) (Record, error)
	Get(ctx context.Context, id string) (Record, error)
	List(ctx context.Context) ([]Record, error)
	Delete(ctx context.Context, id string) error
}

// Image is a bootable guest image (strata-image's image.json).
type Image struct {
	Key       string `json:"key"`
	Kernel    string `json:"vmlinux"`
	Initrd    string `json:"initramfs"`
	Disk      string `json:"disk"`
	DiskBytes int64  `json:"disk_virtual_bytes"`
}

// ImageFile is the description of an image in its directory.
const ImageFile = "image.json"

// LoadImage reads dir/image.json and checks that its files are there.
func LoadImage(dir string) (Image, error) {
	b, err := os.ReadFile(filepath.Join(dir, ImageFile))
	if err != nil {
		return Image{}, fmt.Errorf("guest image: %w (build it with make image)", err)
	}
	var im Image
	if err := json.Unmarshal(b, &im); err != nil {
		return Image{}, fmt.Errorf("guest image %s: %w", dir, err)
	}
	for _, p := range []string{im.Kernel, im.Initrd, im.Disk} {
		if !filepath.IsAbs(p) {
			return Image{}, fmt.Errorf("guest image %s: path %q is not absolute", dir, p)
		}
		if _, err := os.Stat(p); err != nil {
			return Image{}, fmt.Errorf("guest image %s: %w (rebuild it with make image)", dir, err)
		}
	}
	if im.Key == "" {
		return Image{}, fmt.Errorf("guest image %s: no key", dir)
	}
	return im, nil
}

// The errors of lifecycle operations; codes are part of the API.
var (
	ErrNotFound          = fault.New(fault.NotFound, "sandbox_not_found", "no such sandbox")
	ErrNotRunning        = fault.New(fault.Conflict, "sandbox_not_running", "the sandbox is not running")
	ErrInProgress        = fault.New(fault.Conflict, "operation_in_progress", "another operation on this sandbox is under way; retry when it has finished")
	ErrWrongState        = fault.New(fault.Conflict, "sandbox_state", "the sandbox's state does not allow this operation")
	ErrHostCapacity      = fault.New(fault.Unavailable, "host_capacity", "the host has no room for another sandbox of this size now")
	ErrNotAMachine       = fault.New(fault.Conflict, "sandbox_not_a_vm", "this sandbox's guest runs outside this host; its lifecycle is not managed here")
	errUnexpectedExit    = "the sandbox's virtual machine stopped unexpectedly; start it to boot it again from its disk"
	errBootFailed        = "the sandbox's virtual machine did not boot; start it to try again"
	errGoneWhileAway     = "the sandbox's virtual machine stopped while the host service was down; start it to boot it again from its disk"
	errBaseDiskMissing   = "the base disk this sandbox's disk was made from is gone; the sandbox cannot boot"
	errStartFailedOnHost = "the sandbox's virtual machine could not be started on this host; start it to try again"
	errLoadFailed        = "the sandbox's saved memory could not be loaded; start it to boot it again from its disk, or restore a snapshot"
	errUnresponsive      = "the sandbox's guest daemon stopped answering for longer than %v; its virtual machine was stopped: start it to boot it again from its disk"
	errResumeFailed      = "the sandbox's saved memory could not be loaded; it is kept: resume to try again, or stop the sandbox to drop it and start it from its disk"

	ErrSnapshotNotFound     = fault.New(fault.NotFound, "snapshot_not_found", "no such snapshot of this sandbox")
	ErrSnapshotNotReady     = fault.New(fault.Conflict, "snapshot_not_ready", "the snapshot is not ready (it is being taken, or failed)")
	ErrSnapshotNameTaken    = fault.New(fault.Conflict, "name_taken", "another snapshot of this sandbox has this name")
	ErrSnapshotLimit        = fault.New(fault.Conflict, "snapshot_limit", "the sandbox has as many snapshots of this kind as it may; delete one, or ask for retention")
	ErrSnapshotInUse        = fault.New(fault.Conflict, "snapshot_in_use", "a restore is loading this snapshot; delete it once the restore has finished")
	ErrSnapshotIncompatible = fault.New(fault.Conflict, "snapshot_incompatible", "this host can no longer load the snapshot's memory (its QEMU, device set or image changed); restore it with disk_only")
)
