package guestimage

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestBaseKey(t *testing.T) {
	in := BaseInputs{
		Layout: 1, Suite: "bookworm", Packages: []string{"git", "python3"},
		KernelPackage: "linux-image-6.12.117+deb12-cloud-amd64", KernelPackageVersion: "6.12.117-1~deb12u1",
		Modules: []string{"xfs"}, DiskBytes: 2 << 30,
	}
	k := BaseKey(in)
	if len(k) != 64 {
		t.Fatalf("key %q", k)
	}
	same := in
	same.Packages = []string{"python3", "git", "git"}
	if BaseKey(same) != k {
		t.Error("the package list is a set: order and repeats must not change the key")
	}
	if in.Packages[0] != "git" || in.Packages[1] != "python3" {
		t.Error("BaseKey changed its argument")
	}
	changes := map[string]func(*BaseInputs){
		"layout":         func(b *BaseInputs) { b.Layout++ },
		"suite":          func(b *BaseInputs) { b.Suite = "trixie" },
		"packages":       func(b *BaseInputs) { b.Packages = append(slices.Clone(b.Packages), "less") },
		"kernel package": func(b *BaseInputs) { b.KernelPackage += "x" },
		"kernel version": func(b *BaseInputs) { b.KernelPackageVersion = "6.12.118-1~deb12u1" },
		"modules":        func(b *BaseInputs) { b.Modules = []string{"xfs", "overlay"} },
		"disk size":      func(b *BaseInputs) { b.DiskBytes *= 2 },
	}
	for name, change := range changes {
		c := in
		change(&c)
		if BaseKey(c) == k {
			t.Errorf("a change of %s keeps the key", name)
		}
	}
}

func TestImageKey(t *testing.T) {
	k := ImageKey("base", "g", "i", "c", "p")
	for _, other := range []string{ImageKey("base2", "g", "i", "c", "p"), ImageKey("base", "g2", "i", "c", "p"), ImageKey("base", "g", "i2", "c", "p"), ImageKey("base", "i", "g", "c", "p"), ImageKey("base", "g", "i", "c2", "p"), ImageKey("base", "g", "c", "i", "p"), ImageKey("base", "g", "i", "c", ""), ImageKey("base", "g", "i", "c", "p2")} {
		if other == k {
			t.Error("a different input gives the same image key")
		}
	}
	if ImageKey("base", "g", "i", "c", "p") != k {
		t.Error("the key is not deterministic")
	}
}

