package guestd

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"strata/internal/api"
	"strata/internal/jsend"
)

// Exec sessions (api.SessionRequest): a program that runs on its own,
// started as an exec's is (findProgram, execEnv, its own process group and,
// inside a microVM, its own cgroup), with pipes or a terminal (a pty of
// its own session) for its standard streams. Its output goes into a
// buffer of api.SessionBuffer bytes (sessionOutput) that every attachment
// reads from its own offset: what one attachment holds is the buffer's
// slices, whatever the others and the program do, and a program never
// waits on a slow attachment (the attachment loses what the buffer let
// go, and is told how much: "dropped"). Stdin is written straight from an
// attachment's frames: a program that does not read it holds that
// attachment's reads back, nothing else.
//
// A session ends when its leader has exited and its output is closed, or
// sessionDrain after the leader exited (processes it left in the
// background holding its pipes do not keep it open); its timeout kills
// it whole (-1, timed_out). A session that is not detachable gets SIGHUP
// when its last attachment closes, or when none came within
// api.SessionAttachWait; when hostproxy ended its last attachment for an
// operation on the sandbox (api.FrameHold), when none came again within
// api.SessionAttachWait. Exited sessions are listed for api.SessionKeep.
//
// Sessions live in guestd's memory: a memory snapshot keeps them, a
// restore or a fork has the snapshot's. So the same session, output
// offsets and all, can run on in several guests, or again from a moment
// a client already saw past: each is another run of it. The guest's
// generation (api.ValidGeneration) names the run: drawn at guestd's start
// and again at each resync, which the host calls after every load of a
// guest's memory (a restore, a fork, a resume); every record and attach
// handshake carries it, and an attachment that names another (?generation=)
// is refused with session_restored rather than given another run's
// output after its own, its stdin sent to another process. A resync of a
// guest whose memory was not loaded (the host healing an unresponsive
// one) draws a new generation too: guestd cannot tell the two apart.

// sessionDrain is how long a session's output is still read after its
// leader exited, for processes that hold its pipes.
const sessionDrain = time.Second

// sessionSet is the sessions of this guest.
type sessionSet struct {
	cg              *execCgroups
	credentialsPath string
	log             *slog.Logger
	// attachWait is api.SessionAttachWait; tests shorten it.
	attachWait time.Duration

	mu   sync.Mutex
	byID map[string]*session
	// generation is the run of this guest's memory (see above); "" until
	// first asked for.
	generation string
}

// newGeneration is 16 random hex digits.
func newGeneration() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// currentLocked is the guest's generation (ss.mu held).
func (ss *sessionSet) currentLocked() string {
	if ss.generation == "" {
		ss.generation = newGeneration()
	}
	return ss.generation
}

// current is the guest's generation.
func (ss *sessionSet) current() string {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.currentLocked()
}

// renew draws a new generation: the guest's memory was loaded again (a
// resync). It returns the new one.
func (ss *sessionSet) renew() string {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	old := ss.generation
	for ss.generation == "" || ss.generation == old {
		ss.generation = newGeneration()
	}
	return ss.generation
}

// session is one program started as a session.
type session struct {
	id         string
	cmd        []string
	tty        bool
	detachable bool
	created    time.Time
	out        *sessionOutput
	proc       *exec.Cmd
	group      *execCgroup
	log        *slog.Logger

	// input is where stdin goes: the pty's master, or the stdin pipe;
	// both pollable, so that closing it wakes a write that waits on a
	// program that does not read.
	input *os.File
	pty   *os.File // the master, with a terminal
	// attachWait is how long a session that is not detachable waits for
	// an attachment (api.SessionAttachWait).
	attachWait time.Duration

	mu       sync.Mutex
	attached int
	attaches int // attachments ever opened
	exitCode *int
	timedOut bool
	ended    time.Time
	done     chan struct{} // closed once exited
}

// newSessionID is "se-" and 16 hex digits.
func newSessionID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "se-" + hex.EncodeToString(b)
}

// start handles POST /v1/sessions.
func (ss *sessionSet) start(r *http.Request) (any, error) {
	req, _, err := api.ReadSession(r)
	if err != nil {
		return nil, err
	}
	// Counted and started under the lock: two starts never pass the
	// limit together (a start takes milliseconds).
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.prune()
	live := 0
	for _, s := range ss.byID {
		if s.running() {
			live++
		}
	}
	if live >= api.MaxSessions {
		return nil, api.ErrSessionLimit
	}
	s, err := ss.startSession(req)
	if err != nil {
		return nil, err
	}
	ss.byID[s.id] = s
	ss.log.Info("session started", "session", s.id, "program", req.Cmd[0], "tty", req.TTY, "detachable", req.Detachable)
	return s.record(ss.currentLocked()), nil
}

