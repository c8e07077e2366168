package channel

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// ErrClosed is returned by Open and Accept after Close.
var ErrClosed = errors.New("channel: closed")

// resetPause is how long the host waits to dial again after it reset a
// session for a silent guest.
const resetPause = 250 * time.Millisecond

// acceptBacklog bounds the streams the guest has opened and the host has
// not accepted yet (yamux resets the rest): each may hold a window (256
// KiB) of what the guest sends.
const acceptBacklog = 16

func config(log *slog.Logger) *yamux.Config {
	c := yamux.DefaultConfig()
	// The host's own heartbeat (Host.heartbeat) tells a dead guest from a
	// paused one; yamux's keep-alive would close a paused guest's session.
	c.EnableKeepAlive = false
	// A stream the other end has not acknowledged yet (a guest still
	// booting, or paused) must not close the whole session.
	c.StreamOpenTimeout = 0
	c.LogOutput = nil
	c.Logger = slogAdapter{log}
	return c
}

type slogAdapter struct{ log *slog.Logger }

func (a slogAdapter) Print(v ...any) { a.log.Debug("yamux", "msg", v) }
func (a slogAdapter) Printf(format string, v ...any) {
	a.log.Debug("yamux", "format", format, "args", v)
}
func (a slogAdapter) Println(v ...any) { a.log.Debug("yamux", "msg", v) }

// session is one yamux session, with its guard on the host end (nil on
// the guest's).
type session struct {
	*yamux.Session
	g *guard
}

// end is what both ends share: the current session, and the streams the
// other end opened, delivered through Accept.
type end struct {
	log *slog.Logger

	mu      sync.Mutex
	sess    *session
	changed chan struct{} // closed and replaced when sess changes
	closed  bool

	incoming chan net.Conn
	done     chan struct{}

	// used is when a stream was last opened, either way (unix nanos):
	// the host's heartbeat is spaced out while the channel is quiet.
	used atomic.Int64
}

func newEnd(log *slog.Logger) *end {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &end{log: log, changed: make(chan struct{}), incoming: make(chan net.Conn), done: make(chan struct{})}
}

// setSession publishes s as the current session (nil: none).
func (e *end) setSession(s *session) {
	if s != nil {
		// A new session is in use: its first pings come at once.
		e.used.Store(time.Now().UnixNano())
	}
	e.mu.Lock()
	e.sess = s
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
}

