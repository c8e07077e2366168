package channel

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func socketPair(t *testing.T) (host, guest net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	return conns[0], conns[1]
}

// TestHandshakeSkipsStaleBytes: what either end reads before the
// handshake (a stale session's frames, long binary runs, HELLOs of an
// earlier dial, a GO of another nonce) is skipped, and the bytes after it
// are the session's.
func TestHandshakeSkipsStaleBytes(t *testing.T) {
	host, guest := socketPair(t)
	// Stale bytes for the guest, already in the stream before the host's
	// first HELLO.
	stale := "\x00\x01\x00\x00garbage\n" + strings.Repeat("x", 5000) + "\n" +
		helloLine + "0123456789abcdef\n" + goLine + "ffffffffffffffff\n" + helloLine + "short\n"
	if _, err := host.Write([]byte(stale)); err != nil {
		t.Fatal(err)
	}
	// The guest's stale session writes frames the host must skip.
	if _, err := guest.Write([]byte("\x00\x02stale-frame" + readyLine + "0000000000000000\n")); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rw  io.ReadWriteCloser
		err error
	}
	gch := make(chan result, 1)
	go func() {
		rw, err := guestHandshake(guest)
		gch <- result{rw, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := hostHandshake(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	g := <-gch
	if g.err != nil {
		t.Fatal(g.err)
	}
	// The session's bytes flow both ways, with nothing of the handshake.
	if _, err := h.Write([]byte("from-host\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := g.rw.Write([]byte("from-guest\n")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		r    io.Reader
		want string
	}{{g.rw, "from-host\n"}, {h, "from-guest\n"}} {
		buf := make([]byte, len(c.want))
		if _, err := io.ReadFull(c.r, buf); err != nil || string(buf) != c.want {
			t.Fatalf("read %q, %v; want %q", buf, err, c.want)
		}
	}
}

// TestHandshakeEndsWithContext: a host whose guest never answers gives up
// when its context ends.
func TestHandshakeEndsWithContext(t *testing.T) {
	host, _ := socketPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := hostHandshake(ctx, host); err == nil {
		t.Fatal("a handshake nobody answered succeeded")
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Fatalf("the handshake took %v to give up", d)
	}
}

func FuzzGuestHandshake(f *testing.F) {
	f.Add([]byte(helloLine + "0123456789abcdef\n" + goLine + "0123456789abcdef\nrest"))
	f.Add([]byte("junk\n\n" + goLine + "0123456789abcdef\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rw, err := guestHandshake(&fakeRW{r: strings.NewReader(string(in))})
		if err != nil {
			return
		}
		// Accepted only after a HELLO and the GO of its nonce.
		s := string(in)
		if !strings.Contains(s, helloLine) || !strings.Contains(s, goLine) {
			t.Fatalf("handshake done on %q", in)
		}
		rw.Close()
	})
}

type fakeRW struct{ r io.Reader }

func (f *fakeRW) Read(b []byte) (int, error)  { return f.r.Read(b) }
func (f *fakeRW) Write(b []byte) (int, error) { return len(b), nil }
func (f *fakeRW) Close() error                { return nil }