// startSession starts req's program and the goroutines that read its
// output and wait for it.
func (ss *sessionSet) startSession(req api.SessionRequest) (*session, error) {
	if err := checkCwd(req.Cwd); err != nil {
		return nil, err
	}
	env := execEnv(credentialsEnv(ss.credentialsPath, ss.log), req.Env)
	if req.TTY && !slices.ContainsFunc(env, func(e string) bool { return len(e) > 5 && e[:5] == "TERM=" }) {
		env = append(env, "TERM=xterm-256color")
	}
	path, err := findProgram(req.Cmd[0], req.Cwd, envPath(env))
	if err != nil {
		return nil, err
	}
	s := &session{id: newSessionID(), cmd: req.Cmd, tty: req.TTY, detachable: req.Detachable, created: time.Now().UTC(),
		out: newSessionOutput(api.SessionBuffer), log: ss.log, done: make(chan struct{}), attachWait: cmp.Or(ss.attachWait, api.SessionAttachWait)}
	if ss.cg != nil {
		if s.group, err = ss.cg.create(); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(path)
	cmd.Args, cmd.Dir, cmd.Env = req.Cmd, req.Cwd, env
	var child, readers []*os.File // the child's ends (closed once it has them); ours to read
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	fail := func(err error) (*session, error) {
		closeAll(child)
		closeAll(readers)
		if s.input != nil {
			s.input.Close()
		}
		if s.group != nil {
			s.group.remove()
		}
		return nil, err
	}
	if req.TTY {
		master, tty, err := openPty()
		if err != nil {
			return fail(err)
		}
		child, readers, s.pty, s.input = append(child, tty), append(readers, master), master, master
		if err := setTermSize(master, req.Rows, req.Cols); err != nil {
			return fail(err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	} else {
		inR, inW, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		child, s.input = append(child, inR), inW
		outR, outW, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		child, readers = append(child, outW), append(readers, outR)
		errR, errW, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		child, readers = append(child, errW), append(readers, errR)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	s.proc = cmd
	if s.group != nil {
		err = ss.cg.start(cmd, s.group)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return fail(startError(req.Cmd[0], err))
	}
	closeAll(child)

	var copies sync.WaitGroup
	for i, f := range readers {
		stream := api.StreamStdout
		if i == 1 {
			stream = api.StreamStderr
		}
		copies.Add(1)
		go func() {
			defer copies.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := f.Read(buf)
				if n > 0 {
					s.out.write(stream, buf[:n])
				}
				if err != nil {
					return // EOF, or EIO from a pty whose every holder closed it
				}
			}
		}()
	}
	output := make(chan struct{})
	go func() {
		copies.Wait()
		close(output)
	}()
	exited := make(chan struct{})
	go func() {
		waitExited(cmd.Process.Pid)
		close(exited)
	}()
	var timeout *time.Timer
	if req.TimeoutS > 0 {
		timeout = time.NewTimer(time.Duration(req.TimeoutS) * time.Second)
	}
	go s.wait(exited, output, readers, timeout)
	if !req.Detachable {
		time.AfterFunc(s.attachWait, func() {
			s.mu.Lock()
			ever := s.attaches > 0
			s.mu.Unlock()
			if !ever && s.running() {
				s.log.Info("session ended: no attachment came", "session", s.id)
				s.signal(syscall.SIGHUP)
			}
		})
	}
	return s, nil
}

// wait waits for the session's end (or kills it at its timeout), then
// reaps its leader and records how it ended.
func (s *session) wait(exited, output <-chan struct{}, readers []*os.File, timeout *time.Timer) {
	var expired <-chan time.Time
	if timeout != nil {
		defer timeout.Stop()
		expired = timeout.C
	}
	timedOut := false
	select {
	case <-exited:
	case <-expired:
		timedOut = true
		s.kill()
		<-exited
	}
	select {
	case <-output:
	case <-time.After(sessionDrain):
	}
	for _, f := range readers {
		f.Close() // ends the copies if something still holds the pipes
	}
	<-output
	err := s.proc.Wait() // reaps the leader: after any kill, so -pid was still its group's
	s.input.Close()
	code := -1
	if !timedOut {
		var exitErr *exec.ExitError
		if err == nil || errors.As(err, &exitErr) {
			code = exitCode(s.proc.ProcessState)
		}
	}
	s.mu.Lock()
	s.exitCode, s.timedOut, s.ended = &code, timedOut, time.Now().UTC()
	s.mu.Unlock()
	s.out.close()
	close(s.done)
	cleanupGroup(s.group, timedOut)
	s.log.Info("session exited", "session", s.id, "exit_code", code, "timed_out", timedOut)
}

func (s *session) running() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// signal sends sig to the session's process group (its terminal's
// session, with a tty: the leader leads both).
func (s *session) signal(sig syscall.Signal) {
	if !s.running() {
		return
	}
	if err := syscall.Kill(-s.proc.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		s.log.Warn("session: signal", "session", s.id, "signal", sig, "err", err)
	}
}

// kill kills the session whole: its cgroup when it has one (processes
// that left its group too), else its process group.
func (s *session) kill() {
	if s.group != nil && s.group.kill() == nil {
		return
	}
	s.signal(syscall.SIGKILL)
}

// record is the session's record in the guest's generation.
func (s *session) record(generation string) api.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := api.Session{ID: s.id, Cmd: s.cmd, TTY: s.tty, Detachable: s.detachable, State: api.SessionRunning,
		Attached: s.attached, CreatedAt: s.created, OutputBytes: s.out.end(), Generation: generation}
	if s.exitCode != nil {
		code, ended := *s.exitCode, s.ended
		rec.State, rec.ExitCode, rec.TimedOut, rec.EndedAt = api.SessionExited, &code, s.timedOut, &ended
	}
	return rec
}

// prune forgets sessions exited more than api.SessionKeep ago, and the
// exited sessions that ended first while more than
// api.MaxSessionsListed are kept (ss.mu held): a list stays within what
// hostproxy relays, however many short sessions a sandbox starts.
func (ss *sessionSet) prune() {
	type ended struct {
		id string
		at time.Time
	}
	var exited []ended
	for id, s := range ss.byID {
		s.mu.Lock()
		done, at := s.exitCode != nil, s.ended
		s.mu.Unlock()
		switch {
		case done && time.Since(at) > api.SessionKeep:
			delete(ss.byID, id)
		case done:
			exited = append(exited, ended{id, at})
		}
	}
	if over := len(ss.byID) - api.MaxSessionsListed; over > 0 {
		slices.SortFunc(exited, func(a, b ended) int { return a.at.Compare(b.at) })
		for _, e := range exited[:min(over, len(exited))] {
			delete(ss.byID, e.id)
		}
	}
}

// list handles GET /v1/sessions: every session kept, oldest first.
func (ss *sessionSet) list(r *http.Request) (any, error) {
	if err := jsend.RejectQueryAndBody(r); err != nil {
		return nil, err
	}
	ss.mu.Lock()
	ss.prune()
	all := make([]*session, 0, len(ss.byID))
	for _, s := range ss.byID {
		all = append(all, s)
	}
	gen := ss.currentLocked()
	ss.mu.Unlock()
	slices.SortFunc(all, func(a, b *session) int { return a.created.Compare(b.created) })
	out := make([]api.Session, 0, len(all))
	for _, s := range all {
		out = append(out, s.record(gen))
	}
	return map[string]any{"sessions": out}, nil
}

func (ss *sessionSet) lookup(r *http.Request) (*session, error) {
	id := r.PathValue("sid")
	if !api.ValidSessionID(id) {
		return nil, api.ErrSessionNotFound.With("session_id", id)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.prune()
	s := ss.byID[id]
	if s == nil {
		return nil, api.ErrSessionNotFound.With("session_id", id)
	}
	return s, nil
}

// get handles GET /v1/sessions/{sid}.
func (ss *sessionSet) get(r *http.Request) (any, error) {
	if err := jsend.RejectQueryAndBody(r); err != nil {
		return nil, err
	}
	s, err := ss.lookup(r)
	if err != nil {
		return nil, err
	}
	return s.record(ss.current()), nil
}

// end handles DELETE /v1/sessions/{sid}: SIGTERM to its process group,
// and the whole session killed api.SessionKillGrace later if it still
// runs. It answers the record at once.
func (ss *sessionSet) end(r *http.Request) (any, error) {
	if err := jsend.RejectQueryAndBody(r); err != nil {
		return nil, err
	}
	s, err := ss.lookup(r)
	if err != nil {
		return nil, err
	}
	if s.running() {
		s.signal(syscall.SIGTERM)
		go func() {
			select {
			case <-s.done:
			case <-time.After(api.SessionKillGrace):
				s.kill()
			}
		}()
		ss.log.Info("session ending", "session", s.id)
	}
	return s.record(ss.current()), nil
}

// attach handles GET /v1/sessions/{sid}/attach: a WebSocket that gets
// the session's output from ?since= (default: the oldest byte the buffer
// holds) and sends it stdin and control messages. With ?generation=, one
// that is not the guest's current generation is session_restored (see
// above); the handshake's answer names the current one
// (api.HeaderSessionGeneration).
func (ss *sessionSet) attach(w http.ResponseWriter, r *http.Request) {
	s, err := ss.lookup(r)
	var since int64 = -1
	gen := ss.current()
	if err == nil {
		if v := r.URL.Query().Get("since"); v != "" {
			if since, err = strconv.ParseInt(v, 10, 64); err != nil || since < 0 {
				err = jsend.InvalidField("since", "since must be a byte offset of the output, 0 or more")
			}
		}
	}
	if v, ok := r.URL.Query()["generation"]; err == nil && ok {
		switch {
		case len(v) != 1 || !api.ValidGeneration(v[0]):
			err = jsend.InvalidField("generation", "generation must be a session record's generation: 16 lowercase hex digits, once")
		case v[0] != gen:
			err = api.ErrSessionRestored.With("session_id", s.id).With("generation", gen)
		}
	}
	if err != nil {
		jsend.Error(w, ss.log, "", err)
		return
	}
	w.Header().Set(api.HeaderSessionGeneration, gen)
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return // Accept answered the client
	}
	c.SetReadLimit(api.MaxSessionFrame)
	s.mu.Lock()
	s.attached++
	s.attaches++
	s.mu.Unlock()
	var held atomic.Bool
	defer func() {
		s.mu.Lock()
		s.attached--
		last, n := s.attached == 0, s.attaches
		s.mu.Unlock()
		switch {
		case !last || s.detachable || !s.running():
		case held.Load():
			s.log.Info("session held: an operation on the sandbox ended its last attachment", "session", s.id, "wait", s.attachWait)
			time.AfterFunc(s.attachWait, func() {
				s.mu.Lock()
				again := s.attached > 0 || s.attaches != n
				s.mu.Unlock()
				if !again && s.running() {
					s.log.Info("session ended: no attachment came again", "session", s.id)
					s.signal(syscall.SIGHUP)
				}
			})
		default:
			s.log.Info("session ended: its last attachment closed", "session", s.id)
			s.signal(syscall.SIGHUP)
		}
	}()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		defer cancel()
		err := s.readAttachment(ctx, c)
		switch {
		case errors.Is(err, errHeld):
			held.Store(true)
		case err != nil:
			c.Close(websocket.StatusPolicyViolation, err.Error())
		}
	}()
	s.writeAttachment(ctx, c, since)
}

// errHeld is readAttachment's end at hostproxy's FrameHold.
var errHeld = errors.New("held")

// readAttachment passes an attachment's frames to the session until the
// attachment closes; a frame it cannot take is an error.
func (s *session) readAttachment(ctx context.Context, c *websocket.Conn) error {
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			return nil // closed
		}
		if typ == websocket.MessageBinary {
			if len(b) == 1 && b[0] == api.FrameHold {
				return errHeld
			}
			if len(b) == 0 || b[0] != api.StreamStdin {
				return errors.New("a binary frame from the client must carry stdin (first byte 0)")
			}
			_, err := s.input.Write(b[1:])
			if err != nil && s.running() {
				s.log.Debug("session: stdin", "session", s.id, "err", err)
			}
			continue
		}
		var m api.SessionControl
		if err := json.Unmarshal(b, &m); err != nil {
			return errors.New("a text frame must be one JSON control message")
		}
		switch m.Type {
		case "resize":
			if err := api.CheckTermSize(m.Rows, m.Cols); err != nil {
				return errors.New("resize: rows and cols must be 1 to 1000")
			}
			if s.pty != nil {
				setTermSize(s.pty, m.Rows, m.Cols)
			}
		case "signal":
			sig, ok := api.SessionSignals[m.Signal]
			if !ok {
				return errors.New("signal: not one of HUP INT QUIT KILL USR1 USR2 TERM CONT STOP TSTP WINCH")
			}
			s.signal(syscall.Signal(sig))
		case "eof":
			if s.pty != nil {
				s.input.Write([]byte{4}) // ^D at the start of a line
			} else {
				s.input.Close()
			}
		default:
			return errors.New("a control message's type must be resize, signal or eof")
		}
	}
}

