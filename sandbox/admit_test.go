package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
	"strata/sandbox"
)

// TestMemoryAdmissionCountsRunningSandboxes: a sandbox that runs counts
// with its whole memory (and a QEMU's overhead) against the host's total
// less the reserve, however much memory the host shows available: the
// second 700 MiB guest on a 1800 MiB host is refused, and admitted with
// an overcommit of 2.
func TestMemoryAdmissionCountsRunningSandboxes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		overcommit float64
		code       string
	}{{"no_overcommit", 0, "host_capacity"}, {"overcommit_2", 2, ""}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			m := h.manager(func(c *sandbox.Config) {
				c.MemTotal = func() (int, error) { return 1800, nil }
				c.Overcommit = tc.overcommit
			})
			for i, id := range []string{"sb-a", "sb-b"} {
				r := record(id)
				r.MemoryMiB = 700
				_, err := m.Create(context.Background(), r)
				if i == 0 || tc.code == "" {
					if err != nil {
						t.Fatalf("Create %s: %v", id, err)
					}
					h.waitState(id, sandbox.Running)
					continue
				}
				wantFault(t, "Create beside a running sandbox", err, tc.code, "")
			}
		})
	}
}

// TestSnapshotQuota: a sandbox's snapshots are capped in bytes: snapshots
// whose disks grow are taken until the next would pass the quota, which
// answers 409 snapshot_quota_exceeded and records nothing; a delete makes
// room again.
func TestSnapshotQuota(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion, c.SnapshotQuotaBytes = qemuVersion, 10<<20 })
	h.running(m, "sb-1")
	var err error
	taken := 0
	for taken < 10 {
		// The guest writes 3 MiB into its disk's top.
		top := h.get("sb-1").Machine.Disk[0]
		f, oerr := os.OpenFile(h.layerPath(top), os.O_WRONLY|os.O_APPEND, 0)
		if oerr != nil {
			t.Fatal(oerr)
		}
		_, werr := f.Write(make([]byte, 3<<20))
		f.Close()
		if werr != nil {
			t.Fatal(werr)
		}
		if _, err = m.Snapshot(ctx, "sb-1", sandbox.SnapshotRequest{}); err != nil {
			break
		}
		taken++
	}
	wantFault(t, "Snapshot past the quota", err, "snapshot_quota_exceeded", "")
	if taken != 3 {
		t.Errorf("%d snapshots of about 3 MiB taken under a 10 MiB quota, want 3", taken)
	}
	r := h.get("sb-1")
	if len(r.Snapshots) != taken || r.SnapshotSeq != taken {
		t.Errorf("snapshots %v (seq %d) after the refusal, want %d", snapshotIDs(r), r.SnapshotSeq, taken)
	}
	if err := m.DeleteSnapshot(ctx, "sb-1", "v1"); err != nil {
		t.Fatal(err)
	}
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	checkStore(t, m)
}

// TestPauseThatCannotSaveSaysSo: a pause admitted (answered pausing) whose
// save then runs out of space ends running, with the record's last_error
// saying so (insufficient_storage), never a silent return; the next pause
// that succeeds clears it.
func TestPauseThatCannotSaveSaysSo(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m := h.manager(nil)
	h.drv.setPlan(plan{saveENOSPC: true})
	h.running(m, "sb-1")
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	r := h.waitState("sb-1", sandbox.Running)
	// Written in the transaction that says running again.
	if r.LastError == nil {
		t.Fatalf("running again with no last_error: %+v", r)
	}
	if e := r.LastError; e.Operation != "pause" || e.Code != "insufficient_storage" || e.At.IsZero() {
		t.Errorf("last_error %+v", e)
	}
	checkStore(t, m)
	h.drv.last("sb-1").plan.saveENOSPC = false
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if r := h.waitState("sb-1", sandbox.Paused); r.LastError != nil {
		t.Errorf("last_error %+v after a pause that worked", r.LastError)
	}
}

