package guestimage

import (
	"path"
	"strings"
)

// WantedModules are the modules the guest needs at boot, each with its
// dependencies: the virtio-mmio transport of QEMU's microvm, the disk, the
// host channel, the NIC, the root filesystem and guestd's overlays. Those
// built into the kernel are skipped.
var WantedModules = []string{"virtio_mmio", "virtio_blk", "virtio_console", "virtio_net", "xfs", "overlay"}

// ShowDepends is what `modprobe --show-depends MOD` says: the module files
// to load, in order, and the modules that are built in.
type ShowDepends struct {
	Files   []string
	Builtin []string
}

// ParseShowDepends reads `modprobe --show-depends` output: "insmod PATH
// [options]" and "builtin NAME" lines; anything else is ignored.
func ParseShowDepends(out string) ShowDepends {
	var d ShowDepends
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "insmod":
			d.Files = append(d.Files, f[1])
		case "builtin":
			d.Builtin = append(d.Builtin, f[1])
		}
	}
	return d
}

// ModuleOrder merges the --show-depends answers of several modules into
// one load order: each file once, at its first place, so every module
// still comes after its dependencies.
func ModuleOrder(deps []ShowDepends) (files, builtin []string) {
	seen := map[string]bool{}
	for _, d := range deps {
		for _, f := range d.Files {
			if !seen[f] {
				seen[f] = true
				files = append(files, f)
			}
		}
		for _, b := range d.Builtin {
			if !seen["builtin:"+b] {
				seen["builtin:"+b] = true
				builtin = append(builtin, b)
			}
		}
	}
	return files, builtin
}

// ModuleName is a module file's name without directory and extensions
// (".ko", ".ko.xz", ".ko.zst", ".ko.gz").
func ModuleName(file string) string {
	base := path.Base(file)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		base = strings.TrimSuffix(base, ext)
	}
	return strings.TrimSuffix(base, ".ko")
}
