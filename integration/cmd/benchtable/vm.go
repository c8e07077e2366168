package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"strata/internal/servertiming"
)

var (
	vmImage  = flag.String("vm-image", "", "guest image directory: measure microVM sandboxes too (make bench passes make image's)")
	vmIdle   = flag.Int("vm-idle", 20, "idle sandboxes to hold at once before one more boots")
	vmRounds = flag.Int("vm-rounds", 30, "exec round trips, captures and restores measured in a sandbox")
	vmOnly   = flag.Bool("vm-only", false, "measure only the microVM sandboxes")
)

// vmBench is hostproxy running microVM sandboxes, driven through the
// public API only, as a user would.
type vmBench struct {
	base, url, key string
	proxy          *exec.Cmd
	client         *http.Client
	// net is the test host sandboxes' networks reach (vmnet.go).
	net *netHost
}

// vmRows boots sandboxes and measures them through the public API.
func vmRows(ctx context.Context, bin string) (rows []row, err error) {
	base, err := os.MkdirTemp("/var/tmp", "strata-bench-vm-")
	if err != nil {
		return nil, err
	}
	os.Chmod(base, 0o711)
	b := &vmBench{base: base, key: "sk_bench_key_0123456789abcdefghij", client: &http.Client{Timeout: 10 * time.Minute}}
	defer b.close()
	if b.net, err = startNetHost(); err != nil {
		return nil, err
	}
	defer b.net.close()
	if err := b.start(bin); err != nil {
		return nil, err
	}
	if *vmNetOnly {
		return b.netRows(ctx)
	}
	if *vmSnapOnly {
		return b.snapshotRows()
	}
	if *vmHostileOnly {
		return b.hostileRows()
	}
	if *vmPoolOnly {
		return b.poolRows(bin)
	}
	if *vmIdleOnly {
		var ids []string
		for i := range *vmIdle {
			fmt.Fprintf(os.Stderr, "booting sandbox %d of %d…\n", i+1, *vmIdle)
			id, _, _, err := b.createWith(`{"memory_mib":256}`)
			if err != nil {
				return nil, err
			}
			ids = append(ids, id)
		}
		return b.idleRows(bin, ids)
	}

	// Boots one at a time, each measured from create to running (guestd
	// answered through the channel) and to the first exec answered.
	// Exec and checkpoints in the first sandbox, while it is the only one
	// (idle guests under TCG still take some CPU for their timers).
	execRows := func(id string) ([]row, error) {
		var rows []row
		// 10,000 files in 100 directories; each capture follows a change
		// of 10 of them.
		if _, err := b.exec(id, "sh", "-c", "mkdir -p /workspace/p && cd /workspace/p && for d in $(seq 0 99); do mkdir $d && (cd $d && seq 0 99 | xargs touch); done"); err != nil {
			return nil, err
		}
		execT := timeN(*vmRounds, func(int) error { _, err := b.exec(id, "true"); return err })
		rows = append(rows, row{"exec round trip (`true`)", dur(median(execT)), dur(p99(execT)), fmt.Sprintf("%d runs: API, channel, guestd, fork and exec under TCG", *vmRounds), "", ""})
		var first string
		var capT []time.Duration
		parts := map[string][]time.Duration{}
		var order []string
		for i := range *vmRounds + 1 {
			if _, err := b.exec(id, "sh", "-c", fmt.Sprintf("for d in $(seq 0 9); do echo %d > /workspace/p/$d/0; done", i)); err != nil {
				return nil, err
			}
			t0 := time.Now()
			data, h, err := b.callHeader("POST", "/v1/sandboxes/"+id+"/checkpoints", `{"path":"/workspace/p"}`)
			if err != nil {
				return nil, err
			}
			if i == 0 { // the enrollment
				first = data["id"].(string)
				continue
			}
			capT = append(capT, time.Since(t0))
			if i == *vmRounds {
				fmt.Fprintf(os.Stderr, "the last capture's Server-Timing: %s\n", h.Get(servertiming.Header))
			}
			for _, m := range servertiming.Parse(h.Get(servertiming.Header)) {
				if _, ok := parts[m.Name]; !ok {
					order = append(order, m.Name)
				}
				parts[m.Name] = append(parts[m.Name], m.Dur)
			}
		}
		var steps []string
		for _, name := range order {
			if after, ok := strings.CutPrefix(name, "guest.capture."); ok {
				steps = append(steps, fmt.Sprintf("%s %s", after, dur(median(parts[name]))))
			}
		}
		guestd := parts["guest.total"]
		rows = append(rows,
			row{"directory capture in a sandbox, through the API", dur(median(capT)), dur(p99(capT)),
				fmt.Sprintf("%d runs, 10 files of 10,000 changed (by exec) before each; medians of its Server-Timing: hostproxy %s, of which the channel %s and guestd %s", len(capT),
					dur(median(parts["total"])), dur(median(parts["channel"])), dur(median(guestd))), "", "≤ 30 ms"},
			row{"guestd's part of that capture", dur(median(guestd)), dur(p99(guestd)), "its steps' medians: " + strings.Join(steps, ", "), "", "≤ 10 ms"},
		)
		restT := timeN(*vmRounds, func(int) error {
			_, err := b.call("POST", "/v1/sandboxes/"+id+"/checkpoints/"+first+"/restore", "")
			return err
		})
		rows = append(rows,
			row{"directory restore in a sandbox, through the API", dur(median(restT)), dur(p99(restT)), fmt.Sprintf("%d runs, to the enrollment's checkpoint (10,000 files)", *vmRounds), "", ""},
		)
		return rows, nil
	}
	var boots, toExec []time.Duration
	var ids []string
	var inOne []row
	var stages []bootStages
	for i := range *vmIdle {
		fmt.Fprintf(os.Stderr, "booting sandbox %d of %d…\n", i+1, *vmIdle)
		t0 := time.Now()
		id, boot, exec, err := b.create()
		if err != nil {
			return nil, err
		}
		if i < 5 {
			st, err := b.measureBoot(id, t0, t0.Add(boot))
			if err != nil {
				return nil, err
			}
			stages = append(stages, st)
		}
		ids = append(ids, id)
		boots, toExec = append(boots, boot), append(toExec, exec)
		if i == 0 {
			if inOne, err = execRows(id); err != nil {
				return nil, err
			}
		}
	}
	// The first 5 boots are the ones with the host to themselves; the
	// later ones boot beside idle sandboxes.
	alone := boots[:min(5, len(boots))]
	rows = append(rows,
		row{"create to running (guestd answers), one at a time", dur(median(alone)), dur(slices.Max(alone)), fmt.Sprintf("%d boots (p99 column: worst); TCG, 512 MiB, 1 vCPU", len(alone)), "2.45 s", "≤ 2.5 s"},
		row{"create to first exec answered", dur(median(toExec[:len(alone)])), dur(slices.Max(toExec[:len(alone)])), "the same boots", "", ""},
	)
	rows = append(rows, bootRows(stages)...)

	// Idle cost, then one more boot beside all of them.
	time.Sleep(5 * time.Second)
	rss, pss := b.qemuMemory()
	rows = append(rows, row{fmt.Sprintf("host memory per idle sandbox (%d running)", len(ids)), human(pss / int64(len(ids))), "", fmt.Sprintf("PSS of the QEMU processes; RSS %s each", human(rss/int64(len(ids)))), "", ""})
	idle, err := b.idleRows(bin, ids)
	if err != nil {
		return nil, err
	}
	rows = append(rows, idle...)
	fmt.Fprintf(os.Stderr, "booting one more beside %d idle sandboxes…\n", len(ids))
	_, extra, _, err := b.create()
	if err != nil {
		return nil, err
	}
	rows = append(rows, row{fmt.Sprintf("create to running beside %d idle sandboxes", len(ids)), dur(extra), "", fmt.Sprintf("%.1fx the boot alone (goal: under 2x)", float64(extra)/float64(median(alone))), "", ""})
	rows = append(rows, inOne...)
	netr, err := b.netRows(ctx)
	if err != nil {
		return nil, err
	}
	rows = append(rows, netr...)
	if !*vmSnapshots {
		// The idle ones stay for the pool's creates: b.close ends them.
		pool, err := b.poolRows(bin)
		return append(rows, pool...), err
	}
	// The idle ones go: the snapshot figures are of a host to itself.
	if data, err := b.call("GET", "/v1/sandboxes?limit=500", ""); err == nil {
		list, _ := data["data"].([]any)
		for _, v := range list {
			b.call("DELETE", "/v1/sandboxes/"+v.(map[string]any)["id"].(string), "")
		}
	}
	snap, err := b.snapshotRows()
	if err != nil {
		return nil, err
	}
	rows = append(rows, snap...)
	hostile, err := b.hostileRows()
	if err != nil {
		return nil, err
	}
	rows = append(rows, hostile...)
	pool, err := b.poolRows(bin)
	if err != nil {
		return nil, err
	}
	return append(rows, pool...), nil
}

