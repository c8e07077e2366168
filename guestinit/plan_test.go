package guestinit

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestParseModulesOrder(t *testing.T) {
	tests := []struct {
		name, data string
		want       []string
	}{
		{"empty", "", nil},
		{"as the image writes it", "/modules/virtio_mmio.ko\n/modules/virtio_blk.ko\n/modules/xfs.ko\n",
			[]string{"/modules/virtio_mmio.ko", "/modules/virtio_blk.ko", "/modules/xfs.ko"}},
		{"blanks, comments, spaces", "\n  # comment\n /modules/a.ko  \r\n\n", []string{"/modules/a.ko"}},
		{"relative taken from /", "modules/a.ko", []string{"/modules/a.ko"}},
		{"repeats loaded once", "/a.ko\n/b.ko\n/a.ko\n", []string{"/a.ko", "/b.ko"}},
		{"dot-dot cleaned", "/modules/../x.ko\n/", []string{"/x.ko"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParseModulesOrder(tt.data); !slices.Equal(got, tt.want) {
				t.Errorf("ParseModulesOrder = %q, want %q", got, tt.want)
			}
		})
	}
}

// FuzzParseModulesOrder: every path is absolute, clean and listed once.
func FuzzParseModulesOrder(f *testing.F) {
	f.Add("/modules/a.ko\n/modules/b.ko\n")
	f.Add("a\n../b\n#c\n")
	f.Fuzz(func(t *testing.T, data string) {
		seen := map[string]bool{}
		for _, p := range ParseModulesOrder(data) {
			if !strings.HasPrefix(p, "/") || p == "/" || strings.Contains(p, "/../") || seen[p] {
				t.Fatalf("bad path %q in %q", p, data)
			}
			seen[p] = true
		}
	})
}

func TestUnmountOrder(t *testing.T) {
	// /proc/self/mountinfo of a booted guest (moved mounts keep their early
	// ids), with a guestd overlay and a mount point that has a space.
	mountinfo := `21 1 0:20 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
23 1 0:5 / /dev rw,nosuid - devtmpfs devtmpfs rw,size=242548k,mode=755
1 1 254:0 / / rw,relatime - xfs /dev/vda rw,attr2
25 1 0:22 / /run rw,nosuid,nodev - tmpfs tmpfs rw,mode=755
26 23 0:23 / /dev/pts rw,nosuid,noexec - devpts devpts rw,gid=5,mode=620,ptmxmode=666
27 23 0:24 / /dev/shm rw,nosuid,nodev - tmpfs tmpfs rw
28 22 0:25 / /sys/fs/cgroup rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate
40 1 0:30 / /workspace/my\040project rw - overlay overlay rw,lowerdir=/a
41 40 0:31 / /workspace/my\040project rw - overlay overlay rw,lowerdir=/b
`
	want := []string{"/workspace/my project", "/sys/fs/cgroup", "/dev/shm", "/dev/pts", "/run", "/dev", "/sys", "/proc"}
	if got := UnmountOrder(mountinfo); !slices.Equal(got, want) {
		t.Errorf("UnmountOrder =\n%q\nwant\n%q", got, want)
	}
}

// FuzzUnmountOrder: never "/", never a relative path, each once.
func FuzzUnmountOrder(f *testing.F) {
	f.Add("1 1 254:0 / / rw - xfs /dev/vda rw\n2 1 0:1 / /proc rw - proc proc rw\n")
	f.Add("x y z\n3 1 0:1 / a\\0 rw\n")
	f.Fuzz(func(t *testing.T, mountinfo string) {
		seen := map[string]bool{}
		for _, p := range UnmountOrder(mountinfo) {
			if p == "/" || !strings.HasPrefix(p, "/") || seen[p] {
				t.Fatalf("bad mount point %q", p)
			}
			seen[p] = true
		}
	})
}

func TestNeedsGrow(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name       string
		fs, disk   uint64
		wantGrowth bool
	}{
		{"base image on its own disk", 2*gib - 64<<20, 2 * gib, false},
		{"sandbox overlay of 4 GiB", 2*gib - 64<<20, 4 * gib, true},
		{"already grown", 4*gib - 64<<20, 4 * gib, false},
		{"disk smaller (never shrink)", 4 * gib, 2 * gib, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NeedsGrow(tt.fs, tt.disk); got != tt.wantGrowth {
				t.Errorf("NeedsGrow(%d, %d) = %v", tt.fs, tt.disk, got)
			}
		})
	}
}

func TestPlans(t *testing.T) {
	for _, m := range append(append(Stage1Mounts(), Stage2Mounts()...), RootMounts(ParseCmdline(""))...) {
		if !strings.HasPrefix(m.Target, "/") || m.FSType == "" || m.Source == "" {
			t.Errorf("incomplete mount %+v", m)
		}
		if m.Target == "/tmp" {
			t.Errorf("/tmp must stay on the disk: %+v", m)
		}
	}
	if r := RootMounts(ParseCmdline("strata.root=/dev/vdb")); r[0].Source != "/dev/vdb" || r[0].FSType != "xfs" || r[0].Target != NewRoot {
		t.Errorf("root mount %+v", r[0])
	}
}

