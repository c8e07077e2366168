package integration

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The bounds the hostile-guest suite holds hostproxy to while one guest
// attacks it, over what it held before the attack: what one guest may
// make the host hold is fixed (docs/design.md), and these leave room for
// the other sandbox's calls and Go's own slack.
const (
	hostileGoroutines = 300       // more goroutines at any sample
	hostileFDs        = 64        // more descriptors at any sample
	hostileRSS        = 160 << 20 // more resident bytes at any sample
	hostileConsole    = 4 << 20   // bytes of console log kept on the host
)

// TestVMHostileGuest is the hostile-guest suite: a root process in
// sandbox A takes the channel's port from its guestd and floods pings,
// writes garbage, reopens the port in a loop, answers the host's calls
// with endless headers and with bodies that never end; then A floods its
// console, fills its disk and snapshots itself with its own token until
// it is refused. Meanwhile sandbox B's exec keeps answering, hostproxy's
// goroutines, descriptors and memory stay under fixed bounds, A's own
// calls fail with clear errors, and A answers again by itself after
// each attack (its guestd is back) and after a stop and start.
func TestVMHostileGuest(t *testing.T) {
	s := startVMStackWith(t, "10s", map[string]any{"snapshot_quota_gib": 3})
	attacker := buildHostile(t)

	var a, b string
	var wg sync.WaitGroup
	ids := make([]string, 2)
	for i, name := range []string{"hostile-a", "quiet-b"} {
		r := s.call(s.key, "POST", "/v1/sandboxes", fmt.Sprintf(`{"name":%q,"memory_mib":256,"disk_gib":1}`, name))
		if r.Status != 202 {
			t.Fatalf("create %s: %d %s", name, r.Status, r.Raw)
		}
		ids[i] = r.data()["id"].(string)
	}
	for _, id := range ids {
		s.waitState(s.key, id, "running", 4*time.Minute)
	}
	a, b = ids[0], ids[1]
	upload(t, s, a, attacker, "/root/hostile")

	quiet := rtts(t, s, b, 60)
	base := sampleProxy(t, s)
	t.Logf("quiet: B's exec p50 %v p99 %v; hostproxy %+v", pct(quiet, 50), pct(quiet, 99), base)

	// B is called all through the attacks; every call must answer. Its
	// round trips are held to the bound while A attacks the
	// channel and the console (measuring is on); while A fills its disk
	// and saves its memory, the host's disk is busy for everyone, and
	// B's calls must only answer.
	stopB := make(chan struct{})
	// However the test ends, B's caller and the sampler end before the
	// stack's cleanup deletes the sandboxes.
	endB := sync.OnceFunc(func() {
		close(stopB)
		wg.Wait()
	})
	t.Cleanup(endB)
	var bDur []time.Duration
	var bErr []string
	var measuring atomic.Bool
	measuring.Store(true)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stopB:
				return
			default:
			}
			start := time.Now()
			r, err := s.send(s.key, "POST", "/v1/sandboxes/"+b+"/exec", `{"cmd":["true"]}`, nil)
			d := time.Since(start)
			switch {
			case err != nil:
				bErr = append(bErr, err.Error())
			case r.Status != 200:
				bErr = append(bErr, fmt.Sprintf("%d %s", r.Status, r.Raw))
			case measuring.Load():
				bDur = append(bDur, d)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	// hostproxy is sampled all through too.
	var peak proxyStats
	var peakMu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stopB:
				return
			case <-time.After(200 * time.Millisecond):
			}
			st, err := readProxy(s)
			if err != nil {
				continue
			}
			peakMu.Lock()
			peak = peak.max(st)
			peakMu.Unlock()
		}
	}()

	for _, at := range []struct {
		mode  string
		secs  int
		calls bool // A is called during the attack
	}{
		{"ping", 10, false},
		{"garbage", 4, false},
		{"reopen", 4, false},
		{"headers", 10, true},
		{"body", 10, true},
	} {
		t.Run(at.mode, func(t *testing.T) {
			s := s.on(t)
			// The attacker races guestinit for the port (guestd is started
			// again a second after it is killed) and, for the attacks
			// that speak yamux, for the host's next handshake: on a host
			// loaded enough it can lose either, and the attack does not
			// happen. Such a try is told and made again.
			for try := 1; ; try++ {
				log, attacked := attack(t, s, a, at.mode, at.secs, at.calls)
				if attacked {
					t.Logf("attacker: %s", strings.TrimSpace(log))
					return
				}
				if try == 3 {
					t.Fatalf("the attacker never got its session in %d tries: %s", try, log)
				}
				t.Logf("try %d: the attacker never got its session; again: %s", try, log)
			}
		})
	}

	t.Run("console", func(t *testing.T) {
		s := s.on(t)
		shUp(t, s, a, "setsid sh -c 'timeout 8 cat /dev/zero > /dev/ttyS0' >/dev/null 2>&1 </dev/null &")
		time.Sleep(10 * time.Second)
		var total int64
		filepath.Walk(filepath.Join(s.machines, a), func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() && strings.HasPrefix(fi.Name(), "console") {
				total += fi.Size()
			}
			return nil
		})
		if total > hostileConsole {
			t.Fatalf("console logs of A hold %d bytes on the host, bound %d", total, hostileConsole)
		}
		waitExec(t, s, a, 30*time.Second)
	})

	measuring.Store(false)
	t.Run("disk", func(t *testing.T) {
		s := s.on(t)
		// A gigabyte written under TCG takes its time: the exec's timeout
		// is not what this tests.
		res := s.execFor(a, 900, "sh", "-c", "dd if=/dev/zero of=/root/fill bs=1M 2>&1; sync; df -k /root | tail -1")
		if !strings.Contains(res.Stdout, "No space left") {
			t.Fatalf("A's disk did not fill: %+v", res)
		}
		s.sh(a, "rm -f /root/fill; sync")
	})

	t.Run("snapshots", func(t *testing.T) {
		s := s.on(t)
		// A's own token, from inside: memory snapshots until refused.
		tok := s.must(200, "POST", "/v1/sandboxes/"+a+"/access-token", "").data()["token"].(string)
		line := `. /run/strata/credentials.env; for i in $(seq 1 40); do ` +
			`c=$(curl -sS -o /tmp/snap.out -w '%{http_code}' -X POST -H 'X-Api-Key: ` + tok + `' -H 'Content-Type: application/json' ` +
			`-d '{"memory":true}' "$CREATEOS_API_URL/v1/sandboxes/` + a + `/snapshots"); ` +
			`if [ "$c" != 200 ]; then echo "$i $c $(cat /tmp/snap.out)"; exit 0; fi; done; echo never refused`
		res := s.execFor(a, 600, "sh", "-c", line)
		out := strings.TrimSpace(res.Stdout)
		if !strings.Contains(out, "snapshot_quota_exceeded") && !strings.Contains(out, "insufficient_storage") {
			t.Fatalf("A's snapshots were not refused by its quota: %q %s", out, res.Stderr)
		}
		// Some were taken before the refusal: the quota, not a failure.
		n, _ := strconv.Atoi(strings.Fields(out)[0])
		if n < 2 {
			t.Fatalf("A's first snapshot was refused: %q", out)
		}
		var snaps []map[string]any
		r := s.call(s.key, "GET", "/v1/sandboxes/"+a+"/snapshots", "")
		if err := json.Unmarshal(r.Raw, &snaps); err != nil {
			// The list is a plain array, or JSend's data.
			d, _ := json.Marshal(r.Body["data"])
			json.Unmarshal(d, &snaps)
		}
		if len(snaps) < n-1 {
			t.Fatalf("A took %d snapshots before the refusal, its list holds %d: %s", n-1, len(snaps), r.Raw)
		}
		for _, sn := range snaps {
			if sn["status"] != "ready" {
				t.Fatalf("a snapshot of A is %v after the refusal: %v", sn["status"], sn)
			}
		}
		t.Logf("refused: %s", out)
	})

	endB()

	// B never noticed: every call answered.
	if len(bErr) > 0 {
		t.Errorf("B's calls failed during the attacks (%d): %v", len(bErr), bErr[:min(len(bErr), 5)])
	}
	t.Logf("B's exec during the channel and console attacks: %d calls, p50 %v p99 %v (quiet p99 %v)", len(bDur), pct(bDur, 50), pct(bDur, 99), pct(quiet, 99))
	t.Logf("hostproxy at its peak: %+v (before: %+v)", peak, base)
	// The bound on B's p99: 3x its quiet value, and never under
	// two seconds: under TCG on two shared cores one exec in a hundred
	// can take a second for reasons of its own (a garbage collection of
	// the race detector, the other package's tests), while a starved
	// channel or a held lock shows as stalls of many seconds (yamux's
	// pings held calls for 10 s).
	if limit := max(3*pct(quiet, 99), 2*time.Second); pct(bDur, 99) > limit {
		t.Errorf("B's exec p99 during the attacks %v, over %v (3x its quiet p99 %v)", pct(bDur, 99), limit, pct(quiet, 99))
	}
	if peak.Goroutines-base.Goroutines > hostileGoroutines {
		t.Errorf("hostproxy's goroutines reached %d (before %d, bound +%d)", peak.Goroutines, base.Goroutines, hostileGoroutines)
	}
	if peak.FDs-base.FDs > hostileFDs {
		t.Errorf("hostproxy's descriptors reached %d (before %d, bound +%d)", peak.FDs, base.FDs, hostileFDs)
	}
	if peak.RSS-base.RSS > hostileRSS {
		t.Errorf("hostproxy's RSS reached %d (before %d, bound +%d)", peak.RSS, base.RSS, hostileRSS)
	}

	// A recovers with a stop and a start; B still answers.
	s.must(200, "POST", "/v1/sandboxes/"+a+"/stop", "")
	s.must(202, "POST", "/v1/sandboxes/"+a+"/start", "")
	s.waitState(s.key, a, "running", 4*time.Minute)
	if out := s.sh(a, "echo ok"); strings.TrimSpace(out) != "ok" {
		t.Fatalf("A after a restart: %q", out)
	}
	if out := s.sh(b, "cat /etc/hostname"); strings.TrimSpace(out) == "" {
		t.Fatal("B has no hostname")
	}
}

