package pathpolicy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
)

// node is one entry of a file tree written as data.
type node struct {
	path   string // relative to the tree root
	kind   byte   // 'd' dir, 'f' file, 'l' symlink, 'h' hardlink, 'p' FIFO, 's' socket, 'c' char device, 'b' block device
	target string // symlink target, or the existing file a hardlink points to
	rdev   uint64 // device number for 'c' and 'b'
}

func mkdir(p string) node                { return node{path: p, kind: 'd'} }
func file(p string) node                 { return node{path: p, kind: 'f'} }
func symlink(p, target string) node      { return node{path: p, kind: 'l', target: target} }
func hardlink(p, existing string) node   { return node{path: p, kind: 'h', target: existing} }
func fifo(p string) node                 { return node{path: p, kind: 'p'} }
func socket(p string) node               { return node{path: p, kind: 's'} }
func chardev(p string, rdev uint64) node { return node{path: p, kind: 'c', rdev: rdev} }
func blockdev(p string, rdev uint64) node {
	return node{path: p, kind: 'b', rdev: rdev}
}

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
		case 'h':
			err = os.Link(filepath.Join(root, n.target), p)
		case 'p':
			err = unix.Mkfifo(p, 0o644)
		case 's':
			err = bindSocket(p)
		case 'c':
			err = unix.Mknod(p, unix.S_IFCHR|0o644, int(n.rdev))
		case 'b':
			err = unix.Mknod(p, unix.S_IFBLK|0o644, int(n.rdev))
		default:
			err = fmt.Errorf("unknown node kind %q", n.kind)
		}
		if err != nil {
			t.Fatalf("write tree: %s: %v", n.path, err)
		}
	}
}

// bindSocket leaves a unix socket file at p (without importing net, which
// would make the test binary depend on cgo).
func bindSocket(p string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Bind(fd, &unix.SockaddrUnix{Name: p})
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