func TestParseKernelDepends(t *testing.T) {
	tests := []struct {
		name, show string
		want       KernelPackage
		wantErr    bool
	}{
		{"6.12 cloud", "Package: linux-image-6.12-cloud-amd64\nSource: linux-signed-amd64 (6.12.117+1~deb12u1)\nVersion: 6.12.117-1~deb12u1\nDepends: linux-image-6.12.117+deb12-cloud-amd64 (= 6.12.117-1~deb12u1)\nDescription: Linux for x86-64 cloud (meta-package)\n\n",
			KernelPackage{"linux-image-6.12.117+deb12-cloud-amd64", "6.12.117-1~deb12u1"}, false},
		{"6.1 cloud, several deps", "Package: linux-image-cloud-amd64\nDepends: linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3), foo (>= 1)\n",
			KernelPackage{"linux-image-6.1.0-57-cloud-amd64", "6.1.192-3"}, false},
		{"only the first stanza", "Package: a\nDepends: foo\n\nPackage: b\nDepends: linux-image-x (= 1)\n", KernelPackage{}, true},
		{"no exact version", "Depends: linux-image-x (>= 1)\n", KernelPackage{}, true},
		// Found by FuzzParseKernelDepends: a version with a space, no name.
		{"malformed version", "Depends:linux-image- (=0 0)", KernelPackage{}, true},
		{"empty", "", KernelPackage{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKernelDepends(tt.show)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("ParseKernelDepends = %+v, %v; want %+v, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// FuzzParseKernelDepends: an answer without an error names a linux-image
// package and a version without spaces or parentheses.
func FuzzParseKernelDepends(f *testing.F) {
	f.Add("Depends: linux-image-6.12.117+deb12-cloud-amd64 (= 6.12.117-1~deb12u1)\n")
	f.Add("Depends: linux-image-x (= ), linux-image-y (= 2)")
	f.Fuzz(func(t *testing.T, show string) {
		kp, err := ParseKernelDepends(show)
		if err != nil {
			return
		}
		if !strings.HasPrefix(kp.Name, "linux-image-") || kp.Version == "" || strings.ContainsAny(kp.Version, " ()") {
			t.Fatalf("%+v from %q", kp, show)
		}
	})
}

// bzImage builds a fake bzImage: setup sectors, a boot header pointing at
// payload, and a decoy magic of the other kind in the setup code.
func bzImage(payload []byte, decoy []byte) []byte {
	img := make([]byte, 2*512+0x100)
	copy(img[0x40:], decoy)
	img[0x1f1] = 1 // setup sectors: protected-mode code at 1024
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(img[0x206:], 0x20f)
	binary.LittleEndian.PutUint32(img[0x248:], 0x100)
	binary.LittleEndian.PutUint32(img[0x24c:], uint32(len(payload)))
	img = append(img, payload...)
	return append(img, "trailing garbage"...)
}

func TestPayload(t *testing.T) {
	zst := append([]byte{0x28, 0xB5, 0x2F, 0xFD}, "frame+size"...)
	xz := append([]byte{0xFD, '7', 'z', 'X', 'Z', 0}, "stream"...)
	lz4 := append([]byte{0x02, 0x21, 0x4C, 0x18}, "blocks"...)
	tests := []struct {
		name    string
		img     []byte
		want    []byte
		c       Compression
		wantErr bool
	}{
		{"header: zstd, exactly the payload", bzImage(zst, xz), zst, Zstd, false},
		{"header: xz", bzImage(xz, zst), xz, XZ, false},
		{"no header: first magic to the end", append([]byte("junk"), append(xz, zst...)...), append(xz, zst...), XZ, false},
		{"header: lz4 legacy", bzImage(lz4, zst), lz4, LZ4, false},
		// Debian's 6.1 cloud kernel: a zstd magic appears inside its LZ4
		// data; a scan would take it.
		{"header with an unknown magic: no scan", bzImage(append([]byte("unknown"), zst...), nil), nil, "", true},
		{"nothing", []byte("MZ plain"), nil, "", true},
		{"empty", nil, nil, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, c, err := Payload(tt.img)
			if (err != nil) != tt.wantErr || c != tt.c || !bytes.Equal(p, tt.want) {
				t.Errorf("Payload = %q, %q, %v; want %q, %q, error %v", p, c, err, tt.want, tt.c, tt.wantErr)
			}
		})
	}
}

// FuzzPayload: a payload found is a piece of the image that starts with
// the magic of the compression it names.
func FuzzPayload(f *testing.F) {
	f.Add(bzImage([]byte{0x28, 0xB5, 0x2F, 0xFD, 1, 2, 3}, nil))
	f.Add([]byte{0xFD, '7', 'z', 'X', 'Z', 0})
	f.Fuzz(func(t *testing.T, img []byte) {
		p, c, err := Payload(img)
		if err != nil {
			return
		}
		var magic []byte
		for _, m := range magics {
			if m.c == c {
				magic = m.magic
			}
		}
		if magic == nil || !bytes.HasPrefix(p, magic) || !bytes.Contains(img, p) {
			t.Fatalf("payload %q (%s) from %q", p, c, img)
		}
	})
}

func TestCheckVmlinux(t *testing.T) {
	elf := func(class, data byte, typ, machine uint16) []byte {
		b := make([]byte, 64)
		copy(b, "\x7fELF")
		b[4], b[5] = class, data
		binary.LittleEndian.PutUint16(b[16:], typ)
		binary.LittleEndian.PutUint16(b[18:], machine)
		return b
	}
	tests := []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"x86-64 executable", elf(2, 1, 2, 0x3e), true},
		{"short", []byte("\x7fELF"), false},
		{"not ELF", bytes.Repeat([]byte{0}, 64), false},
		{"32-bit", elf(1, 1, 2, 0x3e), false},
		{"shared object", elf(2, 1, 3, 0x3e), false},
		{"arm64", elf(2, 1, 2, 0xb7), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := CheckVmlinux(tt.b); (err == nil) != tt.ok {
				t.Errorf("CheckVmlinux: %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestModuleOrder(t *testing.T) {
	root := "/c/lib/modules/6.12.117+deb12-cloud-amd64/kernel/"
	answers := map[string]string{
		"virtio_mmio":    "insmod " + root + "drivers/virtio/virtio_mmio.ko.xz \n",
		"virtio_blk":     "insmod " + root + "drivers/block/virtio_blk.ko.xz \n",
		"virtio_console": "builtin virtio_console\n",
		"xfs":            "insmod " + root + "arch/x86/crypto/crc32c-intel.ko.xz \ninsmod " + root + "lib/libcrc32c.ko.xz \ninsmod " + root + "fs/xfs/xfs.ko.xz \n",
		"overlay":        "insmod " + root + "lib/libcrc32c.ko.xz \ninsmod " + root + "fs/overlayfs/overlay.ko.xz opt=1\n",
	}
	var deps []ShowDepends
	for _, m := range WantedModules {
		deps = append(deps, ParseShowDepends(answers[m]))
	}
	files, builtin := ModuleOrder(deps)
	var names []string
	for _, f := range files {
		names = append(names, ModuleName(f))
	}
	want := []string{"virtio_mmio", "virtio_blk", "crc32c-intel", "libcrc32c", "xfs", "overlay"}
	if !slices.Equal(names, want) {
		t.Errorf("order %q, want %q", names, want)
	}
	if !slices.Equal(builtin, []string{"virtio_console"}) {
		t.Errorf("builtin %q", builtin)
	}
	for file, name := range map[string]string{"a/b/x.ko": "x", "x.ko.zst": "x", "/y/crc32c-intel.ko.xz": "crc32c-intel", "z.ko.gz": "z"} {
		if got := ModuleName(file); got != name {
			t.Errorf("ModuleName(%q) = %q, want %q", file, got, name)
		}
	}
}

// FuzzParseShowDepends: each file and builtin name is one field, and
// merging keeps each file once.
func FuzzParseShowDepends(f *testing.F) {
	f.Add("insmod /a.ko.xz \nbuiltin b\nfoo\n")
	f.Fuzz(func(t *testing.T, out string) {
		d := ParseShowDepends(out)
		for _, s := range append(slices.Clone(d.Files), d.Builtin...) {
			if s == "" || strings.ContainsAny(s, " \t\n") {
				t.Fatalf("field %q from %q", s, out)
			}
		}
		files, _ := ModuleOrder([]ShowDepends{d, d})
		if len(files) != len(slices.Compact(slices.Sorted(slices.Values(files)))) {
			t.Fatalf("repeated file in %q", files)
		}
	})
}

// cpioEntry is one entry read back from a newc archive.
type cpioEntry struct {
	name         string
	mode         uint32
	rmaj, rmin   uint32
	data         string
	ino, nlink   uint32
	mtime, check uint32
}

// readCpio parses a newc archive up to its trailer, checking alignment.
func readCpio(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("header field %d at %d: %v", i, off, err)
		}
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if off%4 != 0 || off+110 > len(b) || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at %d", off)
		}
		e := cpioEntry{ino: field(0), mode: field(1), nlink: field(4), mtime: field(5), rmaj: field(9), rmin: field(10), check: field(12)}
		size, namesize := int(field(6)), int(field(11))
		name := b[off+110 : off+110+namesize]
		if name[len(name)-1] != 0 {
			t.Fatalf("name at %d not NUL-terminated", off)
		}
		e.name = string(name[:len(name)-1])
		off = align(off + 110 + namesize)
		e.data = string(b[off : off+size])
		off = align(off + size)
		if e.name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out = append(out, e)
	}
}

func TestCpioWriter(t *testing.T) {
	var buf bytes.Buffer
	w := NewCpioWriter(&buf)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.Dir("/dev", 0o755))
	must(w.CharDev("dev/console", 0o600, 5, 1))
	must(w.File("init", 0o755, 5, strings.NewReader("hello")))
	must(w.File("modules.order", 0o644, 0, strings.NewReader("")))
	must(w.File("odd", 0o644, 3, strings.NewReader("abcdef"))) // only size bytes are taken
	must(w.Close())
	got := readCpio(t, buf.Bytes())
	want := []cpioEntry{
		{name: "dev", mode: 0o040755, nlink: 2},
		{name: "dev/console", mode: 0o020600, rmaj: 5, rmin: 1, nlink: 1},
		{name: "init", mode: 0o100755, data: "hello", nlink: 1},
		{name: "modules.order", mode: 0o100644, nlink: 1},
		{name: "odd", mode: 0o100644, data: "abc", nlink: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("entries %+v", got)
	}
	inos := map[uint32]bool{}
	for i := range want {
		g := got[i]
		if inos[g.ino] || g.ino == 0 {
			t.Errorf("%s: inode %d repeated or zero", g.name, g.ino)
		}
		inos[g.ino] = true
		g.ino = 0
		if g != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, g, want[i])
		}
	}
	if w.File("short", 0o644, 10, strings.NewReader("abc")) == nil {
		t.Error("a file shorter than its size must fail")
	}
	// The system's cpio, when there is one, reads it too.
	if _, err := exec.LookPath("cpio"); err == nil {
		cmd := exec.Command("cpio", "-it", "--quiet")
		cmd.Stdin = bytes.NewReader(buf.Bytes())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("cpio -t: %v", err)
		}
		if names := strings.Fields(string(out)); !slices.Equal(names, []string{"dev", "dev/console", "init", "modules.order", "odd"}) {
			t.Errorf("cpio -t lists %q", names)
		}
	} else {
		t.Log("no cpio on this machine: checked with the test's own reader only")
	}
}

