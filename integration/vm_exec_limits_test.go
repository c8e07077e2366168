package integration

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestVMExecRunaway runs programs that run away in one microVM sandbox,
// each with a timeout of 3 s: a memory hog, a fork bomb, a double-forked
// daemon holding the exec's stdout, a loop of background sleeps. Each
// answers 200 within its timeout plus 2 s (guestd's own duration_ms; the
// call through hostproxy is allowed 3 s more for the channel of an
// emulated guest): timed_out, or for a memory hog killed by its limit
// first, exit_code 137. After each a plain exec answers, guestd is the
// same process (it survived), and nothing of the runaway is left in the
// guest. (Regression, issue 17: such execs answered 503 guest_timeout
// after their timeout plus 30 s, and could take guestd down.)
func TestVMExecRunaway(t *testing.T) {
	s := startVMStack(t, "60s")
	id := s.create(s.key, `{"name":"runaway"}`)

	// guestd (the exec's parent) sits in its own cgroup out of the
	// out-of-memory killer's reach; the exec in one of its own, at the
	// default score.
	info := strings.Fields(s.sh(id, `echo $PPID; cat /proc/$PPID/cgroup /proc/$PPID/oom_score_adj /proc/self/oom_score_adj /proc/self/cgroup`))
	if len(info) != 5 || info[1] != "0::/strata/guestd" || info[2] != "-1000" || info[3] != "0" || !strings.HasPrefix(info[4], "0::/strata/exec/") {
		t.Fatalf("guestd and exec cgroups and scores: %q", info)
	}
	guestd := info[0]
	limits := s.sh(id, `cat /sys/fs/cgroup/strata/exec/memory.max /sys/fs/cgroup/strata/exec/pids.max; cat /sys/fs/cgroup/strata/exec/memory.max /sys/fs/cgroup/strata/exec/pids.max /sys/fs/cgroup/strata/exec/memory.oom.group /sys/fs/cgroup/strata/guestd/cpu.weight /sys/fs/cgroup/strata/exec/cpu.weight; grep MemTotal /proc/meminfo`)
	t.Logf("exec limits (parent memory.max, pids.max; the exec's memory.max, pids.max, memory.oom.group; cpu.weight of guestd and the execs): %q", limits)

	cases := []struct {
		name    string
		cmd     []string
		timeout time.Duration // 3 s when zero
		hog     bool          // may end by its memory limit before its timeout
		oom     bool          // must end by its memory limit
	}{
		{name: "memory hog", cmd: []string{"tail", "/dev/zero"}, hog: true},
		{name: "memory hog in sh", cmd: []string{"sh", "-c", "x=a; while :; do x=$x$x; done"}, hog: true},
		// Each task holds kernel memory: a fork bomb may reach the
		// memory limit before the task limit, and so may the sleeps.
		{name: "fork bomb", cmd: []string{"sh", "-c", "f(){ f|f& }; f"}, hog: true},
		{name: "double-forked daemon holding stdout", cmd: []string{"sh", "-c", "setsid sleep 1000 &"}},
		{name: "a loop of background sleeps", cmd: []string{"sh", "-c", "echo started; while :; do sleep 1000 & done"}, hog: true},
		// Given the time to reach its limit, a hog is killed by it, with
		// every process of its exec, and guestd is not.
		{name: "memory hog over its limit", cmd: []string{"sh", "-c", "sleep 1000 & tail /dev/zero"}, timeout: 120 * time.Second, hog: true, oom: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := s.on(t)
			timeout := 3 * time.Second
			if tc.timeout != 0 {
				timeout = tc.timeout
			}
			// The execs' memory.events count for all of them: an earlier
			// hog may have been killed by the limit too (on a fast machine
			// it reaches it within its 3 s), so a case counts its own.
			groupKills := func() int {
				events := s.sh(id, "cat /sys/fs/cgroup/strata/exec/memory.events")
				for _, line := range strings.Split(events, "\n") {
					if n, ok := strings.CutPrefix(line, "oom_group_kill "); ok {
						k, err := strconv.Atoi(n)
						if err != nil {
							t.Fatalf("memory.events: %q", events)
						}
						return k
					}
				}
				t.Fatalf("memory.events has no oom_group_kill: %q", events)
				return 0
			}
			killsBefore := groupKills()
			body, _ := json.Marshal(map[string]any{"cmd": tc.cmd, "timeout_s": int(timeout / time.Second)})
			t0 := time.Now()
			r := s.call(s.key, "POST", "/v1/sandboxes/"+id+"/exec", string(body))
			took := time.Since(t0)
			if r.Status != http.StatusOK {
				t.Fatalf("status %d after %v: %s", r.Status, took, r.Raw)
			}
			var res struct {
				ExitCode   int   `json:"exit_code"`
				TimedOut   bool  `json:"timed_out"`
				DurationMS int64 `json:"duration_ms"`
			}
			d, _ := json.Marshal(r.Body["data"])
			json.Unmarshal(d, &res)
			t.Logf("answered in %v (guestd: %d ms): exit_code %d, timed_out %v", took.Round(time.Millisecond), res.DurationMS, res.ExitCode, res.TimedOut)
			switch {
			case res.TimedOut && res.ExitCode == -1 && !tc.oom:
			case tc.hog && !res.TimedOut && res.ExitCode == 128+9:
			case tc.oom:
				t.Errorf("want exit_code 137 by the memory limit: %s", r.Raw)
			default:
				t.Errorf("want timed_out (or, for a memory hog, exit_code 137): %s", r.Raw)
			}
			// A bound of correctness (an exec outliving its timeout by
			// half a minute was the defect), not of speed: killing and
			// reaping a fork bomb on a starved TCG guest takes seconds.
			if time.Duration(res.DurationMS)*time.Millisecond > timeout+10*time.Second || took > timeout+15*time.Second {
				t.Errorf("answered in %v, guestd's duration %d ms: over the timeout plus 10 s", took, res.DurationMS)
			}
			after := s.sh(id, `echo $PPID; echo ok`)
			if after != guestd+"\nok\n" {
				t.Fatalf("after it: %q, want guestd %s and ok", after, guestd)
			}
			// Nothing of it is left: the only tasks of the execs are the
			// shell and cat that look, and its cgroup is gone within moments.
			var left string
			for range 50 {
				left = s.sh(id, `cat /sys/fs/cgroup/strata/exec/pids.current; ls /sys/fs/cgroup/strata/exec | grep -c '^[0-9]'`)
				if left == "2\n1\n" {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if left != "2\n1\n" {
				t.Errorf("left in the guest (tasks, exec cgroups): %q", left)
			}
			if tc.oom {
				if kills := groupKills() - killsBefore; kills != 1 {
					t.Errorf("group kills by the memory limit during the exec: %d, want 1", kills)
				}
			}
		})
	}
	// A background process whose output goes elsewhere outlives its exec,
	// which answers at once.
	s.sh(id, "setsid sleep 1000 </dev/null >/dev/null 2>&1 &")
	if out := s.sh(id, `pgrep -x sleep`); strings.Count(out, "\n") != 1 {
		t.Errorf("the detached sleep: %q", out)
	}
	if got := s.sh(id, "echo $PPID"); got != guestd+"\n" {
		t.Fatalf("guestd is %q now, was %s", got, guestd)
	}
}