// attack runs the attacker in A in mode for secs and checks what the
// host does meanwhile (calls to A fail with a guest error, when calls)
// and after (A answers again by itself). attacked is false when the
// attacker never got what its mode needs (the port; a session), and
// nothing was tested.
func attack(t *testing.T, s *vmStack, a, mode string, secs int, calls bool) (log string, attacked bool) {
	// The attacker of a try before may still hold the port (it waits
	// two seconds past its deadline for a session).
	shUp(t, s, a, "while grep -qx hostile /proc/[0-9]*/comm 2>/dev/null; do sleep 0.2; done")
	shUp(t, s, a, fmt.Sprintf("setsid /root/hostile %s %d >/root/hostile-%s.log 2>&1 </dev/null &", mode, secs, mode))
	start := time.Now()
	var codes []string
	if calls {
		// The attacker answers after its second; the host's calls to
		// it must fail with a clear error, not hold memory.
		time.Sleep(4 * time.Second)
		var cw sync.WaitGroup
		codes = make([]string, 16)
		for i := range codes {
			cw.Add(1)
			go func(i int) {
				defer cw.Done()
				r, err := s.send(s.key, "POST", "/v1/sandboxes/"+a+"/exec", `{"cmd":["true"]}`, nil)
				switch {
				case err != nil:
					codes[i] = "transport: " + err.Error()
				case r.Status == 200:
					codes[i] = "200"
				default:
					codes[i] = fmt.Sprintf("%d %s", r.Status, r.code())
				}
			}(i)
		}
		cw.Wait()
	}
	// The attack ends by itself; A's guestd is started again by its
	// init and the host finds it.
	time.Sleep(time.Until(start.Add(time.Duration(secs+1) * time.Second)))
	healed := waitExec(t, s, a, 60*time.Second)
	t.Logf("%s: A answers again %v after the attack ended", mode, healed)
	log = shUp(t, s, a, "cat /root/hostile-"+mode+".log")
	if !strings.Contains(log, "port taken") {
		return log, false
	}
	if mode != "garbage" && mode != "reopen" && !strings.Contains(log, "handshake done") {
		return log, false
	}
	for _, c := range codes {
		if c == "200" || strings.HasPrefix(c, "transport") || strings.HasPrefix(c, "500") {
			t.Errorf("a call to A during %s answered %s; want a guest error", mode, c)
		}
	}
	if calls {
		t.Logf("A's calls during %s: %v", mode, codes)
	}
	return log, true
}

