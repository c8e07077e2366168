package channel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// The guard sits between the host's yamux session and the connection to
// the guest, and bounds what the guest's frames can make the host hold.
// yamux v0.1.2 (the newest release) answers each inbound ping in a
// goroutine of its own that may wait 10 s for the send queue: a guest
// sending pings as fast as it can made 65,881 goroutines in 2 s. And a
// stream the host has closed stays in yamux's map, buffering up to its
// window of what the guest sends, until the guest sends FIN or
// StreamCloseTimeout passes: a guest that never does could make the host
// hold a window per stream it ever had.
//
// So the guard reads every frame the guest sends and
//   - passes an inbound ping on to yamux only while no other inbound ping
//     is unanswered (it sees yamux's answer go out), and drops the rest:
//     at most one goroutine of yamux's per guest for pings;
//   - when the host closes a stream (stream.Close), hands yamux a reset of
//     that stream as if the guest had sent it, so that yamux forgets the
//     stream and its buffer at once (and discards what the guest sends
//     on it later, as for any stream it does not know);
//   - refuses frames that are not yamux's (a version or type yamux does
//     not know, a data frame longer than a window): the session ends, as
//     yamux would end it;
//   - remembers which of the host's streams the guest acknowledged, so
//     that a call on a stream that died unacknowledged is known to have
//     never reached guestd (Stream.Delivered).
//
// Window updates and go-aways yamux handles inline, with neither a
// goroutine nor a buffer of their own; streams the guest opens wait in an
// accept backlog of acceptBacklog (yamux resets the rest).
//
// It adds one goroutine per session (its reader) and at most maxQueued
// bytes of frames waiting for yamux.

// Frame types and flags of yamux's header (yamux's const.go).
const (
	frameHeaderSize = 12
	typeData        = 0
	typeWindow      = 1
	typePing        = 2
	typeGoAway      = 3
	flagSYN         = 1
	flagACK         = 2
	flagFIN         = 4
	flagRST         = 8
	// maxFrameData is the longest data frame yamux accepts: one stream
	// window (yamux's initialStreamWindow, the window we configure).
	maxFrameData = 256 << 10
	// maxQueued bounds the guest's bytes read ahead of yamux.
	maxQueued = 64 << 10
	// maxForgotten is how many closed streams the guard remembers.
	maxForgotten = 256
)

// frameHeader is a yamux frame header.
type frameHeader struct {
	Version uint8
	Type    uint8
	Flags   uint16
	Stream  uint32
	Length  uint32
}

func parseHeader(b []byte) frameHeader {
	return frameHeader{
		Version: b[0],
		Type:    b[1],
		Flags:   binary.BigEndian.Uint16(b[2:4]),
		Stream:  binary.BigEndian.Uint32(b[4:8]),
		Length:  binary.BigEndian.Uint32(b[8:12]),
	}
}

func (h frameHeader) encode() []byte {
	b := make([]byte, frameHeaderSize)
	b[0], b[1] = h.Version, h.Type
	binary.BigEndian.PutUint16(b[2:4], h.Flags)
	binary.BigEndian.PutUint32(b[4:8], h.Stream)
	binary.BigEndian.PutUint32(b[8:12], h.Length)
	return b
}

// errFrame is a frame from the guest that is not yamux's.
var errFrame = errors.New("channel: not a yamux frame")

// checkFrame is the guard's policy for one inbound header: an error ends
// the session.
func checkFrame(h frameHeader) error {
	switch {
	case h.Version != 0:
		return fmt.Errorf("%w: version %d", errFrame, h.Version)
	case h.Type > typeGoAway:
		return fmt.Errorf("%w: type %d", errFrame, h.Type)
	case h.Type == typeData && h.Length > maxFrameData:
		return fmt.Errorf("%w: data frame of %d bytes", errFrame, h.Length)
	}
	return nil
}

// verdict is what the guard does with one inbound frame.
type verdict int

const (
	pass verdict = iota // to yamux
	drop                // header and body dropped
)

// guard is one session's filter; see above.
type guard struct {
	conn io.ReadWriteCloser

	mu       sync.Mutex
	cond     *sync.Cond // signals changes of in, err, closed
	in       []byte     // frames for yamux, whole frames but the last
	boundary bool       // in ends at a frame boundary
	pending  [][]byte   // frames to give yamux at the next boundary
	err      error      // the reader's end
	closed   bool
	pingOut  bool            // an inbound ping is with yamux, unanswered
	unacked  map[uint32]bool // the host's streams the guest has not acknowledged
	// forgotten are the last maxForgotten streams the host closed: what
	// the guest still sends on them is dropped here (yamux would discard
	// it too, logging each frame).
	forgotten map[uint32]bool
	order     []uint32
	out       frameScanner // the host's frames, as yamux writes them
	onceClose sync.Once
}

func newGuard(conn io.ReadWriteCloser) *guard {
	g := &guard{conn: conn, boundary: true, unacked: map[uint32]bool{}, forgotten: map[uint32]bool{}}
	g.cond = sync.NewCond(&g.mu)
	go g.readLoop()
	return g
}

