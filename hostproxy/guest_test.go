package hostproxy

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"strata/internal/jsend"
)

// TestExecHasItsOwnPool pins that execs, which may last an hour, do not
// starve a guest's other calls: with maxGuestCalls execs in flight to one
// guest, a checkpoint list still goes through (it timed out waiting for a
// connection when both shared one pool), one more exec waits for a free
// connection (the cap holds), and Forget drops both pools.
func TestExecHasItsOwnPool(t *testing.T) {
	sock, ln := listenGuest(t)
	release := make(chan struct{})
	started := make(chan struct{}, 2*maxGuestCalls)
	var execs atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/exec" {
			execs.Add(1)
			started <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		jsend.Success(w, []any{})
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	g := NewGuestClient(DefaultDialers(), time.Second, 2*time.Second)
	t.Cleanup(g.Close)
	guest := "unix://" + sock
	ctx := t.Context()
	var wg sync.WaitGroup
	for range maxGuestCalls + 1 {
		wg.Go(func() {
			if _, err := g.Exec(ctx, guest, []byte(`{"cmd":["sleep","3600"]}`), time.Minute); err != nil {
				t.Errorf("exec: %v", err)
			}
		})
	}
	for range maxGuestCalls {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d execs reached the guest, want %d", execs.Load(), maxGuestCalls)
		}
	}

	if _, err := g.ListCheckpoints(ctx, guest); err != nil {
		t.Errorf("list with %d execs in flight: %v", maxGuestCalls, err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := execs.Load(); n != maxGuestCalls {
		t.Errorf("%d execs in flight to one guest, want the cap, %d", n, maxGuestCalls)
	}

	close(release)
	wg.Wait()
	if n := execs.Load(); n != maxGuestCalls+1 {
		t.Errorf("%d execs reached the guest in all, want %d", n, maxGuestCalls+1)
	}
	g.Forget(guest)
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.pools) != 0 {
		t.Errorf("Forget left %d guests' pools", len(g.pools))
	}
}

// TestGuestPoolsApart pins that the two pools of a guest are two
// clients, and that another guest has its own.
func TestGuestPoolsApart(t *testing.T) {
	g := NewGuestClient(DefaultDialers(), time.Second, time.Second)
	calls, err := g.client("unix:///a.sock", poolCalls)
	if err != nil {
		t.Fatal(err)
	}
	exec, _ := g.client("unix:///a.sock", poolExec)
	again, _ := g.client("unix:///a.sock", poolCalls)
	other, _ := g.client("unix:///b.sock", poolExec)
	if calls == exec || calls != again || other == exec {
		t.Errorf("pools: calls %p, exec %p, calls again %p, another guest's exec %p", calls, exec, again, other)
	}
	g.Forget("unix:///a.sock")
	if t2, _ := g.client("unix:///a.sock", poolExec); t2 == exec {
		t.Error("Forget kept the exec pool")
	}
}

// TestGuestDataHeldUntilReleased pins issue 17's answers held beside
// the budget: the data of a valid answer was copied out of the budgeted
// buffer, which was given back at once, so that answers a slow client
// had yet to read (16 MiB each, 32 calls in flight) held up to 512 MiB
// for one guest. The data is now a slice of the held answer: answers
// not yet written never hold more than maxGuestHeld; a call finding no
// room waits for it (and fails at its deadline); a release makes room.
func TestGuestDataHeldUntilReleased(t *testing.T) {
	sock, ln := listenGuest(t)
	big := strings.Repeat("x", maxGuestHeld/4-64)
	answer := `{"status":"success","data":"` + big + `"}`
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		io.WriteString(w, answer)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	g := NewGuestClient(DefaultDialers(), time.Second, time.Second)
	t.Cleanup(g.Close)
	guest := "unix://" + sock
	var mu sync.Mutex
	var held []*GuestData
	failed := 0
	var wg sync.WaitGroup
	for range 2 * maxGuestCalls {
		wg.Go(func() {
			d, err := g.ListCheckpoints(t.Context(), guest)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				return
			}
			held = append(held, d) // not written yet: a slow client
		})
	}
	wg.Wait()
	total := 0
	for _, d := range held {
		if string(d.Data) != `"`+big+`"` {
			t.Fatalf("data of %d bytes, want the answer's", len(d.Data))
		}
		total += len(d.Data)
	}
	if total > maxGuestHeld || len(held) == 0 {
		t.Fatalf("%d answers of %d bytes held at once: %d bytes, budget %d", len(held), len(big), total, maxGuestHeld)
	}
	if failed == 0 {
		t.Fatal("every call found room in the budget")
	}
	for _, d := range held {
		d.Release()
	}
	d, err := g.ListCheckpoints(t.Context(), guest)
	if err != nil {
		t.Fatalf("after the answers were released: %v", err)
	}
	d.Release()
}

// listenGuest listens on a unix socket in a short temporary directory (a
// socket path must be short), removed at the end of the test.
func listenGuest(t *testing.T) (string, net.Listener) {
	t.Helper()
	dir, err := os.MkdirTemp("", "guest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "guestd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	return sock, ln
}