func (b *vmBench) start(bin string) error { return b.startWith(bin, 0) }

// startWith starts hostproxy with a pool of that many sandboxes.
func (b *vmBench) startWith(bin string, pool int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	ln.Close()
	b.url = "http://" + addr
	// The bench polls and calls faster than the default per-key limit.
	cfg, _ := json.Marshal(map[string]any{
		"listen": addr, "data_dir": filepath.Join(b.base, "data"),
		"accounts":   []any{map[string]any{"id": "bench", "keys": []any{map[string]any{"id": "bench", "env": "BENCH_KEY"}}}},
		"rate_limit": map[string]any{"per_second": 10000, "burst": 10000},
		"vms":        b.vmsConfig(pool),
	})
	cfgPath := filepath.Join(b.base, "hostproxy.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		return err
	}
	b.proxy = exec.Command(filepath.Join(bin, "hostproxy"), "--config", cfgPath)
	b.proxy.Env = append(os.Environ(), "BENCH_KEY="+b.key)
	logf, err := os.OpenFile(filepath.Join(b.base, "hostproxy.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	b.proxy.Stdout, b.proxy.Stderr = logf, logf
	if err := b.proxy.Start(); err != nil {
		return err
	}
	for range 500 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("hostproxy did not listen (log in %s)", logf.Name())
}

// vmsConfig is hostproxy's vms section, with a pool of that many.
func (b *vmBench) vmsConfig(pool int) map[string]any {
	vms := map[string]any{"dir": filepath.Join(b.base, "vms"), "image": *vmImage, "pool": pool, "forks_ahead": 1}
	if b.net != nil {
		vms["egress"] = b.net.egress()
	}
	return vms
}

// close deletes every sandbox, stops hostproxy and removes the state.
func (b *vmBench) close() {
	if b.proxy != nil {
		if data, err := b.call("GET", "/v1/sandboxes?limit=500", ""); err == nil {
			list, _ := data["data"].([]any)
			for _, v := range list {
				b.call("DELETE", "/v1/sandboxes/"+v.(map[string]any)["id"].(string), "")
			}
		}
		b.proxy.Process.Signal(syscall.SIGTERM)
		b.proxy.Wait()
	}
	// Whatever the API could not delete (a failed run) is killed here:
	// nothing the bench starts outlives it.
	for _, pid := range b.qemus(nil) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	// hostproxy's log outlives the run, for a look after a failure.
	if log, err := os.ReadFile(filepath.Join(b.base, "hostproxy.log")); err == nil {
		kept := filepath.Join(os.TempDir(), "strata-bench-hostproxy.log")
		if os.WriteFile(kept, log, 0o600) == nil {
			fmt.Fprintln(os.Stderr, "hostproxy's log:", kept)
		}
	}
	cleanup(b.base)
}

func (b *vmBench) call(method, path, body string) (map[string]any, error) {
	data, _, err := b.callHeader(method, path, body)
	return data, err
}

// callHeader is call, with the answer's header.
func (b *vmBench) callHeader(method, path, body string) (map[string]any, http.Header, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, b.url+path, rd)
	req.Header.Set("X-Api-Key", b.key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var env struct {
		Data map[string]any `json:"data"`
	}
	json.Unmarshal(raw, &env)
	if resp.StatusCode/100 != 2 {
		return nil, nil, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	return env.Data, resp.Header, nil
}

// create makes a sandbox and times it to running and to a first exec.
func (b *vmBench) create() (id string, boot, toExec time.Duration, err error) {
	return b.createWith("{}")
}

// createWith is create with a body.
func (b *vmBench) createWith(body string) (id string, boot, toExec time.Duration, err error) {
	t0 := time.Now()
	data, err := b.call("POST", "/v1/sandboxes", body)
	if err != nil {
		return "", 0, 0, err
	}
	id = data["id"].(string)
	for {
		d, err := b.call("GET", "/v1/sandboxes/"+id, "")
		if err != nil {
			return "", 0, 0, err
		}
		if d["state"] == "running" {
			break
		}
		if d["state"] == "error" || time.Since(t0) > 5*time.Minute {
			return "", 0, 0, fmt.Errorf("sandbox %s: %v", id, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	boot = time.Since(t0)
	if _, err := b.exec(id, "true"); err != nil {
		return "", 0, 0, err
	}
	return id, boot, time.Since(t0), nil
}

func (b *vmBench) exec(id string, cmd ...string) (map[string]any, error) {
	body, _ := json.Marshal(map[string]any{"cmd": cmd})
	d, err := b.call("POST", "/v1/sandboxes/"+id+"/exec", string(body))
	if err == nil && d["exit_code"] != 0.0 {
		err = fmt.Errorf("exec %q: %v", cmd, d)
	}
	return d, err
}

// qemuMemory sums RSS and PSS of the QEMU processes under the bench's
// machines directory, in bytes.
func (b *vmBench) qemuMemory() (rss, pss int64) {
	for _, pid := range b.qemus(nil) {
		r, s := smapsRollup(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		rss, pss = rss+r, pss+s
	}
	return rss, pss
}

// qemus are the pids of the QEMUs of the bench's sandboxes (of ids, or
// all when ids is nil). A QEMU is known by its working directory, its
// sandbox's run directory: its command line names no path of the
// machines directory (its sockets and disks are descriptors).
func (b *vmBench) qemus(ids []string) []int {
	procs, _ := os.ReadDir("/proc")
	vms := filepath.Join(b.base, "vms") + "/"
	var pids []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", p.Name(), "exe"))
		cwd, _ := os.Readlink(filepath.Join("/proc", p.Name(), "cwd"))
		if !strings.Contains(filepath.Base(exe), "qemu-system") || !strings.HasPrefix(cwd, vms) {
			continue
		}
		id := strings.Split(strings.TrimPrefix(cwd, vms), "/")[0]
		if ids == nil || slices.Contains(ids, id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// smapsRollup reads a process's RSS and PSS in bytes.
func smapsRollup(path string) (rss, pss int64) {
	roll, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(roll), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "Rss:":
				rss += kb << 10
			case "Pss:":
				pss += kb << 10
			}
		}
	}
	return rss, pss
}
