package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/testenv"
)

// bareHarness runs QEMUs that never run a guest: Start gets Argv's whole
// command line through a wrapper that drops the kernel, the initramfs and
// the kernel's command line and adds -S, so QEMU waits in prelaunch and
// neither firmware nor kernel ever runs. Its block layer works as a
// running machine's does (descriptor sets, nodes, reopens, block jobs,
// exports: QEMU 10.0.2), which is all these tests look at; they need root
// and QEMU, not the guest image.
type bareHarness struct {
	t    *testing.T
	dir  string
	qemu *QEMU
}

func newBareHarness(t *testing.T) *bareHarness {
	t.Helper()
	testenv.RequiresRoot(t)
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "qemu-io"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("this test starts QEMU: %s is not on PATH (make deps installs it)", tool)
		}
	}
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	wrapper := filepath.Join(dir, "qemu-bare")
	script := `#!/bin/sh
# Argv's command line without -kernel, -initrd and -append, in prelaunch.
for a do
	shift
	if [ -n "$skip" ]; then skip=; continue; fi
	case "$a" in -kernel|-initrd|-append) skip=1; continue;; esac
	set -- "$@" "$a"
done
exec qemu-system-x86_64 -S "$@"
`
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return &bareHarness{t: t, dir: dir, qemu: &QEMU{Binary: wrapper}}
}

// layer makes a qcow2 of 64 MiB (over backing, when given), root's, 0600,
// and writes each pattern into it: "0x22@1M+1M" writes bytes 0x22 from
// 1 MiB on, 1 MiB of them.
func (h *bareHarness) layer(name, backing string, patterns ...string) string {
	h.t.Helper()
	path := filepath.Join(h.dir, name+".qcow2")
	args := []string{"create", "-q", "-f", "qcow2"}
	if backing != "" {
		args = append(args, "-b", backing, "-F", "qcow2")
	}
	h.run("qemu-img", append(args, path, "64M")...)
	for _, p := range patterns {
		pat, rest, _ := strings.Cut(p, "@")
		off, n, _ := strings.Cut(rest, "+")
		h.run("qemu-io", "-f", "qcow2", "-c", fmt.Sprintf("write -P %s %s %s", pat, off, n), path)
	}
	os.Chmod(path, 0o600)
	return path
}

// merged is a copy of file rebased (safe mode) onto base: it reads over
// base what file reads over the chain its header names.
func (h *bareHarness) merged(name, file, base string) string {
	h.t.Helper()
	path := filepath.Join(h.dir, name+".qcow2")
	b, err := os.ReadFile(file)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		h.t.Fatal(err)
	}
	h.run("qemu-img", "rebase", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", path)
	return path
}

