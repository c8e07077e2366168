package hostproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/labstack/echo/v4"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/jsend"
)

// Exec sessions (api.SessionRequest): records are guestd's, passed on
// with the sandbox's id added; an attachment is two WebSockets, the
// client's and one to guestd through the channel, whose frames hostproxy
// passes on one at a time (each at most api.MaxSessionFrame bytes: what
// one attachment makes hostproxy hold is four frames, whatever the guest
// sends). A sandbox has at most maxAttachments at once, an account
// maxAccountAttachments (so that no account takes the host's from the
// others), the host maxAllAttachments; each holds a place of its guest's
// exec pool (holdStream) while it lasts. A memory snapshot, pause,
// restore, stop or delete of the sandbox ends its attachments first with
// close code 1011 and a reason (endAttachments): its guest is about to
// stop, or to become another moment's.

const (
	maxAttachments        = 16
	maxAccountAttachments = 1024
	maxAllAttachments     = 4096
)

// SessionProtocol is the WebSocket subprotocol of an attachment. A client
// that cannot send the X-Api-Key header (a browser's or Node's
// WebSocket) offers its key as one more subprotocol, "key." and the key.
const SessionProtocol = "strata.v1"

// keyProtocol is the prefix of a subprotocol that carries an API key.
const keyProtocol = "key."

var (
	errAttachLimit        = fault.New(fault.Conflict, "attach_limit", "the sandbox has as many attachments as it may; close one first").With("limit", maxAttachments)
	errAccountAttachLimit = fault.New(fault.Conflict, "attach_limit", "the account has as many attachments as it may; close one first").With("limit", maxAccountAttachments)
	errHostAttachLimit    = fault.New(fault.Conflict, "attach_limit", "the host has as many attachments as it may; retry later").With("limit", maxAllAttachments)
)

// attachments are the attachments open, by sandbox, and their count by
// account and in all.
type attachments struct {
	mu        sync.Mutex
	by        map[string]map[*attached]struct{}
	byAccount map[string]int
	total     int
}

// attached is one open attachment: its end closes its client's side
// with a code and reason, and the guest's. An end asked for before the
// attachment is joined (arm) happens as it is joined.
type attached struct {
	mu      sync.Mutex
	end     func(code websocket.StatusCode, reason string)
	pending *websocket.CloseError
	// operation is set when endAttachments ends it.
	operation bool
}

// holdWait bounds the write of api.FrameHold to the guest.
const holdWait = 200 * time.Millisecond

// byOperation tells whether endAttachments ended the attachment.
func (at *attached) byOperation() bool {
	at.mu.Lock()
	defer at.mu.Unlock()
	return at.operation
}

func (at *attached) arm(end func(code websocket.StatusCode, reason string)) {
	at.mu.Lock()
	at.end = end
	p := at.pending
	at.mu.Unlock()
	if p != nil {
		end(p.Code, p.Reason)
	}
}

func (at *attached) stop(code websocket.StatusCode, reason string) {
	at.mu.Lock()
	at.operation = true
	end := at.end
	if end == nil {
		at.pending = &websocket.CloseError{Code: code, Reason: reason}
	}
	at.mu.Unlock()
	if end != nil {
		end(code, reason)
	}
}

func (a *attachments) add(account, id string, at *attached) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.by == nil {
		a.by, a.byAccount = map[string]map[*attached]struct{}{}, map[string]int{}
	}
	switch {
	case len(a.by[id]) >= maxAttachments:
		return errAttachLimit
	case a.byAccount[account] >= maxAccountAttachments:
		return errAccountAttachLimit
	case a.total >= maxAllAttachments:
		return errHostAttachLimit
	}
	if a.by[id] == nil {
		a.by[id] = map[*attached]struct{}{}
	}
	a.by[id][at] = struct{}{}
	a.byAccount[account]++
	a.total++
	return nil
}