// TestFullStore puts the sandboxes' directory on a small filesystem of its
// own (a loop-mounted ext4 image) and fills it: a memory snapshot, a
// disk-only one, a pause, a fork, a create, a restore and a resume each answer 507
// insufficient_storage, with needed and free bytes, before changing
// anything: the sandbox runs on, no snapshot is left processing, and once
// there is room again the snapshots taken before restore and fork.
func TestFullStore(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	mountSmallFS(t, h.dir, 1<<30)
	const reserve = 64 << 20
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion, c.StoreReserveBytes = qemuVersion, reserve })
	h.running(m, "sb-1")
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	h.running(m, "sb-5")
	if _, err := m.Pause(ctx, "sb-5"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-5", sandbox.Paused)
	before, paused := recordJSON(t, h, "sb-1"), recordJSON(t, h, "sb-5")
	want507 := func(what string, err error) {
		t.Helper()
		fe := fault.As(err)
		if fe == nil || fe.Code != "insufficient_storage" || fe.Kind != fault.InsufficientStorage || fe.Fields["free_bytes"] == nil || fe.Fields["needed_bytes"] == nil {
			t.Errorf("%s on a full store: %v (%#v), want insufficient_storage with needed and free bytes", what, err, fe)
		}
	}
	// Room for a layer, not for the guest's 256 MiB of memory.
	filler := fillTo(t, h.dir, reserve+100<<20)
	_, err := m.Snapshot(ctx, "sb-1", sandbox.SnapshotRequest{Memory: true})
	want507("a memory snapshot", err)
	_, err = m.Pause(ctx, "sb-1")
	want507("a pause", err)
	_, err = m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-2", Account: "acct"})
	want507("a fork of a memory snapshot", err)
	_, err = m.Restore(ctx, "sb-1", "v2", false)
	want507("a restore (its automatic snapshot keeps the memory)", err)
	// No room even for a layer.
	fillTo(t, h.dir, reserve+512<<10)
	_, err = m.Snapshot(ctx, "sb-1", sandbox.SnapshotRequest{})
	want507("a disk-only snapshot", err)
	_, err = m.Create(ctx, record("sb-3"))
	want507("a create", err)
	_, err = m.Fork(ctx, "sb-1", "v2", sandbox.Record{ID: "sb-4", Account: "acct"})
	want507("a fork of a disk-only snapshot", err)
	_, err = m.Resume(ctx, "sb-5")
	want507("a resume of a paused sandbox (its load runs on a new top)", err)
	if after := recordJSON(t, h, "sb-1"); after != before {
		t.Errorf("the record changed on a full store:\n%s\n%s", before, after)
	}
	if after := recordJSON(t, h, "sb-5"); after != paused {
		t.Errorf("the paused sandbox's record changed on a full store:\n%s\n%s", paused, after)
	}
	for _, id := range []string{"sb-2", "sb-3", "sb-4"} {
		if _, err := h.recs.Get(ctx, id); fault.CodeOf(err) != "sandbox_not_found" {
			t.Errorf("%s recorded on a full store: %v", id, err)
		}
	}
	checkStore(t, m)
	// Room again: what was there is whole.
	for _, f := range []string{filler, filler + ".2"} {
		os.Remove(f)
	}
	restore(t, m, "sb-1", "v1", false)
	if _, err := m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-2", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-2", sandbox.Running)
	restore(t, m, "sb-1", "v2", false)
	if _, err := m.Resume(ctx, "sb-5"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-5", sandbox.Running)
	checkStore(t, m)
}

// mountSmallFS mounts a fresh ext4 filesystem of size bytes (a sparse
// image beside dir) on dir, traversable by others, until the test ends
// (after the Managers it starts later have closed).
func mountSmallFS(t *testing.T, dir string, size int64) {
	t.Helper()
	img := dir + ".img"
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
}

// fillTo takes the free space of dir's filesystem down to about free
// bytes with a file of its own (allocated, not sparse); a second call adds
// a second file. It returns the first file's path.
func fillTo(t *testing.T, dir string, free int64) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	have := int64(st.Bavail) * st.Bsize
	if have <= free {
		t.Fatalf("%s has %d bytes free, already under %d", dir, have, free)
	}
	path := filepath.Join(dir, "filler")
	if _, err := os.Stat(path); err == nil {
		path += ".2"
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, have-free); err != nil {
		t.Fatalf("fallocate %d bytes: %v", have-free, err)
	}
	return filepath.Join(dir, "filler")
}

// TestTemplateQEMUAdmitted: the QEMU that makes a snapshot's template at
// its first fork holds the snapshot's whole memory, and is admitted as a
// boot is: on a host with room for the fork but not for the template
// QEMU beside it, the fork runs from the snapshot's whole state, with no
// template; with room, from the template.
func TestTemplateQEMUAdmitted(t *testing.T) {
	for _, tc := range []struct {
		name     string
		total    int
		template bool
	}{{"no_room", 1400, false}, {"room", 4096, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			m := h.manager(func(c *sandbox.Config) {
				c.QEMUVersion = qemuVersion
				c.MemTotal = func() (int, error) { return tc.total, nil }
			})
			h.running(m, "sb-1")
			takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
			if _, err := m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-2", Account: "acct"}); err != nil {
				t.Fatal(err)
			}
			r := h.waitState("sb-2", sandbox.Running)
			if got := r.Machine.RAM != ""; got != tc.template {
				t.Errorf("fork maps a template: %v, want %v", got, tc.template)
			}
		})
	}
}