// shUp is s.sh for A, whose state may still change after an attack (the
// heartbeat finds the guestd it restarted, or one that is not answering
// yet): a call refused because A is not running, or because its guest is
// not answering, is made again, for a minute at most.
func shUp(t *testing.T, s *vmStack, id, line string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"cmd": []string{"sh", "-c", line}})
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := s.send(s.key, "POST", "/v1/sandboxes/"+id+"/exec", string(body), nil)
		if err == nil && r.Status == 200 {
			var res execResult
			d, _ := json.Marshal(r.Body["data"])
			json.Unmarshal(d, &res)
			if res.ExitCode != 0 {
				t.Fatalf("sh -c %q in %s: exit %d\nstdout: %s\nstderr: %s", line, id, res.ExitCode, res.Stdout, res.Stderr)
			}
			return res.Stdout
		}
		again := err == nil && (r.code() == "sandbox_not_running" && r.data()["state"] == "unresponsive" || r.code() == "guest_unavailable")
		if !again || time.Now().After(deadline) {
			t.Fatalf("sh -c %q in %s: %v %d %s", line, id, err, r.Status, r.Raw)
		}
		t.Logf("sh in %s: %d %s; again", id, r.Status, r.code())
		time.Sleep(200 * time.Millisecond)
	}
}

