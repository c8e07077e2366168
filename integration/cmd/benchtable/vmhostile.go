package main

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

var vmHostileOnly = flag.Bool("vm-hostile-only", false, "measure only the rows of a hostile guest beside a quiet one")

// hostileRows measures what one hostile guest costs the host and its
// neighbours: a quiet sandbox's exec while another floods its channel
// with pings (integration/cmd/hostileguest), hostproxy's memory while the
// hostile guest answers every call with an endless header or body, and
// the time a sandbox takes to answer again after its guestd is killed.
func (b *vmBench) hostileRows() ([]row, error) {
	attacker, err := buildAttacker(b.base)
	if err != nil {
		return nil, err
	}
	var ids []string
	for range 2 {
		id, _, _, err := b.createWith(`{"memory_mib":256,"disk_gib":1}`)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	a, q := ids[0], ids[1]
	if err := b.upload(a, attacker, "/root/hostile"); err != nil {
		return nil, err
	}
	execTrue := func(id string) error { _, err := b.exec(id, "true"); return err }
	quiet := timeN(*vmRounds, func(int) error { return execTrue(q) })

	// A floods pings for as long as the quiet one is measured.
	if _, err := b.exec(a, "sh", "-c", "setsid /root/hostile ping 30 >/root/ping.log 2>&1 </dev/null &"); err != nil {
		return nil, err
	}
	time.Sleep(3 * time.Second)
	var flooded []time.Duration
	for end := time.Now().Add(25 * time.Second); time.Now().Before(end); {
		t0 := time.Now()
		if err := execTrue(q); err != nil {
			return nil, fmt.Errorf("the quiet sandbox beside a ping flood: %w", err)
		}
		flooded = append(flooded, time.Since(t0))
	}
	if _, err := b.waitExec(a, 90*time.Second); err != nil {
		return nil, err
	}
	pings, _ := b.exec(a, "cat", "/root/ping.log")

	// hostproxy's memory while A answers 16 calls at a time without end.
	pid := b.proxy.Process.Pid
	baseRSS := rssOf(pid)
	var peak int64
	for _, mode := range []string{"headers", "body"} {
		if _, err := b.waitExec(a, 90*time.Second); err != nil {
			return nil, err
		}
		if _, err := b.exec(a, "sh", "-c", "setsid /root/hostile "+mode+" 12 >/dev/null 2>&1 </dev/null &"); err != nil {
			return nil, err
		}
		time.Sleep(4 * time.Second)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
					peak = max(peak, rssOf(pid))
				}
			}
		}()
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b.call("POST", "/v1/sandboxes/"+a+"/exec", `{"cmd":["true"]}`)
			}()
		}
		wg.Wait()
		close(stop)
		if _, err := b.waitExec(a, 90*time.Second); err != nil {
			return nil, err
		}
	}

	// guestd killed inside A: the time until an exec is answered by the
	// guestd that init started again.
	var back []time.Duration
	for range 5 {
		// A's guestd may still be coming back from the attacks: its own
		// calls are waited for.
		if _, err := b.waitExec(a, 90*time.Second); err != nil {
			return nil, err
		}
		d, err := b.exec(a, "pidof", "guestd")
		if err != nil {
			return nil, err
		}
		// pidof may also name the child guestd forks for the exec itself.
		old := strings.Fields(fmt.Sprint(d["stdout"]))
		if _, err := b.exec(a, "sh", "-c", "setsid sh -c 'sleep 1; kill -9 "+strings.Join(old, " ")+"' >/dev/null 2>&1 </dev/null &"); err != nil {
			return nil, err
		}
		killed := time.Now().Add(time.Second)
		for {
			d, err := b.exec(a, "pidof", "guestd")
			if err == nil && !slices.ContainsFunc(strings.Fields(fmt.Sprint(d["stdout"])), func(p string) bool { return slices.Contains(old, p) }) {
				break
			}
			if time.Since(killed) > 90*time.Second {
				return nil, fmt.Errorf("sandbox %s: no new guestd answered within 90 s of the kill (last: %v)", a, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		back = append(back, time.Since(killed))
	}

	for _, id := range ids {
		b.call("DELETE", "/v1/sandboxes/"+id, "")
	}
	return []row{
		{"exec round trip (`true`), quiet neighbour", dur(median(quiet)), dur(p99(quiet)), fmt.Sprintf("%d runs, 256 MiB sandboxes, the other one idle", len(quiet)), "", ""},
		{"exec round trip beside a guest flooding pings", dur(median(flooded)), dur(p99(flooded)), fmt.Sprintf("%d runs in 25 s while root in the other sandbox writes yamux pings into the channel as fast as it takes them (%s); p99 %.1fx the quiet one", len(flooded), strings.TrimSpace(fmt.Sprint(pings["stdout"])), float64(p99(flooded))/float64(p99(quiet))), "", ""},
		{"hostproxy memory held by one hostile guest", human(max(0, peak-baseRSS)), "", fmt.Sprintf("peak RSS over its %s before, while the guest answers 16 calls at a time with an endless header, then a 1 GiB body (bound: docs/design.md)", human(baseRSS)), "", ""},
		{"guestd killed: until an exec answers again", dur(median(back)), dur(slices.Max(back)), fmt.Sprintf("%d kills (p99 column: worst); guestinit restarts guestd after about 1 s, the host's heartbeat resets the channel", len(back)), "", ""},
	}, nil
}

// buildAttacker builds integration/cmd/hostileguest for the guest.
func buildAttacker(base string) (string, error) {
	out := filepath.Join(base, "hostileguest")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "strata/integration/cmd/hostileguest")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the attacker: %v\n%s", err, b)
	}
	return out, nil
}

// upload copies a host file into a sandbox through exec's stdin, in
// base64 pieces that fit its limit.
func (b *vmBench) upload(id, src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if _, err := b.exec(id, "rm", "-f", dst+".b64"); err != nil {
		return err
	}
	const piece = 600 << 10
	for off := 0; off < len(data); off += piece {
		body, _ := json.Marshal(map[string]any{"cmd": []string{"sh", "-c", "base64 -d >> " + dst + ".b64"},
			"stdin": base64.StdEncoding.EncodeToString(data[off:min(off+piece, len(data))])})
		d, err := b.call("POST", "/v1/sandboxes/"+id+"/exec", string(body))
		if err != nil {
			return err
		}
		if d["exit_code"] != 0.0 {
			return fmt.Errorf("upload %s: %v", dst, d)
		}
	}
	_, err = b.exec(id, "sh", "-c", fmt.Sprintf("mv %s.b64 %s && chmod 0755 %s", dst, dst, dst))
	return err
}

// waitExec waits until an exec answers and returns how long that took.
func (b *vmBench) waitExec(id string, limit time.Duration) (time.Duration, error) {
	t0 := time.Now()
	for {
		_, err := b.exec(id, "true")
		if err == nil {
			return time.Since(t0), nil
		}
		if time.Since(t0) > limit {
			return 0, fmt.Errorf("sandbox %s did not answer within %v: %w", id, limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rssOf is a process's resident memory in bytes.
func rssOf(pid int) int64 {
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