// TestSaveFailedInQEMUWords: a pause and a memory snapshot whose saves
// QEMU fails with text and no errno (its monitor's "No space left on
// device"), after the store filled under them past its reserve, answer
// insufficient_storage (the pause in its last_error), not 500 or an
// empty code: any failed save checks the store's free space again.
//
// Regression: only errors.Is(err, ENOSPC) made a 507.
func TestSaveFailedInQEMUWords(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	mountSmallFS(t, h.dir, 1<<30)
	const reserve = 64 << 20
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion, c.StoreReserveBytes = qemuVersion, reserve })
	gate := make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the Manager's Close, which waits for the save
	h.drv.setPlan(plan{saveGate: gate, saveFails: "qemu of sb-1: saving its state failed: Unable to write to file: No space left on device"})
	h.running(m, "sb-1")
	fm := h.drv.last("sb-1")

	// A memory snapshot.
	done := make(chan error, 1)
	go func() {
		_, err := m.Snapshot(ctx, "sb-1", sandbox.SnapshotRequest{Memory: true})
		done <- err
	}()
	for fm.saves.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	filler := fillTo(t, h.dir, reserve/2)
	open()
	if err := <-done; fault.CodeOf(err) != "insufficient_storage" || fault.As(err).Fields["free_bytes"] == nil {
		t.Errorf("a memory snapshot whose save QEMU failed on a full store: %v, want insufficient_storage with free bytes", err)
	}
	os.Remove(filler)

	// A pause: admitted, then the store fills while it saves.
	gate = make(chan struct{})
	release = sync.Once{}
	fm.plan.saveGate = gate
	saves := fm.saves.Load()
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	for fm.saves.Load() == saves {
		time.Sleep(time.Millisecond)
	}
	filler = fillTo(t, h.dir, reserve/2)
	open()
	r := h.waitState("sb-1", sandbox.Running)
	if e := r.LastError; e == nil || e.Operation != "pause" || e.Code != "insufficient_storage" {
		t.Errorf("last_error %+v after a pause whose save QEMU failed on a full store", e)
	}
	os.Remove(filler)
	checkStore(t, m)
}

// TestNewRefusesADirOthersCanWrite: a Dir below a directory that others
// may write (not sticky) is refused at New, saying which and why.
func TestNewRefusesADirOthersCanWrite(t *testing.T) {
	h := newHarness(t)
	parent := filepath.Dir(h.dir)
	if err := os.Chmod(parent, 0o777); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(parent, 0o711)
	_, err := h.newManager(nil)
	if err == nil || !strings.Contains(err.Error(), parent+" is writable by its group or others") {
		t.Errorf("New below a directory writable by all: %v", err)
	}
}