// buildHostile builds the attacker for the guest.
func buildHostile(t *testing.T) string {
	t.Helper()
	return buildGuestProgram(t, "hostileguest")
}

// buildGuestProgram builds integration/cmd/<name> for a guest (static,
// stripped) and returns the binary's path.
func buildGuestProgram(t *testing.T, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "strata/integration/cmd/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s for the guest: %v\n%s", name, err, b)
	}
	return out
}

// upload copies a host file into a sandbox through exec's stdin, in
// base64 pieces that fit its limit.
func upload(t *testing.T, s *vmStack, id, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	s.sh(id, "rm -f "+dst+".b64")
	const piece = 600 << 10
	for off := 0; off < len(b); off += piece {
		chunk := base64.StdEncoding.EncodeToString(b[off:min(off+piece, len(b))])
		body, _ := json.Marshal(map[string]any{"cmd": []string{"sh", "-c", "base64 -d >> " + dst + ".b64"}, "stdin": chunk})
		r := s.call(s.key, "POST", "/v1/sandboxes/"+id+"/exec", string(body))
		if r.Status != 200 || r.data()["exit_code"] != float64(0) {
			t.Fatalf("upload %s: %d %s", dst, r.Status, r.Raw)
		}
	}
	s.sh(id, fmt.Sprintf("mv %s.b64 %s && chmod 0755 %s && test $(stat -c %%s %s) = %d", dst, dst, dst, dst, len(b)))
}

// rtts times n execs of true in a sandbox.
func rtts(t *testing.T, s *vmStack, id string, n int) []time.Duration {
	t.Helper()
	var d []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		s.exec(id, "true")
		d = append(d, time.Since(start))
	}
	return d
}

// waitExec waits until an exec in the sandbox answers 200 and returns
// how long that took.
func waitExec(t *testing.T, s *vmStack, id string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		r, err := s.send(s.key, "POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":["true"]}`, nil)
		if err == nil && r.Status == 200 {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("sandbox %s did not answer within %v: %v %d %s", id, limit, err, r.Status, r.Raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

// proxyStats is what hostproxy holds.
type proxyStats struct {
	Goroutines int
	FDs        int
	RSS        int64
}

func (p proxyStats) max(o proxyStats) proxyStats {
	return proxyStats{max(p.Goroutines, o.Goroutines), max(p.FDs, o.FDs), max(p.RSS, o.RSS)}
}

func sampleProxy(t *testing.T, s *vmStack) proxyStats {
	t.Helper()
	st, err := readProxy(s)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// readProxy reads hostproxy's goroutines (its metrics), descriptors and
// resident memory (/proc).
func readProxy(s *vmStack) (proxyStats, error) {
	s.mu.Lock()
	pid := 0
	if s.proxy != nil && s.proxy.Process != nil {
		pid = s.proxy.Process.Pid
	}
	s.mu.Unlock()
	if pid == 0 {
		return proxyStats{}, fmt.Errorf("hostproxy is not running")
	}
	var st proxyStats
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return st, err
	}
	st.FDs = len(fds)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			st.RSS = kb << 10
		}
	}
	req, err := http.NewRequest(http.MethodGet, s.url+"/metrics", nil)
	if err != nil {
		return st, err
	}
	req.Header.Set("X-Api-Key", s.key) // the metrics are an account key's
	resp, err := s.client.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	var buf strings.Builder
	if _, err := io.Copy(&buf, resp.Body); err != nil {
		return st, err
	}
	for _, line := range strings.Split(buf.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			st.Goroutines, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if st.Goroutines == 0 {
		return st, fmt.Errorf("no go_goroutines in hostproxy's metrics")
	}
	return st, nil
}