func (a *attachments) remove(account, id string, at *attached) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.by[id][at]; ok {
		delete(a.by[id], at)
		a.total--
		if len(a.by[id]) == 0 {
			delete(a.by, id)
		}
		if a.byAccount[account]--; a.byAccount[account] <= 0 {
			delete(a.byAccount, account)
		}
	}
}

// endAttachments ends every attachment of sandbox id with close code
// 1011 and reason.
func (s *Server) endAttachments(id, reason string) {
	s.attached.mu.Lock()
	var all []*attached
	for at := range s.attached.by[id] {
		all = append(all, at)
	}
	s.attached.mu.Unlock()
	// All at once, and never longer than endWait: a client that ignores
	// the close frame must not hold up the operation.
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, at := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at.stop(websocket.StatusInternalError, reason)
		}()
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(endWait):
	}
}

// endWait bounds how long ending a sandbox's attachments holds up the
// operation that ends them (their guest sides are closed at once).
const endWait = 2 * time.Second

// sessionRoute checks a session route (and a files route), after
// authorize (authz.go: the exec scope, the files scope): the sandbox
// running.
func (s *Server) sessionRoute(c echo.Context) (Sandbox, error) {
	sb := sandboxOf(c)
	if sb.State != StateRunning {
		return sb, errSandboxNotRunning.With("state", string(sb.State))
	}
	return sb, nil
}

// sessionID is the route's session id, or session_not_found.
func sessionID(c echo.Context) (string, error) {
	id := c.Param("sid")
	if !api.ValidSessionID(id) {
		return "", api.ErrSessionNotFound.With("session_id", id)
	}
	return id, nil
}

// withSandbox checks guestd's session record, or list of records
// (api.EachSession: at most api.MaxSessionsListed records, each bounded,
// decoded one at a time, one guest's at a time), and sets d to be
// written with the sandbox's id added to each record: the records as the
// guest sent them, once checked, so that writing them decodes nothing
// and what the answer holds until it is written is the guest's text,
// within the guest's budget, whatever it lists. A record or list out of
// bounds is errGuestAnswer; d is released then.
func (s *Server) withSandbox(d *GuestData, guest, id string, list bool) (*GuestData, error) {
	var records [][]byte // slices of d.Data
	err := s.guests.decoding(guest, func() error {
		if !list {
			records = [][]byte{bytes.TrimLeft(d.Data, " \t\r\n")}
			_, err := api.ParseSessionRecord(records[0])
			return err
		}
		return api.EachSession(d.Data, func(raw []byte, _ api.Session) error {
			records = append(records, raw)
			return nil
		})
	})
	if err != nil {
		d.Release()
		return nil, errGuestAnswer.Wrap(fmt.Errorf("guest %s: %w", guest, err))
	}
	// A checked record is an object with members: the sandbox's id goes
	// in as its first.
	sandbox, _ := json.Marshal(id)
	field := append(append([]byte(`"sandbox":`), sandbox...), ',')
	write := func(w io.Writer, raw []byte) {
		_, _ = w.Write(raw[:1])
		_, _ = w.Write(field)
		_, _ = w.Write(raw[1:])
	}
	d.encode = func(w io.Writer) error {
		if !list {
			write(w, records[0])
			return nil
		}
		_, _ = io.WriteString(w, `{"sessions":[`)
		for i, raw := range records {
			if i > 0 {
				_, _ = io.WriteString(w, ",")
			}
			write(w, raw)
		}
		_, _ = io.WriteString(w, "]}")
		return nil
	}
	return d, nil
}

