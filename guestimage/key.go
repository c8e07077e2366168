package guestimage

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
)

// LayoutVersion names the build's recipe: bump it whenever the build
// changes what it produces (another mmdebstrap option, a rootfs edit, a new
// initramfs entry...), so that every cached base and image is rebuilt.
const LayoutVersion = 2

// BaseInputs are everything a base is built from; BaseKey hashes them.
type BaseInputs struct {
	Layout               int      `json:"layout"`
	Suite                string   `json:"suite"`
	Packages             []string `json:"packages"`
	KernelPackage        string   `json:"kernel_package"`
	KernelPackageVersion string   `json:"kernel_package_version"`
	Modules              []string `json:"modules"`
	DiskBytes            int64    `json:"disk_bytes"`
}

// BaseKey is the sha256 (hex) of in. The package list is a set: its order
// does not change the key.
func BaseKey(in BaseInputs) string {
	in.Packages = slices.Sorted(slices.Values(in.Packages))
	in.Packages = slices.Compact(in.Packages)
	b, err := json.Marshal(in)
	if err != nil {
		panic(err) // strings and ints only
	}
	sum := sha256.Sum256(append([]byte("strata-base\n"), b...))
	return hex.EncodeToString(sum[:])
}

// ImageKey is the sha256 (hex) of an image's inputs: its base, the build's
// layout, the binaries that go into the initramfs and the Python package's
// digest ("" for none).
func ImageKey(baseKey, guestdSHA256, initSHA256, createosSHA256, pythonSHA256 string) string {
	s := fmt.Sprintf("strata-image\nlayout=%d\nbase=%s\nguestd=%s\ninit=%s\ncreateos=%s\npython=%s\n", LayoutVersion, baseKey, guestdSHA256, initSHA256, createosSHA256, pythonSHA256)
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// fileSHA256 is the sha256 (hex) of a file's content.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
