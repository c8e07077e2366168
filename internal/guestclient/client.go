package guestclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"strata/channel"
)

// ErrAnswerTooLarge is an answer whose body is over Limits.MaxAnswer.
var ErrAnswerTooLarge = errors.New("guest answer too large")

// Limits bound what one client's calls can hold.
type Limits struct {
	// Calls is how many calls may be in flight at once (16 when zero).
	Calls int
	// MaxHeader bounds an answer's status line and headers (64 KiB when
	// zero).
	MaxHeader int64
	// MaxAnswer bounds one answer's body (1 MiB when zero); it must not
	// be over the budget's size.
	MaxAnswer int64
	// Timeout is a call's deadline when its Request has none (30 s when
	// zero).
	Timeout time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.Calls == 0 {
		l.Calls = 16
	}
	if l.MaxHeader == 0 {
		l.MaxHeader = 64 << 10
	}
	if l.MaxAnswer == 0 {
		l.MaxAnswer = 1 << 20
	}
	if l.Timeout == 0 {
		l.Timeout = 30 * time.Second
	}
	return l
}

// Budget is the bytes of answers that the clients of one guest may hold
// at once.
type Budget struct {
	size int64
	sem  *semaphore.Weighted
}

// NewBudget returns a budget of size bytes.
func NewBudget(size int64) *Budget {
	return &Budget{size: size, sem: semaphore.NewWeighted(size)}
}

// Dial opens a connection to guestd.
type Dial func(ctx context.Context) (net.Conn, error)

// Client calls one guest's daemon.
type Client struct {
	lim    Limits
	calls  *semaphore.Weighted
	budget *Budget
	t      *http.Transport
}

// New returns a client that reaches the guest through dial, within lim,
// holding answers within budget.
func New(dial Dial, lim Limits, budget *Budget) *Client {
	lim = lim.withDefaults()
	if lim.MaxAnswer > budget.size {
		lim.MaxAnswer = budget.size
	}
	return &Client{
		lim:    lim,
		calls:  semaphore.NewWeighted(int64(lim.Calls)),
		budget: budget,
		t: &http.Transport{
			Proxy: nil,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				c, err := dial(ctx)
				if err == nil {
					if slot, ok := ctx.Value(connKey{}).(*net.Conn); ok {
						*slot = c
					}
				}
				return c, err
			},
			DisableKeepAlives:      true,
			DisableCompression:     true,
			MaxResponseHeaderBytes: lim.MaxHeader,
		},
	}
}

// Hold takes one of the client's places for calls in flight (Limits.
// Calls) for a stream the caller opens itself through HTTPClient or
// StreamClient (an upgrade, a streamed body), for as long as it lasts:
// so that every stream to the guest counts against one cap, whatever
// opened it. It does not wait: ok is false when every place is taken.
// release gives the place back; it may be called more than once.
func (c *Client) Hold() (release func(), ok bool) {
	if !c.calls.TryAcquire(1) {
		return nil, false
	}
	var once sync.Once
	return func() { once.Do(func() { c.calls.Release(1) }) }, true
}

// HTTPClient is an HTTP client of the guest's transport, for an upgrade
// (a WebSocket): its answer's header is bounded as every call's, and
// nothing else of the client's limits applies (the caller bounds what
// the connection carries). A redirect is the answer, never followed: a
// guest must not send the host's requests again where it likes.
func (c *Client) HTTPClient() *http.Client {
	return &http.Client{Transport: c.t, CheckRedirect: noRedirects}
}

// StreamClient is HTTPClient for a request whose body and answer stream:
// the answer's header must come within headerTimeout of the request's
// end (its body sent), however long the body takes.
func (c *Client) StreamClient(headerTimeout time.Duration) *http.Client {
	t := c.t.Clone()
	t.ResponseHeaderTimeout = headerTimeout
	return &http.Client{Transport: t, CheckRedirect: noRedirects}
}

func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Request is one call.
type Request struct {
	Method, Path string
	Header       http.Header
	Body         []byte
	// Timeout is the call's deadline (the client's Limits.Timeout when
	// zero).
	Timeout time.Duration
	// MaxAnswer bounds this call's answer below the client's.
	MaxAnswer int64
	// Idempotent calls are sent again once when their connection fails
	// before an answer.
	Idempotent bool
}

// Answer is a guest's answer, read whole.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
	held   int64
	budget *Budget
}