// startSession is POST …/sessions: 201 and the record.
func (s *Server) startSession(c echo.Context) error {
	sb, err := s.sessionRoute(c)
	if err != nil {
		return err
	}
	release, err := s.holdBody(c, api.MaxExecBody)
	if err != nil {
		return err
	}
	defer release()
	req, body, err := api.ReadSession(c.Request())
	if err != nil {
		return err
	}
	// The sandbox's env, under the session's own, as exec's.
	if body, err = api.WithSandboxEnv(body, sb.Env, req.Env); err != nil {
		return err
	}
	v, err := s.guestCall(c, "session", func() (*GuestData, error) {
		return s.guests.call(c.Request().Context(), sb.Guest, http.MethodPost, "/v1/sessions", body, "")
	})
	if err != nil {
		return err
	}
	d, err := s.withSandbox(v.(*GuestData), sb.Guest, sb.ID, false)
	if err != nil {
		return err
	}
	defer d.Release()
	d.write(c.Response(), http.StatusCreated)
	return nil
}

// sessionCall is a list, get or delete of sessions: path is guestd's.
func (s *Server) sessionCall(method string, one bool) func(c echo.Context) (any, error) {
	return func(c echo.Context) (any, error) {
		sb, err := s.sessionRoute(c)
		if err != nil {
			return nil, err
		}
		if err := jsend.RejectQueryAndBody(c.Request()); err != nil {
			return nil, err
		}
		p := "/v1/sessions"
		if one {
			id, err := sessionID(c)
			if err != nil {
				return nil, err
			}
			p += "/" + id
		}
		v, err := s.guestCall(c, "session", func() (*GuestData, error) {
			return s.guests.call(c.Request().Context(), sb.Guest, method, p, nil, "")
		})
		if err != nil {
			return nil, err
		}
		return s.withSandbox(v.(*GuestData), sb.Guest, sb.ID, !one)
	}
}

// attachSession is GET …/sessions/{sid}/attach: the guest's attachment
// is opened first (its refusal is the answer, as JSend: a session_restored
// of a ?generation= that is not the guest's current one among them), then
// the client's WebSocket is accepted, its handshake naming the guest's
// generation, and the two are joined.
func (s *Server) attachSession(c echo.Context) error {
	sb, err := s.sessionRoute(c)
	if err != nil {
		return err
	}
	id, err := sessionID(c)
	if err != nil {
		return err
	}
	r := c.Request()
	q := url.Values{}
	for k, v := range r.URL.Query() {
		if k != "since" && k != "generation" || len(v) != 1 {
			return jsend.InvalidField(k, "the query parameters are since and generation, each once")
		}
		if n, err := strconv.ParseInt(v[0], 10, 64); k == "since" && (err != nil || n < 0) {
			return jsend.InvalidField("since", "since must be a byte offset of the output, 0 or more")
		}
		if k == "generation" && !api.ValidGeneration(v[0]) {
			return jsend.InvalidField("generation", "generation must be a session record's generation: 16 lowercase hex digits")
		}
		q.Set(k, v[0])
	}
	// The client's handshake is checked before the guest is dialled: a
	// bad one must not count as an attachment that came and went (a
	// session that is not detachable would end).
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || !headerHas(r.Header, "Connection", "upgrade") ||
		r.Header.Get("Sec-WebSocket-Version") != "13" || r.Header.Get("Sec-WebSocket-Key") == "" {
		return jsend.InvalidField("upgrade", "attach is a WebSocket: send a WebSocket handshake (Upgrade: websocket, version 13)")
	}
	at := &attached{}
	if err := s.attached.add(sb.Account, sb.ID, at); err != nil {
		return err
	}
	defer s.attached.remove(sb.Account, sb.ID, at)
	releaseStream, err := s.guests.holdStream(sb.Guest)
	if err != nil {
		return err
	}
	defer releaseStream()

	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	path := "/v1/sessions/" + id + "/attach"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	guest, generation, err := s.guests.AttachSession(ctx, sb.Guest, path)
	if err != nil {
		return err
	}
	defer guest.CloseNow()
	if generation != "" {
		c.Response().Header().Set(api.HeaderSessionGeneration, generation)
	}
	client, err := websocket.Accept(c.Response(), r, &websocket.AcceptOptions{Subprotocols: []string{SessionProtocol}, InsecureSkipVerify: true})
	if err != nil {
		return nil // Accept answered the client
	}
	defer client.CloseNow()
	client.SetReadLimit(api.MaxSessionFrame)

	var once sync.Once
	// fromClient is closed once the client's frames stop coming (its
	// reader below has returned).
	fromClient := make(chan struct{})
	end := func(code websocket.StatusCode, reason string) {
		once.Do(func() {
			if at.byOperation() {
				// An operation's end (endAttachments): the client's side
				// first, with its close frame, while its reader still
				// passes on what the client sent before it saw the close
				// (stdin it would not know to send again); then the
				// guest is told to hold the session for the client to
				// attach again, in a frame no client can send (one
				// write, bounded: the guest may not read it).
				client.Close(code, reason)
				select {
				case <-fromClient:
				case <-time.After(holdWait):
				}
				wctx, done := context.WithTimeout(ctx, holdWait)
				guest.Write(wctx, websocket.MessageBinary, []byte{api.FrameHold})
				done()
				guest.CloseNow()
				cancel()
				return
			}
			// The guest's side at once (no handshake with a guest that
			// may not answer); the client's with its close frame.
			guest.CloseNow()
			client.Close(code, reason)
			cancel()
		})
	}
	at.arm(end)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(fromClient)
		// The client's frames: stdin (binary, first byte 0) and control.
		for {
			typ, b, err := client.Read(ctx)
			if err != nil {
				if !at.byOperation() {
					end(websocket.StatusNormalClosure, "")
				}
				return
			}
			if typ == websocket.MessageBinary && (len(b) == 0 || b[0] != api.StreamStdin) {
				end(websocket.StatusPolicyViolation, "a binary frame from the client must carry stdin (first byte 0)")
				return
			}
			if guest.Write(ctx, typ, b) != nil {
				end(websocket.StatusInternalError, "the guest's side of the attachment ended")
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for {
			typ, b, err := guest.Read(ctx)
			if err != nil {
				if st := websocket.CloseStatus(err); st != -1 {
					// guestd's own close (1000 after the exit, 1008):
					// the same to the client.
					end(st, closeReason(err))
				} else {
					end(websocket.StatusInternalError, "the guest's side of the attachment ended")
				}
				return
			}
			if client.Write(ctx, typ, b) != nil {
				end(websocket.StatusNormalClosure, "")
				return
			}
		}
	}()
	wg.Wait()
	return nil
}

// closeReason is the reason of a close error.
func closeReason(err error) string {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Reason
	}
	return ""
}

