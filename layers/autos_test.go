package layers

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fstree"
	"strata/layers/meta"
)

// autos returns the automatic checkpoints of the list, oldest first.
func autos(cps []Checkpoint) []Checkpoint {
	var out []Checkpoint
	for _, c := range cps {
		if c.Auto {
			out = append(out, c)
		}
	}
	return out
}

// TestSafetyCheckpoint: a restore keeps the unsaved changes it discards
// as an automatic checkpoint, and restoring that one brings back every
// byte of them; a restore with nothing unsaved makes none.
func TestSafetyCheckpoint(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		h.reopenWithAutos(DefaultAutoCheckpoints)
		dir := h.mkdir("proj", func(d string) { richTree(t, d) })
		cp1 := h.capture(dir, "one")
		// Unsaved: edits, a new file, a deletion, a renamed directory,
		// a chmod of the root.
		write(t, dir+"/a.txt", "unsaved alpha")
		write(t, dir+"/new/deep/n.txt", strings.Repeat("n", 70000))
		if err := os.Remove(dir + "/empty"); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(dir+"/sub", dir+"/moved"); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		unsaved := fstree.MustSnapshot(t, dir)
		res, err := h.store.Restore(context.Background(), cp1.ID)
		if err != nil {
			t.Fatal(err)
		}
		if res.SafetyCheckpointID == "" {
			t.Fatal("restore with unsaved changes: no safety checkpoint")
		}
		as := autos(mustList(t, h))
		if len(as) != 1 || as[0].ID != res.SafetyCheckpointID || as[0].Name != "before restoring "+cp1.ID || as[0].ParentID != cp1.ID {
			t.Fatalf("automatic checkpoints %+v, want one named for %s with parent %s", as, res.SafetyCheckpointID, cp1.ID)
		}
		if as[0].SizeBytes < 70000 {
			t.Fatalf("safety checkpoint size_bytes %d, want at least the 70000-byte file", as[0].SizeBytes)
		}
		if _, err := os.Stat(dir + "/new"); !os.IsNotExist(err) {
			t.Fatalf("restore left an unsaved file: %v", err)
		}
		// Nothing unsaved now: no second safety checkpoint.
		res2, err := h.store.Restore(context.Background(), cp1.ID)
		if err != nil || res2.SafetyCheckpointID != "" {
			t.Fatalf("restore with nothing unsaved: %+v, %v; want no safety checkpoint", res2, err)
		}
		h.restore(res.SafetyCheckpointID)
		assertTree(t, dir, unsaved)
		h.reopen()
		assertTree(t, dir, unsaved)
		// The undo is a checkpoint like another: its lineage goes on.
		cp2 := h.capture(dir, "after undo")
		if cp2.ParentID != res.SafetyCheckpointID {
			t.Fatalf("capture after the undo has parent %s, want %s", cp2.ParentID, res.SafetyCheckpointID)
		}
		h.assertNoOrphans()
	})
}

// TestSafetyCheckpointsKept: the newest DefaultAutoCheckpoints automatic
// checkpoints are kept; the sixth removes the oldest automatic one and no
// other record.
func TestSafetyCheckpointsKept(t *testing.T) {
	h := newHarness(t, false)
	h.reopenWithAutos(DefaultAutoCheckpoints)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/f", "base") })
	cp1 := h.capture(dir, "one")
	cp2 := h.capture(dir, "two")
	var made []string
	for i := range DefaultAutoCheckpoints + 1 {
		write(t, dir+"/f", "unsaved "+string(rune('a'+i)))
		res, err := h.store.Restore(context.Background(), cp1.ID)
		if err != nil || res.SafetyCheckpointID == "" {
			t.Fatalf("restore %d: %+v, %v", i, res, err)
		}
		made = append(made, res.SafetyCheckpointID)
	}
	all := mustList(t, h)
	as := autos(all)
	if len(as) != DefaultAutoCheckpoints {
		t.Fatalf("%d automatic checkpoints, want %d", len(as), DefaultAutoCheckpoints)
	}
	for i, a := range as {
		if a.ID != made[i+1] {
			t.Fatalf("automatic checkpoint %d is %s, want %s (the oldest goes)", i, a.ID, made[i+1])
		}
	}
	if len(all) != DefaultAutoCheckpoints+2 || all[0].ID != cp1.ID || all[1].ID != cp2.ID {
		t.Fatalf("records %+v: want both client checkpoints kept", all)
	}
	// Each kept one holds its own unsaved version.
	for i, a := range as {
		h.restore(a.ID)
		if b, _ := os.ReadFile(dir + "/f"); string(b) != "unsaved "+string(rune('a'+i+1)) {
			t.Fatalf("automatic checkpoint %d holds %q", i, b)
		}
	}
	h.store.Settle(context.Background())
	h.assertNoOrphans()
}

