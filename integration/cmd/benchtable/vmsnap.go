package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

var (
	vmSnapshots = flag.Bool("vm-snapshots", true, "measure VM snapshots, restores, forks and pauses")
	vmSnapOnly  = flag.Bool("vm-snapshots-only", false, "measure only VM snapshots, restores, forks and pauses")
	vmForks     = flag.Int("vm-forks", 10, "forks of one snapshot made at once")
)

// snapshotRows measures VM snapshots on a 1 GiB sandbox with 400 MiB of
// its memory written (random bytes: nothing for QEMU to skip), through the
// public API; the guest's pause and the load of a restore are the
// figures hostproxy logs for each.
func (b *vmBench) snapshotRows() ([]row, error) {
	fmt.Fprintln(os.Stderr, "VM snapshots: booting a 1 GiB sandbox…")
	data, err := b.call("POST", "/v1/sandboxes", `{"name":"snapshots","memory_mib":1024}`)
	if err != nil {
		return nil, err
	}
	id := data["id"].(string)
	if _, err := b.wait(id, "running", 5*time.Minute); err != nil {
		return nil, err
	}
	if _, err := b.exec(id, "sh", "-c", `setsid python3 -c "import os,time; b=bytearray(os.urandom(1<<20))*400; open('/dev/shm/ready','w').close(); time.sleep(1e9)" </dev/null >/dev/null 2>&1 & while [ ! -e /dev/shm/ready ]; do sleep 0.2; done`); err != nil {
		return nil, err
	}
	snaps := "/v1/sandboxes/" + id + "/snapshots"
	var rows []row
	const n = 5

	// Memory snapshots: the API's time, and the pause.
	// Each on a quiet host: the one before has reached the disk (its
	// files are written back in the background; back to back, each
	// save waits on the writeback of the one before).
	quiet := func() { time.Sleep(4 * time.Second) }
	var snapT []time.Duration
	var sizes []int64
	for range n {
		quiet()
		t0 := time.Now()
		d, err := b.call("POST", snaps, `{"retention":{"mode":"delete_oldest","max_count":8}}`)
		if err != nil {
			return nil, err
		}
		snapT = append(snapT, time.Since(t0))
		sizes = append(sizes, int64(d["size_bytes"].(float64)))
	}
	pauses, err := b.logged(`msg="snapshot taken" .*sandbox=`+id+` snapshot=v\d+ memory=true .*pause=(\S+)`, n)
	if err != nil {
		return nil, err
	}
	rows = append(rows,
		row{"memory snapshot (1 GiB guest, 400 MiB written), through the API", dur(median(snapT)), dur(p99(snapT)), fmt.Sprintf("%d runs, 4 s apart; live: copied while the guest runs, stopped for the last dirty pages, its disk switched there; mapped-ram, multifd, direct-io; %s held each (was 616 ms stopped)", n, human(sizes[len(sizes)-1])), "mapped-ram, multifd, direct-io: 10× faster than a classic save", "≤ 1 s, durable"},
		row{"… the pause the guest sees", dur(median(pauses)), dur(p99(pauses)), "stop to cont, as hostproxy measures it (its record's pause_ms; was 574 ms)", "156 ms (live precopy downtime)", "≤ 100 ms"},
	)

	// Restores of the last one: the automatic snapshot first, then the
	// load (QEMU started, state read, guest running and answering).
	var restT []time.Duration
	for range n {
		quiet()
		t0 := time.Now()
		if _, err := b.call("POST", snaps+"/v5/restore", ""); err != nil {
			return nil, err
		}
		restT = append(restT, time.Since(t0))
	}
	loads, err := b.logged(`msg="sandbox running" .*sandbox=`+id+` .*loaded=true loaded_in=(\S+)`, n)
	if err != nil {
		return nil, err
	}
	boots, err := b.logged(`msg="sandbox running" .*sandbox=`+id+` boot=(\S+) loaded=true`, n)
	if err != nil {
		return nil, err
	}
	rows = append(rows,
		row{"memory restore, through the API", dur(median(restT)), dur(p99(restT)), fmt.Sprintf("%d runs: the guest stopped and its disk frozen as auto-N, the load; auto-N's memory written once the snapshot runs (was 4.04 s)", n), "the load alone: 412 ms", "≤ 1 s"},
		row{"… the load: QEMU started, the state read (its devices alone through a template), the guest running", dur(median(loads)), dur(p99(loads)), "as hostproxy logs it (prototype's load alone: 412 ms)", "412 ms", ""},
		row{"… to running: the channel again, guestd answering, clock and RNG, credentials", dur(median(boots)), dur(p99(boots)), "as hostproxy logs it", "", ""},
	)
	// A restore right after its snapshot: the snapshot's template is
	// being made in the background (a QEMU loading the same state).
	var rightT []time.Duration
	for range 3 {
		quiet()
		d, err := b.call("POST", snaps, `{"retention":{"mode":"delete_oldest","max_count":8}}`)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		if _, err := b.call("POST", snaps+"/"+d["id"].(string)+"/restore", ""); err != nil {
			return nil, err
		}
		rightT = append(rightT, time.Since(t0))
	}
	rows = append(rows, row{"memory restore right after its snapshot, through the API", dur(median(rightT)), dur(p99(rightT)), fmt.Sprintf("%d runs: the snapshot's template is being made meanwhile (a QEMU of low priority loading the same state)", len(rightT)), "", "≤ 1.5 s"})
	// The last restore's auto-N is written by the old QEMU after the
	// restore answered: measured once it is ready, and that QEMU gone.
	if err := b.autosWritten(id); err != nil {
		return nil, err
	}
	rss, _ := b.qemuMemoryOf([]string{id})
	rows = append(rows, row{"host memory after a restore (1 GiB guest, 400 MiB written)", human(rss), "", "RSS of its QEMU after the last restore: a mapped-ram load touches only the pages the state holds (was 1.1 GB)", "614 MB (a mapped-ram load)", "≤ the touched pages + 100 MiB"})

	var diskT []time.Duration
	for range n {
		t0 := time.Now()
		if _, err := b.call("POST", snaps, `{"memory":false}`); err != nil {
			return nil, err
		}
		diskT = append(diskT, time.Since(t0))
	}
	rows = append(rows, row{"disk-only snapshot, through the API", dur(median(diskT)), dur(p99(diskT)), fmt.Sprintf("%d runs: guest sync, then the disk's top frozen under a new one", n), "", ""})

	// Forks. Cold: the first fork of each of n new memory snapshots
	// (its template made in the background once it was taken, before
	// the fork). Then n forks of the last one, each taking the fork
	// hostproxy made ahead of it (forks_ahead), once that one is ready.
	var lastSnap string
	fork := func(body string) ([]string, time.Duration, error) {
		t0 := time.Now()
		d, err := b.call("POST", snaps+"/"+lastSnap+"/fork", body)
		if err != nil {
			return nil, 0, err
		}
		var ids []string
		for _, s := range d["sandboxes"].([]any) {
			ids = append(ids, s.(map[string]any)["id"].(string))
		}
		for _, f := range ids {
			if _, err := b.wait(f, "running", 5*time.Minute); err != nil {
				return nil, 0, err
			}
		}
		return ids, time.Since(t0), nil
	}
	// waitLog waits until hostproxy has logged n lines matching pattern.
	waitLog := func(pattern string, n int) error {
		for deadline := time.Now().Add(2 * time.Minute); len(b.logLines(pattern)) < n; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("hostproxy logged %d lines matching %q in 2 minutes, want %d", len(b.logLines(pattern)), pattern, n)
			}
		}
		return nil
	}
	var coldT []time.Duration
	var forks []string
	for range n {
		quiet()
		d, err := b.call("POST", snaps, `{"retention":{"mode":"delete_oldest","max_count":8}}`)
		if err != nil {
			return nil, err
		}
		lastSnap = d["id"].(string)
		if err := waitLog(`msg="template made" .*sandbox=`+id+` snapshot=`+lastSnap+` `, 1); err != nil {
			return nil, err
		}
		ids, d2, err := fork(`{"count":1}`)
		if err != nil {
			return nil, err
		}
		forks, coldT = append(forks, ids...), append(coldT, d2)
	}
	coldLoads, err := b.logged(`msg="sandbox running" .*sandbox=(?:`+strings.Join(forks, "|")+`) .*loaded=true loaded_in=(\S+)`, n)
	if err != nil {
		return nil, err
	}
	var warmT []time.Duration
	warm := `msg="fork made ahead" .*snapshot=` + lastSnap + ` `
	for i := range n {
		if err := waitLog(warm, i+1); err != nil {
			return nil, err
		}
		quiet()
		ids, d, err := fork(`{"count":1}`)
		if err != nil {
			return nil, err
		}
		forks, warmT = append(forks, ids...), append(warmT, d)
	}
	takes, err := b.logged(`msg="sandbox forked" .*ahead=true took=(\S+)`, n)
	if err != nil {
		return nil, err
	}
	if err := waitLog(warm, n+1); err != nil {
		return nil, err
	}
	aheads, err := b.logged(warm+`.*took=(\S+)`, n)
	if err != nil {
		return nil, err
	}
	// The templates: one per memory snapshot taken above, made in the
	// background once it was taken.
	templates, err := b.logged(`msg="template made" .*sandbox=`+id+` .*took=(\S+)`, n)
	if err != nil {
		return nil, err
	}
	rows = append(rows,
		row{"fork of a snapshot with no fork made ahead (its first), to running", dur(median(coldT)), dur(p99(coldT)), fmt.Sprintf("%d snapshots, the first fork of each: a QEMU maps the snapshot's own state; its template (the devices apart) made when the snapshot was taken", n), "", "≤ 1.5 s"},
		row{"… the template, in the background after each memory snapshot", dur(median(templates)), dur(p99(templates)), fmt.Sprintf("%d snapshots: a QEMU loads the state into RAM in memory and saves the devices alone; nothing of the RAM is written", n), "", ""},
		row{"… the fork's start: QEMU on the snapshot's state, its devices loaded, the guest running", dur(median(coldLoads)), dur(p99(coldLoads)), "as hostproxy logs it; then some 400 ms of TCG translating the guest's first instructions before guestd answers", "33 ms", "≤ 50 ms"},
		row{"fork, to running, through the API", dur(median(warmT)), dur(p99(warmT)), fmt.Sprintf("%d runs, one at a time, create to the API saying running: each takes the fork made ahead of the snapshot (forks_ahead)", n), "fork start 33 ms", "≤ 300 ms"},
		row{"… the take: its CPUs started, the resync, the record", dur(median(takes)), dur(p99(takes)), "as hostproxy logs it", "", ""},
		row{"… the next fork made ahead, in the background", dur(median(aheads)), dur(p99(aheads)), "fork, guestd answering, CPUs stopped", "", ""},
	)
	for _, f := range forks {
		b.call("DELETE", "/v1/sandboxes/"+f, "")
	}
	many, manyT, err := fork(fmt.Sprintf(`{"count":%d}`, *vmForks))
	if err != nil {
		return nil, err
	}
	time.Sleep(3 * time.Second)
	_, forksPSS := b.qemuMemoryOf(many)
	_, srcPSS := b.qemuMemoryOf([]string{id})
	rows = append(rows,
		row{fmt.Sprintf("%d forks of one snapshot at once, to all running", *vmForks), dur(manyT), "", "", "", ""},
		row{fmt.Sprintf("host memory of those %d forks, together", *vmForks), human(forksPSS), "", fmt.Sprintf("PSS; the source sandbox alone: %s, 3 such sandboxes %s (goal: the forks under that)", human(srcPSS), human(3*srcPSS)), "", ""},
	)
	for _, f := range many {
		b.call("DELETE", "/v1/sandboxes/"+f, "")
	}

	// Pause (memory to the store, QEMU ends) and resume: once the paused
	// state's template is made (in the background, 1–2 s after the
	// pause: a paused sandbox's usual case), and right after the pause
	// (the template not yet made: the whole state loaded).
	var pauseT, resumeT, resumeNowT []time.Duration
	pauseResume := func(waitTemplate bool) error {
		t0 := time.Now()
		if _, err := b.call("POST", "/v1/sandboxes/"+id+"/pause", ""); err != nil {
			return err
		}
		if _, err := b.wait(id, "paused", time.Minute); err != nil {
			return err
		}
		pauseT = append(pauseT, time.Since(t0))
		if waitTemplate {
			made := len(b.logLines(`msg="pause template made" .*sandbox=` + id))
			for deadline := time.Now().Add(time.Minute); len(b.logLines(`msg="pause template made" .*sandbox=`+id)) == made; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					return fmt.Errorf("no pause template for %s a minute after its pause", id)
				}
			}
		}
		t0 = time.Now()
		if _, err := b.call("POST", "/v1/sandboxes/"+id+"/resume", ""); err != nil {
			return err
		}
		if _, err := b.wait(id, "running", time.Minute); err != nil {
			return err
		}
		if waitTemplate {
			resumeT = append(resumeT, time.Since(t0))
		} else {
			resumeNowT = append(resumeNowT, time.Since(t0))
		}
		quiet()
		return nil
	}
	for range n {
		if err := pauseResume(true); err != nil {
			return nil, err
		}
	}
	pauseTpl, err := b.logged(`msg="pause template made" .*sandbox=`+id+` took=(\S+)`, n)
	if err != nil {
		return nil, err
	}
	resumeLoads, err := b.logged(`msg="sandbox running" .*sandbox=`+id+` .*loaded=true loaded_in=(\S+)`, n)
	if err != nil {
		return nil, err
	}
	for range n {
		if err := pauseResume(false); err != nil {
			return nil, err
		}
	}
	resumeNowLoads, err := b.logged(`msg="sandbox running" .*sandbox=`+id+` .*loaded=true loaded_in=(\S+)`, n)
	if err != nil {
		return nil, err
	}
	rows = append(rows,
		row{"pause (memory to disk, QEMU ended), to paused", dur(median(pauseT)), dur(p99(pauseT)), fmt.Sprintf("%d runs; mapped-ram with direct-io: on disk when paused; a paused sandbox costs the host no memory", len(pauseT)), "", "≤ 1 s"},
		row{"… the pause's template, in the background after it", dur(median(pauseTpl)), dur(p99(pauseTpl)), "a QEMU loads the paused state into RAM in memory and saves the devices alone", "", ""},
		row{"resume, to running, through the pause's template", dur(median(resumeT)), dur(p99(resumeT)), fmt.Sprintf("%d runs: the paused state's RAM mapped where it is, its devices loaded", n), "", "≤ 500 ms"},
		row{"… the load: QEMU started, the devices read, the guest running", dur(median(resumeLoads)), dur(p99(resumeLoads)), "as hostproxy logs it", "", ""},
		row{"resume right after the pause, to running", dur(median(resumeNowT)), dur(p99(resumeNowT)), fmt.Sprintf("%d runs: the template not made yet; the whole state loaded", n), "", ""},
		row{"… the load", dur(median(resumeNowLoads)), dur(p99(resumeNowLoads)), "as hostproxy logs it", "", ""},
	)
	chain, err := b.chainRows()
	if err != nil {
		return nil, err
	}
	return append(rows, chain...), nil
}

