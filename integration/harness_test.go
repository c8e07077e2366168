package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/testenv"
)

// bins holds the binaries built once for the whole package.
var bins string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "strata-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		cmd := exec.Command("go", "build", "-o", dir+"/", "strata/cmd/...")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build binaries:", err)
			return 1
		}
		bins = dir
		defer xfs.close()
		return m.Run()
	}()
	os.Exit(code)
}

// guest is a guestd process under test.
type guest struct {
	t      *testing.T
	store  string
	sock   string
	cmd    *exec.Cmd
	done   chan error
	log    *bytes.Buffer
	client *http.Client
	flags  []string // passed at every start
}

// newGuest prepares (but does not start) a guestd with its store and
// socket in a fresh temporary directory.
func newGuest(t *testing.T) *guest {
	t.Helper()
	testenv.RequiresRootMounts(t)
	return newGuestIn(t, t.TempDir())
}

// newGuestIn is newGuest with the store (and the socket) in base, on
// whatever filesystem base is; flags are passed at every start.
func newGuestIn(t *testing.T, base string, flags ...string) *guest {
	t.Helper()
	testenv.RequiresRootMounts(t)
	g := &guest{t: t, store: filepath.Join(base, "store"), sock: filepath.Join(base, "guestd.sock"), flags: flags}
	g.client = &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", g.sock)
		}},
	}
	t.Cleanup(func() {
		if g.cmd != nil && g.cmd.ProcessState == nil {
			g.cmd.Process.Kill()
			<-g.done
		}
	})
	return g
}

// start runs guestd with extra environment and waits until it serves.
// An environment entry "-flag" is passed as a command-line flag instead.
func (g *guest) start(env ...string) {
	g.t.Helper()
	g.spawn(env...)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := g.client.Get("http://guest/v1/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case err := <-g.done:
			g.done <- err
			g.t.Fatalf("guestd exited at start: %v\n%s", err, g.log)
		case <-time.After(20 * time.Millisecond):
		}
	}
	g.t.Fatalf("guestd did not serve within 30s\n%s", g.log)
}

// spawn starts guestd (arguments start with "-", the rest is environment)
// without waiting for it to serve.
func (g *guest) spawn(env ...string) {
	g.t.Helper()
	g.log = &bytes.Buffer{}
	args := []string{"--listen", "unix://" + g.sock, "--store", g.store, "--debug", "--credentials", g.credentials()}
	args = append(args, g.flags...)
	var envs []string
	for _, e := range env {
		if strings.HasPrefix(e, "-") {
			args = append(args, e)
		} else {
			envs = append(envs, e)
		}
	}
	g.cmd = exec.Command(filepath.Join(bins, "guestd"), args...)
	g.cmd.Env = append(os.Environ(), envs...)
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	if err := g.cmd.Start(); err != nil {
		g.t.Fatal(err)
	}
	g.done = make(chan error, 1)
	go func() { g.done <- g.cmd.Wait() }()
}

// credentials is the env file this guestd writes for processes inside.
func (g *guest) credentials() string { return filepath.Join(filepath.Dir(g.sock), "credentials.env") }

// stop ends guestd gracefully (SIGTERM) and waits.
func (g *guest) stop() {
	g.t.Helper()
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-g.done:
		if err != nil {
			g.t.Fatalf("guestd exit: %v\n%s", err, g.log)
		}
	case <-time.After(30 * time.Second):
		g.t.Fatalf("guestd did not stop\n%s", g.log)
	}
}

// waitKilled waits for guestd to die of SIGKILL (a failpoint).
func (g *guest) waitKilled(d time.Duration) bool {
	select {
	case err := <-g.done:
		g.done <- err
		var ee *exec.ExitError
		if e, ok := err.(*exec.ExitError); ok {
			ee = e
		}
		return ee != nil && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
	case <-time.After(d):
		return false
	}
}

// reply is a decoded JSend response.
type reply struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    []byte
}

func (r reply) data() map[string]any {
	d, _ := r.Body["data"].(map[string]any)
	return d
}

func (r reply) code() string {
	c, _ := r.data()["code"].(string)
	return c
}

// do sends a request to guestd; err is a transport error (a killed guestd).
func (g *guest) do(method, path, contentType, body string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, "http://guest"+path, rd)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{Status: resp.StatusCode, Raw: raw}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		g.t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		g.t.Errorf("%s %s: no X-Request-Id", method, path)
	}
	if err := json.Unmarshal(raw, &r.Body); err != nil {
		g.t.Errorf("%s %s: body is not JSON: %q", method, path, raw)
	}
	return r, nil
}

