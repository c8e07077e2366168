package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"strata/internal/testenv"
	"strata/vmm"
)

// vmStack is hostproxy running microVM sandboxes, as a process, with its
// registry and machines directory kept across restarts.
type vmStack struct {
	t        *testing.T
	image    string
	data     string
	machines string
	config   string
	addr     string
	url      string
	key      string
	client   *http.Client

	*vmProc
}

// vmProc is the hostproxy process of a vmStack, shared by every view of
// the stack (on).
type vmProc struct {
	// env is added to hostproxy's environment at its next start
	// (failpoints).
	env []string

	mu     sync.Mutex
	proxy  *exec.Cmd
	exited chan struct{} // closed once proxy has exited (and is reaped)
	plog   *syncBuffer
}

// on is s for the subtest t: a call that fails ends t. A subtest that
// fails through its parent's t ends the whole test binary ("subtest may
// have called FailNow on a parent test"), every later test unrun.
func (s *vmStack) on(t *testing.T) *vmStack {
	c := *s
	c.t = t
	return &c
}

// syncBuffer is a bytes.Buffer safe for a process's output and a test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startVMStack starts hostproxy with microVM sandboxes. guestRequest
// bounds each call to a guest ("5s" for the tests of a wedged guest).
// Every sandbox left at the end is deleted, and any QEMU of the machines
// directory killed.
func startVMStack(t *testing.T, guestRequest string) *vmStack {
	return startVMStackWith(t, guestRequest, nil)
}