// writeAttachment sends the session's output from since until the
// session exited and every byte was sent (then "exit" and a normal
// close), or ctx ends.
func (s *session) writeAttachment(ctx context.Context, c *websocket.Conn, since int64) {
	off := since
	for {
		chunks, dropped, next, more, closed := s.out.read(off)
		if dropped > 0 {
			if writeControl(ctx, c, api.SessionControl{Type: "dropped", Bytes: dropped}) != nil {
				return
			}
		}
		for _, ch := range chunks {
			frame := append([]byte{ch.stream}, ch.data...)
			if c.Write(ctx, websocket.MessageBinary, frame) != nil {
				return
			}
		}
		off = next
		if closed && len(chunks) == 0 && dropped == 0 {
			rec := s.record("")
			if writeControl(ctx, c, api.SessionControl{Type: "exit", ExitCode: rec.ExitCode}) == nil {
				c.Close(websocket.StatusNormalClosure, "exited")
			}
			return
		}
		if closed {
			continue // the rest, then the exit
		}
		select {
		case <-more:
		case <-ctx.Done():
			return
		}
	}
}

func writeControl(ctx context.Context, c *websocket.Conn, m api.SessionControl) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return c.Write(ctx, websocket.MessageText, b)
}

// sessionOutput is a session's output: at least its last max bytes
// (and less than one frame more), in chunks
// that know their stream and their offset in the whole output.
type sessionOutput struct {
	max int

	mu     sync.Mutex
	chunks []outputChunk
	held   int
	total  int64 // bytes ever written: the offset of the next
	closed bool
	more   chan struct{} // closed (and replaced) at each write and at close
}

