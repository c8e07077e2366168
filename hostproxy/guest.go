package hostproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/guestclient"
	"strata/internal/jsend"
	"strata/internal/servertiming"
)

// Dialer connects to a guest daemon. addr is the guest address without its
// scheme: a socket path for unix, host:port for tcp.
type Dialer func(ctx context.Context, addr string) (net.Conn, error)

// DefaultDialers are the transports known today: unix sockets and TCP.
// A vsock dialer plugs in under its own scheme.
func DefaultDialers() map[string]Dialer {
	var d net.Dialer
	return map[string]Dialer{
		"unix": func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "unix", addr) },
		"tcp":  func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) },
	}
}

// ParseGuestAddress splits a guest address into scheme and address:
// unix:///run/guestd.sock is ("unix", "/run/guestd.sock"), tcp://127.0.0.1:7070
// is ("tcp", "127.0.0.1:7070"). Other schemes are split without checks.
func ParseGuestAddress(s string) (scheme, addr string, err error) {
	scheme, addr, ok := strings.Cut(s, "://")
	if !ok || scheme == "" || addr == "" {
		return "", "", fmt.Errorf("guest address %q: want unix:///path/to.sock or tcp://host:port", s)
	}
	switch scheme {
	case "unix":
		if !path.IsAbs(addr) {
			return "", "", fmt.Errorf("guest address %q: the socket path must be absolute (unix:///path)", s)
		}
	case "tcp":
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return "", "", fmt.Errorf("guest address %q: %w", s, err)
		}
	}
	return scheme, addr, nil
}

// maxGuestReply bounds one guest's answer; a list of many checkpoints is
// well under it.
const maxGuestReply = 16 << 20

// maxGuestHeld bounds the bytes of one guest's answers that hostproxy
// holds at once, over both of its pools (guestclient.Budget).
const maxGuestHeld = 16 << 20

// GuestClient calls guest daemons' local API, through guestclient: the
// host's one client of guestd, with limits on what an answer may hold. It
// keeps two clients per guest address, so a dead guest costs its own
// callers a bounded dial and nobody else anything: one for execs, which
// may last an hour, and one for every other call, so that a sandbox busy
// with long execs still answers checkpoint calls. Each caps the calls in
// flight to its guest (maxGuestCalls); the two share the guest's budget of
// answers held (maxGuestHeld).
type GuestClient struct {
	dialers        map[string]Dialer
	dialTimeout    time.Duration
	requestTimeout time.Duration

	mu    sync.Mutex
	pools map[string]*guestPools
}

// guestPools are the clients of one guest, and the lock under which its
// answers are decoded (decoding).
type guestPools struct {
	calls, exec *guestclient.Client
	decode      sync.Mutex
}

// maxGuestCalls caps the calls in flight to one guest in each pool: a
// guest is untrusted (root inside a sandbox controls it), so a slow one
// must not pin host memory. The exec pool's cap covers its execs and
// the streams hostproxy opens beside it, file transfers and attachments
// (holdStream): every channel stream hostproxy holds to a guest is one
// of 2 × maxGuestCalls.
const maxGuestCalls = 16

// NewGuestClient returns a client that dials with dialers (by scheme),
// bounds each dial by dialTimeout and each call by requestTimeout.
func NewGuestClient(dialers map[string]Dialer, dialTimeout, requestTimeout time.Duration) *GuestClient {
	return &GuestClient{
		dialers:        dialers,
		dialTimeout:    dialTimeout,
		requestTimeout: requestTimeout,
		pools:          map[string]*guestPools{},
	}
}

// Check fails when guest is not an address this client can dial.
func (g *GuestClient) Check(guest string) error {
	scheme, _, err := ParseGuestAddress(guest)
	if err != nil {
		return err
	}
	if g.dialers[scheme] == nil {
		return fmt.Errorf("guest address %q: no transport for scheme %q", guest, scheme)
	}
	return nil
}

// CreateRequest is the body of a capture, after validation at the edge.
type CreateRequest struct {
	Path      string         `json:"path"`
	Name      *string        `json:"name,omitempty"`
	Retention *api.Retention `json:"retention,omitempty"`
}

