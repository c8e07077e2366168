package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
	"strata/internal/testenv"
	"strata/sandbox"
	"strata/vmm"
)

const (
	uidBase     = 300000
	stopTimeout = 300 * time.Millisecond
	// waitFor bounds every wait for a state: far above what any step
	// takes, so that only a state never reached fails.
	waitFor = 10 * time.Second
)

// harness is one state directory, its records, a fake QEMU and the
// Managers a test starts over them (a second one is a restarted
// hostproxy).
type harness struct {
	t      *testing.T
	dir    string
	claims string // the host's claims of id ranges (one per test)
	image  sandbox.Image
	recs   *memRecords
	drv    *fakeDriver
	mem    atomic.Int64 // MiB the host has available
	booted atomic.Int32 // calls of Config.Booted
	logs   *lockedBuffer
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	// prepare chowns each run directory and disk to the sandbox's uid.
	testenv.RequiresRoot(t)
	requireQemuImg(t)
	// QEMU runs unprivileged below Dir, which New checks: every parent
	// must be traversable by others (t.TempDir's are not). Short, too:
	// a unix socket path is at most 107 bytes.
	top, err := os.MkdirTemp("", "sbx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o711); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(top, "image")
	if err := os.Mkdir(img, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"vmlinux", "initramfs"} {
		if err := os.WriteFile(filepath.Join(img, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := filepath.Join(img, "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	h := &harness{
		t: t, dir: filepath.Join(top, "sb"), claims: filepath.Join(top, "ids.json"),
		image: sandbox.Image{Key: "k", Kernel: filepath.Join(img, "vmlinux"), Initrd: filepath.Join(img, "initramfs"), Disk: base},
		recs:  newMemRecords(),
		logs:  &lockedBuffer{},
	}
	h.mem.Store(16 << 10)
	h.drv = newFakeDriver(slog.New(slog.NewTextHandler(h.logs, nil)))
	t.Cleanup(func() {
		// After the Managers' own cleanups (registered later, run
		// earlier): nothing watches the machines any more.
		for _, m := range h.drv.running() {
			m.Kill()
		}
		if t.Failed() {
			t.Logf("logs:\n%s", h.logs.String())
		}
	})
	return h
}

// requireQemuImg fails t unless qemu-img is on PATH: the Manager makes
// each sandbox's disk with it. Under -short the test is skipped instead.
func requireQemuImg(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("makes disks with qemu-img; skipped under -short")
	}
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Fatal("this test makes sandbox disks: qemu-img is not on PATH (make deps installs it, with QEMU)")
	}
}

// manager starts a Manager over the harness's records and directory,
// closed when the test ends; edit may change its configuration first.
func (h *harness) manager(edit func(*sandbox.Config)) *sandbox.Manager {
	h.t.Helper()
	m, err := h.newManager(edit)
	if err != nil {
		h.t.Fatalf("sandbox.New: %v", err)
	}
	return m
}

// newManager is manager, answering New's error.
func (h *harness) newManager(edit func(*sandbox.Config)) (*sandbox.Manager, error) {
	h.t.Helper()
	cfg := sandbox.Config{
		Dir: h.dir, Image: h.image, Driver: h.drv,
		Accel:   vmm.Probe{Accel: vmm.TCG, TSCKHz: 2_000_000},
		Records: h.recs,
		Log:     slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		UIDBase: uidBase, IDClaims: h.claims, BootTimeout: waitFor, StopTimeout: stopTimeout,
		Booted: func(ctx context.Context, r sandbox.Record) error {
			h.booted.Add(1)
			return nil
		},
		MemAvailable: func() (int, error) { return int(h.mem.Load()), nil },
		// Templates at the first fork, as the tests of records and
		// admission expect; TestTemplateAhead turns it off.
		LazyTemplates: true,
	}
	if edit != nil {
		edit(&cfg)
	}
	m, err := sandbox.New(cfg)
	if err != nil {
		return nil, err
	}
	h.t.Cleanup(m.Close)
	return m, nil
}

// record is a new sandbox's record as hostproxy hands it to Create.
func record(id string) sandbox.Record {
	return sandbox.Record{ID: id, Account: "acct", MemoryMiB: 256, VCPUs: 1, DiskGiB: 1, CreatedAt: time.Now().UTC().Truncate(time.Second)}
}

// create creates sandbox id and checks the answer: creating, with a uid
// of its own and the image's base disk.
func (h *harness) create(m *sandbox.Manager, id string) sandbox.Record {
	h.t.Helper()
	r, err := m.Create(context.Background(), record(id))
	if err != nil {
		h.t.Fatalf("Create %s: %v", id, err)
	}
	if r.State != sandbox.Creating || r.Machine == nil || r.Machine.Uid < uidBase || r.Machine.BaseDisk != h.image.Disk {
		h.t.Fatalf("Create %s answered %+v (machine %+v)", id, r, r.Machine)
	}
	return r
}

// running creates sandbox id and waits until it runs.
func (h *harness) running(m *sandbox.Manager, id string) sandbox.Record {
	h.t.Helper()
	h.create(m, id)
	return h.waitState(id, sandbox.Running)
}

func (h *harness) get(id string) sandbox.Record {
	h.t.Helper()
	r, err := h.recs.Get(context.Background(), id)
	if err != nil {
		h.t.Fatalf("Get %s: %v", id, err)
	}
	return r
}

// waitState waits until the record of id is in state want.
func (h *harness) waitState(id string, want sandbox.State) sandbox.Record {
	h.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		r, err := h.recs.Get(context.Background(), id)
		if err == nil && r.State == want {
			return r
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("sandbox %s: state %q (error %q, get %v) after %v, want %q", id, r.State, r.Error, err, waitFor, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitWritten waits until a record of id in state want has been written
// since the n-th write (memRecords.wrote), however briefly it held, and
// returns the first such.
func (h *harness) waitWritten(id string, want sandbox.State, n int) sandbox.Record {
	h.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		recs, _ := h.recs.wrote(id, n)
		for _, r := range recs {
			if r.State == want {
				return r
			}
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("sandbox %s: no record in state %q written after %v", id, want, waitFor)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitExit waits until the fake machine has exited and returns how.
func waitExit(t *testing.T, fm *fakeMachine) string {
	t.Helper()
	select {
	case <-fm.Done():
		return fm.howExited()
	case <-time.After(waitFor):
		t.Fatalf("machine %d still runs after %v", fm.proc.Pid, waitFor)
		return ""
	}
}

// checkHealth asks the sandbox's guestd for GET /v1/health through a
// stream of its channel (Dial), as hostproxy's guest client does.
func checkHealth(t *testing.T, m *sandbox.Manager, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := m.Dial(ctx, id)
	if err != nil {
		t.Fatalf("Dial %s: %v", id, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(waitFor))
	if _, err := io.WriteString(conn, "GET /v1/health HTTP/1.1\r\nHost: guestd\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("health of %s: %v", id, err)
	}
	defer resp.Body.Close()
	var env struct{ Status string }
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil || resp.StatusCode != 200 || env.Status != "success" {
		t.Fatalf("health of %s: %s, %+v, %v", id, resp.Status, env, err)
	}
}

// wantFault checks that err carries code and, when state is not "", the
// sandbox's state in its fields.
func wantFault(t *testing.T, what string, err error, code string, state sandbox.State) {
	t.Helper()
	fe := fault.As(err)
	if fe == nil || fe.Code != code {
		t.Fatalf("%s: got %v, want %s", what, err, code)
	}
	if state != "" && fe.Fields["state"] != string(state) {
		t.Errorf("%s: fields %v, want state %q", what, fe.Fields, state)
	}
}

func waitMachine(t *testing.T, d *fakeDriver, id string) *fakeMachine {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for d.last(id) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no machine started for %s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return d.last(id)
}

// waitHealthAsked waits until the host's end of fm's channel is
// connected: the Manager's health request goes through it at once, and
// waits for guestd.
func waitHealthAsked(t *testing.T, fm *fakeMachine) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !fm.guest.Up() {
		if time.Now().After(deadline) {
			t.Fatal("the host never connected to the guest's channel")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stopWithin calls Stop and fails the test if it has not returned within
// waitFor.
func stopWithin(t *testing.T, m *sandbox.Manager, id string) (sandbox.Record, time.Duration, error) {
	t.Helper()
	type result struct {
		r   sandbox.Record
		err error
	}
	t0 := time.Now()
	c := make(chan result, 1)
	go func() {
		r, err := m.Stop(context.Background(), id)
		c <- result{r, err}
	}()
	select {
	case res := <-c:
		return res.r, time.Since(t0), res.err
	case <-time.After(waitFor):
		t.Fatalf("Stop of %s has not returned after %v (StopTimeout %v)", id, waitFor, stopTimeout)
		return sandbox.Record{}, 0, nil
	}
}

// checkDeleted checks that a deleted sandbox left nothing: no record, no
// run directory (disk, sockets, logs).
func checkDeleted(t *testing.T, h *harness, id string) {
	t.Helper()
	if _, err := h.recs.Get(context.Background(), id); fault.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("record after Delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.dir, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run directory after Delete: %v", err)
	}
}

func setState(t *testing.T, h *harness, id string, s sandbox.State) {
	t.Helper()
	if _, err := h.recs.Update(context.Background(), id, func(r *sandbox.Record) error {
		r.State = s
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// lockedBuffer collects the logs of a test's Managers and fake guests.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// qemuVersion is the host's QEMU as these tests' Managers report it: a
// memory snapshot records it.
const qemuVersion = "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)"

// snapshotHarness starts a Manager (reporting qemuVersion) with sandbox
// sb-1 running.
func snapshotHarness(t *testing.T) (*harness, *sandbox.Manager) {
	t.Helper()
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
	h.running(m, "sb-1")
	return h, m
}

// checkStore fails t unless the host's store holds exactly what the
// records name: no file missing, none orphaned, no snapshot unfinished.
func checkStore(t *testing.T, m *sandbox.Manager) sandbox.StoreReport {
	t.Helper()
	// A load collects the store in the background, and a restore writes
	// its automatic snapshot's memory there after it answers: orphans and
	// unfinished snapshots may stand for a moment (longer on a busy
	// machine), missing files never.
	var rep sandbox.StoreReport
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var err error
		if rep, err = m.Check(context.Background()); err != nil {
			t.Fatalf("Check: %v", err)
		}
		if rep.Clean() || len(rep.Missing) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if !rep.Clean() {
		t.Errorf("store not clean: %d files, missing %v, orphans %v, unfinished %v", rep.Files, rep.Missing, rep.Orphans, rep.Unfinished)
	}
	return rep
}

func (h *harness) layerPath(id string) string { return filepath.Join(h.dir, "store", id+".qcow2") }

func (h *harness) statePath(id string) string { return filepath.Join(h.dir, "store", id+".state") }

// chainPaths is the disk QEMU must get for layers (top first): their
// files in the store, then the image's base.
func (h *harness) chainPaths(layers []string) []string {
	var out []string
	for _, id := range layers {
		out = append(out, h.layerPath(id))
	}
	return append(out, h.image.Disk)
}

// diskPaths is the disk a fake machine was started with.
func diskPaths(fm *fakeMachine) []string {
	var out []string
	for _, l := range fm.cfg.Disk {
		out = append(out, l.Path)
	}
	return out
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// snapshotIDs are the ids of a record's snapshots, oldest first.
func snapshotIDs(r sandbox.Record) []string {
	ids := []string{}
	for _, s := range r.Snapshots {
		ids = append(ids, s.ID)
	}
	return ids
}

// takeSnapshot takes a snapshot of id and fails t if it is refused.
func takeSnapshot(t *testing.T, m *sandbox.Manager, id string, req sandbox.SnapshotRequest) sandbox.Snapshot {
	t.Helper()
	s, err := m.Snapshot(context.Background(), id, req)
	if err != nil {
		t.Fatalf("Snapshot of %s (%+v): %v", id, req, err)
	}
	// Its files reach the disk in the background, and then its record
	// loses the mark: tests compare records once that is done.
	m.Synced()
	s.Unsynced = ""
	return s
}

// copyDiskSnapshots takes one disk-only snapshot of sb-1 and records n-1
// copies of it by hand (over the same frozen disk): taking
// MaxDiskSnapshots through the Manager takes seconds, each one deepening
// the chain.
func copyDiskSnapshots(t *testing.T, h *harness, m *sandbox.Manager, n int) {
	t.Helper()
	s := takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	if _, err := h.recs.Update(context.Background(), "sb-1", func(r *sandbox.Record) error {
		for range n - 1 {
			r.SnapshotSeq++
			c := s
			c.ID, c.Disk = fmt.Sprintf("v%d", r.SnapshotSeq), slices.Clone(s.Disk)
			r.Snapshots = append(r.Snapshots, c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// takeSnapshots takes n snapshots of sb-1 of one kind.
func takeSnapshots(t *testing.T, m *sandbox.Manager, n int, memory bool) {
	t.Helper()
	for range n {
		takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: memory})
	}
}

func restore(t *testing.T, m *sandbox.Manager, id, snapID string, diskOnly bool) sandbox.RestoreResult {
	t.Helper()
	res, err := m.Restore(context.Background(), id, snapID, diskOnly)
	if err != nil {
		t.Fatalf("Restore %s to %s: %v", id, snapID, err)
	}
	// A running guest's memory may still be written (saveLater).
	m.AutoSaved()
	return res
}

func pin(t *testing.T, m *sandbox.Manager, id string, snapIDs ...string) {
	t.Helper()
	for _, s := range snapIDs {
		if _, err := m.PinSnapshot(context.Background(), id, s, true); err != nil {
			t.Fatalf("pin %s: %v", s, err)
		}
	}
}

// editSnapshot changes a snapshot in its sandbox's record by hand, as a
// crash or an older host would have left it.
func editSnapshot(t *testing.T, h *harness, id, snapID string, edit func(*sandbox.Snapshot)) {
	t.Helper()
	if _, err := h.recs.Update(context.Background(), id, func(r *sandbox.Record) error {
		s, ok := r.Snapshot(snapID)
		if !ok {
			return fmt.Errorf("no snapshot %s", snapID)
		}
		edit(s)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// recordJSON is a record as the registry keeps it, for comparing a record
// before and after an operation that must change nothing.
func recordJSON(t *testing.T, h *harness, id string) string {
	t.Helper()
	b, err := json.Marshal(h.get(id))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The places a running sandbox is moved to before a snapshot or a restore.
func pauseIt(t *testing.T, h *harness, m *sandbox.Manager) {
	t.Helper()
	if _, err := m.Pause(context.Background(), "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
}

func stopIt(t *testing.T, h *harness, m *sandbox.Manager) {
	t.Helper()
	if _, err := m.Stop(context.Background(), "sb-1"); err != nil {
		t.Fatal(err)
	}
}

func killIt(t *testing.T, h *harness, m *sandbox.Manager) {
	t.Helper()
	h.drv.last("sb-1").Kill()
	h.waitState("sb-1", sandbox.Error)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func qemuImg(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v: %s", args, err, out)
	}
}

// waitChain waits until the sandbox's chains are within the bound of a
// linear history (docs/design.md): its disk at most 1 + S layers, each
// snapshot's at most S, S its snapshots; compaction runs in the
// background.
func waitChain(t *testing.T, h *harness, id string) sandbox.Record {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		r := h.get(id)
		s := len(r.Snapshots)
		ok := len(r.Machine.Disk) <= 1+s
		for _, sn := range r.Snapshots {
			ok = ok && len(sn.Disk) <= s
		}
		if ok {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's chains stay long: disk %v, snapshots %+v", id, r.Machine.Disk, r.Snapshots)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitTemplate waits until a snapshot's template, made ahead, is done,
// and returns the snapshot.
func waitTemplate(t *testing.T, h *harness, id, snapID string) sandbox.Snapshot {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r := h.get(id)
		s, ok := r.Snapshot(snapID)
		if ok && s.Template != nil && !s.Template.Building {
			return *s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s of %s has no template 30 s after it was taken", snapID, id)
		}
	}
}

// waitPauseTemplate waits for paused sandbox id's pause template.
func waitPauseTemplate(t *testing.T, h *harness, id string) sandbox.Template {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r := h.get(id)
		if tp := r.Machine.SavedTemplate; tp != nil && !tp.Building && tp.RAM == r.Machine.Saved {
			return *tp
		}
		if time.Now().After(deadline) {
			t.Fatalf("paused %s has no pause template 30 s after its pause: %+v", id, r.Machine)
		}
	}
}

// notCached counts the pages of path's [off, off+size) that are not in
// the page cache.
func notCached(t *testing.T, path string, off, size int64) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), off, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	vec := make([]byte, (size+4095)/4096)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		if v&1 == 0 {
			n++
		}
	}
	return n
}

// checkIncompatible checks that v1 of sb-1 (running) is refused as
// incompatible for what, changing nothing, and then restores its disk.
func checkIncompatible(t *testing.T, h *harness, m *sandbox.Manager, what string) {
	t.Helper()
	ctx := context.Background()
	fm := h.drv.last("sb-1")
	before := recordJSON(t, h, "sb-1")
	_, err := m.Restore(ctx, "sb-1", "v1", false)
	wantFault(t, "Restore", err, "snapshot_incompatible", "")
	differs, _ := fault.As(err).Fields["differs"].(map[string]string)
	if len(differs) != 1 || !strings.Contains(differs[what], "snapshot needs") {
		t.Errorf("differs %v; want only %s, saying what the snapshot needs", fault.As(err).Fields["differs"], what)
	}
	_, err = m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-fork", Account: "acct"})
	wantFault(t, "Fork", err, "snapshot_incompatible", "")
	if after := recordJSON(t, h, "sb-1"); after != before {
		t.Errorf("an incompatible restore changed the record:\n%s\nwas\n%s", after, before)
	}
	if _, err := h.recs.Get(ctx, "sb-fork"); fault.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("an incompatible fork was recorded: %v", err)
	}
	if h.drv.starts("sb-1") != 1 || fm.exited() || h.drv.starts("sb-fork") != 0 {
		t.Error("an incompatible restore or fork touched a machine")
	}
	checkStore(t, m)

	res := restore(t, m, "sb-1", "v1", true)
	r := h.get("sb-1")
	v1, _ := r.Snapshot("v1")
	restored := h.drv.last("sb-1")
	if res.AutoID != "auto-1" || restored == fm || restored.cfg.Incoming || !slices.Equal(r.Machine.Disk[1:], v1.Disk) {
		t.Errorf("disk-only restore: %+v, machine incoming %v, disk %v; want a fresh boot over v1's disk %v", res, restored.cfg.Incoming, r.Machine.Disk, v1.Disk)
	}
	checkHealth(t, m, "sb-1")
	checkStore(t, m)
}
