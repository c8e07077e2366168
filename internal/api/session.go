package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"strata/internal/fault"
	"strata/internal/jsend"
)

// Exec sessions: a program started as a session runs on its own; its
// standard streams go through WebSocket attachments (GET
// …/sessions/{sid}/attach), each of which first gets the output it
// missed from the session's buffer.
//
// Frames of an attachment: binary frames carry one stream's bytes after
// a first byte naming the stream (StreamStdin from the client, StreamStdout
// and StreamStderr from the server); text frames carry one JSON control
// message (SessionControl).
const (
	StreamStdin  byte = 0
	StreamStdout byte = 1
	StreamStderr byte = 2
	// FrameHold is a binary frame of this one byte that only hostproxy
	// sends guestd (hostproxy lets a client's binary frames through only
	// as stdin): the attachment is being ended by an operation on the
	// sandbox (a memory snapshot, a pause, a restore, a stop), whose
	// client side gets close code 1011. A session that is not detachable
	// and loses its last attachment this way is held SessionAttachWait
	// for an attachment to come again, rather than ended at once.
	FrameHold byte = 0xff
)

// Limits of sessions, as the contract states them.
const (
	// MaxSessions is the most live (running) sessions of one sandbox.
	MaxSessions = 64
	// MaxSessionsListed is the most sessions guestd keeps, so lists: the
	// live ones and the exited ones kept SessionKeep, of which those that
	// ended first are forgotten past this many.
	MaxSessionsListed = 256
	// MaxSessionRecord bounds a session's record as JSON: the longest cmd
	// written the longest way (MaxExecCmdBytes, every byte escaped as
	// \u00XX, and MaxExecArgs quotes and commas), and 1 KiB for the rest.
	MaxSessionRecord = 6*MaxExecCmdBytes + 3*MaxExecArgs + 1<<10
	// SessionBuffer is how much of its latest output each session keeps
	// for attachments that come later, in bytes.
	SessionBuffer = 1 << 20
	// SessionKeep is how long an exited session stays listed.
	SessionKeep = 10 * time.Minute
	// MaxSessionFrame bounds one frame of an attachment, either way.
	MaxSessionFrame = 64 << 10
	// MaxTermSize bounds a terminal's rows and cols.
	MaxTermSize = 1000
	// DefaultRows and DefaultCols are a terminal's size when the request
	// gives none.
	DefaultRows, DefaultCols = 24, 80
	// SessionAttachWait is how long a session that is not detachable
	// waits for its first attachment, or for one to come again after an
	// operation on the sandbox ended its last (FrameHold), before it is
	// ended (SIGHUP), as it is at once when its last attachment closes
	// otherwise.
	SessionAttachWait = 60 * time.Second
	// SessionKillGrace is the time between a session's SIGTERM and its
	// SIGKILL at a DELETE.
	SessionKillGrace = 5 * time.Second
)

// Session states.
const (
	SessionRunning = "running"
	SessionExited  = "exited"
)

// CodeSessionLimit is the code of a session refused because its sandbox
// has MaxSessions live ones (409); CodeSessionNotFound of an unknown
// session id (404); CodeSessionRestored of an attachment whose
// ?generation= is not the guest's current one (409): the sandbox was
// restored or forked since, and the session is now another run's.
const (
	CodeSessionLimit    = "session_limit"
	CodeSessionNotFound = "session_not_found"
	CodeSessionRestored = "session_restored"
)

var (
	ErrSessionLimit    = fault.New(fault.Conflict, CodeSessionLimit, "the sandbox has as many live sessions as it may; end one first").With("limit", MaxSessions)
	ErrSessionNotFound = fault.New(fault.NotFound, CodeSessionNotFound, "no session of this sandbox has this id")
	ErrSessionRestored = fault.New(fault.Conflict, CodeSessionRestored, "the sandbox was restored or forked since this generation: the session's output and stdin are another run's now; attach without generation to follow that run")
)

