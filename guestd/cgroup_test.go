package guestd

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

const mib = 1 << 20

// TestLimitsFor pins the execs' limits for the guests strata boots: the
// memory less max(128 MiB, 10%), never under half of it; the tasks less
// max(256, 25%), never under half, at most 4,096.
func TestLimitsFor(t *testing.T) {
	tests := []struct {
		name        string
		mem, tasks  uint64
		memMax, pid uint64
	}{
		// MemTotal and threads-max as a 512 MiB guest of the 6.12 kernel shows them.
		{name: "512 MiB guest", mem: 482 * mib, tasks: 3856, memMax: 354 * mib, pid: 2892},
		{name: "1 GiB guest", mem: 986 * mib, tasks: 7888, memMax: 858 * mib, pid: 4096},
		{name: "256 MiB guest", mem: 226 * mib, tasks: 1808, memMax: 113 * mib, pid: 1356},
		{name: "the reserve is 10% past 1.25 GiB", mem: 4000 * mib, tasks: 32768, memMax: 3600 * mib, pid: 4096},
		{name: "less than the reserve: half", mem: 100 * mib, tasks: 100, memMax: 50 * mib, pid: 50},
		{name: "pid_max smaller than threads-max", mem: 986 * mib, tasks: 1000, memMax: 858 * mib, pid: 744},
		{name: "rounded down to a page", mem: 300*mib + 4097, tasks: 2, memMax: 172*mib + 4096, pid: 1},
		{name: "nothing", mem: 0, tasks: 0, memMax: 0, pid: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := limitsFor(tc.mem, tc.tasks)
			if got.MemoryMax != tc.memMax || got.PidsMax != tc.pid {
				t.Fatalf("limitsFor(%d, %d) = %d MiB (%d), %d tasks; want %d MiB (%d), %d", tc.mem, tc.tasks,
					got.MemoryMax/mib, got.MemoryMax, got.PidsMax, tc.memMax/mib, tc.memMax, tc.pid)
			}
		})
	}
}

// FuzzLimitsFor: whatever the guest reports, the execs get at least half
// of its memory (less a page) and at most 90% of it or all but 128 MiB,
// whichever is less; and 1 to execPidsMax tasks, never more than the
// kernel's.
func FuzzLimitsFor(f *testing.F) {
	f.Add(uint64(482*mib), uint64(3856))
	f.Add(uint64(0), uint64(0))
	f.Add(uint64(1<<63), uint64(1<<22))
	f.Fuzz(func(t *testing.T, mem, tasks uint64) {
		lim := limitsFor(mem, tasks)
		if lim.MemoryMax%4096 != 0 || lim.MemoryMax > mem || lim.MemoryMax+4096 <= mem/2 {
			t.Fatalf("memory %d of %d", lim.MemoryMax, mem)
		}
		if mem >= 2*execMemoryReserve && (lim.MemoryMax > mem-execMemoryReserve || lim.MemoryMax > mem-mem/10) {
			t.Fatalf("memory %d of %d leaves less than the reserve", lim.MemoryMax, mem)
		}
		if lim.PidsMax < 1 || lim.PidsMax > execPidsMax || tasks > 0 && lim.PidsMax > tasks || lim.PidsMax < min(tasks/2, execPidsMax) {
			t.Fatalf("tasks %d of %d", lim.PidsMax, tasks)
		}
	})
}

// TestSetupPlan pins the order of the setup: controllers enabled at the
// root, guestd moved into its cgroup before "strata" hands controllers to
// its children (a cgroup that does may hold no process), the execs'
// parent limited before it hands them on.
func TestSetupPlan(t *testing.T) {
	lim := execLimits{MemoryMax: 354 * mib, PidsMax: 2892}
	got := setupPlan([]string{"memory", "pids"}, lim)
	want := []string{
		`write "+memory +pids" to cgroup.subtree_control`,
		"mkdir strata",
		"mkdir strata/guestd",
		`write "0" to strata/guestd/cgroup.procs`,
		`write "+memory +pids" to strata/cgroup.subtree_control`,
		"mkdir strata/exec",
		`write "371195904" to strata/exec/memory.max`,
		`write "2892" to strata/exec/pids.max`,
		`write "+memory +pids" to strata/exec/cgroup.subtree_control`,
	}
	if s := steps(got); !reflect.DeepEqual(s, want) {
		t.Fatalf("plan:\n%s\nwant:\n%s", strings.Join(s, "\n"), strings.Join(want, "\n"))
	}
	lim.CPU = true
	got = setupPlan([]string{"memory", "pids", "cpu"}, lim)
	s := steps(got)
	for _, w := range []string{
		`write "+memory +pids +cpu" to strata/cgroup.subtree_control`,
		`write "1000" to strata/guestd/cpu.weight`,
		`write "100" to strata/exec/cpu.weight`,
	} {
		if !contains(s, w) {
			t.Errorf("plan with cpu lacks %s:\n%s", w, strings.Join(s, "\n"))
		}
	}
	if s[len(s)-1] != `write "+memory +pids +cpu" to strata/exec/cgroup.subtree_control` {
		t.Errorf("the execs' parent hands its controllers on last, not %s", s[len(s)-1])
	}
}

