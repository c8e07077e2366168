package sandbox_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/sandbox"
)

// storeBytes is what the store's files take on the host (st_blocks).
func storeBytes(t *testing.T, h *harness) int64 {
	t.Helper()
	dir := filepath.Join(h.dir, "store")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, e.Name()), &st); err != nil {
			t.Fatal(err)
		}
		n += st.Blocks * 512
	}
	return n
}

// chainSpec is the json: description of a chain of qcow2 files (top
// first), as QEMU gets it: never the backing names in the files.
func chainSpec(t *testing.T, files []string) string {
	t.Helper()
	var node map[string]any
	for i := len(files) - 1; i >= 0; i-- {
		n := map[string]any{"driver": "qcow2", "file": map[string]any{"driver": "file", "filename": files[i]}}
		if node != nil {
			n["backing"] = node
		}
		node = n
	}
	b, err := json.Marshal(node)
	if err != nil {
		t.Fatal(err)
	}
	return "json:" + string(b)
}

// qemuIO runs qemu-io's commands on image (read-only unless write).
func qemuIO(t *testing.T, image string, write bool, cmds ...string) {
	t.Helper()
	args := []string{}
	if !write {
		args = append(args, "-r")
	}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := exec.Command("nice", append([]string{"-n", "15", "qemu-io"}, append(args, image)...)...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "failed") || strings.Contains(strings.ToLower(string(out)), "error") {
		t.Fatalf("qemu-io %v %s: %v: %s", cmds, image, err, out)
	}
}

// TestCompactionStoresOnce: the sequence, 2 GiB written, two
// snapshots, the older deleted: once compacted, the store holds the disk
// once (it grows by at most 10% over what it held before the
// snapshots), on a running sandbox (its QEMU switches onto the merged
// layer) and on a stopped one (its record alone moves); the live chain
// and the kept snapshot read the 2 GiB, the snapshot's size is its merged
// layer's, and the store holds what the records name. (Regression, issue
// 30: the merge copied the deleted snapshot's layer into the kept one's
// while the live chain still read it, and a stream then copied it into
// the live top: 4 GiB stored for 2 GiB of disk.)
func TestCompactionStoresOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stopped bool
	}{
		{"running", false},
		{"stopped", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			m := h.manager(func(c *sandbox.Config) { c.QEMUVersion = qemuVersion })
			rec := record("sb-1")
			rec.DiskGiB = 3
			if _, err := m.Create(ctx, rec); err != nil {
				t.Fatal(err)
			}
			h.waitState("sb-1", sandbox.Running)
			if tc.stopped {
				if _, err := m.Stop(ctx, "sb-1"); err != nil {
					t.Fatal(err)
				}
			}
			// The guest writes 2 GiB into its disk (the fake QEMU writes
			// nothing: qemu-io does, into the top's file).
			r := h.get("sb-1")
			qemuIO(t, h.layerPath(r.Machine.Disk[0]), true, "write -P 0xab 0 1G", "write -P 0xab 1G 1G")
			before := storeBytes(t, h)

			v1 := takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
			v2 := takeSnapshot(t, m, "sb-1", sandbox.SnapshotRequest{})
			if err := m.DeleteSnapshot(ctx, "sb-1", v1.ID); err != nil {
				t.Fatal(err)
			}
			m.Compacted()
			after := storeBytes(t, h)
			t.Logf("store: %d bytes (%d MiB) before the snapshots, %d bytes (%d MiB) once compacted", before, before>>20, after, after>>20)
			if after > before+before/10 {
				t.Errorf("the store grew from %d to %d bytes: the disk's data is stored more than once", before, after)
			}

			r = h.get("sb-1")
			s, _ := r.Snapshot(v2.ID)
			if len(s.Disk) != 1 || len(r.Machine.Disk) != 2 || r.Machine.Disk[1] != s.Disk[0] {
				t.Fatalf("after compaction: live chain %v, %s's %v: want the live top over the snapshot's one merged layer", r.Machine.Disk, v2.ID, s.Disk)
			}
			var st unix.Stat_t
			if err := unix.Stat(h.layerPath(s.Disk[0]), &st); err != nil {
				t.Fatal(err)
			}
			if s.SizeBytes != st.Blocks*512 {
				t.Errorf("%s's size is %d bytes, its layer holds %d", v2.ID, s.SizeBytes, st.Blocks*512)
			}
			read := []string{"read -P 0xab 0 1G", "read -P 0xab 1G 1G", "read -P 0 2G 512M"}
			qemuIO(t, chainSpec(t, h.chainPaths(r.Machine.Disk)), false, read...)
			qemuIO(t, chainSpec(t, h.chainPaths(s.Disk)), false, read...)
			var streams, switches, want int32
			h.drv.mu.Lock()
			for _, fm := range h.drv.byID["sb-1"] {
				streams += fm.streams.Load()
				switches += fm.rebases.Load()
			}
			h.drv.mu.Unlock()
			if !tc.stopped {
				want = 1
			}
			if switches != want || streams != 0 {
				t.Errorf("the QEMU switched its disk onto a merged layer %d times and streamed it %d times: want %d, none", switches, streams, want)
			}
			checkStore(t, m)
		})
	}
}
