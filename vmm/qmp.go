package vmm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Event is a QMP event.
type Event struct {
	Name string          `json:"event"`
	Data json.RawMessage `json:"data"`
}

// QMPError is an error QEMU answered a command with.
type QMPError struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *QMPError) Error() string { return "qmp " + e.Command + ": " + e.Class + ": " + e.Desc }

// ErrQMPClosed is returned for commands on a closed connection (QEMU
// exited, or Close was called).
var ErrQMPClosed = errors.New("qmp: connection closed")

// Bounds of the monitor: QEMU is as untrusted as the guest it runs (an
// escaped guest controls what it writes), so neither the size of what it
// says nor the time it takes to answer is left to it.
const (
	// MaxQMPLine bounds one message (a reply or an event): a longer one
	// closes the monitor. QEMU's largest replies here (query-block of a
	// long chain, query-fdsets) are tens of KiB.
	MaxQMPLine = 1 << 20
	// QMPTimeout is a command's deadline when its ctx has none: a wedged
	// monitor cannot hold a sandbox's operation forever.
	QMPTimeout = 30 * time.Second
	// cleanupTimeout bounds the calls that undo a failed step
	// (migrate_cancel, blockdev-del, remove-fd).
	cleanupTimeout = 5 * time.Second
)

// ErrQMPLineTooLong closes a monitor that sent a message longer than
// MaxQMPLine.
var ErrQMPLineTooLong = fmt.Errorf("qmp: a message longer than %d bytes: the monitor is closed", MaxQMPLine)

// QMP is a connection to one QEMU's monitor. Commands may be sent from
// many goroutines; each waits for its own reply.
type QMP struct {
	conn   *net.UnixConn
	events chan Event

	sendMu sync.Mutex // one command on the wire at a time

	mu      sync.Mutex
	next    uint64
	waiting map[string]chan reply
	err     error // set once the reader stops
	done    chan struct{}
}

type reply struct {
	ret json.RawMessage
	err *QMPError
}

// DialQMP connects to the QMP socket at path and negotiates capabilities.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	q := &QMP{
		conn:    c.(*net.UnixConn),
		events:  make(chan Event, 64),
		waiting: map[string]chan reply{},
		done:    make(chan struct{}),
	}
	r := bufio.NewReaderSize(q.conn, 64<<10)
	// The greeting comes first, before any command.
	stop := context.AfterFunc(ctx, func() { q.conn.Close() })
	line, err := readLine(r, MaxQMPLine)
	stop()
	if err != nil {
		q.conn.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := json.Unmarshal(line, &greeting); err != nil || greeting.QMP == nil {
		q.conn.Close()
		return nil, fmt.Errorf("qmp greeting: unexpected %.200q", line)
	}
	go q.read(r)
	if _, err := q.Execute(ctx, "qmp_capabilities", nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// Events delivers QEMU's events. Events that nobody reads are dropped
// when the buffer is full: replies never wait for them.
func (q *QMP) Events() <-chan Event { return q.events }

// Done is closed when the connection ends.
func (q *QMP) Done() <-chan struct{} { return q.done }

// Close ends the connection.
func (q *QMP) Close() error { return q.conn.Close() }

// Execute runs one command and returns its "return" value.
func (q *QMP) Execute(ctx context.Context, command string, args any) (json.RawMessage, error) {
	return q.execute(ctx, command, args, nil)
}

// ExecuteWithFile runs one command, passing f to QEMU with SCM_RIGHTS in
// the same message (getfd, add-fd).
func (q *QMP) ExecuteWithFile(ctx context.Context, command string, args any, f *os.File) (json.RawMessage, error) {
	return q.execute(ctx, command, args, f)
}

// withDefaultTimeout gives ctx QMPTimeout when it has no deadline.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, QMPTimeout)
}

// cleanupContext is the context of a call that undoes a failed step: its
// own short deadline, whatever ended the step's ctx.
func cleanupContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), cleanupTimeout)
}

// cleanup runs a command that undoes a failed step, with its own short
// deadline (cleanupTimeout), whatever ended the step's ctx. Its error is
// dropped: the step has failed already, and says why.
func (q *QMP) cleanup(command string, args any) {
	ctx, cancel := cleanupContext()
	defer cancel()
	q.Execute(ctx, command, args)
}

func (q *QMP) execute(ctx context.Context, command string, args any, f *os.File) (json.RawMessage, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return nil, q.err
	}
	q.next++
	id := strconv.FormatUint(q.next, 10)
	ch := make(chan reply, 1)
	q.waiting[id] = ch
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		delete(q.waiting, id)
		q.mu.Unlock()
	}()

	msg := map[string]any{"execute": command, "id": id}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	b = append(b, '\n')
	q.sendMu.Lock()
	dl, _ := ctx.Deadline()
	q.conn.SetWriteDeadline(dl)
	if f != nil {
		_, _, err = q.conn.WriteMsgUnix(b, unix.UnixRights(int(f.Fd())), nil)
	} else {
		_, err = q.conn.Write(b)
	}
	q.sendMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			r.err.Command = command
			return nil, r.err
		}
		return r.ret, nil
	case <-q.done:
		q.mu.Lock()
		err := q.err
		q.mu.Unlock()
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	case <-ctx.Done():
		return nil, fmt.Errorf("qmp %s: %w", command, ctx.Err())
	}
}

// read dispatches replies by id and events to the channel until the
// connection ends, or QEMU sends a message longer than MaxQMPLine.
func (q *QMP) read(r *bufio.Reader) {
	var err error
	for {
		var line []byte
		line, err = readLine(r, MaxQMPLine)
		if err != nil {
			break
		}
		m, ok := parseMessage(line)
		switch {
		case !ok:
		case m.Event != "":
			select {
			case q.events <- Event{Name: m.Event, Data: m.Data}:
			default:
			}
		case m.ID != nil:
			q.mu.Lock()
			ch := q.waiting[*m.ID]
			q.mu.Unlock()
			if ch != nil {
				// Buffered (1), and an id is answered once: a second
				// reply with the same id is dropped, never waited on.
				select {
				case ch <- reply{ret: m.Return, err: m.Error}:
				default:
				}
			}
		}
	}
	q.mu.Lock()
	q.err = ErrQMPClosed
	switch {
	case errors.Is(err, ErrQMPLineTooLong):
		q.err = fmt.Errorf("%w: %w", ErrQMPClosed, err)
	case err != nil && !errors.Is(err, net.ErrClosed):
		q.err = fmt.Errorf("%w: %v", ErrQMPClosed, err)
	}
	q.mu.Unlock()
	close(q.done)
	close(q.events)
	q.conn.Close()
}

// message is one line QEMU sends: a reply (with the id of its command),
// an event, or the greeting.
type message struct {
	ID     *string         `json:"id"`
	Return json.RawMessage `json:"return"`
	Error  *QMPError       `json:"error"`
	Event  string          `json:"event"`
	Data   json.RawMessage `json:"data"`
}

// parseMessage reads one line of QMP; ok is false for a line that is not
// a JSON object (it is skipped).
func parseMessage(line []byte) (m message, ok bool) {
	if err := json.Unmarshal(line, &m); err != nil {
		return message{}, false
	}
	return m, true
}

// readLine reads up to and including the next '\n', and fails with
// ErrQMPLineTooLong once a line passes max bytes: the memory it takes is
// bounded by max whatever the peer sends.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, ErrQMPLineTooLong
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}