// chainCycles is how many snapshot and delete cycles the chain rows take.
const chainCycles = 300

// chainRows takes disk-only snapshots of a small sandbox, each followed by
// the delete of the one before, and reports the disk chain its QEMU holds
// once the background compaction has run (docs/design.md: at most 1 + S
// layers for a linear history, S snapshots kept).
func (b *vmBench) chainRows() ([]row, error) {
	fmt.Fprintf(os.Stderr, "VM snapshots: %d snapshot and delete cycles…\n", chainCycles)
	data, err := b.call("POST", "/v1/sandboxes", `{"name":"chain","memory_mib":256}`)
	if err != nil {
		return nil, err
	}
	id := data["id"].(string)
	defer b.call("DELETE", "/v1/sandboxes/"+id, "")
	if _, err := b.wait(id, "running", 5*time.Minute); err != nil {
		return nil, err
	}
	snaps := "/v1/sandboxes/" + id + "/snapshots"
	var cycleT []time.Duration
	prev := ""
	for range chainCycles {
		t0 := time.Now()
		d, err := b.call("POST", snaps, `{"memory":false}`)
		if err != nil {
			return nil, err
		}
		if prev != "" {
			if _, err := b.call("DELETE", snaps+"/"+prev, ""); err != nil {
				return nil, err
			}
		}
		prev = d["id"].(string)
		cycleT = append(cycleT, time.Since(t0))
	}
	// The last compaction runs after the last delete's answer.
	var depth int
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if depth = b.qemuLayers(id); depth <= 2 || time.Now().After(deadline) {
			break
		}
	}
	return []row{
		{fmt.Sprintf("chain depth after %d snapshot cycles", chainCycles), strconv.Itoa(depth), "", fmt.Sprintf("store layers the sandbox's QEMU holds over the base image, 1 snapshot kept (bound: 1 + S = 2); before compaction, %d", chainCycles+1), "", ""},
		{"disk-only snapshot and delete of the one before, through the API", dur(median(cycleT)), dur(p99(cycleT)), fmt.Sprintf("%d cycles, 256 MiB guest; a snapshot waits for the compaction the delete before it started", chainCycles), "", ""},
	}, nil
}