// CreateCheckpoint captures a directory; it returns guestd's data
// unchanged. A non-empty idempotencyKey is sent as the Idempotency-Key
// header, for guestd to answer a retry with the first answer.
func (g *GuestClient) CreateCheckpoint(ctx context.Context, guest string, req CreateRequest, idempotencyKey string) (*GuestData, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	return g.call(ctx, guest, http.MethodPost, "/v1/checkpoints", body, idempotencyKey)
}

// ListCheckpoints lists every checkpoint of the sandbox, oldest first.
func (g *GuestClient) ListCheckpoints(ctx context.Context, guest string) (*GuestData, error) {
	return g.call(ctx, guest, http.MethodGet, "/v1/checkpoints", nil, "")
}

// ListDirectories lists the managed directories and where each stands
// (extension).
func (g *GuestClient) ListDirectories(ctx context.Context, guest string) (*GuestData, error) {
	return g.call(ctx, guest, http.MethodGet, "/v1/directories", nil, "")
}

// PutCredentials hands the guest what processes inside it need to call
// the API: the API address, the sandbox id and the access token ("" when
// there is none).
func (g *GuestClient) PutCredentials(ctx context.Context, guest string, c api.Credentials) error {
	body, err := json.Marshal(c)
	if err != nil {
		return err
	}
	d, err := g.call(ctx, guest, http.MethodPut, "/v1/credentials", body, "")
	d.Release()
	return err
}

// RestoreCheckpoint restores a checkpoint at its original path; a
// non-empty idempotencyKey is sent as the Idempotency-Key header.
func (g *GuestClient) RestoreCheckpoint(ctx context.Context, guest, checkpointID, idempotencyKey string) (*GuestData, error) {
	return g.call(ctx, guest, http.MethodPost, "/v1/checkpoints/"+url.PathEscape(checkpointID)+"/restore", nil, idempotencyKey)
}

// DeleteCheckpoint removes a checkpoint record.
func (g *GuestClient) DeleteCheckpoint(ctx context.Context, guest, checkpointID string) (*GuestData, error) {
	return g.call(ctx, guest, http.MethodDelete, "/v1/checkpoints/"+url.PathEscape(checkpointID), nil, "")
}

// Health asks the guest daemon whether it is up.
func (g *GuestClient) Health(ctx context.Context, guest string) (*GuestData, error) {
	return g.call(ctx, guest, http.MethodGet, "/v1/health", nil, "")
}

// Exec runs a command in the guest (POST /v1/exec with body, already
// checked); the call may last timeout.
func (g *GuestClient) Exec(ctx context.Context, guest string, body []byte, timeout time.Duration) (*GuestData, error) {
	return g.send(ctx, poolExec, timeout, guest, http.MethodPost, "/v1/exec", body, "")
}

// errStreamLimit is a transfer or attachment refused because the
// guest's long calls (execs, transfers, attachments) take every place of
// their pool.
var errStreamLimit = fault.New(fault.Conflict, "stream_limit", "the sandbox has as many execs, file transfers and attachments under way as it may; wait for one to end").With("limit", maxGuestCalls)

// holdStream takes a place of the guest's exec pool for a stream hostproxy
// opens itself (a file transfer, an attachment) for as long as it lasts,
// so that every stream to the guest counts against the pools' caps; it
// does not wait (errStreamLimit).
func (g *GuestClient) holdStream(guest string) (release func(), err error) {
	c, err := g.client(guest, poolExec)
	if err != nil {
		return nil, fmt.Errorf("guest %s: %w", guest, err)
	}
	release, ok := c.Hold()
	if !ok {
		return nil, errStreamLimit
	}
	return release, nil
}

// Forget drops the clients of guest (a sandbox stopped or deleted).
func (g *GuestClient) Forget(guest string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p := g.pools[guest]; p != nil {
		p.calls.Close()
		p.exec.Close()
		delete(g.pools, guest)
	}
}

// Close drops idle connections to every guest.
func (g *GuestClient) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range g.pools {
		p.calls.Close()
		p.exec.Close()
	}
}

// pool names one of a guest's two clients.
type pool int

const (
	poolCalls pool = iota
	poolExec
)

