package guestd

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Exec cgroups. Inside a strata microVM (Config.Cgroup set, guestd --vm)
// guestd and the programs it execs live in separate cgroup2 subtrees:
//
//	<mount>/strata/guestd      guestd itself (cpu.weight guestdCPUWeight)
//	<mount>/strata/exec        every exec together: memory.max, pids.max
//	<mount>/strata/exec/<n>    one exec: the same limits, memory.oom.group=1
//
// The limits of strata/exec leave guestd and the kernel their reserve of
// the guest's memory and tasks, whatever the programs do, so that an exec
// that runs away (a memory hog, a fork bomb) is killed by its own limits,
// never guestd; the same limits on each exec's cgroup make an out-of-
// memory kill take that exec whole (memory.oom.group) and no other. Each
// program is started inside its exec's cgroup (clone3 CLONE_INTO_CGROUP),
// so nothing it forks runs outside it, and at its timeout the cgroup is
// killed whole (cgroup.kill), processes that left its process group or
// double-forked included.
//
// This file is the plan as values (paths, limits, the writes in their
// order) and the parsers of the kernel files it reads; cgroup_linux.go
// applies it.

const (
	// cgroupGuestd and cgroupExec are guestd's cgroup and the parent of
	// the execs', relative to the cgroup2 mount.
	cgroupGuestd = "strata/guestd"
	cgroupExec   = "strata/exec"

	// execMemoryReserve is the least memory the execs leave to guestd
	// and the kernel together; beyond a guest of 1.25 GiB it is 10%.
	execMemoryReserve = 128 << 20
	// execPidsMax bounds the tasks (processes and threads) of one exec
	// and of all of them together.
	execPidsMax = 4096
	// execPidsReserve is the least of the kernel's tasks (threads-max)
	// left to guestd and init; beyond 1,024 tasks it is a quarter.
	execPidsReserve = 256

	// CPU weights: under load guestd gets ten times the share of all the
	// execs together, so that it answers the host while a program spins.
	guestdCPUWeight = 1000
	execCPUWeight   = 100
)

// cgroupControllers are the controllers the exec cgroups use; memory and
// pids are needed, cpu is used when the kernel has it.
var (
	neededControllers   = []string{"memory", "pids"}
	optionalControllers = []string{"cpu"}
)

// execLimits are the limits of the execs' cgroups.
type execLimits struct {
	// MemoryMax is memory.max, in bytes (a multiple of 4 KiB).
	MemoryMax uint64
	// PidsMax is pids.max.
	PidsMax uint64
	// CPU tells that the cpu controller is in use (cpu.weight is set).
	CPU bool
}

// limitsFor computes the execs' limits in a guest of memTotal bytes
// (MemTotal of /proc/meminfo) whose kernel runs at most tasks tasks (the
// smaller of kernel.threads-max and kernel.pid_max): the memory less a
// reserve of max(execMemoryReserve, 10%), and never less than half of it;
// the tasks less a reserve of max(execPidsReserve, 25%), never less than
// half of them, and at most execPidsMax.
func limitsFor(memTotal, tasks uint64) execLimits {
	mem := memTotal / 2
	if reserve := max(execMemoryReserve, memTotal/10); memTotal > reserve {
		mem = max(mem, memTotal-reserve)
	}
	pids := tasks / 2
	if reserve := max(execPidsReserve, tasks/4); tasks > reserve {
		pids = max(pids, tasks-reserve)
	}
	return execLimits{MemoryMax: mem &^ 4095, PidsMax: max(1, min(pids, execPidsMax))}
}

// cgroupWrite is one step of a cgroup plan: make the cgroup Mkdir, or
// write Value to File; both relative to the directory the plan is
// applied in.
type cgroupWrite struct {
	Mkdir string
	File  string
	Value string
}

func (w cgroupWrite) String() string {
	if w.Mkdir != "" {
		return "mkdir " + w.Mkdir
	}
	return fmt.Sprintf("write %q to %s", w.Value, w.File)
}

