package guestimage

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Base is base.json: what a base directory holds and what it was built
// from.
type Base struct {
	Key                  string    `json:"key"`
	Layout               int       `json:"layout"`
	KernelVersion        string    `json:"kernel_version"` // uname -r of the guest
	KernelPackage        string    `json:"kernel_package"`
	KernelPackageVersion string    `json:"kernel_package_version"`
	KernelCompression    string    `json:"kernel_compression"` // of the bzImage's payload
	Suite                string    `json:"suite"`
	Packages             []string  `json:"packages"`
	Modules              []string  `json:"modules"`         // in load order, dependencies included
	BuiltinModules       []string  `json:"builtin_modules"` // wanted but built into the kernel
	DiskVirtualBytes     int64     `json:"disk_virtual_bytes"`
	CreatedAt            time.Time `json:"created_at"`

	// Dir is the base directory (not stored).
	Dir string `json:"-"`
}

// Files of a base directory.
const (
	BaseJSON     = "base.json"
	VmlinuxFile  = "vmlinux"
	DiskFile     = "base.qcow2"
	ModulesDir   = "modules"
	ModulesOrder = "modules.order"
)

// Image is image.json, the contract with the VMM: every path is absolute
// and readable by any user. Vmlinux and Disk are the base's files (shared
// by every image of that base); a sandbox's disk is a qcow2 overlay on
// Disk (qemu-img create -f qcow2 -b Disk -F qcow2 overlay.qcow2 SIZE), and
// the guest grows its filesystem to the overlay's size at boot.
type Image struct {
	Key              string    `json:"key"`
	BaseKey          string    `json:"base_key"`
	Layout           int       `json:"layout"`
	KernelVersion    string    `json:"kernel_version"`
	Vmlinux          string    `json:"vmlinux"`
	Initramfs        string    `json:"initramfs"`
	Disk             string    `json:"disk"`
	DiskFormat       string    `json:"disk_format"`
	DiskVirtualBytes int64     `json:"disk_virtual_bytes"`
	BaseDir          string    `json:"base_dir"`
	GuestdSHA256     string    `json:"guestd_sha256"`
	InitSHA256       string    `json:"init_sha256"`
	CreateosSHA256   string    `json:"createos_sha256,omitempty"`
	PythonSHA256     string    `json:"python_sha256,omitempty"` // the Python package's digest (pythonPackage)
	CreatedAt        time.Time `json:"created_at"`

	// Dir is the image directory (not stored).
	Dir string `json:"-"`
}

// Files of an image directory.
const (
	ImageJSON     = "image.json"
	InitramfsFile = "initramfs.cpio"
)

// LoadImage reads dir/image.json. Its presence means the image is
// complete (directories are renamed into place whole).
func LoadImage(dir string) (*Image, error) {
	var img Image
	if err := readJSON(filepath.Join(dir, ImageJSON), &img); err != nil {
		return nil, err
	}
	img.Dir = dir
	return &img, nil
}

// LoadBase reads dir/base.json.
func LoadBase(dir string) (*Base, error) {
	var b Base
	if err := readJSON(filepath.Join(dir, BaseJSON), &b); err != nil {
		return nil, err
	}
	b.Dir = dir
	return &b, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
