package guestimage

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults of a build.
const (
	DefaultCache = "/var/cache/strata"
	DefaultSuite = "bookworm"
	// DiskBytes is the base disk's virtual size; a sandbox's overlay is
	// larger and the guest grows the filesystem onto it.
	DiskBytes = 2 << 30
	// DefaultKeep is how many image directories a build keeps.
	DefaultKeep = 3
	// DiskLabel is the root filesystem's label.
	DiskLabel = "strata-root"
)

// DefaultPackages are installed on top of mmdebstrap's minbase: sh,
// coreutils, git and python3 must run in a sandbox; xfsprogs gives a
// user the XFS tools (the boot grows the root by ioctl, without them).
var DefaultPackages = []string{
	"ca-certificates", "coreutils", "curl", "git", "iproute2", "less",
	"procps", "python3", "python3-minimal", "util-linux", "xfsprogs",
}

// mmdebstrapOptions keep the userland small: no manuals, docs (but
// copyrights), info pages or translations. Part of the layout: change
// them and bump LayoutVersion.
var mmdebstrapOptions = []string{
	"--variant=minbase",
	"--aptopt=Acquire::Languages \"none\"",
	"--dpkgopt=path-exclude=/usr/share/man/*",
	"--dpkgopt=path-exclude=/usr/share/info/*",
	"--dpkgopt=path-exclude=/usr/share/locale/*",
	"--dpkgopt=path-exclude=/usr/share/doc/*",
	"--dpkgopt=path-include=/usr/share/doc/*/copyright",
}

// Config is one build's inputs.
type Config struct {
	Cache    string // the cache directory (made absolute)
	Guestd   string // a static guestd binary
	Init     string // a static strata-init binary
	Createos string // a static createos binary: the CLI on the guest's PATH
	// Python is the directory of the pure-Python SDK package (strata),
	// put on the guest's system Python path; none when empty.
	Python   string
	Kernel   string // a Kernels name; DefaultKernel when empty
	Suite    string // DefaultSuite when empty
	Packages []string
	Keep     int       // image directories kept; DefaultKeep when 0
	Log      io.Writer // progress lines; none when nil
}

// Build returns the image for cfg: from the cache when it is there (no
// lock, well under a second), else built (its base too when needed) under
// the cache's lock. It needs root only to build a base.
func Build(ctx context.Context, cfg Config) (*Image, error) {
	b, err := newBuilder(cfg)
	if err != nil {
		return nil, err
	}
	return b.build(ctx)
}

type builder struct {
	cfg      Config
	flavor   KernelFlavor
	guestd   string // sha256
	init     string // sha256
	createos string // sha256
	python   string // pythonPackage's digest; "" for none
	pyFiles  []pyFile
	baseRoot string // <cache>/base
	imgRoot  string // <cache>/images
}

