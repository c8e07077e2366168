package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"strata/sandbox"
)

// TestTemplateGroupNotGivenWhileAFileHasIt: a group that a file of the
// store still has (a template a crash dropped after giving the
// snapshot's state its group) is never a new template's: its forks could
// open that file.
func TestTemplateGroupNotGivenWhileAFileHasIt(t *testing.T) {
	ctx := context.Background()
	h, m := snapshotHarness(t)
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	if _, err := m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-f1", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	g1 := h.waitState("sb-f1", sandbox.Running).Machine.RAMGid
	// v2's state keeps the next group as if a template had been dropped.
	src := h.get("sb-1")
	v2, _ := src.Snapshot("v2")
	if err := os.Chown(h.statePath(v2.State), 0, int(g1+1)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Fork(ctx, "sb-1", "v2", sandbox.Record{ID: "sb-f2", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	g2 := h.waitState("sb-f2", sandbox.Running).Machine.RAMGid
	if g2 == g1 || g2 == g1+1 || g2 == 0 {
		t.Fatalf("templates' groups %d and %d; the second may be neither the first's nor %d, which a file has", g1, g2, g1+1)
	}
	fi, err := os.Stat(h.statePath(v2.State))
	if err != nil {
		t.Fatal(err)
	}
	if gid := fi.Sys().(*syscall.Stat_t).Gid; gid != g2 {
		t.Errorf("v2's state has group %d, want its template's, %d", gid, g2)
	}
}

// TestTemplateAhead: a memory snapshot's template is made as soon as the
// snapshot is taken, by a QEMU of its own (the source's uid, a directory
// that goes with it), so that the first fork starts no template QEMU and
// maps the snapshot's state at once; a restore's automatic snapshot and
// a disk-only one get none.
func TestTemplateAhead(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion; c.LazyTemplates = false })
	src := h.running(m, "sb-1")
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
	v1 := waitTemplate(t, h, "sb-1", "v1")
	tq := h.drv.last("sb-1" + "+template")
	if tq == nil || tq.cfg.Uid != src.Machine.Uid || tq.cfg.RAM == nil || !tq.cfg.RAM.InMemory {
		t.Fatalf("the template's QEMU: %+v; want one as sb-1's uid %d, its RAM in memory", tq, src.Machine.Uid)
	}
	for deadline := time.Now().Add(30 * time.Second); exists(filepath.Join(h.dir, "sb-1+template")); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the template QEMU's directory outlives it")
		}
	}
	if !tq.exited() {
		t.Fatal("the template's QEMU runs on")
	}
	after := h.get("sb-1")
	if v2, _ := after.Snapshot("v2"); v2.Template != nil {
		t.Errorf("a disk-only snapshot got a template: %+v", v2.Template)
	}
	if _, err := m.Fork(ctx, "sb-1", "v1", sandbox.Record{ID: "sb-f", Account: "acct"}); err != nil {
		t.Fatal(err)
	}
	f := h.waitState("sb-f", sandbox.Running)
	if n := h.drv.starts("sb-f"); n != 1 {
		t.Errorf("the first fork started %d QEMUs; want its own alone", n)
	}
	if f.Machine.RAM != v1.State || f.Machine.RAMOffset != v1.Template.RAMOffset || f.Machine.RAMGid != v1.Template.Gid {
		t.Errorf("the fork maps %s at %d (group %d); want v1's state %s at %d (group %d)", f.Machine.RAM, f.Machine.RAMOffset, f.Machine.RAMGid, v1.State, v1.Template.RAMOffset, v1.Template.Gid)
	}
	restore(t, m, "sb-1", "v1", false)
	time.Sleep(100 * time.Millisecond)
	for _, s := range h.get("sb-1").Snapshots {
		if s.Auto && s.Template != nil {
			t.Errorf("automatic snapshot %s got a template", s.ID)
		}
	}
	if h.drv.starts("sb-1"+"+template") != 1 {
		t.Errorf("%d template QEMUs; want v1's alone", h.drv.starts("sb-1"+"+template"))
	}
	checkStore(t, m)
}

