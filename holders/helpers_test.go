package holders

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