func TestCpioWriterRejects(t *testing.T) {
	for _, name := range []string{"", "/", "a\x00b"} {
		w := NewCpioWriter(io.Discard)
		if w.Dir(name, 0o755) == nil {
			t.Errorf("name %q accepted", name)
		}
	}
}

func TestApplyRootEdits(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	victim := filepath.Join(outside, "hosts")
	if err := os.WriteFile(victim, []byte("host's own\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"etc", "var/lib", "inside"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// An absolute symlink as the edited file, and one as a parent: neither
	// may lead out of root.
	if err := os.Symlink(victim, filepath.Join(root, "etc/hosts")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/inside", filepath.Join(root, "run")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/machine-id"), []byte("0123456789abcdef\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := applyRootEdits(root, RootEdits()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "host's own\n" {
		t.Errorf("the file outside the root changed: %q", b)
	}
	files := map[string]struct {
		content string
		mode    os.FileMode
	}{
		"etc/hosts":      {"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n", 0o644},
		"etc/hostname":   {"sandbox\n", 0o644},
		"etc/fstab":      {"", 0o644},
		"etc/machine-id": {"", 0o444},
	}
	for name, want := range files {
		st, err := os.Lstat(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(root, name))
		if !st.Mode().IsRegular() || st.Mode().Perm() != want.mode || string(b) != want.content {
			t.Errorf("%s: %v %q, want a %v file with %q", name, st.Mode(), b, want.mode, want.content)
		}
	}
	dirs := map[string]os.FileMode{"workspace": 0o755, "var/lib/strata": 0o700, "inside/strata": 0o755}
	for name, mode := range dirs {
		st, err := os.Stat(filepath.Join(root, name))
		if err != nil || !st.IsDir() || st.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want a %v directory", name, st, err, mode)
		}
	}
	if err := applyRootEdits(root, []RootEdit{{Path: "../escape", Mode: 0o644}}); err == nil {
		t.Error("a path with .. was applied")
	}
}

func TestPruneImages(t *testing.T) {
	root := t.TempDir()
	base := time.Now().Add(-time.Hour)
	for i, name := range []string{"a", "b", "c", "d", "e"} { // a oldest, e newest
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mt := base.Add(time.Duration(i) * time.Minute)
		if err := os.Chtimes(dir, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, ".tmp-x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := pruneImages(root, 3, "a"); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(root)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{".tmp-x", "a", "d", "e"}; !slices.Equal(left, want) {
		t.Errorf("left %q, want %q (the current one, the newest others, and builds in progress)", left, want)
	}
}

// TestPythonPackage: the package's .py files and py.typed go into the
// image (caches do not), its digest follows their names and contents,
// and a symlink in it is refused.
func TestPythonPackage(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := pythonPackage(dir); err == nil {
		t.Fatal("a package without __init__.py was taken")
	}
	write("__init__.py", "x = 1\n")
	write("py.typed", "")
	write("aio/client.py", "y = 2\n")
	write("__pycache__/x.cpython-311.pyc", "junk")
	write("notes.txt", "not code")
	files, d1, err := pythonPackage(dir)
	if err != nil {
		t.Fatal(err)
	}
	var rels []string
	for _, f := range files {
		rels = append(rels, f.rel)
	}
	if want := []string{"__init__.py", "aio/client.py", "py.typed"}; !slices.Equal(rels, want) {
		t.Fatalf("files %v, want %v", rels, want)
	}
	if dirs := pythonDirs(files); !slices.Equal(dirs, []string{"aio"}) {
		t.Fatalf("dirs %v", dirs)
	}
	write("aio/client.py", "y = 3\n")
	if _, d2, _ := pythonPackage(dir); d2 == d1 {
		t.Fatal("the digest did not change with a file's content")
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "evil.py")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := pythonPackage(dir); err == nil {
		t.Fatal("a symlink in the package was taken")
	}
}

// TestInitramfsPadded: the initramfs is a multiple of InitrdAlign, its
// entries read back whole before the NULs (see InitrdAlign: an initrd
// that ends too close to the top of low memory overwrote a microvm's
// ACPI tables).
func TestInitramfsPadded(t *testing.T) {
	dir := t.TempDir()
	base := &Base{Dir: filepath.Join(dir, "base"), Modules: []string{"xfs"}}
	os.MkdirAll(filepath.Join(base.Dir, ModulesDir), 0o755)
	for name, size := range map[string]int{"init": 1000, "guestd": 3001, "createos": 77} {
		os.WriteFile(filepath.Join(dir, name), bytes.Repeat([]byte{'x'}, size), 0o755)
	}
	os.WriteFile(filepath.Join(base.Dir, ModulesOrder), []byte("/modules/xfs.ko\n"), 0o644)
	os.WriteFile(filepath.Join(base.Dir, ModulesDir, "xfs.ko"), []byte("module"), 0o644)
	out := filepath.Join(dir, "initramfs.cpio")
	if err := writeInitramfs(out, filepath.Join(dir, "init"), filepath.Join(dir, "guestd"), filepath.Join(dir, "createos"), nil, base); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(b)%InitrdAlign != 0 {
		t.Fatalf("initramfs of %d bytes: not a multiple of %d", len(b), InitrdAlign)
	}
	// The archive ends after the trailer's name, aligned to 4; NULs
	// after it are the padding.
	i := bytes.LastIndex(b, []byte("TRAILER!!!\x00"))
	if i < 0 {
		t.Fatal("no trailer")
	}
	archive := (i + len("TRAILER!!!\x00") + 3) &^ 3
	if len(bytes.Trim(b[archive:], "\x00")) != 0 {
		t.Fatal("bytes other than NULs after the trailer")
	}
	var names []string
	for _, e := range readCpio(t, b[:archive]) {
		names = append(names, e.name)
	}
	for _, want := range []string{"init", "guestd", "createos", ModulesOrder, ModulesDir + "/xfs.ko"} {
		if !slices.Contains(names, want) {
			t.Errorf("the initramfs lacks %s: %v", want, names)
		}
	}
}