func (h *bareHarness) run(name string, args ...string) {
	h.t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		h.t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// start runs a machine over disk, killed at the test's end.
func (h *bareHarness) start(name string, uid uint32, disk []Layer) *qemuMachine {
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
	cfg := Config{
		Name: name, Dir: run, Ctl: ctl, Kernel: "/nonexistent/vmlinux", Initrd: "/nonexistent/initramfs",
		Disk: disk, MemoryMiB: 64, VCPUs: 1, Accel: TCG, TSCKHz: 1_000_000, Uid: uid, Gid: uid,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	vm, err := h.qemu.Start(ctx, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		vm.Kill()
		<-vm.Done()
		vm.Close()
	})
	return vm.(*qemuMachine)
}

// checkGuestDisk compares the disk the machine's guest sees (its top
// node, exported read-only over NBD) with the disk want reads (a qcow2
// over the chain its header names), byte for byte.
func (h *bareHarness) checkGuestDisk(m *qemuMachine, want, what string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := m.monitor(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	sock := filepath.Join(m.cfg.Dir, "nbd.sock")
	if _, err := os.Stat(sock); err != nil {
		if _, err := q.Execute(ctx, "nbd-server-start", map[string]any{"addr": map[string]any{"type": "unix", "data": map[string]any{"path": sock}}}); err != nil {
			h.t.Fatal(err)
		}
	}
	top, err := m.top(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	id := fmt.Sprintf("x%d", time.Now().UnixNano())
	if _, err := q.Execute(ctx, "block-export-add", map[string]any{"type": "nbd", "id": id, "node-name": top, "name": id, "writable": false}); err != nil {
		h.t.Fatal(err)
	}
	defer q.Execute(ctx, "block-export-del", map[string]any{"id": id})
	out, err := exec.CommandContext(ctx, "qemu-img", "compare", "-U", "-f", "qcow2", "-F", "raw", want, "nbd+unix:///"+id+"?socket="+sock).CombinedOutput()
	if err != nil {
		h.t.Fatalf("%s: the guest's disk differs from %s: %v: %s", what, filepath.Base(want), err, out)
	}
}

// qemuFiles are the files a process holds descriptors of, each with the
// access modes of its descriptors (O_RDONLY, O_RDWR).
func qemuFiles(t *testing.T, pid int) map[string][]int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]int{}
	for _, e := range ents {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		if err != nil {
			continue
		}
		mode := unix.O_RDWR
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name())); err == nil {
			if fl, ok := fdinfoFlags(b); ok {
				mode = fl & unix.O_ACCMODE
			}
		}
		files[target] = append(files[target], mode)
	}
	return files
}

// checkHeld fails t unless the machine's QEMU holds descriptors of the
// layers of chain (its files, top first) and of no file of gone, the
// top's with one read-write, every other layer's read-only only.
func checkHeld(t *testing.T, m *qemuMachine, chain []string, gone []string, what string) {
	t.Helper()
	files := qemuFiles(t, m.proc.Pid)
	for i, path := range chain {
		modes := files[path]
		if len(modes) == 0 {
			t.Errorf("%s: QEMU holds no descriptor of %s", what, filepath.Base(path))
		}
		writable := 0
		for _, mode := range modes {
			if mode != unix.O_RDONLY {
				writable++
			}
		}
		if i == 0 && writable == 0 {
			t.Errorf("%s: QEMU holds no read-write descriptor of its top %s", what, filepath.Base(path))
		}
		if i > 0 && writable > 0 {
			t.Errorf("%s: QEMU holds %d writable descriptors of frozen layer %s", what, writable, filepath.Base(path))
		}
	}
	for _, path := range gone {
		if n := len(files[path]); n > 0 {
			t.Errorf("%s: QEMU still holds %d descriptors of %s, dropped", what, n, filepath.Base(path))
		}
	}
}

// checkSets fails t if a descriptor set of QEMU's names one of nodes.
func checkSets(t *testing.T, m *qemuMachine, nodes []string, what string) {
	t.Helper()
	q, err := m.monitor(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ret, err := q.Execute(context.Background(), "query-fdsets", nil)
	if err != nil {
		t.Fatal(err)
	}
	var sets []struct {
		ID  int `json:"fdset-id"`
		FDs []struct {
			Opaque string `json:"opaque"`
		} `json:"fds"`
	}
	if err := json.Unmarshal(ret, &sets); err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		for _, fd := range s.FDs {
			for _, n := range nodes {
				if fd.Opaque == n {
					t.Errorf("%s: descriptor set %d of node %s is still QEMU's", what, s.ID, n)
				}
			}
		}
	}
}