// TestExecPlan: each exec's cgroup has the limits and an out-of-memory
// kill that takes the whole exec.
func TestExecPlan(t *testing.T) {
	got := steps(execPlan(execLimits{MemoryMax: 4096, PidsMax: 7}))
	want := []string{`write "4096" to memory.max`, `write "7" to pids.max`, `write "1" to memory.oom.group`}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestControllersFor(t *testing.T) {
	tests := []struct {
		available string
		want      []string
		err       bool
	}{
		{available: "cpuset cpu io memory hugetlb pids rdma misc", want: []string{"memory", "pids", "cpu"}},
		{available: "memory pids", want: []string{"memory", "pids"}},
		{available: "cpu io pids", err: true},
		{available: "memory", err: true},
		{available: "", err: true},
	}
	for _, tc := range tests {
		t.Run(tc.available, func(t *testing.T) {
			got, err := controllersFor(strings.Fields(tc.available))
			if (err != nil) != tc.err || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, %v", got, err)
			}
		})
	}
}

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name, in string
		want     uint64
		err      bool
	}{
		{name: "proc", in: "MemTotal:         493848 kB\nMemFree:          400000 kB\n", want: 493848 << 10},
		{name: "not first", in: "Foo: 1 kB\nMemTotal: 2 kB", want: 2048},
		{name: "no unit", in: "MemTotal: 2\n", err: true},
		{name: "other unit", in: "MemTotal: 2 MB\n", err: true},
		{name: "not a number", in: "MemTotal: -2 kB\n", err: true},
		{name: "overflows", in: "MemTotal: 18446744073709551615 kB\n", err: true},
		{name: "missing", in: "MemFree: 2 kB\n", err: true},
		{name: "empty", in: "", err: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMeminfo(tc.in)
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("got %d, %v", got, err)
			}
		})
	}
}

// FuzzParseMeminfo: a MemTotal line written as the kernel writes it reads
// back as its bytes, whatever surrounds it; anything else never panics.
func FuzzParseMeminfo(f *testing.F) {
	f.Add("MemFree: 1 kB\n", uint64(493848))
	f.Add("", uint64(0))
	f.Fuzz(func(t *testing.T, before string, kb uint64) {
		parseMeminfo(before)
		kb %= 1 << 53
		if strings.Contains(before, "MemTotal:") {
			return
		}
		if before != "" && !strings.HasSuffix(before, "\n") {
			before += "\n"
		}
		got, err := parseMeminfo(before + fmt.Sprintf("MemTotal: %8d kB\nMemTotal: 1 kB\n", kb))
		if err != nil || got != kb<<10 {
			t.Fatalf("got %d, %v; want %d", got, err, kb<<10)
		}
	})
}

func TestParseFlatKeyed(t *testing.T) {
	got := parseFlatKeyed("low 0\nhigh 0\nmax 12\noom 1\noom_kill 3\noom_group_kill 1\nbad line here\nneg -1\n")
	want := map[string]uint64{"low": 0, "high": 0, "max": 12, "oom": 1, "oom_kill": 3, "oom_group_kill": 1}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v", got)
	}
	if n, err := parseCount(" 3856\n"); n != 3856 || err != nil {
		t.Fatalf("parseCount: %d, %v", n, err)
	}
	if _, err := parseCount("max\n"); err == nil {
		t.Fatal("parseCount of max")
	}
}

// FuzzParseFlatKeyed: every key read has a value a line of the input
// gave it, and a well-formed line appended is read back.
func FuzzParseFlatKeyed(f *testing.F) {
	f.Add("oom_kill 1\n", uint64(2))
	f.Fuzz(func(t *testing.T, s string, v uint64) {
		for k, n := range parseFlatKeyed(s) {
			if !strings.Contains(s, k) || !strings.Contains(s, fmt.Sprint(n)) && n != 0 {
				t.Fatalf("%q: %s %d", s, k, n)
			}
		}
		if s != "" && !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		if got := parseFlatKeyed(s + fmt.Sprintf("zz_fuzz_key %d\n", v)); got["zz_fuzz_key"] != v {
			t.Fatalf("appended line read as %d", got["zz_fuzz_key"])
		}
	})
}

func steps(plan []cgroupWrite) []string {
	out := make([]string, len(plan))
	for i, w := range plan {
		out[i] = w.String()
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