// client returns guest's client p, making both on first use.
func (g *GuestClient) client(guest string, p pool) (*guestclient.Client, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	pools := g.pools[guest]
	if pools == nil {
		scheme, addr, err := ParseGuestAddress(guest)
		if err != nil {
			return nil, err
		}
		dial := g.dialers[scheme]
		if dial == nil {
			return nil, fmt.Errorf("no transport for scheme %q", scheme)
		}
		dialTimeout := g.dialTimeout
		d := func(ctx context.Context) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, dialTimeout)
			defer cancel()
			return dial(ctx, addr)
		}
		budget := guestclient.NewBudget(maxGuestHeld)
		lim := guestclient.Limits{Calls: maxGuestCalls, MaxAnswer: maxGuestReply, Timeout: g.requestTimeout}
		pools = &guestPools{calls: guestclient.New(d, lim, budget), exec: guestclient.New(d, lim, budget)}
		g.pools[guest] = pools
	}
	if p == poolExec {
		return pools.exec, nil
	}
	return pools.calls, nil
}

// decoding runs check, which decodes a part of guest's answer held
// (a session list's records), under the guest's lock: a guest's answers
// are decoded one at a time, so what their decoding holds beside the
// answers (one record's) is one guest's figure, however many clients
// call at once.
func (g *GuestClient) decoding(guest string, check func() error) error {
	g.mu.Lock()
	p := g.pools[guest]
	g.mu.Unlock()
	if p == nil {
		// Forgotten since the call: nothing else decodes for it.
		return check()
	}
	p.decode.Lock()
	defer p.decode.Unlock()
	return check()
}

type requestIDKey struct{}

// withRequestID carries the public request id to the guest, so that one
// id names a request in both daemons' logs.
func withRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// call sends one request and turns the answer into data or an error: a
// guest's fail is relayed as the same *fault.Error; a 5xx, an unreachable
// guest or a timeout become errors without the guest's text. A non-empty
// idempotencyKey goes out as the Idempotency-Key header, as the client
// sent it (checked by api.IdempotencyKey).
func (g *GuestClient) call(ctx context.Context, guest, method, p string, body []byte, idempotencyKey string) (*GuestData, error) {
	return g.send(ctx, poolCalls, g.requestTimeout, guest, method, p, body, idempotencyKey)
}