// TestDiskGrowthAdmitted: on a store whose free space less its reserve,
// times DiskOvercommit, holds the growth of two 1 GiB disks but not of
// three, a third create, a fork and the start of a stopped sandbox answer
// insufficient_storage with the bytes needed, committed and free, and
// nothing is recorded; a sandbox stopped makes room.
//
// Regression: a create reserved only a layer's metadata, so sandboxes
// whose disks could grow to disk_gib filled the store together, and QEMU
// stopped the other guests in io-error.
func TestDiskGrowthAdmitted(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	mountSmallFS(t, h.dir, 1<<30)
	const reserve = 64 << 20
	var st unix.Statfs_t
	if err := unix.Statfs(h.dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	ratio := float64(5<<29) / float64(free-reserve) // 2.5 GiB of growth
	m := h.manager(func(c *sandbox.Config) {
		c.QEMUVersion, c.StoreReserveBytes, c.DiskOvercommit = qemuVersion, reserve, ratio
	})
	h.running(m, "sb-1")
	h.running(m, "sb-2")
	want507 := func(what string, err error) {
		t.Helper()
		fe := fault.As(err)
		if fe == nil {
			t.Errorf("%s past the disks' growth: %v, want insufficient_storage", what, err)
			return
		}
		// A disk's growth: its size less what its top has already.
		needed, _ := fe.Fields["needed_bytes"].(int64)
		if fe.Code != "insufficient_storage" || needed <= 1<<29 || needed > 1<<30 || fe.Fields["committed_bytes"] == nil || fe.Fields["free_bytes"] == nil {
			t.Errorf("%s past the disks' growth: %v (%#v), want insufficient_storage with needed, committed and free bytes", what, err, fe)
		}
	}
	_, err := m.Create(ctx, record("sb-3"))
	want507("a create", err)
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	_, err = m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-4", Account: "acct"})
	want507("a fork", err)
	for _, id := range []string{"sb-3", "sb-4"} {
		if _, err := h.recs.Get(ctx, id); fault.CodeOf(err) != "sandbox_not_found" {
			t.Errorf("%s recorded past the disks' growth: %v", id, err)
		}
	}
	if _, err := m.Stop(ctx, "sb-2"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-2", sandbox.Stopped)
	h.running(m, "sb-3")
	_, err = m.Start(ctx, "sb-2")
	want507("a start", err)
	if r := h.get("sb-2"); r.State != sandbox.Stopped {
		t.Errorf("sb-2 %s after a refused start", r.State)
	}
	checkStore(t, m)
}

// TestIOErrorIsUnresponsive: a guest that QEMU stopped on a failed disk
// write (io-error, the store full) no longer answers and nobody will
// resume it: the heartbeat counts it as not answering, and the sandbox is
// unresponsive saying why, then in error past its limit, saying why too.
//
// Regression: the heartbeat took any guest whose CPUs did not run for a
// paused one, so a guest in io-error showed running while every call
// timed out.
func TestIOErrorIsUnresponsive(t *testing.T) {
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) {
		c.Heartbeat, c.PingTimeout, c.UnresponsiveLimit = 20*time.Millisecond, 150*time.Millisecond, 2*time.Second
	})
	h.running(m, "sb-1")
	fm := waitMachine(t, h.drv, "sb-1")
	fm.ioError.Store(true)
	fm.killGuestd(h.drv.log, false) // its CPUs stopped: nothing answers
	r := h.waitState("sb-1", sandbox.Unresponsive)
	if !strings.Contains(r.UnresponsiveReason, "io-error") || r.UnresponsiveSince.IsZero() {
		t.Errorf("unresponsive since %v, reason %q; want one naming io-error", r.UnresponsiveSince, r.UnresponsiveReason)
	}
	r = h.waitState("sb-1", sandbox.Error)
	if !strings.Contains(r.Error, "io-error") || r.UnresponsiveReason != "" {
		t.Errorf("error %q, reason %q", r.Error, r.UnresponsiveReason)
	}
}

// TestConcurrentBootsHoldTheirDisks: creates and forks at once, on a
// store whose disks' growth (DiskOvercommit × free space less the
// reserve) holds one more 1 GiB disk beside the running one: exactly one
// is admitted, the others answer insufficient_storage, and nothing of
// theirs is recorded.
//
// Regression: disk admission checked and reserved nothing, so boots
// admitted at the same moment each saw room for itself alone.
func TestConcurrentBootsHoldTheirDisks(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	mountSmallFS(t, h.dir, 1<<30)
	const reserve = 64 << 20
	var st unix.Statfs_t
	if err := unix.Statfs(h.dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	ratio := float64(5<<29) / float64(free-reserve) // 2.5 GiB of growth
	m := h.manager(func(c *sandbox.Config) {
		c.QEMUVersion, c.StoreReserveBytes, c.DiskOvercommit = qemuVersion, reserve, ratio
	})
	h.running(m, "sb-1")
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	const n = 10
	var wg sync.WaitGroup
	errs := make([]error, n)
	ready := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ready
			id := fmt.Sprintf("sb-x%d", i)
			if i%2 == 0 {
				_, errs[i] = m.Create(ctx, record(id))
			} else {
				_, errs[i] = m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: id, Account: "acct"})
			}
		}()
	}
	close(ready)
	wg.Wait()
	admitted := 0
	for i, err := range errs {
		id := fmt.Sprintf("sb-x%d", i)
		switch {
		case err == nil:
			admitted++
			h.waitState(id, sandbox.Running)
		case fault.CodeOf(err) != "insufficient_storage":
			t.Errorf("%s: %v, want insufficient_storage or admitted", id, err)
		default:
			if _, err := h.recs.Get(ctx, id); fault.CodeOf(err) != "sandbox_not_found" {
				t.Errorf("%s recorded although refused: %v", id, err)
			}
		}
	}
	if admitted != 1 {
		t.Fatalf("%d of %d boots admitted at once; the store's disks' growth holds one", admitted, n)
	}
	checkStore(t, m)
}
