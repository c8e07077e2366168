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
	line, err := r.ReadBytes('\n')
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

func (q *QMP) execute(ctx context.Context, command string, args any, f *os.File) (json.RawMessage, error) {
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
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetWriteDeadline(dl)
	} else {
		q.conn.SetWriteDeadline(time.Time{})
	}
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
// connection ends.
func (q *QMP) read(r *bufio.Reader) {
	var err error
	for {
		var line []byte
		line, err = r.ReadBytes('\n')
		if err != nil {
			break
		}
		var m struct {
			ID     *string         `json:"id"`
			Return json.RawMessage `json:"return"`
			Error  *QMPError       `json:"error"`
			Event  string          `json:"event"`
			Data   json.RawMessage `json:"data"`
		}
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		switch {
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
				ch <- reply{ret: m.Return, err: m.Error}
			}
		}
	}
	q.mu.Lock()
	q.err = ErrQMPClosed
	if err != nil && !errors.Is(err, net.ErrClosed) {
		q.err = fmt.Errorf("%w: %v", ErrQMPClosed, err)
	}
	q.mu.Unlock()
	close(q.done)
	close(q.events)
	q.conn.Close()
}