// TestSafetyCheckpointsOff: AutoCheckpoints 0 discards unsaved changes as
// the seed's restore does.
func TestSafetyCheckpointsOff(t *testing.T) {
	h := newHarness(t, false)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/f", "base") })
	cp1 := h.capture(dir, "one")
	write(t, dir+"/f", "unsaved")
	res, err := h.store.Restore(context.Background(), cp1.ID)
	if err != nil || res.SafetyCheckpointID != "" || len(autos(mustList(t, h))) != 0 {
		t.Fatalf("restore with automatic checkpoints off: %+v, %v, list %+v", res, err, mustList(t, h))
	}
}

// TestRetention: create with retention keeps the newest max_count client
// checkpoints of the directory, deleting the oldest in the same commit;
// automatic ones are not counted and stay.
func TestRetention(t *testing.T) {
	h := newHarness(t, false)
	h.reopenWithAutos(DefaultAutoCheckpoints)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/f", "0") })
	other := h.mkdir("other", func(d string) { write(t, d+"/g", "x") })
	keepOther := h.capture(other, "other")
	first := h.capture(dir, "0")
	write(t, dir+"/f", "unsaved")
	res, err := h.store.Restore(context.Background(), first.ID)
	if err != nil || res.SafetyCheckpointID == "" {
		t.Fatal(res, err)
	}
	var ids []string
	for i := 1; i <= 5; i++ {
		write(t, dir+"/f", string(rune('0'+i)))
		cp, err := h.store.Capture(context.Background(), dir, "", WithRetention(3))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, cp.ID)
	}
	var got []string
	for _, c := range mustList(t, h) {
		got = append(got, c.ID)
	}
	want := []string{keepOther.ID, res.SafetyCheckpointID, ids[2], ids[3], ids[4]}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("after retention 3: %v, want %v", got, want)
	}
	for i, id := range ids[2:] {
		h.restore(id)
		if b, _ := os.ReadFile(dir + "/f"); string(b) != string(rune('3'+i)) {
			t.Fatalf("checkpoint %s holds %q", id, b)
		}
	}
	h.store.Settle(context.Background())
	h.assertNoOrphans()
	// A retry of a create with the same key and another retention is
	// another request.
	if _, err := h.store.Capture(context.Background(), dir, "", WithIdempotencyKey("k"), WithRetention(3)); err != nil {
		t.Fatal(err)
	}
	_, err = h.store.Capture(context.Background(), dir, "", WithIdempotencyKey("k"), WithRetention(4))
	wantCode(t, err, ErrIdempotencyKeyReused.Code)
}

