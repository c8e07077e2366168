package integration

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestVMIdleWithoutHostproxy: ten idle sandboxes cost the host next to
// nothing whether or not hostproxy runs: each QEMU uses under 2% of a
// core with hostproxy running, and with hostproxy stopped (its guests
// find no host end on their channel and must not spin reopening it).
// Started again, hostproxy adopts all ten and each answers.
//
// Regression: with hostproxy stopped, each idle guest reopened its
// channel port every 10 ms, and its QEMU took 43-44% of a core.
func TestVMIdleWithoutHostproxy(t *testing.T) {
	// It mostly waits: it runs beside TestVMChainBound. What it measures
	// is each of its own QEMUs' CPU time, whatever else the host does.
	t.Parallel()
	s := startVMStack(t, "60s")
	src := s.create(s.key, `{"name":"idle-0","memory_mib":256}`)
	s.must(200, "POST", "/v1/sandboxes/"+src+"/snapshots", `{}`)
	ids := []string{src}
	for i := 1; i < 10; i++ {
		ids = append(ids, s.create(s.key, fmt.Sprintf(`{"name":"idle-%d","from":{"sandbox":%q,"snapshot":"v1"}}`, i, src)))
	}
	pids := map[string]int{}
	for _, id := range ids {
		pids[id] = s.qemuPid(id)
	}
	// Ticks of QEMU's CPU time (its own, whatever else the machine
	// does) over a window, as a share of one core.
	share := func(window time.Duration) map[string]float64 {
		before := map[string]int64{}
		for id, pid := range pids {
			before[id] = cpuTicks(t, pid)
		}
		t0 := time.Now()
		time.Sleep(window)
		el := time.Since(t0).Seconds()
		out := map[string]float64{}
		for id, pid := range pids {
			out[id] = float64(cpuTicks(t, pid)-before[id]) / clockTicks / el
		}
		return out
	}
	check := func(when string, shares map[string]float64) {
		t.Helper()
		for _, id := range ids {
			t.Logf("%s: %s's QEMU used %.2f%% of a core", when, id, 100*shares[id])
		}
		for _, id := range ids {
			if shares[id] >= 0.02 {
				t.Errorf("%s: %s's QEMU used %.2f%% of a core; an idle sandbox must use under 2%%", when, id, 100*shares[id])
			}
		}
	}
	// A guest just booted or forked is busy for a while (its file
	// system writes back, the kernel settles): idle is once ten
	// seconds cost each QEMU under 1%, or after three minutes whatever
	// they cost.
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); {
		busy := 0.0
		for _, v := range share(10 * time.Second) {
			busy = max(busy, v)
		}
		if busy < 0.01 {
			break
		}
		t.Logf("settling: the busiest QEMU used %.2f%% of a core", 100*busy)
	}
	const window = 30 * time.Second
	check("hostproxy running", share(window))

	s.stop()
	for id, pid := range pids {
		if s.findQEMU(id) != pid {
			t.Fatalf("%s's QEMU ended with hostproxy", id)
		}
	}
	// The guests see their host end go, and sleep until it comes back.
	time.Sleep(5 * time.Second)
	check("hostproxy stopped", share(window))

	s.start()
	for _, id := range ids {
		t.Logf("%s answered %v after hostproxy started again", id, waitExec(t, s, id, 2*time.Minute))
		if pid := s.findQEMU(id); pid != pids[id] {
			t.Fatalf("%s runs in QEMU %d, not the one it had (%d): it was not adopted", id, pid, pids[id])
		}
	}
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times.
const clockTicks = 100

// cpuTicks is a process's user and system time so far, in clock ticks.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("QEMU %d: %v", pid, err)
	}
	// The fields after the command (which may hold spaces) in its
	// parentheses: state is the first, utime the 12th, stime the 13th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("QEMU %d: stat %q", pid, b)
	}
	return u + st
}