type outputChunk struct {
	stream byte
	off    int64
	data   []byte
}

func newSessionOutput(max int) *sessionOutput {
	return &sessionOutput{max: max, more: make(chan struct{})}
}

// write appends p (copied) to stream's output, in chunks of at most one
// frame, and lets the oldest go past max.
func (o *sessionOutput) write(stream byte, p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(p) > 0 {
		n := min(len(p), api.MaxSessionFrame-1)
		o.chunks = append(o.chunks, outputChunk{stream: stream, off: o.total, data: slices.Clone(p[:n])})
		o.held += n
		o.total += int64(n)
		p = p[n:]
	}
	// At least the last max bytes stay (the oldest chunk goes only when
	// the rest hold max).
	for len(o.chunks) > 1 && o.held-len(o.chunks[0].data) >= o.max {
		o.held -= len(o.chunks[0].data)
		o.chunks[0] = outputChunk{}
		o.chunks = o.chunks[1:]
	}
	close(o.more)
	o.more = make(chan struct{})
}

func (o *sessionOutput) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	close(o.more)
	o.more = make(chan struct{})
}

func (o *sessionOutput) end() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.total
}

// read returns the chunks from offset from (the oldest held when from is
// negative), how many bytes from there are no longer held (dropped), the
// offset after the last chunk, a channel closed at the next write, and
// whether the output is closed. The chunks' data is shared: not to be
// written.
func (o *sessionOutput) read(from int64) (chunks []outputChunk, dropped, next int64, more <-chan struct{}, closed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	oldest := o.total
	if len(o.chunks) > 0 {
		oldest = o.chunks[0].off
	}
	if from < 0 {
		from = oldest
	}
	if from > o.total {
		from = o.total
	}
	if from < oldest {
		dropped, from = oldest-from, oldest
	}
	for _, ch := range o.chunks {
		end := ch.off + int64(len(ch.data))
		if end <= from {
			continue
		}
		if ch.off < from {
			ch = outputChunk{stream: ch.stream, off: from, data: ch.data[from-ch.off:]}
		}
		chunks = append(chunks, ch)
	}
	return chunks, dropped, o.total, o.more, o.closed
}

// openPty opens a pty pair; the master is made non-blocking and wrapped
// again, so that Go's poller serves it: a read or write on it that waits
// ends when it is closed (creack/pty's master is blocking, and a Close
// would not wake it).
func openPty() (master, tty *os.File, err error) {
	m, t, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	fd, err := unix.Dup(int(m.Fd()))
	m.Close()
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		t.Close()
		return nil, nil, err
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "/dev/ptmx"), t, nil
}

// setTermSize sets a pty's window size through its raw descriptor (Fd
// would make the master blocking again).
func setTermSize(master *os.File, rows, cols int) error {
	sc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = sc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	})
	if err != nil {
		return err
	}
	return ioErr
}