// TestCheckpointLimit: past the cap a create is 409 checkpoint_limit and
// changes nothing, unless it carries retention.
func TestCheckpointLimit(t *testing.T) {
	h := newHarness(t, false)
	old := checkpointCap
	checkpointCap = 3
	t.Cleanup(func() { checkpointCap = old })
	dir := h.mkdir("proj", func(d string) { write(t, d+"/f", "0") })
	for range 3 {
		h.capture(dir, "")
	}
	write(t, dir+"/f", "unsaved")
	_, err := h.store.Capture(context.Background(), dir, "")
	if fe := wantCode(t, err, ErrCheckpointLimit.Code); fe.Fields["limit"] != 3 {
		t.Fatalf("limit %v, want 3", fe.Fields["limit"])
	}
	if n := len(mustList(t, h)); n != 3 {
		t.Fatalf("%d checkpoints after a refused create", n)
	}
	if b, _ := os.ReadFile(dir + "/f"); string(b) != "unsaved" {
		t.Fatalf("the live directory changed: %q", b)
	}
	if err := os.WriteFile(dir+"/g", []byte("still writable"), 0o644); err != nil {
		t.Fatalf("the directory is not writable after a refused create: %v", err)
	}
	cp, err := h.store.Capture(context.Background(), dir, "", WithRetention(3))
	if err != nil {
		t.Fatal(err)
	}
	if l := mustList(t, h); len(l) != 3 || l[2].ID != cp.ID {
		t.Fatalf("with retention at the cap: %+v", l)
	}
}

// TestSizes: a checkpoint's size_bytes counts its own layer; a
// directory's counts its layers and unsaved changes.
func TestSizes(t *testing.T) {
	h := newHarness(t, false)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/big", strings.Repeat("b", 1<<20)) })
	cp1 := h.capture(dir, "")
	if cp1.SizeBytes < 1<<20 {
		t.Fatalf("enrollment checkpoint size_bytes %d, want ≥ 1 MiB", cp1.SizeBytes)
	}
	write(t, dir+"/small", "s")
	cp2 := h.capture(dir, "")
	if cp2.SizeBytes <= 0 || cp2.SizeBytes >= 1<<20 {
		t.Fatalf("second checkpoint size_bytes %d: want its own small layer only", cp2.SizeBytes)
	}
	l := mustList(t, h)
	if l[0].SizeBytes != cp1.SizeBytes || l[1].SizeBytes != cp2.SizeBytes {
		t.Fatalf("list sizes %d %d, create said %d %d", l[0].SizeBytes, l[1].SizeBytes, cp1.SizeBytes, cp2.SizeBytes)
	}
	// A list records the sizes it measured: a restart reads them.
	h.reopen()
	h.store.view(func(tx meta.Tx) error {
		for _, c := range []Checkpoint{cp1, cp2} {
			rec, _ := tx.Checkpoint(c.ID)
			l, err := tx.Layer(rec.Layer)
			if err != nil || l.Bytes != c.SizeBytes {
				t.Errorf("layer of %s records %d bytes (%v), want %d", c.ID, l.Bytes, err, c.SizeBytes)
			}
			// What the operation's tree check measured is what a walk
			// of the layer counts.
			if n, err := treeBytes(h.store.fsDir(rec.Layer)); err != nil || n != c.SizeBytes {
				t.Errorf("a walk of the layer of %s counts %d bytes (%v); the create said %d", c.ID, n, err, c.SizeBytes)
			}
		}
		return nil
	})
	ds, err := h.store.Directories()
	if err != nil {
		t.Fatal(err)
	}
	before := ds[0].SizeBytes
	if before < cp1.SizeBytes+cp2.SizeBytes {
		t.Fatalf("directory size_bytes %d < its checkpoints' %d", before, cp1.SizeBytes+cp2.SizeBytes)
	}
	write(t, filepath.Join(dir, "unsaved"), strings.Repeat("u", 1<<20))
	ds, _ = h.store.Directories()
	if ds[0].SizeBytes < before+1<<20 {
		t.Fatalf("directory size_bytes %d does not count 1 MiB of unsaved changes (was %d)", ds[0].SizeBytes, before)
	}
}

// reopenWithAutos reopens the store keeping n automatic checkpoints.
func (h *harness) reopenWithAutos(n int) {
	h.t.Helper()
	h.cfg.AutoCheckpoints = n
	h.reopen()
}

