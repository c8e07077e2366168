package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"strata/internal/fault"
	"strata/vmm"
)

// State is where a sandbox is in its lifecycle.
type State string

// The states of a sandbox.
const (
	Creating   State = "creating"
	Running    State = "running"
	Pausing    State = "pausing"
	Paused     State = "paused"
	Resuming   State = "resuming"
	Stopping   State = "stopping"
	Stopped    State = "stopped"
	Error      State = "error"
	Destroying State = "destroying"
	Destroyed  State = "destroyed"
)

// Valid tells whether s is one of the states.
func (s State) Valid() bool {
	switch s {
	case Creating, Running, Pausing, Paused, Resuming, Stopping, Stopped, Error, Destroying, Destroyed:
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
	// Error says what went wrong, in state error.
	Error   string   `json:"error,omitempty"`
	Machine *Machine `json:"machine,omitempty"`
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
}

// GuestScheme is the guest address scheme of microVM sandboxes:
// vm://<sandbox id>, dialled through Manager.Dial.
const GuestScheme = "vm"

// Records keeps sandbox records (hostproxy's registry). Update applies fn
// to the record in one transaction, and fails with sandbox_not_found when
// there is none.
type Records interface {
	Insert(ctx context.Context, r Record) error
	Update(ctx context.Context, id string, fn func(*Record) error) (Record, error)
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
)
