package guestclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawGuest is a guestd that answers every request with what answer
// writes, whatever it is.
func rawGuest(t *testing.T, answer func(w io.Writer)) Dial {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				answer(c)
			})
		}
	})
	var d net.Dialer
	return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", ln.Addr().String()) }
}

// endless writes p until the reader goes away.
func endless(w io.Writer, p string) {
	b := []byte(strings.Repeat(p, (64<<10)/len(p)+1))
	for {
		if _, err := w.Write(b); err != nil {
			return
		}
	}
}

// TestHostileAnswers pins issue 17's unbounded answers: the host's own
// calls read the status line and headers with no limit (one endless
// header grew the heap by 448 MiB in 10 s). Each hostile answer fails
// with a clear error within the call's deadline, holds no budget after,
// and grows the heap by less than 16 MiB.
func TestHostileAnswers(t *testing.T) {
	const heapBound = 16 << 20
	cases := []struct {
		name   string
		answer func(w io.Writer)
		want   string // in the error; "" for none
	}{
		{"fine", func(w io.Writer) { io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}") }, ""},
		{"fine, chunked", func(w io.Writer) {
			io.WriteString(w, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
		}, ""},
		{"endless header", func(w io.Writer) { io.WriteString(w, "HTTP/1.1 200 OK\r\nX-A: "); endless(w, "a") }, "exceeded"},
		{"endless status line", func(w io.Writer) { io.WriteString(w, "HTTP/1.1 200 "); endless(w, "O") }, "exceeded"},
		{"many headers", func(w io.Writer) { io.WriteString(w, "HTTP/1.1 200 OK\r\n"); endless(w, "X-A: b\r\n") }, "exceeded"},
		{"huge Content-Length", func(w io.Writer) {
			io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n")
			endless(w, "x")
		}, "too large"},
		{"endless chunked body", func(w io.Writer) {
			io.WriteString(w, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			endless(w, "1000\r\n"+strings.Repeat("x", 0x1000)+"\r\n")
		}, "too large"},
		{"endless body without a length", func(w io.Writer) { io.WriteString(w, "HTTP/1.1 200 OK\r\n\r\n"); endless(w, "x") }, "too large"},
		{"endless 1xx", func(w io.Writer) { endless(w, "HTTP/1.1 102 Processing\r\n\r\n") }, "exceeded"},
		{"silence", func(w io.Writer) { time.Sleep(1500 * time.Millisecond) }, "deadline"},
		{"chunked body cut off mid-chunk", func(w io.Writer) {
			io.WriteString(w, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{}")
		}, "unexpected EOF"},
		{"chunked body cut off before its last chunk", func(w io.Writer) {
			io.WriteString(w, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n")
		}, "unexpected EOF"},
		{"body that stops", func(w io.Writer) {
			io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
			time.Sleep(1500 * time.Millisecond)
		}, "deadline"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			budget := NewBudget(4 << 20)
			c := New(rawGuest(t, tc.answer), Limits{MaxAnswer: 1 << 20, Timeout: time.Second}, budget)
			defer c.Close()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			a, err := c.Do(context.Background(), Request{Method: "GET", Path: "/v1/health"})
			runtime.ReadMemStats(&after)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
			if tc.want == "" && string(a.Body) != "{}" {
				t.Fatalf("body %q", a.Body)
			}
			a.Release()
			if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > heapBound {
				t.Fatalf("heap grew by %d bytes (bound %d)", grew, heapBound)
			}
			if !budget.sem.TryAcquire(budget.size) {
				t.Fatal("the budget was not given back whole")
			}
		})
	}
}

// TestBudgetBoundsWhatAnswersHold: answers held at once never pass the
// budget; a call that finds no room waits for it, and fails at its
// deadline when none comes.
func TestBudgetBoundsWhatAnswersHold(t *testing.T) {
	body := strings.Repeat("x", 1<<20)
	dial := rawGuest(t, func(w io.Writer) {
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	})
	c := New(dial, Limits{MaxAnswer: 1 << 20, Timeout: 500 * time.Millisecond}, NewBudget(2<<20))
	a1, err := c.Do(context.Background(), Request{Method: "GET", Path: "/"})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := c.Do(context.Background(), Request{Method: "GET", Path: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(context.Background(), Request{Method: "GET", Path: "/"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a third answer over the budget: %v, want a deadline", err)
	}
	a1.Release()
	a3, err := c.Do(context.Background(), Request{Method: "GET", Path: "/"})
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	a2.Release()
	a3.Release()
}

// TestCallsAreCapped: at most Limits.Calls calls are in flight; the next
// waits for one to end.
func TestCallsAreCapped(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	inFlight, peak := 0, 0
	dial := rawGuest(t, func(w io.Writer) {
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		mu.Unlock()
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
		io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	})
	c := New(dial, Limits{Calls: 3, Timeout: 10 * time.Second}, NewBudget(1<<20))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			a, err := c.Do(context.Background(), Request{Method: "GET", Path: "/"})
			if err != nil {
				t.Error(err)
			}
			a.Release()
		})
	}
	time.Sleep(200 * time.Millisecond)
	close(release)
	wg.Wait()
	if peak > 3 {
		t.Fatalf("%d calls in flight, cap 3", peak)
	}
}

// TestRetryOnce: a call whose connection died before any answer is sent
// again once when it is idempotent, and not otherwise.
func TestRetryOnce(t *testing.T) {
	var mu sync.Mutex
	seen := 0
	dial := rawGuest(t, func(w io.Writer) {
		mu.Lock()
		seen++
		first := seen%2 == 1
		mu.Unlock()
		if first {
			return // the connection ends with no answer
		}
		io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
	})
	c := New(dial, Limits{Timeout: 5 * time.Second}, NewBudget(1<<20))
	a, err := c.Do(context.Background(), Request{Method: "GET", Path: "/", Idempotent: true})
	if err != nil {
		t.Fatalf("an idempotent call was not sent again: %v", err)
	}
	a.Release()
	if _, err := c.Do(context.Background(), Request{Method: "POST", Path: "/"}); err == nil {
		t.Fatal("a call that is not idempotent was sent again")
	}
	mu.Lock()
	defer mu.Unlock()
	if seen != 3 {
		t.Fatalf("the guest saw %d calls, want 3", seen)
	}
}

// TestHoldCountsAgainstCalls: a stream held (an upgrade, a streamed
// body) takes a place of the calls in flight, so the cap covers every
// stream to the guest (issue 30: file transfers and attachments were
// outside it); none is taken once every place is, and a place comes back
// on release.
func TestHoldCountsAgainstCalls(t *testing.T) {
	dial := rawGuest(t, func(w io.Writer) { io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}") })
	c := New(dial, Limits{Calls: 2, Timeout: 200 * time.Millisecond}, NewBudget(1<<20))
	r1, ok1 := c.Hold()
	r2, ok2 := c.Hold()
	if !ok1 || !ok2 {
		t.Fatal("two places of two not held")
	}
	if _, ok := c.Hold(); ok {
		t.Fatal("a third place held")
	}
	if _, err := c.Do(context.Background(), Request{Method: "GET", Path: "/"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call with every place held: %v, want a deadline", err)
	}
	r1()
	r1() // once only
	if _, ok := c.Hold(); !ok {
		t.Fatal("no place after a release")
	}
	if _, ok := c.Hold(); ok {
		t.Fatal("a release counted twice")
	}
	r2()
	a, err := c.Do(context.Background(), Request{Method: "GET", Path: "/"})
	if err != nil {
		t.Fatalf("a call with a place free: %v", err)
	}
	a.Release()
}
