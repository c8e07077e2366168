package channel

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// byteConn is a guest that sends in and then ends; what the host writes
// goes to out.
type byteConn struct {
	r   io.Reader
	out bytes.Buffer
}

func (c *byteConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *byteConn) Write(p []byte) (int, error) { return c.out.Write(p) }
func (c *byteConn) Close() error                { return nil }

// filterRef is what the guard must give yamux of the guest's bytes in
// when yamux answers no ping: the frames up to the first one checkFrame
// refuses, without the inbound pings after the first.
func filterRef(in []byte) []byte {
	var out []byte
	pings := 0
	for len(in) >= frameHeaderSize {
		h := parseHeader(in)
		if checkFrame(h) != nil {
			return out
		}
		n := frameHeaderSize
		if h.Type == typeData {
			n += int(h.Length)
		}
		frame := in[:min(n, len(in))]
		in = in[len(frame):]
		if h.Type == typePing && h.Flags&flagSYN != 0 {
			pings++
			if pings > 1 {
				continue
			}
		}
		out = append(out, frame...)
	}
	return out
}

func frame(typ uint8, flags uint16, id, length uint32, body []byte) []byte {
	return append(frameHeader{Type: typ, Flags: flags, Stream: id, Length: length}.encode(), body...)
}

// FuzzGuard: whatever a guest sends, yamux is given the guest's frames up
// to the first that is not yamux's, with at most one unanswered inbound
// ping among them.
func FuzzGuard(f *testing.F) {
	f.Add(frame(typePing, flagSYN, 0, 1, nil))
	f.Add(bytes.Repeat(frame(typePing, flagSYN, 0, 7, nil), 50))
	f.Add(append(frame(typeData, flagSYN, 2, 5, []byte("hello")), frame(typePing, flagSYN, 0, 1, nil)...))
	f.Add(append(frame(typeWindow, flagACK, 1, 0, nil), frame(typeGoAway, 0, 0, 0, nil)...))
	f.Add(frame(typeData, 0, 2, maxFrameData+1, nil))
	f.Add(frame(9, 0, 2, 0, nil))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		c := &byteConn{r: bytes.NewReader(in)}
		g := newGuard(c)
		defer g.Close()
		got, err := io.ReadAll(g)
		if err != nil && !errors.Is(err, errFrame) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("the guard ended with %v", err)
		}
		if want := filterRef(in); !bytes.Equal(got, want) {
			t.Fatalf("yamux was given %x, want %x", got, want)
		}
	})
}

// FuzzFrameScanner: the headers found in a stream of frames do not depend
// on how the stream is cut into writes.
func FuzzFrameScanner(f *testing.F) {
	f.Add(append(frame(typeData, 0, 1, 3, []byte("abc")), frame(typePing, flagACK, 0, 9, nil)...), uint8(5))
	f.Add(frame(typeWindow, flagSYN, 3, 0, nil), uint8(1))
	f.Fuzz(func(t *testing.T, in []byte, cut uint8) {
		var whole, pieces []frameHeader
		var s1, s2 frameScanner
		s1.scan(in, func(h frameHeader) { whole = append(whole, h) })
		step := int(cut)%16 + 1
		for p := in; len(p) > 0; {
			k := min(step, len(p))
			s2.scan(p[:k], func(h frameHeader) { pieces = append(pieces, h) })
			p = p[k:]
		}
		if len(whole) != len(pieces) {
			t.Fatalf("%d headers whole, %d in pieces of %d", len(whole), len(pieces), step)
		}
		for i := range whole {
			if whole[i] != pieces[i] {
				t.Fatalf("header %d: %+v whole, %+v in pieces", i, whole[i], pieces[i])
			}
		}
	})
}