// TestSafetyCheckpointRetentionKeepsTheRestored: with the newest 5
// automatic checkpoints kept, restoring the oldest of them (over unsaved
// changes) deletes another one, never the one restored; a restore of
// paths from it does the same.
func TestSafetyCheckpointRetentionKeepsTheRestored(t *testing.T) {
	h := newHarness(t, false)
	h.reopenWithAutos(DefaultAutoCheckpoints)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/f", "base") })
	cp1 := h.capture(dir, "one")
	for i := range DefaultAutoCheckpoints {
		write(t, dir+"/f", "unsaved "+string(rune('a'+i)))
		if _, err := h.store.Restore(context.Background(), cp1.ID); err != nil {
			t.Fatal(err)
		}
	}
	oldest := autos(mustList(t, h))[0]
	write(t, dir+"/f", "more unsaved")
	res, err := h.store.Restore(context.Background(), oldest.ID)
	if err != nil || res.SafetyCheckpointID == "" {
		t.Fatalf("restore of the oldest automatic checkpoint: %+v, %v", res, err)
	}
	as := autos(mustList(t, h))
	if len(as) != DefaultAutoCheckpoints || as[0].ID != oldest.ID {
		t.Fatalf("after restoring the oldest automatic checkpoint: %+v; want it kept, %d in all", as, DefaultAutoCheckpoints)
	}
	if b, _ := os.ReadFile(dir + "/f"); string(b) != "unsaved a" {
		t.Fatalf("f = %q", b)
	}
	write(t, dir+"/f", "even more")
	if _, err := h.store.RestorePaths(context.Background(), oldest.ID, []string{"f"}); err != nil {
		t.Fatalf("restore of a path from the oldest automatic checkpoint: %v", err)
	}
	if as := autos(mustList(t, h)); as[0].ID != oldest.ID {
		t.Fatalf("a restore of paths deleted the automatic checkpoint it restores from: %+v", as)
	}
}

// TestSafetyCheckpointSkipsWhatACaptureRefuses: unsaved changes holding a
// special file cannot be a checkpoint; the restore answers as the seed's
// did (no safety checkpoint) rather than refuse.
func TestSafetyCheckpointSkipsWhatACaptureRefuses(t *testing.T) {
	h := newHarness(t, false)
	h.reopenWithAutos(DefaultAutoCheckpoints)
	dir := h.mkdir("proj", func(d string) { write(t, d+"/f", "base") })
	cp1 := h.capture(dir, "one")
	if err := unix.Mkfifo(dir+"/fifo", 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := h.store.Restore(context.Background(), cp1.ID)
	if err != nil || res.SafetyCheckpointID != "" {
		t.Fatalf("restore over a FIFO: %+v, %v; want the seed's answer", res, err)
	}
	if _, err := os.Lstat(dir + "/fifo"); !os.IsNotExist(err) {
		t.Fatalf("the FIFO is still there: %v", err)
	}
	if as := autos(mustList(t, h)); len(as) != 0 {
		t.Fatalf("automatic checkpoints %+v", as)
	}
}

// TestCheckpointLimitCountsAutomatic: automatic checkpoints count toward
// the cap of a directory.
func TestCheckpointLimitCountsAutomatic(t *testing.T) {
	h := newHarness(t, false)
	h.reopenWithAutos(DefaultAutoCheckpoints)
	old := checkpointCap
	checkpointCap = 3
	t.Cleanup(func() { checkpointCap = old })
	dir := h.mkdir("proj", func(d string) { write(t, d+"/f", "0") })
	cp1 := h.capture(dir, "")
	h.capture(dir, "")
	write(t, dir+"/f", "unsaved")
	if res, err := h.store.Restore(context.Background(), cp1.ID); err != nil || res.SafetyCheckpointID == "" {
		t.Fatal(res, err)
	}
	_, err := h.store.Capture(context.Background(), dir, "")
	wantCode(t, err, ErrCheckpointLimit.Code)
	// Retention makes room among the client's own.
	if _, err := h.store.Capture(context.Background(), dir, "", WithRetention(3)); err != nil {
		t.Fatal(err)
	}
	if l := mustList(t, h); len(l) != 3 {
		t.Fatalf("%d checkpoints, want the cap of 3: %+v", len(l), l)
	}
}
