package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"strata/sandbox"
)

// qemuLayers are the store layers a sandbox's QEMU holds open (its disk
// chain as QEMU has it, the base image aside), and the one it writes.
func (s *vmStack) qemuLayers(id string) (layers []string, top string) {
	s.t.Helper()
	pid := s.qemuPid(id)
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	store := sandbox.StoreDir(s.machines) + "/"
	seen := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil || !strings.HasPrefix(target, store) || !strings.HasSuffix(target, ".qcow2") {
			continue
		}
		if !seen[target] {
			seen[target] = true
			layers = append(layers, target)
		}
		info, _ := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				if fl, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64); err == nil && fl&3 == 2 { // O_RDWR
					top = target
				}
			}
		}
	}
	return layers, top
}

// headerChain is the chain the qcow2 headers name from file down: what a
// tool reading the files alone (qemu-img) finds.
func headerChain(t *testing.T, file string) []string {
	t.Helper()
	names, err := readHeaderChain(file)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// readHeaderChain is headerChain's reading, with its error: a file that
// compaction is rewriting or has just dropped may not be read.
func readHeaderChain(file string) ([]string, error) {
	out, err := exec.Command("qemu-img", "info", "-U", "--backing-chain", "--output=json", file).Output()
	if err != nil {
		return nil, fmt.Errorf("qemu-img info %s: %v", file, err)
	}
	var chain []struct {
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(out, &chain); err != nil {
		return nil, err
	}
	var names []string
	for _, c := range chain {
		names = append(names, c.Filename)
	}
	return names, nil
}

// waitChainBound waits until the sandbox's QEMU holds at most bound store
// layers (compaction runs in the background), and checks that the top's
// qcow2 header names a chain of the same length.
func (s *vmStack) waitChainBound(id string, bound int) int {
	s.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		layers, top := s.qemuLayers(id)
		// QEMU's layers and the top's header are read one after the
		// other: a compaction that ends in between (a block-stream
		// rewrites the top's backing) shows them apart for a moment, so
		// they must agree within the deadline, not at the first look.
		var h []string
		if top != "" {
			h = headerChain(s.t, top)
		}
		if len(layers) <= bound && top != "" && len(h) == len(layers)+1 {
			return len(layers)
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s's QEMU holds %d layers (bound %d), the top's header names %d files: %v, %v", id, len(layers), bound, len(h), layers, h)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// records stops hostproxy and reads its registry (then starts it again).
func (s *vmStack) records() (recs []sandbox.Record) {
	s.t.Helper()
	s.whileStopped(func(r []sandbox.Record) { recs = r })
	return recs
}

func storeFiles(t *testing.T, s *vmStack) int {
	entries, err := os.ReadDir(sandbox.StoreDir(s.machines))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// TestVMChainBound: 300 disk-only snapshots of a running sandbox, each
// followed by the delete of the one before (two kept for good along the
// way), 100 pauses and resumes, and snapshots of the stopped sandbox:
// the disk chain QEMU holds, the one the records name and the one the
// qcow2 headers name stay within the bound of docs/design.md (1 + S
// layers over the base image for a linear history, S snapshots), the
// store does not grow, and every snapshot left restores with the files
// written before it. (Regression: every snapshot, pause and resume added
// a layer for good; at about a thousand, boots failed.)
func TestVMChainBound(t *testing.T) {
	// Beside the idle test, which mostly waits (its own sandboxes'
	// CPU is what it measures): the suite's time, not this test's.
	t.Parallel()
	s := startVMStack(t, "60s")
	id := s.create(s.key, `{"name":"chain","memory_mib":256}`)
	snaps := "/v1/sandboxes/" + id + "/snapshots"
	marks := map[string]string{} // snapshot → /root/mark when taken
	kept := []string{}
	prev := ""
	files := 0
	t0 := time.Now()
	for i := 1; i <= 300; i++ {
		s.sh(id, fmt.Sprintf("echo %d > /root/mark", i))
		sn := s.must(200, "POST", snaps, `{"memory":false}`).data()["id"].(string)
		marks[sn] = strconv.Itoa(i)
		switch {
		case i == 100 || i == 200:
			kept = append(kept, sn) // kept for good, the previous one too
			if prev != "" {
				s.must(200, "DELETE", snaps+"/"+prev, "")
			}
			prev = ""
			continue
		case prev != "":
			s.must(200, "DELETE", snaps+"/"+prev, "")
		}
		prev = sn
		if i == 10 {
			t.Logf("snapshot and delete cycles: %v each", (time.Since(t0) / 10).Round(time.Millisecond))
		}
		if i%50 == 0 {
			n := s.waitChainBound(id, 2+len(kept))
			if i == 250 {
				// Every snapshot kept for good is taken: from here on
				// the store holds as many files.
				files = storeFiles(t, s)
			}
			t.Logf("cycle %d: QEMU holds %d layers, the store %d files", i, n, storeFiles(t, s))
		}
	}
	kept = append(kept, prev)
	t.Logf("300 cycles in %v", time.Since(t0).Round(time.Second))
	// S snapshots: the live chain is the top over at most S layers.
	depth := s.waitChainBound(id, 1+len(kept))
	// A compaction's work files and the layers it let go come and go
	// after QEMU's chain is short: the store settles within moments.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		n := storeFiles(t, s)
		if n <= files {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the store grew from %d to %d files over the cycles", files, n)
			break
		}
	}
	t1 := time.Now()
	for i := 1; i <= 100; i++ {
		s.must(202, "POST", "/v1/sandboxes/"+id+"/pause", "")
		s.waitState(s.key, id, "paused", 2*time.Minute)
		s.must(202, "POST", "/v1/sandboxes/"+id+"/resume", "")
		s.waitState(s.key, id, "running", 2*time.Minute)
		if i%25 == 0 {
			s.waitChainBound(id, 1+len(kept))
		}
	}
	t.Logf("100 pauses and resumes in %v", time.Since(t1).Round(time.Second))
	s.waitChainBound(id, 1+len(kept))
	// The stopped sandbox: snapshots of its disk, each followed by the
	// delete of the one before, rebase its top offline.
	s.sh(id, "echo stopped > /root/mark")
	s.must(200, "POST", "/v1/sandboxes/"+id+"/stop", "")
	prev = kept[len(kept)-1]
	kept = kept[:len(kept)-1]
	for i := 1; i <= 20; i++ {
		sn := s.must(200, "POST", snaps, `{"memory":false}`).data()["id"].(string)
		marks[sn] = "stopped"
		s.must(200, "DELETE", snaps+"/"+prev, "")
		prev = sn
	}
	kept = append(kept, prev)
	// Compaction runs in the background: wait until it has settled,
	// the record's chain short and the top's header naming that chain
	// (an offline rebase writes the header before the record follows).
	var rec sandbox.Record
	var h []string
	// First the top's header, with hostproxy running: reading the
	// records stops it, which stops the compaction it runs.
	for _, r := range s.records() {
		if r.ID == id {
			rec = r
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		h, _ = readHeaderChain(filepath.Join(sandbox.StoreDir(s.machines), rec.Machine.Disk[0]+".qcow2"))
		if len(h) <= 2+len(kept) || time.Now().After(deadline) {
			break
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		for _, r := range s.records() {
			if r.ID == id {
				rec = r
			}
		}
		h, _ = readHeaderChain(filepath.Join(sandbox.StoreDir(s.machines), rec.Machine.Disk[0]+".qcow2"))
		if len(rec.Machine.Disk) <= 1+len(kept) && len(h) == len(rec.Machine.Disk)+1 || time.Now().After(deadline) {
			break
		}
	}
	if len(rec.Machine.Disk) > 1+len(kept) {
		t.Fatalf("the stopped sandbox's chain is %d layers with %d snapshots", len(rec.Machine.Disk), len(kept))
	}
	for _, sn := range rec.Snapshots {
		if len(sn.Disk) > len(rec.Snapshots) {
			t.Errorf("snapshot %s's chain is %d layers with %d snapshots", sn.ID, len(sn.Disk), len(rec.Snapshots))
		}
	}
	if len(h) != len(rec.Machine.Disk)+1 {
		t.Errorf("the stopped top's header names %v, the record %v", h, rec.Machine.Disk)
	}
	s.must(202, "POST", "/v1/sandboxes/"+id+"/start", "")
	s.waitState(s.key, id, "running", 3*time.Minute)
	if got := strings.TrimSpace(s.sh(id, "cat /root/mark")); got != "stopped" {
		t.Errorf("after the stopped cycles the disk has mark %q", got)
	}
	// Every snapshot left restores, with the files written before it.
	for _, sn := range kept {
		s.must(200, "POST", snaps+"/"+sn+"/restore", `{"disk_only":true}`)
		if got := strings.TrimSpace(s.sh(id, "cat /root/mark")); got != marks[sn] {
			t.Errorf("snapshot %s restored with mark %q, want %q", sn, got, marks[sn])
		}
	}
	t.Logf("chain depth after 300 snapshot cycles: %d layers (QEMU), %d snapshots kept", depth, len(kept))
	s.checkStore()
}
