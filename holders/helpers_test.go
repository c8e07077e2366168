package holders

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
)

// helperEnv makes the test binary act as a helper process: "mmap:FILE"
// maps FILE shared-writable, closes the fd and sleeps; "chroot:DIR"
// chroots into DIR and sleeps. Both print "ready" once set up.
const helperEnv = "HOLDERS_TEST_HELPER"

func TestMain(m *testing.M) {
	if v := os.Getenv(helperEnv); v != "" {
		os.Exit(runHelper(v))
	}
	os.Exit(m.Run())
}

func runHelper(v string) int {
	mode, arg, _ := strings.Cut(v, ":")
	switch mode {
	case "mmap":
		fd, err := unix.Open(arg, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		unix.Close(fd) // the mapping alone must be enough to be a holder
	case "chroot":
		if err := unix.Chroot(arg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := unix.Chdir("/"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown helper", v)
		return 2
	}
	fmt.Println("ready")
	for {
		time.Sleep(time.Hour)
	}
}

// requireRoot fails the test when not root, unless -short, which skips it:
// a root-only test must not pass silently.
func requireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs root; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root: run via make test, or use -short to skip it")
	}
}

// requirePrivateNS fails a test that mounts unless it runs in a mount
// namespace of its own, so that no mount can leak to the host: some
// ancestor process (the shell that ran unshare) must be in another mount
// namespace. Ancestors are used rather than pid 1 because pid 1 may not be
// inspectable even by root (as in this project's sandboxes).
func requirePrivateNS(t testing.TB) {
	t.Helper()
	requireRoot(t)
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatalf("cannot read own mount namespace: %v", err)
	}
	for pid := os.Getppid(); pid > 0; {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && ns != self {
			return
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			break
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 {
			break
		}
		pid, _ = strconv.Atoi(fields[1])
	}
	t.Fatal("this test mounts: run via make test (unshare --mount --propagation private go test ./holders/...)")
}

// mount mounts and unmounts in t.Cleanup (lazily, so a leftover holder
// cannot fail the cleanup).
func mount(t testing.TB, source, target, fstype, data string) {
	t.Helper()
	if err := unix.Mount(source, target, fstype, 0, data); err != nil {
		t.Fatalf("mount %s on %s: %v", fstype, target, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
}

// node is one entry of a file tree written as data.
type node struct {
	path   string // relative to the tree root
	kind   byte   // 'd' dir, 'f' file, 'l' symlink
	target string // symlink target
}

func mkdir(p string) node           { return node{path: p, kind: 'd'} }
func file(p string) node            { return node{path: p, kind: 'f'} }
func symlink(p, target string) node { return node{path: p, kind: 'l', target: target} }

// writeTree creates nodes under root, parents first as needed.
func writeTree(t testing.TB, root string, nodes []node) {
	t.Helper()
	for _, n := range nodes {
		p := filepath.Join(root, n.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch n.kind {
		case 'd':
			err = os.MkdirAll(p, 0o755)
		case 'f':
			err = os.WriteFile(p, []byte("data of "+n.path), 0o644)
		case 'l':
			err = os.Symlink(n.target, p)
		default:
			err = fmt.Errorf("unknown node kind %q", n.kind)
		}
		if err != nil {
			t.Fatalf("write tree: %s: %v", n.path, err)
		}
	}
}

// wantFault checks that err is a *fault.Error of kind and code whose Fields
// include want (nil values: the key must be absent).
func wantFault(t testing.TB, err error, kind fault.Kind, code string, want map[string]any) {
	t.Helper()
	var fe *fault.Error
	if !errors.As(err, &fe) {
		t.Fatalf("error = %v (%T), want *fault.Error %s", err, err, code)
	}
	if fe.Kind != kind || fe.Code != code {
		t.Fatalf("error = %s/%s (%v), want %s/%s", fe.Kind, fe.Code, fe, kind, code)
	}
	if fe.Message == "" {
		t.Errorf("error %s has no message", code)
	}
	for k, v := range want {
		got, ok := fe.Fields[k]
		if v == nil {
			if ok {
				t.Errorf("%s: field %q = %v, want absent", code, k, got)
			}
			continue
		}
		if !ok || got != v {
			t.Errorf("%s: field %q = %v, want %v (fields %v)", code, k, got, v, fe.Fields)
		}
	}
}

// spawn starts cmd, kills it in t.Cleanup, and returns its pid. When ready
// is true it waits for the process to print "ready".
func spawn(t testing.TB, cmd *exec.Cmd, ready bool) int {
	t.Helper()
	cmd.Stderr = os.Stderr
	var out *bufio.Reader
	if ready {
		pipe, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		out = bufio.NewReader(pipe)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	})
	if ready {
		line, err := out.ReadString('\n')
		if err != nil || line != "ready\n" {
			t.Fatalf("%v: not ready: %q, %v", cmd.Args, line, err)
		}
	}
	return cmd.Process.Pid
}

// helperCmd runs the test binary as a helper process.
func helperCmd(t testing.TB, mode string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	cmd.Dir = "/"
	return cmd
}