func (g *guest) must(method, path, body string) reply {
	g.t.Helper()
	ct := ""
	if body != "" {
		ct = "application/json"
	}
	r, err := g.do(method, path, ct, body)
	if err != nil {
		g.t.Fatalf("%s %s: %v\n%s", method, path, err, g.log)
	}
	if r.Status != 200 {
		g.t.Fatalf("%s %s: %d %s", method, path, r.Status, r.Raw)
	}
	return r
}

func (g *guest) create(path, name string) map[string]any {
	g.t.Helper()
	b, _ := json.Marshal(map[string]string{"path": path, "name": name})
	return g.must("POST", "/v1/checkpoints", string(b)).data()
}

func (g *guest) list() []map[string]any {
	g.t.Helper()
	r := g.must("GET", "/v1/checkpoints", "")
	var out []map[string]any
	for _, x := range r.Body["data"].([]any) {
		out = append(out, x.(map[string]any))
	}
	return out
}

func ids(cps []map[string]any) []string {
	var out []string
	for _, c := range cps {
		out = append(out, c["id"].(string))
	}
	return out
}

// cleanupMounts unmounts everything under dir and clears immutable flags
// so that t.TempDir can remove it.
func cleanupMounts(t *testing.T, dir string) {
	t.Cleanup(func() {
		for i := 0; i < 16; i++ {
			filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if d != nil && d.IsDir() {
					unix.Unmount(p, unix.MNT_DETACH)
				}
				return nil
			})
		}
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if d != nil && d.IsDir() {
				clearImmutable(p)
			}
			return nil
		})
	})
}

func clearImmutable(dir string) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS); err == nil && flags&0x10 != 0 {
		unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags&^0x10))
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	// A fixed mtime, so that two runs of one scenario compare equal.
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(path, when, when); err != nil {
		t.Fatal(err)
	}
}

func syscallUnmount(dir string) error { return unix.Unmount(dir, 0) }

// xfs is a loop-mounted XFS made once for the tests that run on it too
// (the crash suite's capture); TestMain unmounts it.
var xfs xfsFS

type xfsFS struct {
	once     sync.Once
	img, mnt string
	err      error
}

// xfsDir is a fresh directory on the test binary's XFS (reflink on, as
// sandboxes have it), removed after t.
func xfsDir(t *testing.T) string {
	t.Helper()
	xfs.once.Do(func() {
		dir, err := os.MkdirTemp("", "strata-xfs-")
		if err != nil {
			xfs.err = err
			return
		}
		xfs.img, xfs.mnt = dir+".img", dir
		f, err := os.Create(xfs.img)
		if err == nil {
			err = errors.Join(f.Truncate(2<<30), f.Close())
		}
		if err == nil {
			if out, merr := exec.Command("mkfs.xfs", "-q", "-f", "-m", "reflink=1", xfs.img).CombinedOutput(); merr != nil {
				err = fmt.Errorf("mkfs.xfs: %v: %s", merr, out)
			}
		}
		if err == nil {
			if out, merr := exec.Command("mount", "-o", "loop", xfs.img, xfs.mnt).CombinedOutput(); merr != nil {
				err = fmt.Errorf("mount the XFS image: %v: %s", merr, out)
			}
		}
		xfs.err = err
	})
	if xfs.err != nil {
		t.Fatalf("XFS for the crash suite: %v (make test installs xfsprogs)", xfs.err)
	}
	dir, err := os.MkdirTemp(xfs.mnt, "t-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// close unmounts the XFS, if one was made, and removes its image.
func (x *xfsFS) close() {
	if x.mnt != "" {
		unix.Unmount(x.mnt, unix.MNT_DETACH)
		os.Remove(x.mnt)
	}
	if x.img != "" {
		os.Remove(x.img)
	}
}

// listenAddr returns a loopback address for a hostproxy that a test
// starts (and may start again on the same address). The port is free now
// and outside the kernel's range of ephemeral ports, so that no outgoing
// connection of another test takes it as its source port between the
// test's starts, and no stranger answers in hostproxy's place.
func listenAddr(t *testing.T) string {
	t.Helper()
	lo, _ := ephemeralPorts()
	for range 100 {
		port := 10000 + rand.IntN(lo-10000)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}
	t.Fatalf("no free port below %d", lo)
	return ""
}

// ephemeralPorts is the kernel's range of ports for outgoing connections.
func ephemeralPorts() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		fmt.Sscan(string(b), &lo, &hi)
	}
	return lo, hi
}
