package guestd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// pipeListener serves the host's ends of net.Pipes: a stream without
// half-close, as a channel stream is.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "unix"} }

// TestForwardAPIAnswersAnOversizedBodyAtOnce pins issue 17's stalled
// sender: a 20 MB body sent to 127.0.0.1:7777 waited 20 s instead of
// getting its 413, because the forward stopped reading the sender once the
// host had answered and then waited 30 s. A sender that writes its whole
// body before it reads gets the host's 413 (bound here: 10 s, against the
// 30 s the forward waited), and so does one that reads as it writes.
func TestForwardAPIAnswersAnOversizedBodyAtOnce(t *testing.T) {
	const limit = 16 << 10
	host := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			io.WriteString(w, `{"status":"fail","data":{"code":"body_too_large"}}`)
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"status":"success","data":{}}`)
	})}
	hostLn := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	go host.Serve(hostLn)
	defer host.Close()
	open := func(ctx context.Context) (net.Conn, error) {
		a, b := net.Pipe()
		select {
		case hostLn.conns <- b:
			return a, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fwd := make(chan error, 1)
	go func() { fwd <- ForwardAPI(ctx, ln, open, nil) }()
	defer func() {
		cancel()
		if err := <-fwd; err != nil {
			t.Error(err)
		}
	}()
	body := strings.Repeat("x", 20<<20)
	for _, tc := range []struct {
		name string
		size int
		want string
	}{
		{"20 MB", len(body), "413"},
		{"small", 100, "200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			t0 := time.Now()
			// Written whole before the answer is read.
			if _, err := fmt.Fprintf(c, "POST /v1/sandboxes/x/exec HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", tc.size, body[:tc.size]); err != nil {
				t.Fatalf("sending: %v after %v", err, time.Since(t0))
			}
			status, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				t.Fatalf("reading the answer: %v after %v", err, time.Since(t0))
			}
			if !strings.Contains(status, tc.want) {
				t.Fatalf("answer %q, want %s", status, tc.want)
			}
			t.Logf("%s answered in %v", tc.name, time.Since(t0).Round(time.Millisecond))
		})
	}
}
