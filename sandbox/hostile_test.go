package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"strata/internal/guestclient"
	"strata/sandbox"
)

// hostileHandshake is the guest's side of the channel's handshake, as a
// hostile guest that took the port over speaks it.
func hostileHandshake(c net.Conn) (*bufio.Reader, error) {
	r := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(waitFor))
	defer c.SetReadDeadline(time.Time{})
	nonce := ""
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		line = strings.TrimSpace(line)
		if i := strings.Index(line, "STRATA-CHANNEL HELLO "); i >= 0 && nonce == "" {
			nonce = line[i+len("STRATA-CHANNEL HELLO "):]
			if _, err := io.WriteString(c, "STRATA-CHANNEL READY "+nonce+"\n"); err != nil {
				return nil, err
			}
		}
		if nonce != "" && strings.HasSuffix(line, "STRATA-CHANNEL GO "+nonce) {
			return r, nil
		}
	}
}

// readerConn is a conn whose reads come from r (what the handshake read
// ahead).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

var fill = bytes.Repeat([]byte("a"), 32<<10)

func pingFrame(id uint32) []byte {
	b := make([]byte, 12)
	b[1] = 2                             // ping
	binary.BigEndian.PutUint16(b[2:], 1) // SYN
	binary.BigEndian.PutUint32(b[8:], id)
	return b
}