// enableControllers is the value of a cgroup.subtree_control write that
// enables controllers.
func enableControllers(controllers []string) string {
	parts := make([]string, len(controllers))
	for i, c := range controllers {
		parts[i] = "+" + c
	}
	return strings.Join(parts, " ")
}

// controllersFor picks, from the controllers the root cgroup offers
// (cgroup.controllers), the ones the plan uses; it fails when a needed
// one is missing.
func controllersFor(available []string) ([]string, error) {
	var use []string
	for _, c := range neededControllers {
		if !slices.Contains(available, c) {
			return nil, fmt.Errorf("the kernel offers no %s controller (cgroup.controllers: %q)", c, strings.Join(available, " "))
		}
		use = append(use, c)
	}
	for _, c := range optionalControllers {
		if slices.Contains(available, c) {
			use = append(use, c)
		}
	}
	return use, nil
}

// setupPlan is what guestd does at start, relative to the cgroup2 mount,
// in order: it enables the controllers for the root's children, moves
// itself ("0": the writing process) into cgroupGuestd before it enables
// them below "strata" (a cgroup that hands controllers to its children
// may hold no process), and makes cgroupExec with the execs' limits.
// Every step may find its work done by an earlier guestd of the same
// boot (a restart): a cgroup that exists, a controller already enabled.
func setupPlan(controllers []string, lim execLimits) []cgroupWrite {
	enable := enableControllers(controllers)
	plan := []cgroupWrite{
		{File: "cgroup.subtree_control", Value: enable},
		{Mkdir: "strata"},
		{Mkdir: cgroupGuestd},
		{File: cgroupGuestd + "/cgroup.procs", Value: "0"},
		{File: "strata/cgroup.subtree_control", Value: enable},
		{Mkdir: cgroupExec},
	}
	plan = append(plan, limitWrites(cgroupExec+"/", lim)...)
	if lim.CPU {
		plan = append(plan,
			cgroupWrite{File: cgroupGuestd + "/cpu.weight", Value: strconv.Itoa(guestdCPUWeight)},
			cgroupWrite{File: cgroupExec + "/cpu.weight", Value: strconv.Itoa(execCPUWeight)})
	}
	return append(plan, cgroupWrite{File: cgroupExec + "/cgroup.subtree_control", Value: enable})
}

// execPlan is what one exec's cgroup gets, relative to it, before its
// program starts: the limits, and an out-of-memory kill that takes every
// process of the exec (a program whose helper is killed alone would
// carry on half-done).
func execPlan(lim execLimits) []cgroupWrite {
	return append(limitWrites("", lim), cgroupWrite{File: "memory.oom.group", Value: "1"})
}

func limitWrites(prefix string, lim execLimits) []cgroupWrite {
	return []cgroupWrite{
		{File: prefix + "memory.max", Value: strconv.FormatUint(lim.MemoryMax, 10)},
		{File: prefix + "pids.max", Value: strconv.FormatUint(lim.PidsMax, 10)},
	}
}

// parseMeminfo returns MemTotal of a /proc/meminfo, in bytes.
func parseMeminfo(meminfo string) (uint64, error) {
	for line := range strings.Lines(meminfo) {
		rest, ok := strings.CutPrefix(line, "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("meminfo: MemTotal line %q is not \"<n> kB\"", strings.TrimSpace(line))
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || kb > 1<<53 {
			return 0, fmt.Errorf("meminfo: MemTotal %q is not a size", f[0])
		}
		return kb << 10, nil
	}
	return 0, errors.New("meminfo: no MemTotal line")
}

// parseCount reads a file holding one unsigned number (threads-max,
// pid_max).
func parseCount(s string) (uint64, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a count: %q", strings.TrimSpace(s))
	}
	return n, nil
}

// parseFlatKeyed reads a cgroup file of "key value" lines (memory.events,
// cgroup.events) into a map; a line of another shape is skipped.
func parseFlatKeyed(s string) map[string]uint64 {
	out := map[string]uint64{}
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			out[f[0]] = v
		}
	}
	return out
}