// Generations: a guest's sessions live in its memory, which a restore, a
// fork or a resume loads again from a snapshot, so that a session's output
// offsets and its stdin can belong to another run of it. guestd draws a
// new generation at its start and at each resync (what the host calls
// after every such load), and every session record and attach handshake
// carries the current one (Session.Generation, HeaderSessionGeneration):
// a client that passes the generation it knew (?generation=) is refused
// with ErrSessionRestored when it is not the current one, instead of
// having another run's output spliced after what it had.

// HeaderSessionGeneration is the header of an attachment's 101 answer
// that names the guest's current generation.
const HeaderSessionGeneration = "X-Session-Generation"

// ValidGeneration tells whether g has a generation's shape: 16 lowercase
// hex digits.
func ValidGeneration(g string) bool {
	if len(g) != 16 {
		return false
	}
	for _, c := range g {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// SessionRequest is the body of POST …/sessions: a program started as
// exec starts one (cmd, cwd, env, timeout_s with exec's rules; no stdin,
// which comes through attachments), with a terminal of rows × cols when
// tty. A session that is not detachable ends when its last attachment
// closes. TimeoutS 0 is no timeout.
type SessionRequest struct {
	Cmd        []string          `json:"cmd"`
	Cwd        string            `json:"cwd,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	TTY        bool              `json:"tty,omitempty"`
	Rows       int               `json:"rows,omitempty"`
	Cols       int               `json:"cols,omitempty"`
	Detachable bool              `json:"detachable,omitempty"`
	TimeoutS   int               `json:"timeout_s,omitempty"`
}

// Session is a session's record. ExitCode is set once it exited: the
// program's status, 128+N when signal N ended it, -1 when its timeout
// did.
type Session struct {
	ID         string     `json:"id"`
	Sandbox    string     `json:"sandbox,omitempty"`
	Cmd        []string   `json:"cmd"`
	TTY        bool       `json:"tty"`
	Detachable bool       `json:"detachable"`
	State      string     `json:"state"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	TimedOut   bool       `json:"timed_out,omitempty"`
	Attached   int        `json:"attached"`
	CreatedAt  time.Time  `json:"created_at"`
	EndedAt    *time.Time `json:"ended_at,omitempty"`
	// OutputBytes is how many bytes of output the session has made;
	// attach with ?since= an offset below it to get them again, as far
	// as the buffer still holds them.
	OutputBytes int64 `json:"output_bytes"`
	// Generation is the guest's current generation (ValidGeneration):
	// its offsets are of this run of the session. Empty from a guestd
	// that predates generations.
	Generation string `json:"generation,omitempty"`
}

// SessionControl is a text frame of an attachment. From the client:
// "resize" (Rows, Cols), "signal" (Signal: a name of SessionSignals),
// "eof" (the program's stdin is closed; for a terminal, ^D is typed).
// From the server: "exit" (ExitCode, once every byte of output was
// sent), "dropped" (Bytes of output the attachment never gets: it fell
// behind by more than the buffer, or asked for bytes the buffer no longer
// holds).
type SessionControl struct {
	Type     string `json:"type"`
	Rows     int    `json:"rows,omitempty"`
	Cols     int    `json:"cols,omitempty"`
	Signal   string `json:"signal,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Bytes    int64  `json:"bytes,omitempty"`
}

// SessionSignals are the signals a client may send a session's process
// group, by name.
var SessionSignals = map[string]int{
	"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15, "CONT": 18, "STOP": 19, "TSTP": 20, "WINCH": 28,
}

// sessionWire is SessionRequest as decoded, to tell left-out fields.
type sessionWire struct {
	Cmd        *[]string          `json:"cmd"`
	Cwd        *string            `json:"cwd"`
	Env        *map[string]string `json:"env"`
	TTY        *bool              `json:"tty"`
	Rows       *int               `json:"rows"`
	Cols       *int               `json:"cols"`
	Detachable *bool              `json:"detachable"`
	TimeoutS   *int               `json:"timeout_s"`
}

// ParseSession decodes and checks a session request, filling in the
// defaults (cwd "/", a 24 × 80 terminal).
func ParseSession(body []byte) (SessionRequest, error) {
	if len(body) > MaxExecBody {
		return SessionRequest{}, ErrExecBodyTooLarge
	}
	var w sessionWire
	if err := jsend.DecodeBytes(body, &w); err != nil {
		return SessionRequest{}, err
	}
	req := SessionRequest{Cwd: "/"}
	if w.Cmd == nil {
		return SessionRequest{}, jsend.InvalidField("cmd", "cmd is required: the program and its arguments, as an array of strings")
	}
	req.Cmd = *w.Cmd
	if err := checkCmd(req.Cmd); err != nil {
		return SessionRequest{}, err
	}
	if w.Cwd != nil {
		req.Cwd = *w.Cwd
		if !strings.HasPrefix(req.Cwd, "/") || strings.ContainsRune(req.Cwd, 0) {
			return SessionRequest{}, jsend.InvalidField("cwd", "cwd must be an absolute path without NUL bytes")
		}
	}
	if w.Env != nil && len(*w.Env) > 0 {
		req.Env = *w.Env
		if err := checkEnv(req.Env); err != nil {
			return SessionRequest{}, err
		}
	}
	if w.TTY != nil {
		req.TTY = *w.TTY
	}
	if (w.Rows != nil || w.Cols != nil) && !req.TTY {
		return SessionRequest{}, jsend.InvalidField("rows", "rows and cols go with tty: true")
	}
	if req.TTY {
		req.Rows, req.Cols = DefaultRows, DefaultCols
		if w.Rows != nil {
			req.Rows = *w.Rows
		}
		if w.Cols != nil {
			req.Cols = *w.Cols
		}
		if err := CheckTermSize(req.Rows, req.Cols); err != nil {
			return SessionRequest{}, err
		}
	}
	if w.Detachable != nil {
		req.Detachable = *w.Detachable
	}
	if w.TimeoutS != nil {
		req.TimeoutS = *w.TimeoutS
		if req.TimeoutS < 1 || req.TimeoutS > MaxExecTimeoutS {
			return SessionRequest{}, jsend.InvalidField("timeout_s", "timeout_s must be 1 to 3600 seconds").With("limit", MaxExecTimeoutS)
		}
	}
	return req, nil
}

// CheckTermSize fails unless rows and cols are 1 to MaxTermSize.
func CheckTermSize(rows, cols int) error {
	if rows < 1 || rows > MaxTermSize {
		return jsend.InvalidField("rows", fmt.Sprintf("rows must be 1 to %d", MaxTermSize))
	}
	if cols < 1 || cols > MaxTermSize {
		return jsend.InvalidField("cols", fmt.Sprintf("cols must be 1 to %d", MaxTermSize))
	}
	return nil
}

// ReadSession reads and checks a session request as both daemons do: no
// query string, a JSON body of at most MaxExecBody, then ParseSession. It
// returns the body as read, for hostproxy to pass on.
func ReadSession(r *http.Request) (SessionRequest, []byte, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return SessionRequest{}, nil, err
	}
	body, err := jsend.ReadBody(r, MaxExecBody, ErrExecBodyTooLarge)
	if err != nil {
		return SessionRequest{}, nil, err
	}
	req, err := ParseSession(body)
	if err != nil {
		return SessionRequest{}, nil, err
	}
	return req, body, nil
}

// ValidSessionID tells whether id could be a session's ("se-" and 16
// lowercase hex digits): anything else is unknown without asking.
func ValidSessionID(id string) bool {
	rest, ok := strings.CutPrefix(id, "se-")
	if !ok || len(rest) != 16 {
		return false
	}
	for _, c := range rest {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// sessionRecordWire is a record as guestd writes it: pointers tell the
// fields it always writes from those it leaves out.
type sessionRecordWire struct {
	ID          *string    `json:"id"`
	Cmd         *[]string  `json:"cmd"`
	TTY         *bool      `json:"tty"`
	Detachable  *bool      `json:"detachable"`
	State       *string    `json:"state"`
	ExitCode    *int       `json:"exit_code"`
	TimedOut    *bool      `json:"timed_out"`
	Attached    *int       `json:"attached"`
	CreatedAt   *time.Time `json:"created_at"`
	EndedAt     *time.Time `json:"ended_at"`
	OutputBytes *int64     `json:"output_bytes"`
	Generation  *string    `json:"generation"`
}

// ParseSessionRecord decodes a session's record as guestd answers it, for
// hostproxy, which does not trust the guest: at most MaxSessionRecord
// bytes, one object with jsend.DecodeBytes's rules, every field guestd
// writes (no sandbox: that is hostproxy's to add), an id of a session's
// shape, cmd as a request's, a state, an exit code and end exactly when
// exited, counts of 0 or more. So the record holds no more than its text
// and cmd's strings' headers; and its text, checked, may be relayed as
// it was sent (hostproxy does, with the sandbox's id added).
func ParseSessionRecord(b []byte) (Session, error) {
	if len(b) > MaxSessionRecord {
		return Session{}, fmt.Errorf("session record of %d bytes, at most %d", len(b), MaxSessionRecord)
	}
	var w sessionRecordWire
	if err := jsend.DecodeBytes(b, &w); err != nil {
		return Session{}, fmt.Errorf("session record: %w", err)
	}
	if w.ID == nil || w.Cmd == nil || w.TTY == nil || w.Detachable == nil || w.State == nil ||
		w.Attached == nil || w.CreatedAt == nil || w.OutputBytes == nil {
		return Session{}, errors.New("session record: a field guestd always writes is missing")
	}
	if !ValidSessionID(*w.ID) {
		return Session{}, fmt.Errorf("session record: id %.40q", *w.ID)
	}
	if err := checkCmd(*w.Cmd); err != nil {
		return Session{}, fmt.Errorf("session record: %w", err)
	}
	exited := *w.State == SessionExited
	switch {
	case *w.State != SessionRunning && !exited:
		return Session{}, fmt.Errorf("session record: state %.40q", *w.State)
	case exited != (w.ExitCode != nil) || exited != (w.EndedAt != nil) || (!exited && w.TimedOut != nil && *w.TimedOut):
		return Session{}, errors.New("session record: an exit code, end or timeout that does not go with its state")
	case *w.Attached < 0 || *w.OutputBytes < 0:
		return Session{}, errors.New("session record: a negative count")
	case w.Generation != nil && !ValidGeneration(*w.Generation):
		return Session{}, fmt.Errorf("session record: generation %.40q", *w.Generation)
	}
	rec := Session{
		ID: *w.ID, Cmd: *w.Cmd, TTY: *w.TTY, Detachable: *w.Detachable, State: *w.State,
		ExitCode: w.ExitCode, Attached: *w.Attached, CreatedAt: *w.CreatedAt, EndedAt: w.EndedAt,
		OutputBytes: *w.OutputBytes,
	}
	if w.Generation != nil {
		rec.Generation = *w.Generation
	}
	if w.TimedOut != nil {
		rec.TimedOut = *w.TimedOut
	}
	return rec, nil
}

// EachSession calls f with each record of a session list as guestd
// answers it ({"sessions":[record…]}), as sent (raw: a slice of data)
// and decoded, checked as ParseSessionRecord checks one, in order,
// until f fails. A list of more than MaxSessionsListed records is
// refused before its first is decoded: it decodes one record at a time,
// so a list costs no more than its text and one record, however many
// records it holds.
func EachSession(data []byte, f func(raw []byte, rec Session) error) error {
	var list []byte
	err := jsend.EachMember(data, func(k, v []byte) error {
		if string(k) != `"sessions"` || list != nil {
			return fmt.Errorf("session list: member %.40s", k)
		}
		list = v
		return nil
	})
	if err != nil {
		return err
	}
	if list == nil {
		return errors.New("session list: no sessions")
	}
	n := 0
	errTooMany := fmt.Errorf("session list: more than %d sessions", MaxSessionsListed)
	if err := jsend.EachElement(list, func([]byte) error {
		if n++; n > MaxSessionsListed {
			return errTooMany
		}
		return nil
	}); err != nil {
		return fmt.Errorf("session list: %w", err)
	}
	return jsend.EachElement(list, func(b []byte) error {
		rec, err := ParseSessionRecord(b)
		if err != nil {
			return err
		}
		return f(b, rec)
	})
}