// TestHostileGuest is the fake-guestd half of issue 17's hostile-guest
// suite: a guest whose root killed guestd and took its channel port over
// floods pings, answers every call of the host with an endless header or
// an endless body, writes garbage, and reopens the port in a loop, while
// another sandbox's guest keeps answering every call. The host's bounds,
// stated here: goroutines within the baseline + 150, the heap within the
// baseline + 64 MiB (the manager's share of the 128 MiB docs/design.md
// gives one hostile guest: its calls' budget is 256 KiB, and the live
// heap, sampled after a collection, counts the hostile guest's own
// buffers too),
// every call to the hostile guest fails within its deadline; afterwards
// a stop and a start bring the hostile sandbox back.
func TestHostileGuest(t *testing.T) {
	const goroutineBound, heapBound = 150, 64 << 20
	h := newHarness(t)
	m := h.manager(func(c *sandbox.Config) {
		c.Heartbeat, c.PingTimeout = 50*time.Millisecond, time.Second
	})
	h.running(m, "sb-a")
	h.running(m, "sb-b")
	fa := waitMachine(t, h.drv, "sb-a")

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseG, baseHeap := runtime.NumGoroutine(), ms.HeapAlloc
	var peakG, peakHeap atomic.Uint64
	// guestG counts the hostile guest's own goroutines (it runs in this
	// process): the bound is on the host's.
	var guestG atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // the bounds, sampled
		dumped := false
		for {
			// What the process holds: its live heap (garbage not yet
			// collected is not held by anyone).
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if g := uint64(int64(runtime.NumGoroutine()) - guestG.Load()); g > peakG.Load() {
				peakG.Store(g)
				if g > uint64(baseG+goroutineBound) && !dumped {
					dumped = true
					var b bytes.Buffer
					pprof.Lookup("goroutine").WriteTo(&b, 1)
					t.Logf("goroutines over the bound:\n%.6000s", b.String())
				}
			}
			if ms.HeapAlloc > peakHeap.Load() {
				peakHeap.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	healthy := atomic.Int32{}
	wg.Go(func() { // the other sandbox, meanwhile
		for {
			select {
			case <-stop:
				return
			default:
			}
			checkHealth(t, m, "sb-b")
			healthy.Add(1)
		}
	})
	calls := atomic.Int32{}
	var slowDumped atomic.Bool
	wg.Go(func() { // calls to the hostile guest, as hostproxy makes them
		c := guestclient.New(func(ctx context.Context) (net.Conn, error) { return m.Dial(ctx, "sb-a") },
			guestclient.Limits{Calls: 16, MaxAnswer: 16 << 20, Timeout: time.Second}, guestclient.NewBudget(16<<20))
		var cw sync.WaitGroup
		for range 16 {
			cw.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					t0 := time.Now()
					slow := time.AfterFunc(2500*time.Millisecond, func() {
						if slowDumped.CompareAndSwap(false, true) {
							var b bytes.Buffer
							pprof.Lookup("goroutine").WriteTo(&b, 1)
							t.Logf("a call past its deadline:\n%.12000s", b.String())
						}
					})
					a, err := c.Do(context.Background(), guestclient.Request{Method: "GET", Path: "/v1/checkpoints"})
					slow.Stop()
					a.Release()
					if d := time.Since(t0); d > 5*time.Second {
						t.Errorf("a call to the hostile guest took %v (deadline 1 s): %v", d, err)
					}
					calls.Add(1)
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		cw.Wait()
	})

	// guestd dies; the port is the hostile process's from here.
	fa.killGuestd(h.drv.log, false)
	next := func() net.Conn {
		t.Helper()
		select {
		case c := <-fa.conns:
			return c
		case <-time.After(waitFor):
			t.Fatal("the host did not dial the hostile guest")
			return nil
		}
	}
	phase := func(name string, fn func(c net.Conn, r *bufio.Reader)) {
		t.Helper()
		c := next()
		r, err := hostileHandshake(c)
		if err != nil {
			t.Fatalf("%s: handshake: %v", name, err)
		}
		fn(c, r)
		c.Close()
		t.Logf("%s: goroutines peak %d (baseline %d), heap peak %d MiB (baseline %d MiB)", name, peakG.Load(), baseG, peakHeap.Load()>>20, baseHeap>>20)
	}

	phase("ping flood", func(c net.Conn, _ *bufio.Reader) {
		go io.Copy(io.Discard, c)
		var flood []byte
		for i := range 1000 {
			flood = append(flood, pingFrame(uint32(i))...)
		}
		for range 72 {
			if _, err := c.Write(flood); err != nil {
				t.Fatalf("ping flood: %v", err)
			}
		}
		time.Sleep(time.Second) // a ping unanswered: the host resets
	})
	for _, answer := range []string{"endless header", "endless body"} {
		phase(answer, func(c net.Conn, r *bufio.Reader) {
			s, err := yamux.Server(readerConn{c, r}, yamux.DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			deadline := time.After(3 * time.Second)
			for {
				st, err := acceptWithin(s, deadline)
				if err != nil {
					return
				}
				guestG.Add(1)
				go func() {
					defer guestG.Add(-1)
					defer st.Close()
					// The hostile guest's own goroutines end: the
					// bounds are the host's.
					st.SetDeadline(time.Now().Add(500 * time.Millisecond))
					st.Read(make([]byte, 4096))
					head := "HTTP/1.1 200 OK\r\nX-Endless: "
					if answer == "endless body" {
						head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"status\":\"success\",\"data\":\""
					}
					io.WriteString(st, head)
					for {
						if _, err := st.Write(fill); err != nil {
							return
						}
					}
				}()
			}
		})
	}
	phase("garbage", func(c net.Conn, _ *bufio.Reader) {
		go io.Copy(io.Discard, c)
		c.Write(bytes.Repeat([]byte{0xee}, 1<<20))
		time.Sleep(200 * time.Millisecond)
	})
	for i := range 30 {
		phase("reopen", func(c net.Conn, _ *bufio.Reader) {})
		if i == 0 {
			t.Log("reopening the port 30 times")
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("goroutines peak %d (baseline %d, bound +%d); heap peak %d MiB (baseline %d MiB, bound +%d MiB); %d calls to the hostile guest failed in time; the other sandbox answered %d times", peakG.Load(), baseG, goroutineBound, peakHeap.Load()>>20, baseHeap>>20, heapBound>>20, calls.Load(), healthy.Load())
	if g := peakG.Load(); g > uint64(baseG+goroutineBound) {
		t.Errorf("%d goroutines at the peak (baseline %d, bound +%d)", g, baseG, goroutineBound)
	}
	if hp := peakHeap.Load(); hp > baseHeap+heapBound {
		t.Errorf("heap %d MiB at the peak (baseline %d MiB, bound +%d MiB)", hp>>20, baseHeap>>20, heapBound>>20)
	}
	if healthy.Load() == 0 {
		t.Error("the other sandbox never answered")
	}
	if st := h.get("sb-b").State; st != sandbox.Running {
		t.Errorf("the other sandbox is %s", st)
	}
	if st := h.get("sb-a").State; st != sandbox.Unresponsive {
		t.Errorf("the hostile sandbox is %s, want unresponsive", st)
	}
	if _, err := m.Stop(context.Background(), "sb-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(context.Background(), "sb-a"); err != nil {
		t.Fatal(err)
	}
	h.waitState("sb-a", sandbox.Running)
	checkHealth(t, m, "sb-a")
	checkHealth(t, m, "sb-b")
}

// acceptWithin accepts a stream of s until deadline fires.
func acceptWithin(s *yamux.Session, deadline <-chan time.Time) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := s.AcceptStream()
		ch <- res{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-deadline:
		s.Close()
		return nil, errors.New("phase over")
	}
}