// AttachSession opens a WebSocket to guestd's path (a session's attach)
// through the guest's exec client, and returns it with the generation
// its handshake names ("" when none of a generation's shape: a guestd
// that predates them, or a guest's nonsense). A refusal (guestd's JSend
// fail, such as session_not_found) is returned as the error it carries.
func (g *GuestClient) AttachSession(ctx context.Context, guest, path string) (*websocket.Conn, string, error) {
	c, err := g.client(guest, poolExec)
	if err != nil {
		return nil, "", fmt.Errorf("guest %s: %w", guest, err)
	}
	dctx, cancel := context.WithTimeout(ctx, g.requestTimeout)
	defer cancel()
	h := http.Header{}
	if id, ok := ctx.Value(requestIDKey{}).(string); ok {
		h.Set(jsend.HeaderRequestID, id)
	}
	conn, resp, err := websocket.Dial(dctx, "ws://guestd"+path, &websocket.DialOptions{HTTPClient: c.HTTPClient(), HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 && resp.StatusCode < 500 {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, jsend.MaxFailBody+1))
			return nil, "", guestFail(guest, resp.StatusCode, body)
		}
		return nil, "", g.transportError(ctx, guest, err)
	}
	conn.SetReadLimit(api.MaxSessionFrame)
	generation := resp.Header.Get(api.HeaderSessionGeneration)
	if !api.ValidGeneration(generation) {
		generation = ""
	}
	return conn, generation, nil
}

// headerHas tells whether header name lists token (comma-separated, any
// case).
func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
