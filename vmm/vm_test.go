package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/testenv"
)

// These tests run real QEMUs on the guest image's kernel, initramfs and
// base disk (STRATA_IMAGE): the guest boots, and nothing here talks to
// it; what is checked is what the host hands QEMU and what QEMU holds.

// vmHarness is a directory for machines of one test, traversable by
// their uids.
type vmHarness struct {
	t      *testing.T
	dir    string
	kernel string
	initrd string
	base   string
	khz    int
}

func newVMHarness(t *testing.T) *vmHarness {
	t.Helper()
	image := testenv.RequiresImage(t)
	var img struct {
		Kernel string `json:"vmlinux"`
		Initrd string `json:"initramfs"`
		Disk   string `json:"disk"`
	}
	b, err := os.ReadFile(filepath.Join(image, "image.json"))
	if err == nil {
		err = json.Unmarshal(b, &img)
	}
	if err != nil {
		t.Fatal(err)
	}
	host, err := ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	probe, err := ProbeAccel(host, "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	return &vmHarness{t: t, dir: dir, kernel: img.Kernel, initrd: img.Initrd, base: img.Disk, khz: probe.TSCKHz}
}

// testUID is a uid no deployment's range holds (they are 200,000 ids
// each, from 200000 up), and no other test process's.
func testUID(n int) uint32 { return uint32(3_900_000_000 + os.Getpid()%100000*4 + n) }

// config is a machine named name, with its own top layer over the base.
func (h *vmHarness) config(name string, uid uint32) Config {
	h.t.Helper()
	run, ctl := filepath.Join(h.dir, name, "run"), filepath.Join(h.dir, name, "ctl")
	for _, d := range []string{run, ctl} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			h.t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(h.dir, name), 0o711)
	if err := os.Chown(run, int(uid), int(uid)); err != nil {
		h.t.Fatal(err)
	}
	top := h.layer(name+"-top", h.base)
	return Config{
		Name: name, Dir: run, Ctl: ctl, Kernel: h.kernel, Initrd: h.initrd,
		Disk:      []Layer{{Node: "top", Path: top}, {Node: "base", Path: h.base}},
		MemoryMiB: 256, VCPUs: 1, Accel: TCG, TSCKHz: h.khz,
		KernelArgs: []string{"strata.hostname=" + name}, Uid: uid, Gid: uid,
	}
}

// layer makes an empty qcow2 (over backing, when given), root's, 0600.
func (h *vmHarness) layer(name, backing string) string {
	h.t.Helper()
	path := filepath.Join(h.dir, name+".qcow2")
	args := []string{"create", "-q", "-f", "qcow2"}
	if backing != "" {
		args = append(args, "-b", backing, "-F", "qcow2")
	}
	args = append(args, path, "2G")
	if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
		h.t.Fatalf("qemu-img %v: %v: %s", args, err, out)
	}
	os.Chmod(path, 0o600)
	return path
}

// start runs cfg's QEMU, killed at the test's end.
func (h *vmHarness) start(cfg Config) Machine {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := (&QEMU{}).Start(ctx, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		m.Kill()
		<-m.Done()
		m.Close()
	})
	return m
}

// heldFile is a descriptor a QEMU holds, taken with pidfd_getfd.
type heldFile struct {
	num    int
	target string
	fd     int
}

// takeFDs takes a copy of every descriptor of process pid whose target
// satisfies match (the caller closes them).
func takeFDs(t *testing.T, pid int, match func(target string) bool) []heldFile {
	t.Helper()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	var held []heldFile
	for _, e := range ents {
		num, _ := strconv.Atoi(e.Name())
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, num))
		if err != nil || !match(target) {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, num, 0)
		if err != nil {
			t.Fatalf("pidfd_getfd %d (%s): %v", num, target, err)
		}
		held = append(held, heldFile{num: num, target: target, fd: fd})
	}
	return held
}

