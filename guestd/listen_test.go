package guestd

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListen(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "guestd.sock")

	ln, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	// A second guestd on a socket in use is refused, not silently stolen.
	if _, err := Listen("unix://" + sock); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
	ln.Close()
	// A stale socket file (no one listening) is replaced.
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	ln, err = Listen("unix://" + sock)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	ln.Close()

	ln, err = Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ln.Addr().String(), "127.0.0.1:") {
		t.Fatalf("tcp listener on %s", ln.Addr())
	}
	ln.Close()

	for _, bad := range []string{"", "vsock://3:1024", "unix://", "127.0.0.1:80", "http://x"} {
		if ln, err := Listen(bad); err == nil {
			ln.Close()
			t.Errorf("Listen(%q) accepted", bad)
		}
	}
}
