package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"strata/vmm"
)

// TestVMNothingByPath pins issue 17's "paths the sandbox's uid owns":
// hostproxy used to dial run/qmp.sock and run/channel.sock, in a
// directory the QEMU's uid owns, and connect(2) follows links, so an
// escaped QEMU could point hostproxy at another sandbox's sockets (and
// receive its exec calls and credentials). Here every old name in
// alpha's run/ is a link to beta's sockets and files while hostproxy
// works on alpha (exec, a memory snapshot, a restart of hostproxy that
// adopts alpha again, a stop and a start): every call reaches alpha,
// and beta's files are as they were.
func TestVMNothingByPath(t *testing.T) {
	s := startVMStack(t, "60s")
	a := s.create(s.key, `{"name":"alpha"}`)
	b := s.create(s.key, `{"name":"beta"}`)
	runA := filepath.Join(s.machines, a, "run")
	ctlB := filepath.Join(s.machines, b, "ctl")
	// Files of beta's that a write through a link would change.
	canaries := map[string]string{}
	for _, name := range []string{"canary.log", "canary.sock"} {
		p := filepath.Join(ctlB, name)
		if err := os.WriteFile(p, []byte("beta's "+name+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		canaries[p] = "beta's " + name + "\n"
	}
	links := map[string]string{
		"qmp.sock":     filepath.Join(ctlB, "qmp.sock"),
		"channel.sock": filepath.Join(ctlB, "channel.sock"),
		"console.sock": filepath.Join(ctlB, "console.sock"),
		"console.log":  filepath.Join(ctlB, "canary.log"),
		"qemu.log":     filepath.Join(ctlB, "canary.log"),
		"guestd.sock":  filepath.Join(ctlB, "canary.sock"),
	}
	plant := func() {
		for name, target := range links {
			p := filepath.Join(runA, name)
			os.Remove(p)
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	plant()
	check := func(when string) {
		t.Helper()
		for id, want := range map[string]string{a: "alpha", b: "beta"} {
			if got := strings.TrimSpace(s.sh(id, "hostname")); got != want {
				t.Fatalf("%s: exec in %s reached %q, want %q", when, id, got, want)
			}
		}
		for p, want := range canaries {
			if got, err := os.ReadFile(p); err != nil || string(got) != want {
				t.Fatalf("%s: beta's %s is %q (%v), want %q", when, filepath.Base(p), got, err, want)
			}
		}
	}
	check("links planted")

	snaps := "/v1/sandboxes/" + a + "/snapshots"
	if v1 := s.must(200, "POST", snaps, `{"comment":"through links"}`).data(); v1["status"] != "ready" || v1["memory"] != true {
		t.Fatalf("snapshot of alpha: %v", v1)
	}
	check("a memory snapshot")

	s.stop()
	s.start()
	check("hostproxy restarted (alpha adopted again)")

	if r := s.must(200, "POST", "/v1/sandboxes/"+a+"/stop", ""); r.data()["state"] != "stopped" {
		t.Fatalf("stop: %s", r.Raw)
	}
	plant() // whatever the stop left
	s.must(202, "POST", "/v1/sandboxes/"+a+"/start", "")
	s.waitState(s.key, a, "running", 4*time.Minute)
	check("alpha stopped and started")

	// Nothing of the host's was made in run/ (QEMU's working directory);
	// the links are still links, untouched.
	ents, _ := os.ReadDir(runA)
	for _, e := range ents {
		if _, planted := links[e.Name()]; !planted || e.Type()&os.ModeSymlink == 0 {
			t.Errorf("run/ of alpha holds %s (%v)", e.Name(), e.Type())
		}
	}
	s.checkConfined(a)
	s.checkConfined(b)
}

// TestVMConsoleFlood pins issue 17's unbounded console: with
// -serial file:console.log, a guest writing its serial console without
// end filled the file system holding the store. The console is drained
// by hostproxy into a log of at most vmm.LogBytes plus one rotated file
// of as much; while a guest floods it, both stay within the cap,
// hostproxy's memory stays within a bound, and the guest answers.
func TestVMConsoleFlood(t *testing.T) {
	s := startVMStack(t, "60s")
	id := s.create(s.key, `{"name":"flood"}`)
	ctl := filepath.Join(s.machines, id, "ctl")
	rss0 := s.proxyRSS()
	// In the background inside the guest, so the exec answers at once.
	s.sh(id, "nohup sh -c 'yes console-flood > /dev/ttyS0' >/dev/null 2>&1 &")
	deadline := time.Now().Add(3 * time.Minute)
	maxRSS := rss0
	for {
		cur, _ := os.Stat(filepath.Join(ctl, "console.log"))
		prev, _ := os.Stat(filepath.Join(ctl, "console.log.1"))
		for _, fi := range []os.FileInfo{cur, prev} {
			if fi != nil && fi.Size() > vmm.LogBytes {
				t.Fatalf("%s is %d bytes, over the cap of %d", fi.Name(), fi.Size(), vmm.LogBytes)
			}
		}
		maxRSS = max(maxRSS, s.proxyRSS())
		// Rotated, and the current file refilled past half: over 1.5
		// MiB drained.
		if prev != nil && cur != nil && cur.Size() > vmm.LogBytes/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood did not fill the console log in 3 minutes (current %v, previous %v)", cur, prev)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := strings.TrimSpace(s.sh(id, "hostname")); got != "flood" {
		t.Fatalf("exec during the flood: %q", got)
	}
	s.sh(id, "pkill yes; true")
	tail := vmm.ReadTail(filepath.Join(ctl, "console.log"), 4096)
	if !bytes.Contains(tail, []byte("console-flood\r\nconsole-flood\r\n")) {
		t.Fatalf("the console log's end is not the flood: %q", tail)
	}
	// The drain holds one 32 KiB buffer: hostproxy's memory does not
	// follow the megabytes going through it.
	const bound = 32 << 20
	t.Logf("hostproxy RSS %d KiB before the flood, at most %d KiB during it", rss0>>10, maxRSS>>10)
	if maxRSS > rss0+bound {
		t.Fatalf("hostproxy's RSS grew from %d to %d bytes during the flood (bound: +%d)", rss0, maxRSS, bound)
	}
}

// proxyRSS is hostproxy's resident memory in bytes.
func (s *vmStack) proxyRSS() int64 {
	s.t.Helper()
	s.mu.Lock()
	pid := s.proxy.Process.Pid
	s.mu.Unlock()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		s.t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	s.t.Fatal("no VmRSS in hostproxy's status")
	return 0
}
