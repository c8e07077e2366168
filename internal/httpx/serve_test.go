package httpx_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"strata/internal/httpx"
)

// TestServeShutdown: once ctx is done, Serve stops accepting connections,
// lets the request in flight finish (its context is not cancelled) and
// returns nil.
func TestServeShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		if err := r.Context().Err(); err != nil {
			t.Errorf("request context ended by the shutdown: %v", err)
		}
		io.WriteString(w, "done")
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- httpx.Serve(ctx, ln, h, httpx.ServeConfig{Log: slog.New(slog.DiscardHandler), ShutdownTimeout: 10 * time.Second})
	}()
	reply := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			reply <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		reply <- string(b)
	}()
	<-started
	cancel()
	// Serve stops accepting at once; the request in flight holds it open.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("still accepting connections after ctx is done")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve returned %v with a request in flight", err)
	default:
	}
	close(release)
	if got := <-reply; got != "done" {
		t.Errorf("request in flight got %q", got)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestServeShutdownTimeout: a request still running when the shutdown
// wait ends makes Serve close the connections and say so.
func TestServeShutdownTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(started)
		<-release
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- httpx.Serve(ctx, ln, h, httpx.ServeConfig{Log: slog.New(slog.DiscardHandler), ShutdownTimeout: 50 * time.Millisecond})
	}()
	go func() {
		if resp, err := http.Get("http://" + ln.Addr().String()); err == nil {
			resp.Body.Close()
		}
	}()
	<-started
	cancel()
	err = <-done
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "requests still running after 50ms") {
		t.Errorf("Serve: %v, want requests still running after 50ms", err)
	}
}

// TestServeListenerError: a listener that fails ends Serve with its error.
func TestServeListenerError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	err = httpx.Serve(context.Background(), ln, http.NotFoundHandler(), httpx.ServeConfig{Log: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, net.ErrClosed) {
		t.Errorf("Serve on a closed listener: %v", err)
	}
}