// Release gives the answer's bytes back to the budget; Body must not be
// used afterwards. It may be called more than once.
func (a *Answer) Release() {
	if a == nil || a.held == 0 {
		return
	}
	a.budget.sem.Release(a.held)
	a.held, a.Body = 0, nil
}

type connKey struct{}

// Do sends req and reads the answer whole; the caller releases it.
func (c *Client) Do(ctx context.Context, req Request) (*Answer, error) {
	timeout := req.Timeout
	if timeout == 0 {
		timeout = c.lim.Timeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.calls.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	defer c.calls.Release(1)
	for attempt := 0; ; attempt++ {
		var conn net.Conn
		a, err := c.once(context.WithValue(ctx, connKey{}, &conn), req)
		if err == nil || attempt > 0 || ctx.Err() != nil || conn == nil || a != nil {
			return a, err
		}
		if !channel.NeverAccepted(conn) && !req.Idempotent {
			return nil, err
		}
	}
}

// once is one attempt; a non-nil answer with an error is one that failed
// while its body was read (not retried).
func (c *Client) once(ctx context.Context, req Request) (*Answer, error) {
	var body io.Reader
	if req.Body != nil {
		body = bytes.NewReader(req.Body)
	}
	// The host part is never resolved: the transport dials the guest.
	hr, err := http.NewRequestWithContext(ctx, req.Method, "http://guestd"+req.Path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range req.Header {
		hr.Header[k] = v
	}
	resp, err := c.t.RoundTrip(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	limit := c.lim.MaxAnswer
	if req.MaxAnswer > 0 {
		limit = min(limit, req.MaxAnswer)
	}
	a := &Answer{Status: resp.StatusCode, Header: resp.Header, budget: c.budget}
	if err := c.read(ctx, a, resp, limit); err != nil {
		a.Release()
		return a, err
	}
	return a, nil
}

// chunk is what an answer without a Content-Length is read (and held) by.
const chunk = 64 << 10

// read reads resp's body into a, holding its bytes from the budget.
func (c *Client) read(ctx context.Context, a *Answer, resp *http.Response, limit int64) error {
	if n := resp.ContentLength; n >= 0 {
		if n > limit {
			return fmt.Errorf("%w: %d bytes (Content-Length), at most %d", ErrAnswerTooLarge, n, limit)
		}
		if err := c.hold(ctx, a, n); err != nil {
			return err
		}
		a.Body = make([]byte, n)
		_, err := io.ReadFull(resp.Body, a.Body)
		return err
	}
	var pieces [][]byte
	total := int64(0)
	for {
		if err := c.hold(ctx, a, chunk); err != nil {
			return err
		}
		p := make([]byte, chunk)
		n, err := fill(resp.Body, p)
		pieces = append(pieces, p[:n])
		total += int64(n)
		if total > limit {
			return fmt.Errorf("%w: over %d bytes", ErrAnswerTooLarge, limit)
		}
		// Only io.EOF ends a body whole: a chunked body cut off ends in
		// io.ErrUnexpectedEOF, and is not an answer.
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("guest answer cut off after %d bytes: %w", total, err)
		}
	}
	a.Body = bytes.Join(pieces, nil)
	// What was held beyond the body goes back.
	if extra := a.held - int64(len(a.Body)); extra > 0 {
		a.budget.sem.Release(extra)
		a.held -= extra
	}
	return nil
}

// fill reads into p until it is full or r fails; unlike io.ReadFull it
// returns r's error as it is, so that io.EOF (the body's end) stays apart
// from io.ErrUnexpectedEOF (a body cut off).
func fill(r io.Reader, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := r.Read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (c *Client) hold(ctx context.Context, a *Answer, n int64) error {
	if n == 0 {
		return nil
	}
	if a.held+n > c.budget.size {
		return fmt.Errorf("%w: over the guest's budget of %d bytes", ErrAnswerTooLarge, c.budget.size)
	}
	if err := c.budget.sem.Acquire(ctx, n); err != nil {
		return fmt.Errorf("guest answers held: no room for %s bytes in %d: %w", strconv.FormatInt(n, 10), c.budget.size, err)
	}
	a.held += n
	return nil
}

// Close drops the client's idle connections (it keeps none: calls do not
// pool).
func (c *Client) Close() { c.t.CloseIdleConnections() }