// TestPauseTemplate: a pause's state is made a template in the
// background; the resume maps the state and loads the devices alone; a
// memory snapshot of the paused sandbox shares the state and its
// template; a resume without one loads the whole state; a template a
// crash left building is dropped, the state root's alone again.
func TestPauseTemplate(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion; c.LazyTemplates = false })
	h.running(m, "sb-1")
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
	tpl := waitPauseTemplate(t, h, "sb-1")
	state := h.get("sb-1").Machine.Saved
	if fi, err := os.Stat(h.statePath(state)); err != nil || fi.Mode().Perm() != 0o640 || fi.Sys().(*syscall.Stat_t).Gid != tpl.Gid || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("the paused state once its template is made: %v %v; want root's, group %d, 0640", fi.Mode(), err, tpl.Gid)
	}
	if tq := h.drv.last("sb-1" + "+template"); tq == nil || !tq.exited() || tq.cfg.RAM == nil || !tq.cfg.RAM.InMemory {
		t.Fatalf("the pause template's QEMU: %+v; want one ended, its RAM in memory", tq)
	}
	takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{Memory: true})
	after := h.get("sb-1")
	v1, _ := after.Snapshot("v1")
	if v1.State != state || v1.Template == nil || *v1.Template != tpl {
		t.Fatalf("the paused sandbox's memory snapshot: state %s, template %+v; want the paused state %s and its template %+v", v1.State, v1.Template, state, tpl)
	}
	if _, err := m.Resume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	got := h.waitState("sb-1", sandbox.Running)
	vm := h.drv.last("sb-1")
	if r := vm.cfg.RAM; r == nil || r.Shared || r.Path != h.statePath(state) || r.Offset != tpl.RAMOffset || !slices.Equal(vm.cfg.Groups, []uint32{tpl.Gid}) {
		t.Fatalf("the resumed machine's RAM %+v, groups %v; want the paused state from %d, group %d", r, vm.cfg.Groups, tpl.RAMOffset, tpl.Gid)
	}
	if vm.loaded.Load() != "sb-1" || got.Machine.RAM != state || got.Machine.Saved != "" || got.Machine.SavedTemplate != nil {
		t.Errorf("resumed: loaded %v, record %+v; want sb-1's memory, mapped, nothing left to load", vm.loaded.Load(), got.Machine)
	}
	if n := h.drv.starts("sb-1" + "+template"); n != 1 {
		t.Errorf("%d template QEMUs; want the pause's alone (v1 shares it)", n)
	}
	checkStore(t, m)
	// The mapped state is read into the page cache once the machine
	// runs, holes included (the fake state's RAM is all holes): a save
	// of the resumed guest reads every page.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(h.logs.String(), `msg="RAM file in the page cache" path=`+h.statePath(state)); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the resumed machine's RAM file was not read into the page cache")
		}
	}
	if n := notCached(t, h.statePath(state), tpl.RAMOffset, int64(got.MemoryMiB)<<20); n > 0 {
		t.Errorf("%d pages of the mapped state are not in the page cache after it was read in", n)
	}

	// A load through the template that fails leaves the sandbox paused
	// on its whole state, which the next resume loads.
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
	broken := waitPauseTemplate(t, h, "sb-1")
	if err := os.WriteFile(h.statePath(broken.State), []byte("not a state"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Resume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
	if r := h.get("sb-1"); r.Machine.Saved != broken.RAM || r.Machine.SavedTemplate != nil || r.Machine.RAM != "" {
		t.Fatalf("after a failed load through the pause template: %+v; want the whole state %s to load, no template, no RAM mapped", r.Machine, broken.RAM)
	}
	if _, err := m.Resume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Running)
	if vm := h.drv.last("sb-1"); vm.cfg.RAM != nil || vm.loaded.Load() != "sb-1" {
		t.Errorf("resumed after the failed load: RAM %+v, loaded %v; want the whole state loaded", vm.cfg.RAM, vm.loaded.Load())
	}
	checkStore(t, m)

	// Paused again, its template forgotten: the whole state loads, and
	// the state the first resume mapped goes with its QEMU.
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
	waitPauseTemplate(t, h, "sb-1")
	h.recs.Update(ctx, "sb-1", func(r *sandbox.Record) error {
		r.Machine.SavedTemplate = nil
		return nil
	})
	if _, err := m.Resume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Running)
	if vm := h.drv.last("sb-1"); vm.cfg.RAM != nil || vm.loaded.Load() != "sb-1" {
		t.Errorf("resumed without a template: RAM %+v, loaded %v; want the whole state loaded", vm.cfg.RAM, vm.loaded.Load())
	}
	checkStore(t, m)

	// A template a crash left building: dropped by the next Recover,
	// the paused state root's alone.
	if _, err := m.Pause(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Paused)
	tpl = waitPauseTemplate(t, h, "sb-1")
	h.recs.Update(ctx, "sb-1", func(r *sandbox.Record) error {
		r.Machine.SavedTemplate.Building = true
		return nil
	})
	m.Close()
	m = h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion; c.LazyTemplates = true })
	if err := m.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	r := h.get("sb-1")
	if r.Machine.SavedTemplate != nil {
		t.Errorf("a pause template left building survived Recover: %+v", r.Machine.SavedTemplate)
	}
	if fi, err := os.Stat(h.statePath(r.Machine.Saved)); err != nil || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Gid != 0 {
		t.Errorf("the paused state after its template was dropped: %v %v; want root's alone, 0600", fi.Mode(), err)
	}
	if exists(h.statePath(tpl.State)) {
		t.Errorf("the dropped template's devices state %s is still in the store", tpl.State)
	}
	if _, err := m.Resume(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-1", sandbox.Running)
	checkStore(t, m)
}