// send is call through one pool, with a timeout of its own. A call that
// reads (GET), puts (PUT) or carries an Idempotency-Key may be sent again
// once when its stream died before any answer (a channel session reset).
func (g *GuestClient) send(ctx context.Context, pl pool, timeout time.Duration, guest, method, p string, body []byte, idempotencyKey string) (*GuestData, error) {
	c, err := g.client(guest, pl)
	if err != nil {
		return nil, fmt.Errorf("guest %s: %w", guest, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	h := http.Header{}
	if body != nil {
		h.Set("Content-Type", "application/json")
	}
	h.Set("Accept", "application/json")
	if idempotencyKey != "" {
		h.Set(api.HeaderIdempotencyKey, idempotencyKey)
	}
	if id, ok := ctx.Value(requestIDKey{}).(string); ok {
		h.Set(jsend.HeaderRequestID, id)
	}
	t0 := time.Now()
	resp, err := c.Do(ctx, guestclient.Request{
		Method: method, Path: p, Header: h, Body: body, Timeout: timeout,
		Idempotent: method == http.MethodGet || method == http.MethodPut || idempotencyKey != "",
	})
	if err != nil {
		return nil, g.transportError(ctx, guest, err)
	}
	addGuestTiming(ctx, time.Since(t0), resp.Header)
	reply := resp.Body
	switch {
	case resp.Status == http.StatusOK:
		data, err := jsend.ParseSuccess(reply)
		if err != nil {
			resp.Release()
			return nil, errGuestAnswer.Wrap(fmt.Errorf("guest %s: %w: %q", guest, err, head(reply, 200)))
		}
		// data is a slice of the answer: it stays held until the
		// handler wrote it.
		return &GuestData{Data: data, answer: resp}, nil
	}
	// A fail is copied out of the answer (at most jsend.MaxFailBody
	// bytes), which goes back to the budget at once.
	defer resp.Release()
	switch {
	case resp.Status >= 400 && resp.Status < 500:
		return nil, guestFail(guest, resp.Status, reply)
	case resp.Status >= 500:
		cause := fmt.Errorf("guest %s answered %d: %q", guest, resp.Status, head(reply, 500))
		if fe := guest5xx[resp.Status]; fe != nil {
			return nil, fe.Wrap(cause)
		}
		return nil, cause
	default:
		return nil, errGuestAnswer.Wrap(fmt.Errorf("guest %s: unexpected status %d", guest, resp.Status))
	}
}

// head is the first n bytes of a guest's answer, for a log: fmt's
// precision (%.200q) copies a whole []byte before it cuts it (16 MiB
// for a 16 MiB answer).
func head(b []byte, n int) []byte { return b[:min(len(b), n)] }

// guestFailKinds are the kinds of guestd's fails: the statuses a guest's
// refusal of a HEAD, which has no body to tell its code, may have.
var guestFailKinds = func() map[fault.Kind]bool {
	m := map[fault.Kind]bool{}
	for _, k := range api.GuestFailCodes {
		m[k] = true
	}
	return m
}()

// guestFail is the error a guest's client error (status, body) is
// answered with: guestd's fail as it was sent (jsend.ParseFail's bounds)
// when its code is one guestd answers with, with its status
// (api.GuestFailCodes); errGuestAnswer otherwise, so that no guest can
// answer for the edge (401, 403, 429, sandbox_not_found) or make up codes.
func guestFail(guest string, status int, body []byte) error {
	fe, err := jsend.ParseFail(status, body)
	if err != nil {
		return errGuestAnswer.Wrap(fmt.Errorf("guest %s: %w: %q", guest, err, head(body, 200)))
	}
	if kind, ok := api.GuestFailCodes[fe.Code]; !ok || kind != fe.Kind {
		return errGuestAnswer.Wrap(fmt.Errorf("guest %s answered %d %.80q, not a fail of guestd's", guest, status, fe.Code))
	}
	return fe
}

// GuestData is the data of a guest's answer, held within the guest's
// budget of answers (maxGuestHeld) until Release: a handler releases it
// once it has written it, so that answers a slow client reads count
// against the budget, not beside it.
type GuestData struct {
	// Data is a slice of the held answer: not to be used after Release.
	Data   json.RawMessage
	answer *guestclient.Answer
	// encode, when set, writes what the client sees in place of Data,
	// from Data as it is written (a session's records, checked, with the
	// sandbox's id put in), so that nothing but the held answer is held
	// whole. It does not fail; w's errors (a client gone) are not its.
	encode func(w io.Writer) error
}

// write writes d as the data of a JSend success answered with status.
func (d *GuestData) write(w http.ResponseWriter, status int) {
	if d.encode == nil {
		jsend.SuccessStream(w, status, func(w io.Writer) error {
			_, _ = w.Write(d.Data)
			return nil
		})
		return
	}
	jsend.SuccessStream(w, status, d.encode)
}

// Release gives the answer's bytes back to the guest's budget. It may be
// called on nil and more than once.
func (d *GuestData) Release() {
	if d == nil {
		return
	}
	d.answer.Release()
	d.Data = nil
}

// transportError classifies a failed exchange: the client's own
// cancellation stays a context error; everything else is the guest's
// fault and answers 503.
func (g *GuestClient) transportError(ctx context.Context, guest string, err error) error {
	cause := fmt.Errorf("guest %s: %w", guest, err)
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return errGuestUnavailable.Wrap(cause)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || isTimeout(err) {
		return errGuestTimeout.Wrap(cause)
	}
	if errors.Is(err, context.Canceled) {
		return cause
	}
	return errGuestUnavailable.Wrap(cause)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// addGuestTiming adds a guest call to the request's Server-Timing:
// "channel", the call's time beyond the guest's own total (the channel
// both ways and this client), then the guest's metrics under "guest."
// (parsed within servertiming's bounds: the guest is not trusted, and a
// guest that lies about its times misleads only its own owner).
func addGuestTiming(ctx context.Context, d time.Duration, h http.Header) {
	ms := servertiming.Parse(h.Get(servertiming.Header))
	var total time.Duration
	for _, m := range ms {
		if m.Name == "total" {
			total = m.Dur
		}
	}
	servertiming.Add(ctx, "channel", max(d-total, 0))
	for _, m := range ms {
		servertiming.Add(ctx, "guest."+m.Name, m.Dur)
	}
}
