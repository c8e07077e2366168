package hostproxy

import (
	"context"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/sync/semaphore"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/jsend"
)

// Bodies of the calls a sandbox's guest makes through its channel (calls
// from inside). A guest is not trusted, and opens as many streams as it
// likes (32 are served at once, maxGuestConns): the bodies of most
// routes are at most jsend.MaxBody, but exec's and sessions' may be
// api.MaxExecBody, and 32 of those read at once held 256 MiB before any
// limit on calls to the guest applied. So such a body is read only
// within its sandbox's budget of bodies, taken before the first byte is
// read: it costs bodyCost times its length (Content-Length, or the
// route's limit when it has none), for its bytes and what decoding them
// holds at once (measured: 3.5 times an 8 MiB body of one string), and
// is given back when the handler returns (for an exec, when the command
// ended). The budget holds one body of the largest: the others wait, up
// to the server's read timeout, then are answered 429 rate_limited.

const (
	bodyCost       = 4
	maxGuestBodies = bodyCost * api.MaxExecBody
)

var errBodiesBusy = fault.New(fault.TooManyRequests, "rate_limited", "calls from inside the sandbox are reading as many large bodies as they may; retry later")

// inbound are the budgets of bodies of calls from inside, by sandbox.
type inbound struct {
	mu sync.Mutex
	by map[string]*bodyBudget
}

// bodyBudget is one sandbox's, forgotten when no call holds or waits for
// it.
type bodyBudget struct {
	sem   *semaphore.Weighted
	users int
}

// holdBody takes what the request's body will cost from the budget of
// the sandbox whose channel it came through, before it is read: limit is
// the route's largest body. A call from the network, a body the route
// refuses on its Content-Length alone (over limit) and a body of at
// most jsend.MaxBody take nothing. The caller calls release once the
// body and what was decoded from it are no longer held.
func (s *Server) holdBody(c echo.Context, limit int64) (release func(), err error) {
	r := c.Request()
	id := channelSandbox(r.Context())
	n := r.ContentLength
	if n < 0 {
		n = limit
	}
	if id == "" || n <= jsend.MaxBody || n > limit {
		return func() {}, nil
	}
	cost := bodyCost * n
	s.inbound.mu.Lock()
	if s.inbound.by == nil {
		s.inbound.by = map[string]*bodyBudget{}
	}
	b := s.inbound.by[id]
	if b == nil {
		b = &bodyBudget{sem: semaphore.NewWeighted(maxGuestBodies)}
		s.inbound.by[id] = b
	}
	b.users++
	s.inbound.mu.Unlock()
	done := func() {
		s.inbound.mu.Lock()
		defer s.inbound.mu.Unlock()
		if b.users--; b.users == 0 {
			delete(s.inbound.by, id)
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeouts.read)
	defer cancel()
	if err := b.sem.Acquire(ctx, cost); err != nil {
		done()
		return nil, s.rateLimited(c, errBodiesBusy, time.Second)
	}
	return func() {
		b.sem.Release(cost)
		done()
	}, nil
}
