package channel

import (
	"bufio"
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// fakePort plays QEMU's chardev socket: the host end dials the socket,
// the guest end's open takes the accepted connection. drop ends the
// current connection, as a guest reboot or a host restart does.
type fakePort struct {
	ln    net.Listener
	conns chan net.Conn
}

func newFakePort(t *testing.T) (*fakePort, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "channel.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePort{ln: ln, conns: make(chan net.Conn, 4)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(p.conns)
				return
			}
			p.conns <- c
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p, path
}

func (p *fakePort) open() (io.ReadWriteCloser, error) {
	c, ok := <-p.conns
	if !ok {
		return nil, io.EOF
	}
	return c, nil
}

// echo answers every line on every stream accepted from l with the same
// line prefixed by who.
func echo(l interface{ Accept() (net.Conn, error) }, who string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				io.WriteString(c, who+":"+line)
			}
		}()
	}
}

func roundTrip(t *testing.T, ctx context.Context, open func(context.Context) (net.Conn, error), msg, want string) {
	t.Helper()
	c, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, msg+"\n")
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("round trip %q: %v", msg, err)
	}
	if got != want+"\n" {
		t.Fatalf("round trip %q: got %q, want %q", msg, got, want)
	}
}

// TestStreamsBothWays: streams opened by either end reach the other, many
// at once, and the host end comes back after its connection drops.
func TestStreamsBothWays(t *testing.T) {
	port, path := newFakePort(t)
	g := ListenGuest(port.open, nil)
	defer g.Close()
	h := DialHost(path, nil)
	defer h.Close()
	go echo(g, "guest")
	go echo(h, "host")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 20 {
		roundTrip(t, ctx, h.Open, "ping", "guest:ping")
		roundTrip(t, ctx, g.Open, "pong", "host:pong")
	}

	// Drop the host end's connection from the host side: both ends start
	// a new session and streams work again.
	h.mu.Lock()
	s := h.sess
	h.mu.Unlock()
	s.Close()
	roundTrip(t, ctx, h.Open, "again", "guest:again")
	roundTrip(t, ctx, g.Open, "again", "host:again")
}

// TestOpenWaitsForItsContext: with no guest end, Open waits for its
// context and fails with its error.
func TestOpenWaitsForItsContext(t *testing.T) {
	h := DialHost(filepath.Join(t.TempDir(), "absent.sock"), nil)
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := h.Open(ctx); err != context.DeadlineExceeded {
		t.Fatalf("Open with no guest: %v, want context.DeadlineExceeded", err)
	}
	h.Close()
	if _, err := h.Open(context.Background()); err != ErrClosed {
		t.Fatalf("Open after Close: %v, want ErrClosed", err)
	}
}

func TestFindPort(t *testing.T) {
	dir := t.TempDir()
	for dev, name := range map[string]string{"vport0p1": "org.other\n", "vport0p2": "org.strata.guest\n"} {
		if err := mkfile(filepath.Join(dir, dev, "name"), name); err != nil {
			t.Fatal(err)
		}
	}
	got, err := FindPort(dir, "org.strata.guest")
	if err != nil || got != "vport0p2" {
		t.Fatalf("FindPort = %q, %v; want vport0p2", got, err)
	}
	if _, err := FindPort(dir, "absent"); err == nil {
		t.Fatal("FindPort of an absent name succeeded")
	}
}

// TestCloseEndsAWaitingRead: closing a stream ends a Read waiting on a
// peer that never answers (yamux alone would wait for its 5-minute
// stream close timeout).
func TestCloseEndsAWaitingRead(t *testing.T) {
	port, path := newFakePort(t)
	g := ListenGuest(port.open, nil)
	defer g.Close()
	h := DialHost(path, nil)
	defer h.Close()
	go func() {
		for {
			c, err := g.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accepted and never answered
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := h.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		read <- err
	}()
	time.Sleep(50 * time.Millisecond)
	c.Close()
	select {
	case err := <-read:
		if err == nil {
			t.Fatal("Read after Close returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a waiting Read")
	}
}

// TestPlainHostReachesAGuestFromBeforeTheHandshake: a guest whose channel
// starts yamux at once (a sandbox booted by an earlier host service,
// adopted running) is served by DialHostPlain.
func TestPlainHostReachesAGuestFromBeforeTheHandshake(t *testing.T) {
	port, path := newFakePort(t)
	old := &end{log: newEnd(nil).log, changed: make(chan struct{}), incoming: make(chan net.Conn), done: make(chan struct{})}
	go func() {
		for {
			c, err := port.open()
			if err != nil {
				return
			}
			s, err := yamux.Server(c, config(old.log))
			if err != nil {
				return
			}
			old.serve(&session{Session: s})
		}
	}()
	defer old.close()
	go echo(old, "old-guest")
	h := DialHostPlain(path, nil)
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	roundTrip(t, ctx, h.Open, "hi", "old-guest:hi")
}