func TestQuietSysctls(t *testing.T) {
	for path, v := range QuietSysctls() {
		if !strings.HasPrefix(path, "/proc/sys/") || strings.Contains(path, "..") || v == "" {
			t.Errorf("sysctl %s = %q", path, v)
		}
	}
}

func TestHuman(t *testing.T) {
	for n, want := range map[uint64]string{0: "0B", 1023: "1023B", 1024: "1.0KiB", 3 << 29: "1.5GiB"} {
		if got := human(n); got != want {
			t.Errorf("human(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestGrowBlocks(t *testing.T) {
	for _, tt := range []struct {
		disk      uint64
		blocksize uint32
		want      uint64
	}{
		{4 << 30, 4096, 1 << 20},
		{4<<30 + 1000, 4096, 1 << 20}, // a partial block is not the filesystem's
		{8 << 30, 1024, 8 << 20},
		{4 << 30, 0, 0},
		{0, 4096, 0},
	} {
		if got := GrowBlocks(tt.disk, tt.blocksize); got != tt.want {
			t.Errorf("GrowBlocks(%d, %d) = %d, want %d", tt.disk, tt.blocksize, got, tt.want)
		}
	}
}

func TestPythonLinks(t *testing.T) {
	got := PythonLinks([]string{"python3", "python3.11", "python3.12", "python3.", "python3.x", "python3.11-venv", "python2.7", "x86_64-linux-gnu"})
	want := map[string]string{
		"/usr/local/lib/python3.11/dist-packages/strata": "/run/strata/python/strata",
		"/usr/local/lib/python3.12/dist-packages/strata": "/run/strata/python/strata",
	}
	if !maps.Equal(got, want) {
		t.Errorf("PythonLinks: %v, want %v", got, want)
	}
}

// FuzzPythonLinks: whatever /usr/lib holds, a link is only ever made in
// a python3.N directory under /usr/local/lib, to the package.
func FuzzPythonLinks(f *testing.F) {
	f.Add("python3.11")
	f.Add("python3.11/../../../etc")
	f.Fuzz(func(t *testing.T, name string) {
		for link, target := range PythonLinks([]string{name}) {
			minor, ok := strings.CutPrefix(name, "python3.")
			if !ok || minor == "" || strings.ContainsFunc(minor, func(r rune) bool { return r < '0' || r > '9' }) ||
				target != PythonPath+"/strata" || link != "/usr/local/lib/"+name+"/dist-packages/strata" {
				t.Fatalf("PythonLinks(%q): %s -> %s", name, link, target)
			}
		}
	})
}

func TestHasFilesystem(t *testing.T) {
	listing := "nodev\tsysfs\nnodev\ttmpfs\n\text3\n\text4\nnodev\toverlay\n\txfs\n"
	for _, tc := range []struct {
		fs   string
		want bool
	}{
		{"overlay", true}, {"xfs", true}, {"ext4", true}, {"tmpfs", true},
		{"nodev", false}, {"btrfs", false}, {"over", false}, {"", false},
	} {
		if got := HasFilesystem(listing, tc.fs); got != tc.want {
			t.Errorf("HasFilesystem(%q) = %v, want %v", tc.fs, got, tc.want)
		}
	}
	if HasFilesystem("", "xfs") || HasFilesystem("nodev\n", "xfs") {
		t.Error("found in an empty listing")
	}
}

// FuzzHasFilesystem: a type is found exactly when some line's last field
// is it, and never a type with white space in it.
func FuzzHasFilesystem(f *testing.F) {
	f.Add("nodev\toverlay\n\txfs\n", "xfs")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, listing, fs string) {
		got := HasFilesystem(listing, fs)
		if f := strings.Fields(fs); got && (len(f) != 1 || f[0] != fs) {
			t.Fatalf("found %q", fs)
		}
		if got && !strings.Contains(listing, fs) {
			t.Fatalf("found %q, not in the listing", fs)
		}
	})
}

func TestStripModuleSignature(t *testing.T) {
	mod := []byte("\x7fELF module body")
	sig := []byte("SIGNATURE-BYTES")
	desc := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(len(sig))}
	signed := append(append(append(append([]byte{}, mod...), sig...), desc...), moduleSigMagic...)
	if got := StripModuleSignature(signed); string(got) != string(mod) {
		t.Fatalf("signed: %q, want %q", got, mod)
	}
	if got := StripModuleSignature(mod); string(got) != string(mod) {
		t.Fatalf("unsigned: %q", got)
	}
	// A length past the start keeps the module as it is.
	bad := append(append([]byte("x"), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 200), moduleSigMagic...)
	if got := StripModuleSignature(bad); string(got) != string(bad) {
		t.Fatalf("a bad description: %q", got)
	}
}

// FuzzStripModuleSignature: never a panic, and the result is a prefix.
func FuzzStripModuleSignature(f *testing.F) {
	f.Add([]byte("x" + moduleSigMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		got := StripModuleSignature(b)
		if !strings.HasPrefix(string(b), string(got)) {
			t.Fatal("not a prefix")
		}
	})
}
