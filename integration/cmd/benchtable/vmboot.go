package main

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// bootStages is where one boot's time went, from the API's create to the
// API saying running: the host's part up to QEMU's process start (read
// from /proc), then the guest's, on the guest's own clock (its uptime,
// its kernel log, guestd's start time), placed on the host's clock by one
// exec that reads them (its round trip is the error, about 0.1 s under
// TCG).
type bootStages struct {
	HostToQEMU   time.Duration // create answered, record, disk layer, QEMU spawned
	QEMUToKernel time.Duration // QEMU's own start until the guest kernel's clock starts
	KernelToInit time.Duration // the kernel until it runs /init
	InitToGuestd time.Duration // the initramfs: modules, root and data disks, guestd started
	GuestdToRun  time.Duration // guestd's start, the channel's handshake, health, credentials
}

// The guest's view of its boot, read by one exec.
const bootProbe = `set -e; p=$(pgrep -xo guestd); awk '{print $22}' /proc/$p/stat; getconf CLK_TCK; cut -d' ' -f1 /proc/uptime; dmesg`

var runInit = regexp.MustCompile(`^\[\s*(\d+\.\d+)\] Run /init as init process`)

// measureBoot reads the stages of the boot of sandbox id, created at t0
// and running at running.
func (b *vmBench) measureBoot(id string, t0, running time.Time) (bootStages, error) {
	var st bootStages
	pids := b.qemus([]string{id})
	if len(pids) != 1 {
		return st, fmt.Errorf("sandbox %s: %d QEMUs", id, len(pids))
	}
	qemuStart, err := procStart(pids[0])
	if err != nil {
		return st, err
	}
	sent := time.Now()
	d, err := b.exec(id, "sh", "-c", bootProbe)
	if err != nil {
		return st, err
	}
	answered := time.Now()
	out, _ := d["stdout"].(string)
	lines := strings.Split(out, "\n")
	if len(lines) < 4 {
		return st, fmt.Errorf("boot probe: %q", out)
	}
	startTicks, err1 := strconv.ParseFloat(strings.TrimSpace(lines[0]), 64)
	tck, err2 := strconv.ParseFloat(strings.TrimSpace(lines[1]), 64)
	uptime, err3 := strconv.ParseFloat(strings.TrimSpace(lines[2]), 64)
	if err1 != nil || err2 != nil || err3 != nil || tck <= 0 {
		return st, fmt.Errorf("boot probe: %q", strings.Join(lines[:3], " | "))
	}
	initAt := -1.0
	for _, l := range lines[3:] {
		if m := runInit.FindStringSubmatch(l); m != nil {
			initAt, _ = strconv.ParseFloat(m[1], 64)
			break
		}
	}
	if initAt < 0 {
		return st, fmt.Errorf("boot probe: no %q in the guest's kernel log", "Run /init")
	}
	// The guest's clock started at the exec's middle less its uptime.
	kernel := sent.Add(answered.Sub(sent) / 2).Add(-secs(uptime))
	guestd := kernel.Add(secs(startTicks / tck))
	st = bootStages{
		HostToQEMU:   qemuStart.Sub(t0),
		QEMUToKernel: kernel.Sub(qemuStart),
		KernelToInit: secs(initAt),
		InitToGuestd: secs(startTicks/tck - initAt),
		GuestdToRun:  running.Sub(guestd),
	}
	return st, nil
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// procStart is when process pid started, on the wall clock: its start
// time (field 22 of /proc/PID/stat, clock ticks since the host's boot)
// against the boot-time clock now (btime of /proc/stat is whole seconds:
// too coarse here).
func procStart(pid int) (time.Time, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, err
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	ticks, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, err
	}
	now := time.Now()
	// Linux's USER_HZ is 100 on every architecture it runs on.
	age := time.Duration(ts.Nano()) - time.Duration(ticks)*10*time.Millisecond
	return now.Add(-age), nil
}

// bootRows are the medians of the stages of some boots.
func bootRows(stages []bootStages) []row {
	if len(stages) == 0 {
		return nil
	}
	pick := func(f func(bootStages) time.Duration) (string, string) {
		var d []time.Duration
		for _, s := range stages {
			d = append(d, f(s))
		}
		return dur(median(d)), dur(p99(d))
	}
	var rows []row
	for _, s := range []struct {
		name, note string
		f          func(bootStages) time.Duration
	}{
		{"… host: create to QEMU's process started", "the API, the record, the disk's top layer, admission, the spawn (host clock)", func(s bootStages) time.Duration { return s.HostToQEMU }},
		{"… QEMU's start to the guest kernel's clock starting", "QEMU's own start and the PVH entry (the guest's uptime placed on the host's clock by one exec: ±0.1 s)", func(s bootStages) time.Duration { return s.QEMUToKernel }},
		{"… the kernel to /init", "the guest kernel's log (`Run /init as init process`)", func(s bootStages) time.Duration { return s.KernelToInit }},
		{"… /init to guestd started", "the initramfs: modules, the root and data disks mounted, guestd spawned (guestd's start time in the guest)", func(s bootStages) time.Duration { return s.InitToGuestd }},
		{"… guestd started to running", "guestd's own start, the channel's handshake, health, credentials, the API's poll (20 ms)", func(s bootStages) time.Duration { return s.GuestdToRun }},
	} {
		med, worst := pick(s.f)
		rows = append(rows, row{s.name, med, worst, fmt.Sprintf("%s; %d boots (p99 column: worst)", s.note, len(stages)), "", ""})
	}
	return rows
}