// checkReadOnly fails unless every descriptor is read-only: its flags
// say so, and a write through it fails with EBADF.
func checkReadOnly(t *testing.T, what string, held []heldFile) {
	t.Helper()
	for _, f := range held {
		flags, err := unix.FcntlInt(uintptr(f.fd), unix.F_GETFL, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, werr := unix.Pwrite(f.fd, []byte{0}, 1<<40)
		if flags&unix.O_ACCMODE != unix.O_RDONLY || !errors.Is(werr, unix.EBADF) {
			t.Errorf("%s: QEMU's fd %d on %s has flags %#o; a write: %v (want read-only, EBADF)", what, f.num, f.target, flags, werr)
		}
	}
}

func closeHeld(held []heldFile) {
	for _, f := range held {
		unix.Close(f.fd)
	}
}

// TestFrozenLayersReadOnly: after a disk-only switch and a live memory
// snapshot (two layers frozen), the QEMU holds no descriptor of a frozen
// layer (nor of the base) that can write it; its new top stays writable.
func TestFrozenLayersReadOnly(t *testing.T) {
	h := newVMHarness(t)
	cfg := h.config("frozen", testUID(0))
	m := h.start(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l1 := Layer{Node: "l1", Path: h.layer("l1", "")}
	if err := m.SwitchDisk(ctx, l1); err != nil {
		t.Fatal(err)
	}
	l2 := Layer{Node: "l2", Path: h.layer("l2", "")}
	state, err := os.Create(filepath.Join(h.dir, "frozen.state"))
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	st, err := m.Save(ctx, state, SaveOptions{Live: true, Overlay: &l2})
	if err != nil || !st.Switched {
		t.Fatalf("Save: %+v, %v", st, err)
	}
	if running, err := m.Running(ctx); err != nil || !running {
		t.Fatalf("after the snapshot: running %v, %v", running, err)
	}
	frozen := map[string]bool{cfg.Disk[0].Path: true, l1.Path: true, h.base: true}
	held := takeFDs(t, m.Process().Pid, func(target string) bool { return frozen[target] })
	defer closeHeld(held)
	seen := map[string]bool{}
	for _, f := range held {
		seen[f.target] = true
	}
	if len(seen) != len(frozen) {
		t.Fatalf("QEMU holds descriptors of %v, want one at least of each of %v", seen, frozen)
	}
	checkReadOnly(t, "frozen layer", held)
	top := takeFDs(t, m.Process().Pid, func(target string) bool { return target == l2.Path })
	defer closeHeld(top)
	writable := false
	for _, f := range top {
		flags, _ := unix.FcntlInt(uintptr(f.fd), unix.F_GETFL, 0)
		writable = writable || flags&unix.O_ACCMODE == unix.O_RDWR
	}
	if !writable {
		t.Error("the new top has no read-write descriptor")
	}
}

// TestForkRAMReadOnly: a fork's QEMU maps the template's RAM from a
// read-only descriptor, the file (0640, root and the template's group)
// cannot be opened for writing by the fork's uid, and the fork loads the
// template's devices and runs.
func TestForkRAMReadOnly(t *testing.T) {
	h := newVMHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gid := testUID(3)
	ram := filepath.Join(h.dir, "t.ram")
	f, err := os.OpenFile(ram, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Chown(0, int(gid)), f.Chmod(0o660), f.Truncate(256<<20)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// The template: the guest's RAM in the file (shared); its devices
	// saved alone.
	tcfg := h.config("template", testUID(1))
	tcfg.RAM, tcfg.Groups = &RAMFile{Path: ram, Shared: true}, []uint32{gid}
	tm := h.start(tcfg)
	dev, err := os.Create(filepath.Join(h.dir, "devices.state"))
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if _, err := tm.Save(ctx, dev, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	tm.Kill()
	<-tm.Done()
	if err := os.Chmod(ram, 0o640); err != nil {
		t.Fatal(err)
	}
	// The fork: its own uid, the template's group.
	fcfg := h.config("fork", testUID(2))
	fcfg.Disk[0].Path = h.layer("fork-top2", "")
	fcfg.Disk = []Layer{{Node: "top", Path: fcfg.Disk[0].Path}, {Node: "ttop", Path: tcfg.Disk[0].Path}, {Node: "base", Path: h.base}}
	fcfg.RAM, fcfg.Groups, fcfg.Incoming = &RAMFile{Path: ram}, []uint32{gid}, true
	fm := h.start(fcfg)
	if _, err := dev.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	if err := fm.Load(ctx, dev); err != nil {
		t.Fatal(err)
	}
	if err := fm.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if running, err := fm.Running(ctx); err != nil || !running {
		t.Fatalf("the fork: running %v, %v", running, err)
	}
	held := takeFDs(t, fm.Process().Pid, func(target string) bool { return target == ram })
	defer closeHeld(held)
	if len(held) == 0 {
		t.Fatal("the fork's QEMU holds no descriptor of the template's RAM")
	}
	checkReadOnly(t, "template RAM", held)
	// As the fork's uid, with the template's group: reading is allowed,
	// writing is not.
	for _, tc := range []struct {
		script string
		denied bool
	}{
		{"exec 3<" + ram, false},
		{"exec 3>>" + ram, true},
		{"exec 3<>" + ram, true},
	} {
		cmd := exec.Command("/bin/sh", "-c", tc.script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: fcfg.Uid, Gid: fcfg.Gid, Groups: []uint32{gid}}}
		out, err := cmd.CombinedOutput()
		if denied := err != nil && strings.Contains(string(out), "Permission denied"); denied != tc.denied {
			t.Errorf("%q as the fork's uid: %v %s (want denied %v)", tc.script, err, out, tc.denied)
		}
	}
}

// TestForkMapsState: a fork maps its RAM from a memory snapshot's own
// mapped-ram state (where RAMRegionOf finds the RAM's pages), read-only,
// with the devices a template QEMU saved from RAM in memory (a memfd: it
// leaves no RAM file on disk); the fork loads them and runs.
func TestForkMapsState(t *testing.T) {
	h := newVMHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	src := h.config("source", testUID(1))
	sm := h.start(src)
	time.Sleep(3 * time.Second) // its kernel and init touch memory
	statePath := filepath.Join(h.dir, "snap.state")
	state, err := os.OpenFile(statePath, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	if _, err := sm.Save(ctx, state, SaveOptions{Live: true}); err != nil {
		t.Fatal(err)
	}
	sm.Kill()
	<-sm.Done()
	fi, err := state.Stat()
	if err != nil {
		t.Fatal(err)
	}
	region, err := RAMRegionOf(state, fi.Size(), RAMID, int64(src.MemoryMiB)<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ClearUnwritten(state, region); err != nil {
		t.Fatal(err)
	}
	// The template: the whole state loaded into RAM in memory, its
	// devices saved alone.
	tcfg := h.config("template", testUID(2))
	tcfg.Disk = []Layer{{Node: "top", Path: tcfg.Disk[0].Path}, {Node: "stop", Path: src.Disk[0].Path}, {Node: "base", Path: h.base}}
	tcfg.RAM, tcfg.Incoming = &RAMFile{InMemory: true, Shared: true}, true
	tm := h.start(tcfg)
	if err := tm.Load(ctx, state); err != nil {
		t.Fatal(err)
	}
	dev, err := os.Create(filepath.Join(h.dir, "devices.state"))
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if _, err := tm.Save(ctx, dev, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	tm.Kill()
	<-tm.Done()
	if di, _ := dev.Stat(); di.Size() > 4<<20 {
		t.Fatalf("the template's devices state is %d bytes: its RAM was saved too", di.Size())
	}
	gid := testUID(0)
	if err := errors.Join(state.Chown(0, int(gid)), state.Chmod(0o640)); err != nil {
		t.Fatal(err)
	}
	fcfg := h.config("fork", testUID(3))
	fcfg.Disk = []Layer{{Node: "top", Path: fcfg.Disk[0].Path}, {Node: "stop", Path: src.Disk[0].Path}, {Node: "base", Path: h.base}}
	fcfg.RAM, fcfg.Groups, fcfg.Incoming = &RAMFile{Path: statePath, Offset: region.Offset}, []uint32{gid}, true
	fm := h.start(fcfg)
	if _, err := dev.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	if err := fm.Load(ctx, dev); err != nil {
		t.Fatal(err)
	}
	if err := fm.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // a guest whose memory is wrong dies now
	if running, err := fm.Running(ctx); err != nil || !running {
		t.Fatalf("the fork: running %v, %v", running, err)
	}
	console, _ := os.ReadFile(fcfg.ConsoleLog())
	for _, bad := range []string{"Oops", "BUG:", "Kernel panic", "general protection"} {
		if strings.Contains(string(console), bad) {
			t.Fatalf("the fork's kernel says %q:\n%s", bad, console)
		}
	}
	held := takeFDs(t, fm.Process().Pid, func(target string) bool { return target == statePath })
	defer closeHeld(held)
	if len(held) == 0 {
		t.Fatal("the fork's QEMU holds no descriptor of the state it maps")
	}
	checkReadOnly(t, "mapped state", held)
}