// readLoop reads the guest's frames and queues those that pass.
func (g *guard) readLoop() {
	hdr := make([]byte, frameHeaderSize)
	buf := make([]byte, 16<<10)
	for {
		if _, err := io.ReadFull(g.conn, hdr); err != nil {
			g.fail(err)
			return
		}
		h := parseHeader(hdr)
		if err := checkFrame(h); err != nil {
			g.fail(err)
			return
		}
		body := int64(0)
		if h.Type == typeData {
			body = int64(h.Length)
		}
		v := g.admit(h)
		if v == pass && !g.queue(hdr, body == 0) {
			return
		}
		for body > 0 {
			n, err := g.conn.Read(buf[:min(int64(len(buf)), body)])
			body -= int64(n)
			if n > 0 && v == pass && !g.queue(buf[:n], body == 0) {
				return
			}
			if err != nil {
				g.fail(err)
				return
			}
		}
	}
}

// admit decides on one inbound frame and notes what it says.
func (g *guard) admit(h frameHeader) verdict {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch h.Type {
	case typePing:
		if h.Flags&flagSYN == 0 {
			return pass // an answer to the host's ping
		}
		if g.pingOut {
			return drop
		}
		g.pingOut = true
		return pass
	case typeData, typeWindow:
		if h.Flags&(flagACK|flagRST) != 0 {
			delete(g.unacked, h.Stream)
		}
		if g.forgotten[h.Stream] && h.Flags&flagSYN == 0 {
			return drop
		}
	}
	return pass
}

// queue appends b (part of a frame; end: its last part) for yamux,
// waiting while maxQueued bytes wait already. False: the guard is closed.
func (g *guard) queue(b []byte, end bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.in) >= maxQueued && !g.closed {
		g.cond.Wait()
	}
	if g.closed {
		return false
	}
	g.in = append(g.in, b...)
	g.boundary = end
	if end {
		for _, f := range g.pending {
			g.in = append(g.in, f...)
		}
		g.pending = nil
	}
	g.cond.Broadcast()
	return true
}

func (g *guard) fail(err error) {
	g.mu.Lock()
	if g.err == nil {
		g.err = err
	}
	g.cond.Broadcast()
	g.mu.Unlock()
}

// Read gives yamux the frames that passed.
func (g *guard) Read(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.in) == 0 && g.err == nil && !g.closed {
		g.cond.Wait()
	}
	if len(g.in) == 0 {
		if g.closed {
			return 0, io.ErrClosedPipe
		}
		return 0, g.err
	}
	n := copy(p, g.in)
	g.in = g.in[n:]
	if len(g.in) == 0 {
		g.in = nil // let a large backing array go
	}
	g.cond.Broadcast()
	return n, nil
}

// Write sends yamux's frames to the guest, noting the ping answers and
// the streams the host opens.
func (g *guard) Write(p []byte) (int, error) {
	n, err := g.conn.Write(p)
	g.mu.Lock()
	g.out.scan(p[:n], func(h frameHeader) {
		switch {
		case h.Type == typePing && h.Flags&flagACK != 0:
			g.pingOut = false
		case (h.Type == typeData || h.Type == typeWindow) && h.Flags&flagSYN != 0:
			g.unacked[h.Stream] = true
		}
	})
	g.mu.Unlock()
	return n, err
}

// Close closes the connection and ends Read.
func (g *guard) Close() error {
	var err error
	g.onceClose.Do(func() {
		err = g.conn.Close()
		g.mu.Lock()
		g.closed = true
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	return err
}

// forget makes yamux drop stream id (the host closed it): a reset from
// the guest is handed to yamux at the next frame boundary. What the guest
// still sends on it yamux then reads and discards, as for any stream it
// does not know.
func (g *guard) forget(id uint32) {
	rst := frameHeader{Type: typeWindow, Flags: flagRST, Stream: id}.encode()
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.unacked, id)
	if g.closed || g.err != nil {
		return
	}
	if len(g.order) == maxForgotten {
		delete(g.forgotten, g.order[0])
		g.order = g.order[1:]
	}
	g.forgotten[id] = true
	g.order = append(g.order, id)
	if g.boundary {
		g.in = append(g.in, rst...)
		g.cond.Broadcast()
		return
	}
	g.pending = append(g.pending, rst)
}

// acknowledged tells whether the guest acknowledged the host's stream id
// (or reset it): a stream it never did was never read by guestd.
func (g *guard) acknowledged(id uint32) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.unacked[id]
}

// frameScanner finds the frame headers in a byte stream of whole frames
// written in pieces.
type frameScanner struct {
	hdr  [frameHeaderSize]byte
	n    int    // bytes of hdr read
	body uint32 // bytes of the current frame's body still to come
}

func (s *frameScanner) scan(p []byte, each func(frameHeader)) {
	for len(p) > 0 {
		if s.body > 0 {
			k := min(uint32(len(p)), s.body)
			s.body -= k
			p = p[k:]
			continue
		}
		k := copy(s.hdr[s.n:], p)
		s.n += k
		p = p[k:]
		if s.n < frameHeaderSize {
			return
		}
		s.n = 0
		h := parseHeader(s.hdr[:])
		if h.Type == typeData {
			s.body = h.Length
		}
		each(h)
	}
}