// Open opens a stream to the other end, waiting for a session up to ctx.
func (e *end) Open(ctx context.Context) (net.Conn, error) {
	for {
		e.mu.Lock()
		s, changed, closed := e.sess, e.changed, e.closed
		e.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		if s != nil && !s.IsClosed() {
			st, err := openStream(ctx, s)
			if err == nil {
				e.used.Store(time.Now().UnixNano())
				return st, nil
			}
			if !errors.Is(err, yamux.ErrSessionShutdown) {
				return nil, err
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// openStream is yamux's OpenStream bounded by ctx: OpenStream waits,
// without a deadline, while 256 streams are still unacknowledged (a guest
// that is hung, or hostile). A stream opened after ctx ended is closed.
func openStream(ctx context.Context, s *session) (net.Conn, error) {
	type result struct {
		st  *yamux.Stream
		err error
	}
	ch := make(chan result, 1)
	go func() {
		st, err := s.OpenStream()
		ch <- result{st, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		return newStream(r.st, s.g), nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.st != nil {
				newStream(r.st, s.g).Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// Up reports whether a session is up now.
func (e *end) Up() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sess != nil && !e.sess.IsClosed()
}

// Accept returns the next stream the other end opened.
func (e *end) Accept() (net.Conn, error) {
	select {
	case c := <-e.incoming:
		return c, nil
	case <-e.done:
		return nil, ErrClosed
	}
}

// Addr is the channel's address as a net.Listener.
func (e *end) Addr() net.Addr { return addr{} }

type addr struct{}

func (addr) Network() string { return "channel" }
func (addr) String() string  { return "channel" }

// serve runs one session until it ends: it delivers the streams the other
// end opens to Accept.
func (e *end) serve(s *session) {
	e.setSession(s)
	for {
		st, err := s.AcceptStream()
		if err != nil {
			break
		}
		e.used.Store(time.Now().UnixNano())
		select {
		case e.incoming <- newStream(st, s.g):
		case <-e.done:
			newStream(st, s.g).Close()
		}
	}
	s.Close()
	e.setSession(nil)
}

func (e *end) close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	s := e.sess
	e.mu.Unlock()
	close(e.done)
	if s != nil {
		s.Close()
	}
}

// HostConfig configures the host end of a channel.
type HostConfig struct {
	Log *slog.Logger
	// Plain: no handshake, for a guest whose channel predates it (a
	// sandbox booted by an earlier hostproxy, adopted running): its
	// sessions start with yamux at once.
	Plain bool
	// Heartbeat is how often the host pings the guest (0: never).
	Heartbeat time.Duration
	// PingTimeout is how long a ping may go unanswered (3 s when zero).
	PingTimeout time.Duration
	// Stalled is asked when a ping goes unanswered for PingTimeout:
	// true (the guest's CPUs run, so it should have answered) resets
	// the session, and the host dials again; false (a paused guest)
	// keeps it. An error, or an answer slower than PingTimeout/6 (a
	// stopped QEMU answers once it runs again), is unsure: the guest
	// gets more time, maxUnsure rounds in a row at most, then the
	// session is reset. Nil resets.
	Stalled func(ctx context.Context) (bool, error)
	// Answering is told whether the guest answers: true for the first
	// answered ping of each session (n counts the sessions from 1), false
	// when a session is reset for a ping unanswered, or ended otherwise
	// and no next one started within PingTimeout. Each session's words
	// are told in order, and a session's after every word of the ones
	// before it. It must be safe for concurrent use and must not block
	// for long.
	Answering func(n uint64, answering bool)
}

// Host is the host end of one machine's channel.
type Host struct {
	*end
	path   string
	cfg    HostConfig
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// tell orders a lost session's word (answering false, told by a
	// timer) before the next session's start: the word of session
	// newest only, told whole before newest grows.
	tell   sync.Mutex
	newest uint64
}

// DialHost keeps a session to the guest through the unix socket at path
// until Close. It returns at once; Open waits for the session.
func DialHost(path string, log *slog.Logger) *Host {
	return Dial(path, HostConfig{Log: log})
}

// DialHostPlain is DialHost for a guest whose channel predates the
// handshake (HostConfig.Plain).
func DialHostPlain(path string, log *slog.Logger) *Host {
	return Dial(path, HostConfig{Log: log, Plain: true})
}

// Dial keeps a session to the guest through the unix socket at path
// until Close, as cfg says. It returns at once; Open waits for the
// session.
func Dial(path string, cfg HostConfig) *Host {
	if cfg.PingTimeout == 0 {
		cfg.PingTimeout = 3 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Host{end: newEnd(cfg.Log), path: path, cfg: cfg, cancel: cancel}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.run(ctx)
	}()
	return h
}

func (h *Host) run(ctx context.Context) {
	var d net.Dialer
	backoff := 10 * time.Millisecond
	var n uint64
	var lost *time.Timer // a session that ended and was not followed yet
	defer func() {
		if lost != nil {
			lost.Stop()
		}
	}()
	for ctx.Err() == nil {
		conn, err := d.DialContext(ctx, "unix", h.path)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 500*time.Millisecond)
			continue
		}
		backoff = 10 * time.Millisecond
		var hs io.ReadWriteCloser = conn
		if !h.cfg.Plain {
			hs, err = hostHandshake(ctx, conn)
		}
		if err != nil {
			h.log.Debug("channel handshake", "socket", h.path, "err", err)
			conn.Close()
			continue
		}
		g := newGuard(hs)
		c := config(h.log)
		c.AcceptBacklog = acceptBacklog
		ys, err := yamux.Client(g, c)
		if err != nil {
			g.Close()
			continue
		}
		h.tell.Lock()
		if lost != nil {
			lost.Stop()
			lost = nil
		}
		n++
		h.newest = n
		h.tell.Unlock()
		s := &session{ys, g}
		stop := context.AfterFunc(ctx, func() { s.Close() })
		beat := make(chan bool, 1)
		go func() { beat <- h.heartbeat(ctx, s, n) }()
		h.serve(s)
		stop()
		g.Close()
		pause := 10 * time.Millisecond
		if <-beat {
			// Reset for a silent guest: the guest's port must see this
			// connection end (its reads return EOF) before the next
			// one starts, or it may see the end in the middle of the
			// next session's handshake and leave that session dead.
			pause = resetPause
		} else if h.cfg.Answering != nil && h.cfg.Heartbeat > 0 && ctx.Err() == nil {
			// Ended otherwise (the guest's frames were not yamux's, or
			// its port closed): a guest that does not start another
			// session within PingTimeout is not answering either.
			// The timer may fire as the next session starts: the word
			// is told under tell, and only if no session followed, so
			// that it never lands after the next session's answer.
			ended := n
			lost = time.AfterFunc(h.cfg.PingTimeout+resetPause, func() {
				h.tell.Lock()
				defer h.tell.Unlock()
				if h.newest == ended {
					h.cfg.Answering(ended, false)
				}
			})
		}
		h.log.Debug("channel session ended", "socket", h.path)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

// heartbeat pings the guest every cfg.Heartbeat while s is up: one ping
// at a time, so its cost is fixed. A ping unanswered for PingTimeout of a
// guest whose CPUs run (cfg.Stalled) resets the session: a guestd that
// was killed and started again waits for a handshake, and a session with
// a dead peer would never end by itself (the port stays open on QEMU's
// side).
//
// It returns true when it reset the session.
func (h *Host) heartbeat(ctx context.Context, s *session, n uint64) bool {
	if h.cfg.Heartbeat <= 0 {
		return false
	}
	answered := false
	for {
		select {
		case <-s.CloseChan():
			return false
		case <-time.After(h.interval(time.Now())):
		}
		res := make(chan error, 1)
		go func() {
			_, err := s.Ping()
			res <- err
		}()
		ok, reset, err := h.await(ctx, s, n, res)
		if !ok {
			return reset
		}
		if err == nil && !answered {
			answered = true
			if h.cfg.Answering != nil {
				h.cfg.Answering(n, true)
			}
		}
	}
}

// The heartbeat of a quiet channel (no stream opened either way for
// quietAfter heartbeats) is every quietEvery heartbeats: under TCG each
// ping wakes the guest and costs its QEMU host CPU (about a third of an
// idle sandbox's), and a guest nobody uses has nobody waiting on it. A
// dead guestd is then found within quietEvery heartbeats and a
// PingTimeout, where a channel in use finds it within one and a
// PingTimeout.
const (
	quietAfter = 10
	quietEvery = 5
)

// interval is the wait before the next ping at now.
func (h *Host) interval(now time.Time) time.Duration {
	if now.Sub(time.Unix(0, h.used.Load())) > quietAfter*h.cfg.Heartbeat {
		return quietEvery * h.cfg.Heartbeat
	}
	return h.cfg.Heartbeat
}

// maxUnsure is how many rounds in a row a look at the CPUs (Stalled) may
// be unsure (failed, or slow) and the guest get more time: a wedged
// monitor or a host loaded for that long must not hide a dead guestd for
// good.
const maxUnsure = 3

// await waits for the answer to one ping: a ping unanswered for
// PingTimeout is a stalled guest's unless Stalled says its CPUs are
// stopped (asked again each PingTimeout); once they were, the guest has
// a PingTimeout from when they run again. A look that is unsure (lookCPUs)
// counts as stopped, maxUnsure rounds in a row at most; then as running.
// ok false: the session ended (reset: await ended it).
func (h *Host) await(ctx context.Context, s *session, n uint64, res chan error) (ok, reset bool, err error) {
	grace := false
	unsure := 0
	// stopped reports whether a look says the CPUs are (or may be)
	// stopped, counting unsure looks.
	stopped := func() bool {
		running, sure := h.lookCPUs(ctx)
		if !sure {
			unsure++
			return unsure <= maxUnsure
		}
		unsure = 0
		return !running
	}
	for {
		select {
		case err := <-res:
			return true, false, err
		case <-s.CloseChan():
			<-res
			return false, false, nil
		case <-time.After(h.cfg.PingTimeout):
		}
		if stopped() {
			grace = true
			continue
		}
		if grace {
			// The CPUs run again after a stop (a pause, a save, QEMU
			// itself stopped): the guest gets a PingTimeout of its own
			// to answer.
			grace = false
			continue
		}
		// They run now, but may have been stopped until the moment QEMU
		// answered (a stopped QEMU answers when it runs again): a last
		// look a while later, for the answer or for the CPUs stopped.
		select {
		case err := <-res:
			return true, false, err
		case <-s.CloseChan():
			<-res
			return false, false, nil
		case <-time.After(h.cfg.PingTimeout / 3):
		}
		if stopped() {
			grace = true
			continue
		}
		h.log.Warn("channel: the guest did not answer a ping; the session is reset", "socket", h.path, "timeout", h.cfg.PingTimeout, "unsure_looks", unsure)
		// The session is closed before the word is told: whoever acts
		// on it (opens a stream to reach the next guestd) must never be
		// given the dead session's stream.
		s.Close()
		if h.cfg.Answering != nil {
			h.cfg.Answering(n, false)
		}
		<-res
		return false, true, nil
	}
}

// lookCPUs asks Stalled whether the guest's CPUs run. It is unsure (sure
// false) when Stalled fails or answers later than PingTimeout/6: a
// stopped QEMU answers late, and only once it runs again.
func (h *Host) lookCPUs(ctx context.Context) (running, sure bool) {
	if h.cfg.Stalled == nil {
		return true, true
	}
	asked := time.Now()
	sctx, cancel := context.WithTimeout(ctx, h.cfg.PingTimeout)
	defer cancel()
	running, err := h.cfg.Stalled(sctx)
	if err != nil || time.Since(asked) > h.cfg.PingTimeout/6 {
		return false, false
	}
	return running, true
}

// Reset ends the current session, if any; the host dials again.
func (h *Host) Reset() {
	h.mu.Lock()
	s := h.sess
	h.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

// Close ends the session and stops dialling.
func (h *Host) Close() error {
	h.cancel()
	h.end.close()
	h.wg.Wait()
	return nil
}

// Guest is the guest end of the channel.
type Guest struct {
	*end
	open   func() (io.ReadWriteCloser, error)
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// ListenGuest serves the guest end on the port that open opens (OpenPort
// in a VM), reopening it whenever it ends, until Close.
func ListenGuest(open func() (io.ReadWriteCloser, error), log *slog.Logger) *Guest {
	ctx, cancel := context.WithCancel(context.Background())
	g := &Guest{end: newEnd(log), open: open, cancel: cancel}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.run(ctx)
	}()
	return g
}

// The guest's wait between two opens of its port that failed: the first
// is reopenFirst, each one after a try that got no session doubles, up
// to reopenMost. A port that can wait for its host end (Port) waits
// instead, at most hostWaitMost at a time.
const (
	reopenFirst  = 10 * time.Millisecond
	reopenMost   = time.Second
	hostWaitMost = 5 * time.Second
)

// hostWaiter is a port that can wait for its host end to connect (Port).
type hostWaiter interface {
	AwaitHost(ctx context.Context, d time.Duration)
}

func (g *Guest) run(ctx context.Context) {
	wait := reopenFirst
	for ctx.Err() == nil {
		port, err := g.open()
		if err == nil {
			for ctx.Err() == nil {
				var s *session
				hs, serr := guestHandshake(port)
				if serr == nil {
					var ys *yamux.Session
					ys, serr = yamux.Server(hs, config(g.log))
					s = &session{Session: ys}
				}
				if serr == nil {
					stop := context.AfterFunc(ctx, func() { s.Close() })
					g.serve(s)
					stop()
					// A session was had: the port is opened again (its
					// close drops what the dead session left in it), at
					// once (the host may be back at once: a reset).
					wait = reopenFirst
					break
				}
				// With no host end connected the port reads EOF at
				// once. Each open and close, and each read, is a message
				// or an exit to QEMU, which under TCG costs the host real
				// CPU: a guest whose hostproxy is stopped keeps its port
				// open and sleeps until a host end connects.
				w, ok := port.(hostWaiter)
				if !ok || !errors.Is(serr, io.EOF) {
					break
				}
				w.AwaitHost(ctx, hostWaitMost)
			}
			port.Close()
		} else {
			g.log.Debug("channel port", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, reopenMost)
	}
}

// Close ends the session and stops reopening the port.
func (g *Guest) Close() error {
	g.cancel()
	g.end.close()
	g.wg.Wait()
	return nil
}

// Listener is a view of the streams the other end opens whose Close stops
// only its own Accept, not the channel (for a server that closes its
// listener when it shuts down).
func (e *end) Listener() net.Listener {
	return &view{end: e, done: make(chan struct{})}
}

type view struct {
	*end
	once sync.Once
	done chan struct{}
}

func (v *view) Accept() (net.Conn, error) {
	select {
	case c := <-v.incoming:
		return c, nil
	case <-v.end.done:
		return nil, ErrClosed
	case <-v.done:
		return nil, ErrClosed
	}
}

func (v *view) Close() error {
	v.once.Do(func() { close(v.done) })
	return nil
}

// stream is a yamux stream whose Close also ends a Read or Write waiting
// on it, as a net.Conn's does: yamux's own Close only half-closes, and a
// Read waiting for a peer that never answers would wait until yamux's
// stream close timeout (5 minutes).
//
// On the host end, Close also makes yamux forget the stream (guard.forget):
// nothing the guest sends on it afterwards is kept.
type stream struct {
	*yamux.Stream
	g *guard // the host end's; nil on the guest's
	// unaccepted is set by Close when the guest had not accepted the
	// stream (the guard forgets it then).
	unaccepted *atomic.Bool
}

func newStream(st *yamux.Stream, g *guard) stream {
	return stream{st, g, new(atomic.Bool)}
}

func (s stream) Close() error {
	if s.g != nil && !s.g.acknowledged(s.StreamID()) {
		s.unaccepted.Store(true)
	}
	err := s.Stream.Close()
	s.Stream.SetDeadline(time.Unix(1, 0))
	if s.g != nil {
		s.g.forget(s.StreamID())
	}
	return err
}

// NeverAccepted tells whether c is a stream the host opened that the guest
// never accepted (acknowledged): whatever was written to it never reached
// a reader in the guest, so a call on it that failed may be sent again.
func NeverAccepted(c net.Conn) bool {
	s, ok := c.(stream)
	return ok && s.g != nil && (s.unaccepted.Load() || !s.g.acknowledged(s.StreamID()))
}
