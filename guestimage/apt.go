package guestimage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// KernelFlavor is a guest kernel the image can be built with: a Debian
// metapackage that depends on the versioned linux-image package.
type KernelFlavor struct {
	Name string
	Meta string
}

// DefaultKernel is the flavor used when none is named: 6.12 from
// bookworm-security, cloud flavour (virtio core and virtio_console built
// in; the new mount API that guestd prefers).
const DefaultKernel = "6.12-cloud"

// Kernels are the flavors strata-image knows.
var Kernels = map[string]KernelFlavor{
	"6.12-cloud": {Name: "6.12-cloud", Meta: "linux-image-6.12-cloud-amd64"},
	"6.1":        {Name: "6.1", Meta: "linux-image-cloud-amd64"},
}

// KernelPackage is the exact package a flavor resolves to.
type KernelPackage struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// ResolveKernel finds the versioned kernel package behind a flavor's
// metapackage in the host's apt lists (no apt-get update): the Depends of
// the metapackage's candidate version.
func ResolveKernel(ctx context.Context, f KernelFlavor) (KernelPackage, error) {
	show, err := output(ctx, "apt-cache", "show", "--no-all-versions", f.Meta)
	if err != nil {
		return KernelPackage{}, fmt.Errorf("%w (run apt-get update once; bookworm-security must be among the host's apt sources)", err)
	}
	kp, err := ParseKernelDepends(show)
	if err != nil {
		return KernelPackage{}, fmt.Errorf("%s: %w", f.Meta, err)
	}
	return kp, nil
}

// aptState fingerprints what apt-cache's answer depends on: the lists
// (name, size, mtime of each file) and the pinning preferences.
func aptState() string {
	h := sha256.New()
	for _, pattern := range []string{"/var/lib/apt/lists/*", "/etc/apt/preferences", "/etc/apt/preferences.d/*"} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			if st, err := os.Stat(f); err == nil && st.Mode().IsRegular() {
				fmt.Fprintf(h, "%s %d %d\n", f, st.Size(), st.ModTime().UnixNano())
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// kernelMemo is <cache>/kernel-<flavor>.json: a resolution and the apt
// state it was made in. apt-cache takes most of a second here (no
// pkgcache.bin); the memo keeps a cache hit well under one.
type kernelMemo struct {
	AptState string        `json:"apt_state"`
	Package  KernelPackage `json:"package"`
}

// resolveKernelMemo is ResolveKernel through the memo in cache.
func resolveKernelMemo(ctx context.Context, cache string, f KernelFlavor) (KernelPackage, error) {
	state := aptState()
	path := filepath.Join(cache, "kernel-"+f.Name+".json")
	var m kernelMemo
	if readJSON(path, &m) == nil && m.AptState == state && m.Package.Name != "" && m.Package.Version != "" {
		return m.Package, nil
	}
	kp, err := ResolveKernel(ctx, f)
	if err != nil {
		return KernelPackage{}, err
	}
	// Best effort: a cache we cannot write to still builds.
	if mkdirPublic(cache) == nil {
		if tmp, err := os.CreateTemp(cache, ".tmp-kernel-"); err == nil {
			tmp.Close()
			if writeJSON(tmp.Name(), kernelMemo{AptState: state, Package: kp}) != nil || os.Chmod(tmp.Name(), 0o644) != nil || os.Rename(tmp.Name(), path) != nil {
				os.Remove(tmp.Name())
			}
		}
	}
	return kp, nil
}

// ParseKernelDepends reads the versioned linux-image package that a
// kernel metapackage depends on, from `apt-cache show META=VERSION` (the
// first stanza's Depends: "linux-image-X (= V)"). With --no-all-versions
// the only stanza is the candidate's.
func ParseKernelDepends(show string) (KernelPackage, error) {
	for _, line := range strings.Split(show, "\n") {
		if line == "" {
			break // end of the first stanza
		}
		deps, ok := strings.CutPrefix(line, "Depends:")
		if !ok {
			continue
		}
		for _, dep := range strings.Split(deps, ",") {
			alt, _, _ := strings.Cut(dep, "|")
			name, rest, _ := strings.Cut(strings.TrimSpace(alt), " ")
			if !strings.HasPrefix(name, "linux-image-") {
				continue
			}
			rest = strings.TrimSpace(rest)
			ver, ok := strings.CutPrefix(rest, "(=")
			if !ok || !strings.HasSuffix(ver, ")") {
				return KernelPackage{}, fmt.Errorf("dependency %q has no exact version", strings.TrimSpace(alt))
			}
			ver = strings.TrimSpace(strings.TrimSuffix(ver, ")"))
			if ver == "" || strings.ContainsAny(ver, " \t()") || name == "linux-image-" {
				return KernelPackage{}, fmt.Errorf("dependency %q has no exact version", strings.TrimSpace(alt))
			}
			return KernelPackage{Name: name, Version: ver}, nil
		}
	}
	return KernelPackage{}, fmt.Errorf("no linux-image-* dependency")
}

// output runs a command and returns its stdout; its stderr goes into the
// error.
func output(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(stderr.String(), 2000))
	}
	return string(out), nil
}

// tail is s cut to about n bytes for an error message: its start (where
// usage errors are) and its end (where most tools say what failed).
func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	head := n / 4
	return s[:head] + " … " + s[len(s)-(n-head):]
}