// qemuLayers counts the store layers a sandbox's QEMU holds open.
func (b *vmBench) qemuLayers(id string) int {
	store := filepath.Join(b.base, "vms", "store") + "/"
	pids := b.qemus([]string{id})
	if len(pids) != 1 {
		return -1
	}
	p := strconv.Itoa(pids[0])
	fds, _ := os.ReadDir(filepath.Join("/proc", p, "fd"))
	seen := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc", p, "fd", fd.Name()))
		if err == nil && strings.HasPrefix(target, store) && strings.HasSuffix(target, ".qcow2") {
			seen[target] = true
		}
	}
	return len(seen)
}

// wait polls a sandbox until it reaches state.
func (b *vmBench) wait(id, state string, timeout time.Duration) (map[string]any, error) {
	t0 := time.Now()
	for {
		d, err := b.call("GET", "/v1/sandboxes/"+id, "")
		if err != nil {
			return nil, err
		}
		if d["state"] == state {
			return d, nil
		}
		if d["state"] == "error" || time.Since(t0) > timeout {
			return nil, fmt.Errorf("sandbox %s: %v, waiting for %s", id, d, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logged reads durations from hostproxy's log: the first group of the
// last n lines that match pattern.
func (b *vmBench) logged(pattern string, n int) ([]time.Duration, error) {
	var all []time.Duration
	for _, m := range b.logLines(pattern) {
		if d, err := time.ParseDuration(m[1]); err == nil {
			all = append(all, d)
		}
	}
	if len(all) < n {
		return nil, fmt.Errorf("hostproxy's log has %d lines matching %q, want %d", len(all), pattern, n)
	}
	return all[len(all)-n:], nil
}

// logLines are the submatches of pattern in the lines of hostproxy's log
// that match it.
func (b *vmBench) logLines(pattern string) [][]string {
	re := regexp.MustCompile(pattern)
	f, err := os.Open(filepath.Join(b.base, "hostproxy.log"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines [][]string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			lines = append(lines, m)
		}
	}
	return lines
}

// qemuMemoryOf sums RSS and PSS of the QEMUs of the given sandboxes.
func (b *vmBench) qemuMemoryOf(ids []string) (rss, pss int64) {
	for _, pid := range b.qemus(ids) {
		r, s := smapsRollup(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		rss, pss = rss+r, pss+s
	}
	return rss, pss
}

// autosWritten waits until no snapshot of sandbox id is processing: the
// automatic snapshots its restores write in the background are ready (or
// failed), and their old QEMUs have ended.
func (b *vmBench) autosWritten(id string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		req, _ := http.NewRequest("GET", b.url+"/v1/sandboxes/"+id+"/snapshots", nil)
		req.Header.Set("X-Api-Key", b.key)
		resp, err := b.client.Do(req)
		if err != nil {
			return err
		}
		var env struct {
			Data []struct {
				Status string `json:"status"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		if err != nil {
			return err
		}
		processing := false
		for _, s := range env.Data {
			processing = processing || s.Status == "processing"
		}
		if !processing && len(b.qemus([]string{id})) <= 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s: snapshots still processing after a minute", id)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