// TestRebaseDisk: a running chain's layers are replaced by a merged copy
// of them under a frozen layer (one QEMU reopens read-only: it was the
// top once) and under the top, then a stream runs on the reopened chain;
// the guest's disk stays byte for byte the same, QEMU lets go of every
// dropped layer's descriptors and sets, and holds no writable descriptor
// of a frozen layer (onto was never handed one). A reopen that QEMU
// refuses takes onto's node and descriptors back.
func TestRebaseDisk(t *testing.T) {
	h := newBareHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Each layer writes its own range, and some hide what is under them.
	base := h.layer("base", "", "0x11@0+1M")
	l1 := h.layer("l1", base, "0x22@1M+1M", "0x23@8M+64K")
	l2 := h.layer("l2", l1, "0x33@2M+1M", "0x34@0+512K")
	l3 := h.layer("l3", l2, "0x66@6M+1M", "0x67@1M+4K")
	top := h.layer("top", l3, "0x44@3M+1M")
	want := top // the disk, as the headers chain it
	m := h.start("rebase", testUID(10), []Layer{{"top", top}, {"l3", l3}, {"l2", l2}, {"l1", l1}, {"base", base}})
	h.checkGuestDisk(m, want, "at start")

	// The top is frozen under a new one: QEMU made its node read-write.
	t2 := Layer{Node: "t2", Path: h.layer("t2", "")}
	if err := m.SwitchDisk(ctx, t2); err != nil {
		t.Fatal(err)
	}
	// l3 over l2 and l1 becomes m1, under the frozen old top.
	m1 := Layer{Node: "m1", Path: h.merged("m1", l3, base)}
	if err := m.RebaseDisk(ctx, "top", m1, "base", []string{"l3", "l2", "l1"}); err != nil {
		t.Fatalf("RebaseDisk under a frozen layer: %v", err)
	}
	h.checkGuestDisk(m, want, "under a frozen layer")
	checkHeld(t, m, []string{t2.Path, top, m1.Path, base}, []string{l3, l2, l1}, "under a frozen layer")
	checkSets(t, m, []string{"l3", "l2", "l1"}, "under a frozen layer")

	// The frozen old top over m1 becomes m2, under the top.
	m2 := Layer{Node: "m2", Path: h.merged("m2", top, base)}
	if err := m.RebaseDisk(ctx, "t2", m2, "base", []string{"top", "m1"}); err != nil {
		t.Fatalf("RebaseDisk under the top: %v", err)
	}
	h.checkGuestDisk(m, want, "under the top")
	checkHeld(t, m, []string{t2.Path, m2.Path, base}, []string{top, m1.Path, l3, l2, l1}, "under the top")
	checkSets(t, m, []string{"top", "m1"}, "under the top")
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", t2.Path).Output()
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Backing string `json:"backing-filename"`
	}
	json.Unmarshal(out, &info)
	if info.Backing != m2.Path {
		t.Errorf("the top's header names %q as its backing file, want %s", info.Backing, m2.Path)
	}

	// A block job on the reopened chain still runs to its end (a reopen
	// before block-stream once left the job paused).
	if err := m.StreamDisk(ctx, Layer{Node: "base", Path: base}, []string{"m2"}); err != nil {
		t.Fatalf("StreamDisk after the reopens: %v", err)
	}
	h.checkGuestDisk(m, want, "after a stream")
	checkHeld(t, m, []string{t2.Path, base}, []string{m2.Path}, "after a stream")

	// A reopen QEMU refuses (base over a layer over base: a cycle)
	// leaves no node or descriptor of onto behind.
	m3 := Layer{Node: "m3", Path: h.merged("m3", l1, base)}
	err = m.RebaseDisk(ctx, "base", m3, "base", []string{"l1"})
	if err == nil || errors.Is(err, ErrNotDropped) {
		t.Fatalf("RebaseDisk making a cycle: %v, want a refused reopen", err)
	}
	h.checkGuestDisk(m, want, "after a refused reopen")
	checkHeld(t, m, []string{t2.Path, base}, []string{m3.Path}, "after a refused reopen")
	checkSets(t, m, []string{"m3"}, "after a refused reopen")
	if st, err := m.State(ctx); err != nil || st.Status != "prelaunch" {
		t.Fatalf("the machine: %+v, %v (want prelaunch: no guest ever ran)", st, err)
	}
}