// rawGuest is a guest end that speaks the handshake and then writes what
// the test says, frame by frame, as a hostile guestd would.
func rawGuest(t *testing.T, port *fakePort) io.ReadWriteCloser {
	t.Helper()
	c, err := port.open()
	if err != nil {
		t.Fatal(err)
	}
	hs, err := guestHandshake(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return hs
}

// TestPingFloodCostsNoGoroutines pins issue 17's ping flood: yamux
// answered each of 72,000 pings in a goroutine of its own (65,881 at
// once). Through the guard the host holds at most one inbound ping, so
// its goroutines stay within a fixed bound (the baseline plus 20) while a
// guest sends 72,000 pings, and its session stays up.
func TestPingFloodCostsNoGoroutines(t *testing.T) {
	port, path := newFakePort(t)
	h := DialHost(path, nil)
	defer h.Close()
	guest := rawGuest(t, port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !h.Up() {
		if ctx.Err() != nil {
			t.Fatal("no session")
		}
		time.Sleep(5 * time.Millisecond)
	}
	acks := make(chan int, 1)
	go func() {
		n := 0
		hdr := make([]byte, frameHeaderSize)
		for {
			if _, err := io.ReadFull(guest, hdr); err != nil {
				acks <- n
				return
			}
			if f := parseHeader(hdr); f.Type == typePing && f.Flags&flagACK != 0 {
				n++
			}
		}
	}()
	base := runtime.NumGoroutine()
	const bound = 20
	peak := 0
	var flood []byte
	for i := range 1000 {
		flood = append(flood, frame(typePing, flagSYN, 0, uint32(i), nil)...)
	}
	for range 72 {
		if _, err := guest.Write(flood); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, runtime.NumGoroutine())
	}
	if peak > base+bound {
		t.Fatalf("%d goroutines during a ping flood (baseline %d, bound +%d)", peak, base, bound)
	}
	if !h.Up() {
		t.Fatal("the session ended under a ping flood")
	}
	guest.Close()
	t.Logf("goroutines: baseline %d, peak %d; pings answered: %d of 72000", base, peak, <-acks)
}

// TestClosedStreamIsForgotten: a stream the host closed is dropped by
// yamux at once, with what the guest had sent on it, although the guest
// never closes its end (yamux alone kept it, and up to a window of data,
// for its 5-minute stream close timeout).
func TestClosedStreamIsForgotten(t *testing.T) {
	port, path := newFakePort(t)
	h := DialHost(path, nil)
	defer h.Close()
	c, err := port.open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hs, err := guestHandshake(c)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := yamux.Server(hs, config(newEnd(nil).log))
	if err != nil {
		t.Fatal(err)
	}
	defer gs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 20
	for range n {
		st, err := h.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st.Write([]byte("x"))
		gst, err := gs.AcceptStream()
		if err != nil {
			t.Fatal(err)
		}
		// The guest fills the host's window and never closes.
		gst.Write(bytes.Repeat([]byte("y"), 200<<10))
		st.Close()
	}
	for {
		h.mu.Lock()
		streams := h.sess.NumStreams()
		h.mu.Unlock()
		if streams == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d closed streams still held by the host", streams, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestGarbageEndsTheSessionOnly: bytes that are not yamux's end the
// session; the host dials again, and a guest that then speaks properly is
// reached.
func TestGarbageEndsTheSessionOnly(t *testing.T) {
	port, path := newFakePort(t)
	h := DialHost(path, nil)
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 5 {
		guest := rawGuest(t, port)
		guest.Write(bytes.Repeat([]byte{0xff}, 4096))
		// The host ends the session: the guest reads the end.
		io.Copy(io.Discard, guest)
	}
	g := ListenGuest(port.open, nil)
	defer g.Close()
	go echo(g, "guest")
	roundTrip(t, ctx, h.Open, "hi", "guest:hi")
}

// TestNeverAccepted: a stream the guest never accepted is known as such;
// one it accepted is not.
func TestNeverAccepted(t *testing.T) {
	port, path := newFakePort(t)
	h := DialHost(path, nil)
	defer h.Close()
	guest := rawGuest(t, port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := h.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.Write([]byte("x"))
	if !NeverAccepted(st) {
		t.Fatal("a stream the guest never saw is taken as accepted")
	}
	id := st.(stream).StreamID()
	guest.Write(frame(typeWindow, flagACK, id, 0, nil))
	for NeverAccepted(st) {
		if ctx.Err() != nil {
			t.Fatal("an acknowledged stream is taken as never accepted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.Reset()
	if _, err := st.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read on a reset session: %v", err)
	}
	var _ net.Conn = st
}

// TestHeartbeatResetsADeadPeer pins issue 17's dead guestd: a guest end
// that stops answering (its guestd was killed; a new one waits for a
// handshake) kept the session up for good. The heartbeat resets it, the
// host dials again, and the next guest end is reached; a stalled guest
// whose CPUs are stopped (Stalled false) keeps its session.
func TestHeartbeatResetsADeadPeer(t *testing.T) {
	port, path := newFakePort(t)
	type event struct {
		n  uint64
		up bool
	}
	events := make(chan event, 16)
	paused := make(chan bool, 1)
	paused <- true
	// PingTimeout leaves the live session's answers room under the race
	// detector on a loaded machine (at 100 ms, CI once saw the second
	// session reset in the middle of its round trip).
	h := Dial(path, HostConfig{
		Heartbeat: 20 * time.Millisecond, PingTimeout: 600 * time.Millisecond,
		Stalled: func(context.Context) (bool, error) {
			p := <-paused
			paused <- false
			return !p, nil // first asked: paused; then running
		},
		Answering: func(n uint64, up bool) { events <- event{n, up} },
	})
	defer h.Close()
	dead := rawGuest(t, port) // reads nothing, answers nothing
	defer dead.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	select {
	case e := <-events:
		if e != (event{1, false}) {
			t.Fatalf("first event %+v, want session 1 not answering", e)
		}
	case <-ctx.Done():
		t.Fatal("a dead peer was never noticed")
	}
	g := ListenGuest(port.open, nil)
	defer g.Close()
	go echo(g, "guest")
	roundTrip(t, ctx, h.Open, "hi", "guest:hi")
	select {
	case e := <-events:
		if e != (event{2, true}) {
			t.Fatalf("second event %+v, want session 2 answering", e)
		}
	case <-ctx.Done():
		t.Fatal("the new session's answer was never told")
	}
}

// TestLostSessionIsTold: a session that ends otherwise than by the
// heartbeat (the guest wrote garbage) and is not followed by another
// within PingTimeout is told as not answering; one that is followed in
// time is not.
func TestLostSessionIsTold(t *testing.T) {
	port, path := newFakePort(t)
	told := make(chan uint64, 4)
	h := Dial(path, HostConfig{
		Heartbeat: time.Hour, PingTimeout: 100 * time.Millisecond,
		Answering: func(n uint64, up bool) {
			if !up {
				told <- n
			}
		},
	})
	defer h.Close()
	guest := rawGuest(t, port)
	guest.Write(bytes.Repeat([]byte{0xff}, 64))
	io.Copy(io.Discard, guest)
	select {
	case n := <-told:
		if n != 1 {
			t.Fatalf("told session %d, want 1", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a session lost for good was never told")
	}
	// Followed at once by a guest that speaks properly: nothing told.
	g := ListenGuest(port.open, nil)
	defer g.Close()
	go echo(g, "guest")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	roundTrip(t, ctx, h.Open, "hi", "guest:hi")
	select {
	case n := <-told:
		t.Fatalf("session %d told lost while the next one runs", n)
	case <-time.After(500 * time.Millisecond):
	}
}

// TestLostIsToldBeforeTheNextSession pins a race of issue 17's heal: the
// timer that tells a lost session (answering false) could fire just as
// the next session started, and its word land after that session's
// first answer (true), which heals the sandbox and is told once: the
// sandbox stayed unresponsive, and was stopped at its limit while its
// guest answered. A lost session's word is told whole before the next
// session starts, or not at all.
func TestLostIsToldBeforeTheNextSession(t *testing.T) {
	port, path := newFakePort(t)
	type event struct {
		n  uint64
		up bool
	}
	events := make(chan event, 16)
	lostTold := make(chan struct{})
	proceed := make(chan struct{})
	h := Dial(path, HostConfig{
		Heartbeat: 20 * time.Millisecond, PingTimeout: 600 * time.Millisecond, // as TestHeartbeatResetsADeadPeer: no spurious reset under -race
		Answering: func(n uint64, up bool) {
			if !up && n == 1 {
				// The manager's record write, slow.
				close(lostTold)
				<-proceed
			}
			events <- event{n, up}
		},
	})
	defer h.Close()
	guest := rawGuest(t, port)
	guest.Write(bytes.Repeat([]byte{0xff}, 64))
	io.Copy(io.Discard, guest)
	select {
	case <-lostTold:
	case <-time.After(10 * time.Second):
		t.Fatal("a session lost for good was never told")
	}
	// The next session comes up while the lost one is being told.
	g := ListenGuest(port.open, nil)
	defer g.Close()
	for !g.Up() {
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case e := <-events:
		t.Fatalf("%+v told while session 1's loss was being told", e)
	case <-time.After(10 * 20 * time.Millisecond): // ten heartbeats
	}
	close(proceed)
	for _, want := range []event{{1, false}, {2, true}} {
		select {
		case e := <-events:
			if e != want {
				t.Fatalf("event %+v, want %+v", e, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("event %+v never told", want)
		}
	}
}

// TestStalledUnsureHasALimit pins issue 17's endless grace: a look at the
// CPUs that failed or took longer than PingTimeout/6 was taken for a
// stopped guest's, which gets more time, without limit: on a loaded host
// or with a wedged monitor a dead guestd was never noticed. A few such
// rounds in a row (maxUnsure) now reset the session; CPUs known stopped
// keep it.
func TestStalledUnsureHasALimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stalled func(ctx context.Context) (bool, error)
		reset   bool
	}{
		{"the monitor fails", func(context.Context) (bool, error) { return false, errors.New("monitor gone") }, true},
		{"the monitor is wedged", func(ctx context.Context) (bool, error) { <-ctx.Done(); return false, ctx.Err() }, true},
		{"the monitor answers slowly", func(context.Context) (bool, error) { time.Sleep(40 * time.Millisecond); return true, nil }, true},
		{"the CPUs run", func(context.Context) (bool, error) { return true, nil }, true},
		{"the CPUs are stopped", func(context.Context) (bool, error) { return false, nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, path := newFakePort(t)
			told := make(chan uint64, 4)
			h := Dial(path, HostConfig{
				Heartbeat: 20 * time.Millisecond, PingTimeout: 100 * time.Millisecond,
				Stalled: tc.stalled,
				Answering: func(n uint64, up bool) {
					if !up {
						told <- n
					}
				},
			})
			defer h.Close()
			dead := rawGuest(t, port) // reads nothing, answers nothing
			defer dead.Close()
			wait := time.After(10 * time.Second)
			if !tc.reset {
				wait = time.After(4 * (maxUnsure + 2) * 100 * time.Millisecond)
			}
			select {
			case n := <-told:
				if !tc.reset {
					t.Fatalf("session %d of a guest whose CPUs are stopped was reset", n)
				}
			case <-wait:
				if tc.reset {
					t.Fatal("a dead peer was never noticed")
				}
			}
		})
	}
}