// startVMStackWith is startVMStack with more keys of the configuration's
// "vms" section.
func startVMStackWith(t *testing.T, guestRequest string, vms map[string]any) *vmStack {
	image := testenv.RequiresImage(t)
	base := t.TempDir()
	// QEMU runs unprivileged below the machines directory.
	for d := base; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	s := &vmStack{
		t: t, image: image, data: filepath.Join(base, "data"), machines: filepath.Join(base, "machines"),
		config: filepath.Join(base, "hostproxy.json"), key: "sk_vm_integration_key_0123456789abcdef",
		client: &http.Client{Timeout: 5 * time.Minute}, vmProc: &vmProc{},
	}
	s.addr = listenAddr(t)
	s.url = "http://" + s.addr
	cfg := map[string]any{
		"listen": s.addr, "data_dir": s.data,
		"accounts": []any{
			map[string]any{"id": "acct-a", "keys": []any{map[string]any{"id": "key-a", "env": "TEST_KEY_A"}}},
			map[string]any{"id": "acct-b", "keys": []any{map[string]any{"id": "key-b", "env": "TEST_KEY_B"}}},
		},
		"rate_limit": map[string]any{"per_second": 1000, "burst": 1000},
		"timeouts":   map[string]any{"guest_request": guestRequest},
		"vms":        map[string]any{"dir": s.machines, "image": image, "boot_timeout": "180s"},
	}
	for k, v := range vms {
		cfg["vms"].(map[string]any)[k] = v
	}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(s.config, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s.start()
	t.Cleanup(func() {
		if t.Failed() {
			// Before the deletes take them away.
			// QEMU's own messages too: a QEMU that ends in its first
			// second says why only there.
			consoles, _ := filepath.Glob(filepath.Join(s.machines, "*", "ctl", "console.log"))
			qemus, _ := filepath.Glob(filepath.Join(s.machines, "*", "ctl", "qemu.log"))
			for _, c := range append(consoles, qemus...) {
				b, _ := os.ReadFile(c)
				// The boot's first lines too (its modules, its mounts):
				// a guestd that fails and restarts fills the tail.
				if _, err := os.Stat(c + ".1"); err == nil || len(b) > 5500 {
					t.Logf("%s, its start:\n%s", c, vmm.ReadHead(c, 2500))
				}
				t.Logf("%s:\n%s", c, tail(b, 3000))
			}
		}
		// Whatever state the test left hostproxy in (killed by a
		// failpoint, say), nothing here may fail the test again.
		for _, key := range []string{s.key, s.keyB()} {
			r, err := s.send(key, "GET", "/v1/sandboxes?limit=500", "", nil)
			if err != nil {
				break
			}
			list, _ := r.data()["data"].([]any)
			for _, v := range list {
				s.send(key, "DELETE", "/v1/sandboxes/"+v.(map[string]any)["id"].(string), "", nil)
			}
		}
		s.stop()
		killQEMUsUnder(s.machines)
		if t.Failed() {
			t.Logf("hostproxy log:\n%s", s.plog)
		}
	})
	return s
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (s *vmStack) keyB() string { return s.key + "_b" }

// start runs hostproxy and waits until it serves.
func (s *vmStack) start() {
	s.t.Helper()
	s.mu.Lock()
	s.plog = &syncBuffer{}
	s.proxy = exec.Command(filepath.Join(bins, "hostproxy"), "--config", s.config, "--debug")
	s.proxy.Env = append(os.Environ(), "TEST_KEY_A="+s.key, "TEST_KEY_B="+s.keyB())
	s.proxy.Env = append(s.proxy.Env, s.env...)
	s.proxy.Stdout, s.proxy.Stderr = s.plog, s.plog
	err := s.proxy.Start()
	if err == nil {
		exited, proxy := make(chan struct{}), s.proxy
		s.exited = exited
		go func() {
			proxy.Wait()
			close(exited)
		}()
	}
	s.mu.Unlock()
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", s.addr); err == nil {
			c.Close()
			return
		}
		if i > 1000 {
			s.t.Fatalf("hostproxy did not listen\n%s", s.plog)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends hostproxy (SIGTERM); its sandboxes keep running.
func (s *vmStack) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proxy == nil {
		return
	}
	s.proxy.Process.Signal(syscall.SIGTERM)
	<-s.exited
	s.proxy = nil
}

// killQEMUsUnder kills every QEMU that runs below dir: nothing a
// test starts outlives it.
func killQEMUsUnder(dir string) {
	for _, pid := range qemusUnder(dir) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// qemusUnder are the pids of the QEMUs that run below dir.
func qemusUnder(dir string) []int {
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		// A sandbox's QEMU runs in its run directory; its command line
		// names no path of the machines directory.
		cmdline, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		cwd, _ := vmm.RunDirOf(pid)
		if bytes.Contains(cmdline, []byte("qemu-system")) && strings.HasPrefix(cwd, dir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// call sends one request with key; a transport error fails the test.
func (s *vmStack) call(key, method, path, body string) reply {
	s.t.Helper()
	return s.callWith(key, method, path, body, nil)
}

// callWith is call with extra headers.
func (s *vmStack) callWith(key, method, path, body string, headers map[string]string) reply {
	s.t.Helper()
	r, err := s.send(key, method, path, body, headers)
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

// send is callWith that returns what goes wrong (hostproxy killed under
// the request).
func (s *vmStack) send(key, method, path, body string, headers map[string]string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	req.Header.Set("X-Api-Key", key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{Status: resp.StatusCode, Header: resp.Header, Raw: raw}
	if err := json.Unmarshal(raw, &r.Body); err != nil {
		return r, fmt.Errorf("%s %s: not JSON (%d): %s", method, path, resp.StatusCode, raw)
	}
	return r, nil
}

// must sends a request that must succeed with want.
func (s *vmStack) must(want int, method, path, body string) reply {
	s.t.Helper()
	r := s.call(s.key, method, path, body)
	if r.Status != want {
		s.t.Fatalf("%s %s: %d %s, want %d", method, path, r.Status, r.Raw, want)
	}
	return r
}

// sandboxes lists the account's sandbox ids.
func (s *vmStack) sandboxes(account string) []string {
	key := s.key
	if account == "acct-b" {
		key = s.keyB()
	}
	r := s.call(key, "GET", "/v1/sandboxes?limit=500", "")
	var ids []string
	list, _ := r.data()["data"].([]any)
	for _, v := range list {
		ids = append(ids, v.(map[string]any)["id"].(string))
	}
	return ids
}

// create makes a sandbox and waits until it runs.
func (s *vmStack) create(key, body string) string {
	s.t.Helper()
	r := s.call(key, "POST", "/v1/sandboxes", body)
	if r.Status != http.StatusAccepted || r.data()["state"] != "creating" || r.Header.Get("X-Poll-After") == "" {
		s.t.Fatalf("create: %d %s", r.Status, r.Raw)
	}
	id := r.data()["id"].(string)
	s.waitState(key, id, "running", 4*time.Minute)
	return id
}

// waitState polls a sandbox until it reaches state; error fails at once.
func (s *vmStack) waitState(key, id, state string, timeout time.Duration) map[string]any {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := s.call(key, "GET", "/v1/sandboxes/"+id, "")
		d := r.data()
		if d["state"] == state {
			return d
		}
		if d["state"] == "error" && state != "error" || time.Now().After(deadline) {
			s.t.Fatalf("sandbox %s: %s, waiting for %s", id, r.Raw, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// execResult is the data of an exec.
type execResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timed_out"`
}

// exec runs cmd in the sandbox and returns its result; the call itself
// must succeed.
func (s *vmStack) exec(id string, cmd ...string) execResult {
	s.t.Helper()
	return s.execFor(id, 0, cmd...)
}

// execFor is exec with timeout_s (0: the API's default).
func (s *vmStack) execFor(id string, timeoutS int, cmd ...string) execResult {
	s.t.Helper()
	req := map[string]any{"cmd": cmd}
	if timeoutS > 0 {
		req["timeout_s"] = timeoutS
	}
	b, _ := json.Marshal(req)
	r := s.call(s.key, "POST", "/v1/sandboxes/"+id+"/exec", string(b))
	if r.Status != http.StatusOK {
		s.t.Fatalf("exec %q in %s: %d %s", cmd, id, r.Status, r.Raw)
	}
	var res execResult
	d, _ := json.Marshal(r.Body["data"])
	json.Unmarshal(d, &res)
	return res
}

// sh runs a shell line in the sandbox and fails unless it exits 0.
func (s *vmStack) sh(id, line string) string {
	s.t.Helper()
	res := s.exec(id, "sh", "-c", line)
	if res.ExitCode != 0 {
		s.t.Fatalf("sh -c %q in %s: exit %d\nstdout: %s\nstderr: %s", line, id, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// qemuPid is the pid of a sandbox's QEMU, from the machines directory.
func (s *vmStack) qemuPid(id string) int {
	s.t.Helper()
	pid := s.findQEMU(id)
	if pid == 0 {
		s.t.Fatalf("no QEMU runs for %s", id)
	}
	return pid
}

// findQEMU is the pid of a sandbox's QEMU, or 0 when none runs.
func (s *vmStack) findQEMU(id string) int {
	procs, _ := os.ReadDir("/proc")
	run := filepath.Join(s.machines, id, "run")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if cwd, _ := vmm.RunDirOf(pid); bytes.Contains(cmdline, []byte("qemu-system")) && cwd == run {
			return pid
		}
	}
	return 0
}

// console is a sandbox's serial console so far.
func (s *vmStack) console(id string) string {
	return string(vmm.ReadTail(filepath.Join(s.machines, id, "ctl", "console.log"), 2*vmm.LogBytes))
}

// checkConfined checks a sandbox's QEMU as the host sees it: not root,
// with its seccomp filter on, and holding no descriptor but its own
// (its devices, logs, sockets, its disk's layers and the base).
func (s *vmStack) checkConfined(id string) {
	s.t.Helper()
	pid := s.qemuPid(id)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		s.t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) > 1 && (f[0] == "Uid:" || f[0] == "Gid:") {
			for _, v := range f[1:] {
				if v == "0" {
					s.t.Fatalf("QEMU of %s runs with %s", id, line)
				}
			}
		}
		if strings.HasPrefix(line, "Seccomp:") && strings.TrimSpace(strings.TrimPrefix(line, "Seccomp:")) != "2" {
			s.t.Fatalf("QEMU of %s: %s, want the filter mode 2", id, line)
		}
	}
	// A network namespace of its own, with no interface but loopback,
	// and that one down: an escaped QEMU reaches no network.
	qnet, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		s.t.Fatal(err)
	}
	if self, _ := os.Readlink("/proc/self/ns/net"); qnet == self {
		s.t.Fatalf("QEMU of %s runs in the host's network namespace %s", id, qnet)
	}
	dev, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		s.t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(dev)), "\n")
	if len(lines) != 3 || !strings.HasPrefix(strings.TrimSpace(lines[2]), "lo:") {
		s.t.Fatalf("QEMU of %s has network devices:\n%s", id, dev)
	}
	if route, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/route", pid)); strings.Count(string(route), "\n") > 1 {
		s.t.Fatalf("QEMU of %s has routes:\n%s", id, route)
	}
	// Its one network backend is the inherited socket of the host's
	// stack (package egress): no user networking, tap, bridge or socket
	// by address.
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	netdevs := bytes.Count(cmdline, []byte("-netdev\x00"))
	if !bytes.Contains(cmdline, []byte("-sandbox\x00on,")) || netdevs != 1 ||
		!bytes.Contains(cmdline, []byte("-netdev\x00stream,id=net0,server=on,addr.type=fd,addr.str=")) || bytes.Contains(cmdline, []byte("-nic\x00")) {
		s.t.Fatalf("QEMU of %s: command line %q", id, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(target, filepath.Join(s.machines, id)+"/"),
			// its disk's layers, handed over as descriptors
			strings.HasPrefix(target, filepath.Join(s.machines, "store")+"/"),
			strings.HasSuffix(target, "/base.qcow2"), // the image's shared base, read-only
			strings.HasPrefix(target, "/dev/"),
			strings.HasPrefix(target, "socket:"),
			// its stdout and stderr, drained by hostproxy into ctl/qemu.log
			strings.HasPrefix(target, "pipe:"),
			strings.HasPrefix(target, "anon_inode:"):
		default:
			s.t.Fatalf("QEMU of %s holds fd %s -> %s", id, fd.Name(), target)
		}
	}
}
