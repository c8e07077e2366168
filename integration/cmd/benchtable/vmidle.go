package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var vmIdleOnly = flag.Bool("vm-idle-only", false, "measure only the CPU of idle sandboxes (-vm-idle of them, 256 MiB each), with and without hostproxy")

// idleRows measures what idle sandboxes cost the host's CPUs: each QEMU's
// own CPU time (user and system, /proc/PID/stat) over 30 s, once they have
// settled (a sandbox just booted takes a minute or so to quiet down), with
// hostproxy running and then with it stopped; hostproxy is started again
// after, and adopts them.
func (b *vmBench) idleRows(bin string, ids []string) ([]row, error) {
	const window = 30 * time.Second
	share := func(d time.Duration) []float64 {
		pids := b.qemus(ids)
		before := map[int]int64{}
		for _, pid := range pids {
			before[pid] = cpuTicks(pid)
		}
		t0 := time.Now()
		time.Sleep(d)
		el := time.Since(t0).Seconds()
		var out []float64
		for _, pid := range pids {
			out = append(out, float64(cpuTicks(pid)-before[pid])/100/el)
		}
		slices.Sort(out)
		return out
	}
	fmt.Fprintf(os.Stderr, "idle CPU of %d sandboxes: letting them settle…\n", len(ids))
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); {
		if s := share(10 * time.Second); len(s) > 0 && s[len(s)-1] < 0.02 {
			break
		}
	}
	running := share(window)
	b.proxy.Process.Signal(syscall.SIGTERM)
	b.proxy.Wait()
	b.proxy = nil
	time.Sleep(5 * time.Second)
	stopped := share(window)
	if err := b.start(bin); err != nil {
		return nil, err
	}
	pct := func(s []float64, i int) string {
		if len(s) == 0 {
			return ""
		}
		return fmt.Sprintf("%.2f%%", 100*s[min(i, len(s)-1)])
	}
	note := fmt.Sprintf("%d idle sandboxes, each QEMU's own CPU time over %v once settled, as a share of one core (p99 column: the busiest); was 1%%", len(running), window)
	return []row{
		{"CPU of an idle sandbox, hostproxy running", pct(running, len(running)/2), pct(running, len(running)-1), note, "", "< 2%"},
		{"CPU of an idle sandbox, hostproxy stopped", pct(stopped, len(stopped)/2), pct(stopped, len(stopped)-1), fmt.Sprintf("the same, hostproxy stopped for %v (was 43%%: the guest reopened its channel every 10 ms)", window+5*time.Second), "", "< 2%"},
	}, nil
}

// cpuTicks is a process's user and system time so far, in clock ticks
// (USER_HZ, 100); 0 when it cannot be read.
func cpuTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}