func newBuilder(cfg Config) (*builder, error) {
	if cfg.Cache == "" {
		cfg.Cache = DefaultCache
	}
	abs, err := filepath.Abs(cfg.Cache)
	if err != nil {
		return nil, err
	}
	cfg.Cache = abs
	if cfg.Kernel == "" {
		cfg.Kernel = DefaultKernel
	}
	flavor, ok := Kernels[cfg.Kernel]
	if !ok {
		names := make([]string, 0, len(Kernels))
		for n := range Kernels {
			names = append(names, n)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("unknown kernel %q (want one of %s)", cfg.Kernel, strings.Join(names, ", "))
	}
	if cfg.Suite == "" {
		cfg.Suite = DefaultSuite
	}
	if len(cfg.Packages) == 0 {
		cfg.Packages = DefaultPackages
	}
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	b := &builder{cfg: cfg, flavor: flavor, baseRoot: filepath.Join(cfg.Cache, "base"), imgRoot: filepath.Join(cfg.Cache, "images")}
	for _, bin := range []struct{ name, path string }{{"guestd", cfg.Guestd}, {"strata-init", cfg.Init}, {"createos", cfg.Createos}} {
		if err := checkStatic(bin.path); err != nil {
			return nil, fmt.Errorf("%s: %w", bin.name, err)
		}
	}
	if b.guestd, err = fileSHA256(cfg.Guestd); err != nil {
		return nil, err
	}
	if b.init, err = fileSHA256(cfg.Init); err != nil {
		return nil, err
	}
	if b.createos, err = fileSHA256(cfg.Createos); err != nil {
		return nil, err
	}
	if cfg.Python != "" {
		if b.pyFiles, b.python, err = pythonPackage(cfg.Python); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// checkStatic refuses a binary that is not a statically linked ELF: the
// initramfs has no libc.
func checkStatic(path string) error {
	if path == "" {
		return errors.New("no binary given")
	}
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}

func (b *builder) logf(format string, args ...any) {
	fmt.Fprintf(b.cfg.Log, "strata-image: "+format+"\n", args...)
}

// step runs one named step of a build and logs it with its duration.
func (b *builder) step(name, what string, fn func() error) error {
	b.logf("%s: %s", name, what)
	t0 := time.Now()
	if err := fn(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	b.logf("%s: done in %v", name, time.Since(t0).Round(10*time.Millisecond))
	return nil
}

func (b *builder) build(ctx context.Context) (*Image, error) {
	kp, err := resolveKernelMemo(ctx, b.cfg.Cache, b.flavor)
	if err != nil {
		return nil, err
	}
	in := BaseInputs{
		Layout: LayoutVersion, Suite: b.cfg.Suite, Packages: b.cfg.Packages,
		KernelPackage: kp.Name, KernelPackageVersion: kp.Version,
		Modules: WantedModules, DiskBytes: DiskBytes,
	}
	baseKey := BaseKey(in)
	imgKey := ImageKey(baseKey, b.guestd, b.init, b.createos, b.python)
	imgDir := filepath.Join(b.imgRoot, imgKey)
	if img, err := LoadImage(imgDir); err == nil {
		now := time.Now()
		_ = os.Chtimes(imgDir, now, now)
		return img, nil
	}
	unlock, err := lockCache(ctx, b.cfg.Cache, b.logf)
	if err != nil {
		return nil, err
	}
	defer unlock()
	for _, root := range []string{b.cfg.Cache, b.baseRoot, b.imgRoot} {
		if err := mkdirPublic(root); err != nil {
			return nil, err
		}
		removeStale(root)
	}
	baseDir := filepath.Join(b.baseRoot, baseKey)
	base, err := LoadBase(baseDir)
	if errors.Is(err, os.ErrNotExist) {
		base, err = b.buildBase(ctx, in, baseKey, baseDir)
	}
	if err != nil {
		return nil, err
	}
	img, err := LoadImage(imgDir)
	if errors.Is(err, os.ErrNotExist) {
		img, err = b.buildImage(base, imgKey, imgDir)
	}
	if err != nil {
		return nil, err
	}
	if err := pruneImages(b.imgRoot, b.cfg.Keep, imgKey); err != nil {
		b.logf("pruning old images: %v", err)
	}
	return img, nil
}

// buildBase builds the kernel, modules and root disk into a temporary
// directory beside dir and renames it into place.
func (b *builder) buildBase(ctx context.Context, in BaseInputs, key, dir string) (*Base, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("building a base needs root (it loop-mounts the root disk): run strata-image as root")
	}
	for _, tool := range []string{"apt-get", "apt-cache", "dpkg-deb", "depmod", "modprobe", "zstd", "xz", "lz4", "mmdebstrap", "mkfs.xfs", "mount", "tar", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("building a base needs %s: run `make deps` (qemu-utils mmdebstrap xfsprogs zstd xz-utils lz4 kmod)", tool)
		}
	}
	t0 := time.Now()
	b.logf("building base %s (kernel %s %s, Debian %s): about a minute", key[:12], in.KernelPackage, in.KernelPackageVersion, in.Suite)
	tmp, err := os.MkdirTemp(b.baseRoot, ".tmp-"+key[:12]+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	work := filepath.Join(tmp, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, err
	}
	base := &Base{
		Key: key, Layout: LayoutVersion, Suite: in.Suite, Packages: in.Packages,
		KernelPackage: in.KernelPackage, KernelPackageVersion: in.KernelPackageVersion,
		DiskVirtualBytes: in.DiskBytes,
	}
	kroot := filepath.Join(work, "kernel")
	steps := []struct {
		name, what string
		fn         func() error
	}{
		{"kernel.download", fmt.Sprintf("downloading kernel %s %s", in.KernelPackage, in.KernelPackageVersion), func() error {
			return b.downloadKernel(ctx, in, work, kroot, base)
		}},
		{"kernel.vmlinux", "extracting vmlinux from the bzImage", func() error {
			return b.extractVmlinux(ctx, kroot, tmp, base)
		}},
		{"kernel.modules", "resolving modules " + strings.Join(in.Modules, ", "), func() error {
			return b.collectModules(ctx, kroot, tmp, in.Modules, base)
		}},
		{"userland.mmdebstrap", fmt.Sprintf("mmdebstrap %s with %s (about 30 s)", in.Suite, strings.Join(in.Packages, ",")), func() error {
			return b.mmdebstrap(ctx, in, work)
		}},
		{"disk.fill", fmt.Sprintf("mkfs.xfs (reflink, label %s, %d GiB) and unpacking the userland into it", DiskLabel, in.DiskBytes>>30), func() error {
			return b.fillDisk(ctx, work, in.DiskBytes)
		}},
		{"disk.convert", "qemu-img convert to qcow2", func() error {
			return run(ctx, nil, "qemu-img", "convert", "-O", "qcow2", filepath.Join(work, "disk.raw"), filepath.Join(tmp, DiskFile))
		}},
	}
	for _, s := range steps {
		if err := b.step(s.name, s.what, s.fn); err != nil {
			return nil, err
		}
	}
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	base.CreatedAt = time.Now().UTC()
	if err := writeJSON(filepath.Join(tmp, BaseJSON), base); err != nil {
		return nil, err
	}
	if err := publish(tmp, dir); err != nil {
		return nil, err
	}
	b.logf("base %s built in %v", key[:12], time.Since(t0).Round(100*time.Millisecond))
	return LoadBase(dir)
}

func (b *builder) downloadKernel(ctx context.Context, in BaseInputs, work, kroot string, base *Base) error {
	dl := filepath.Join(work, "deb")
	if err := os.Mkdir(dl, 0o755); err != nil {
		return err
	}
	// Run as root, apt-get download would warn that _apt cannot write here.
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", in.KernelPackage+"="+in.KernelPackageVersion)
	cmd.Dir = dl
	if err := runCmd(cmd); err != nil {
		return err
	}
	debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download left %d .deb files", len(debs))
	}
	if err := run(ctx, nil, "dpkg-deb", "-x", debs[0], kroot); err != nil {
		return err
	}
	vers, _ := filepath.Glob(filepath.Join(kroot, "lib/modules/*"))
	if len(vers) != 1 {
		return fmt.Errorf("%s holds %d module trees, want 1", debs[0], len(vers))
	}
	base.KernelVersion = filepath.Base(vers[0])
	return nil
}

func (b *builder) extractVmlinux(ctx context.Context, kroot, tmp string, base *Base) error {
	img, err := os.ReadFile(filepath.Join(kroot, "boot", "vmlinuz-"+base.KernelVersion))
	if err != nil {
		return err
	}
	payload, c, err := Payload(img)
	if err != nil {
		return err
	}
	base.KernelCompression = string(c)
	out := filepath.Join(tmp, VmlinuxFile)
	var args []string
	switch c {
	case Zstd:
		args = []string{"zstd", "-dc"}
	case XZ:
		args = []string{"xz", "-dc", "--single-stream"}
	case LZ4:
		args = []string{"lz4", "-dc"}
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin = bytes.NewReader(payload)
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	runErr := cmd.Run()
	if err := f.Close(); err != nil {
		return err
	}
	// The kernel's build appends the uncompressed size (le32) to the
	// payload: a decompressor may call it trailing garbage. Such an error
	// is fine when the output is a whole ELF of that size.
	got, err := os.ReadFile(out)
	if err != nil {
		return err
	}
	if err := checkELF(got); err != nil {
		return fmt.Errorf("decompressed payload: %w (%s: %v %s)", err, args[0], runErr, tail(stderr.String(), 500))
	}
	if runErr != nil && len(payload) >= 4 && uint32(len(got)) != binary.LittleEndian.Uint32(payload[len(payload)-4:]) {
		return fmt.Errorf("%s: %v: %s", args[0], runErr, tail(stderr.String(), 500))
	}
	return nil
}

// checkELF checks that b is a whole x86-64 executable: its header, and
// every program segment within the file.
func checkELF(b []byte) error {
	if err := CheckVmlinux(b); err != nil {
		return err
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return err
	}
	for _, p := range f.Progs {
		if p.Off+p.Filesz > uint64(len(b)) {
			return fmt.Errorf("segment at %#x+%#x beyond the end (%#x): truncated", p.Off, p.Filesz, len(b))
		}
	}
	return nil
}

func (b *builder) collectModules(ctx context.Context, kroot, tmp string, wanted []string, base *Base) error {
	if err := run(ctx, nil, "depmod", "-b", kroot, base.KernelVersion); err != nil {
		return err
	}
	var deps []ShowDepends
	for _, m := range wanted {
		out, err := output(ctx, "modprobe", "-S", base.KernelVersion, "-d", kroot, "--show-depends", m)
		if err != nil {
			return err
		}
		deps = append(deps, ParseShowDepends(out))
	}
	files, builtin := ModuleOrder(deps)
	base.BuiltinModules = builtin
	mdir := filepath.Join(tmp, ModulesDir)
	if err := os.Mkdir(mdir, 0o755); err != nil {
		return err
	}
	var order strings.Builder
	for _, file := range files {
		name := ModuleName(file)
		dst := filepath.Join(mdir, name+".ko")
		if err := decompressModule(ctx, file, dst); err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
		base.Modules = append(base.Modules, name)
		fmt.Fprintf(&order, "/%s/%s.ko\n", ModulesDir, name)
	}
	builtins := strings.Join(builtin, " ")
	if builtins == "" {
		builtins = "none"
	}
	b.logf("kernel.modules: %s (built in: %s)", strings.Join(base.Modules, " "), builtins)
	return os.WriteFile(filepath.Join(tmp, ModulesOrder), []byte(order.String()), 0o644)
}

func decompressModule(ctx context.Context, src, dst string) error {
	var args []string
	switch {
	case strings.HasSuffix(src, ".ko.xz"):
		args = []string{"xz", "-dc", src}
	case strings.HasSuffix(src, ".ko.zst"):
		args = []string{"zstd", "-dc", src}
	case strings.HasSuffix(src, ".ko.gz"):
		args = []string{"gzip", "-dc", src}
	case strings.HasSuffix(src, ".ko"):
		args = []string{"cat", src}
	default:
		return fmt.Errorf("unknown module file type %s", src)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	err = run(ctx, f, args[0], args[1:]...)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (b *builder) mmdebstrap(ctx context.Context, in BaseInputs, work string) error {
	args := append(slices.Clone(mmdebstrapOptions), "--include="+strings.Join(in.Packages, ","), in.Suite, filepath.Join(work, "rootfs.tar"))
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Env = append(os.Environ(), "TMPDIR="+work)
	return runCmd(cmd)
}

// fillDisk makes work/disk.raw: a sparse file of size bytes holding an XFS
// filesystem with the userland and RootEdits. The loop mount lives in a
// private mount namespace and is undone on every path.
func (b *builder) fillDisk(ctx context.Context, work string, size int64) error {
	raw := filepath.Join(work, "disk.raw")
	f, err := os.OpenFile(raw, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := run(ctx, nil, "mkfs.xfs", "-q", "-m", "reflink=1", "-L", DiskLabel, raw); err != nil {
		return err
	}
	mnt := filepath.Join(work, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	tarball := filepath.Join(work, "rootfs.tar")
	return inPrivateMountNS(func() error {
		if err := run(ctx, nil, "mount", "-t", "xfs", "-o", "loop", raw, mnt); err != nil {
			return err
		}
		err := run(ctx, nil, "tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-xpf", tarball, "-C", mnt)
		if err == nil {
			err = applyRootEdits(mnt, RootEdits())
		}
		if uerr := unix.Unmount(mnt, 0); uerr != nil {
			err = errors.Join(err, fmt.Errorf("unmount %s: %w", mnt, uerr))
		}
		return err
	})
}

// buildImage writes the initramfs and image.json into a temporary
// directory beside dir and renames it into place.
func (b *builder) buildImage(base *Base, key, dir string) (*Image, error) {
	t0 := time.Now()
	tmp, err := os.MkdirTemp(b.imgRoot, ".tmp-"+key[:12]+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	initramfs := filepath.Join(tmp, InitramfsFile)
	err = b.step("image.initramfs", "writing the initramfs (strata-init, guestd, createos, "+fmt.Sprint(len(base.Modules))+" modules)", func() error {
		return writeInitramfs(initramfs, b.cfg.Init, b.cfg.Guestd, b.cfg.Createos, b.pyFiles, base)
	})
	if err != nil {
		return nil, err
	}
	img := &Image{
		Key: key, BaseKey: base.Key, Layout: LayoutVersion, KernelVersion: base.KernelVersion,
		Vmlinux:    filepath.Join(base.Dir, VmlinuxFile),
		Initramfs:  filepath.Join(dir, InitramfsFile),
		Disk:       filepath.Join(base.Dir, DiskFile),
		DiskFormat: "qcow2", DiskVirtualBytes: base.DiskVirtualBytes,
		BaseDir: base.Dir, GuestdSHA256: b.guestd, InitSHA256: b.init, CreateosSHA256: b.createos, PythonSHA256: b.python,
		CreatedAt: time.Now().UTC(),
	}
	if err := writeJSON(filepath.Join(tmp, ImageJSON), img); err != nil {
		return nil, err
	}
	if err := publish(tmp, dir); err != nil {
		return nil, err
	}
	b.logf("image %s built in %v", key[:12], time.Since(t0).Round(10*time.Millisecond))
	return LoadImage(dir)
}

// InitramfsDirs are the directories the initramfs holds besides its
// files: the mount points of stage 1.
var InitramfsDirs = []string{"dev", "proc", "sys", "newroot", ModulesDir}

// writeInitramfs writes the initramfs: /init (strata-init), /guestd,
// /createos, the Python package under /python/strata, /dev/console (5,1:
// the kernel opens it as init's stdio), the modules and their order.
func writeInitramfs(path, initBin, guestd, createos string, python []pyFile, base *Base) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	w := NewCpioWriter(f)
	for _, d := range InitramfsDirs {
		_ = w.Dir(d, 0o755)
	}
	_ = w.CharDev("dev/console", 0o600, 5, 1)
	add := func(name, src string, perm uint32) error {
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		st, err := in.Stat()
		if err != nil {
			return err
		}
		return w.File(name, perm, st.Size(), in)
	}
	err = add("init", initBin, 0o755)
	if err == nil {
		err = add("guestd", guestd, 0o755)
	}
	if err == nil {
		err = add("createos", createos, 0o755)
	}
	if err == nil && len(python) > 0 {
		pkg := InitramfsPythonDir + "/strata"
		for _, d := range append([]string{InitramfsPythonDir, pkg}, prefixAll(pkg+"/", pythonDirs(python))...) {
			if err == nil {
				err = w.Dir(d, 0o755)
			}
		}
		for _, f := range python {
			if err == nil {
				err = add(pkg+"/"+f.rel, f.src, 0o644)
			}
		}
	}
	if err == nil {
		err = add(ModulesOrder, filepath.Join(base.Dir, ModulesOrder), 0o644)
	}
	for _, m := range base.Modules {
		if err == nil {
			err = add(ModulesDir+"/"+m+".ko", filepath.Join(base.Dir, ModulesDir, m+".ko"), 0o644)
		}
	}
	if err == nil {
		err = w.Close()
	}
	if err == nil {
		err = padInitramfs(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// InitrdAlign is the size an initramfs is padded to a multiple of, with
// NULs after its trailer (the kernel skips them). QEMU puts the initrd
// at the top of the guest's low memory, its start rounded down to a page,
// so that its end lies 4095 - (size mod 4096) bytes below a fixed mark; the
// firmware's ACPI tables of a microvm sit just below that mark, and an
// initrd whose end came within about 200 bytes of it overwrote them (the
// MADT's IRQ 0 override gone: the kernel panicked, "IO-APIC + timer
// doesn't work", after a minute in ACPI's set-up). Seen on 2026-12-08 when
// three modules more made the initramfs 27,881,300 bytes (3,924 mod
// 4096); 2,492 mod 4096 booted. A multiple of 4096 ends a whole page
// below the mark: as far from the tables as the alignment allows.
const InitrdAlign = 4096

// padInitramfs pads f, written to its end, to a multiple of InitrdAlign.
func padInitramfs(f *os.File) error {
	end, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	if pad := (InitrdAlign - end%InitrdAlign) % InitrdAlign; pad > 0 {
		_, err = f.Write(make([]byte, pad))
	}
	return err
}

// publish makes tmp world-readable and renames it to dir.
func publish(tmp, dir string) error {
	err := filepath.WalkDir(tmp, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Chmod(p, 0o755)
		case d.Type().IsRegular():
			return os.Chmod(p, 0o644)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

func mkdirPublic(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.Chmod(dir, 0o755)
}

// removeStale removes the .tmp-* directories of builds that died; the
// caller holds the cache's lock, so none is in progress.
func removeStale(root string) {
	stale, _ := filepath.Glob(filepath.Join(root, ".tmp-*"))
	for _, s := range stale {
		_ = os.RemoveAll(s)
	}
}

// run runs a command; stdout goes to out (or into the error with stderr).
func run(ctx context.Context, out io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	if out != nil {
		cmd.Stdout = out
	}
	return runCmd(cmd)
}

// runCmd runs cmd; on failure the error carries the end of its output.
func runCmd(cmd *exec.Cmd) error {
	var buf bytes.Buffer
	if cmd.Stdout == nil {
		cmd.Stdout = &buf
	}
	cmd.Stderr = &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, tail(buf.String(), 3000))
	}
	return nil
}
