package hostproxy

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"strata/internal/fault"
	"strata/internal/httpx"
	"strata/internal/jsend"
	"strata/sandbox"
)

// Options configure a Server. Only Config is required.
type Options struct {
	Config Config
	// Getenv reads the environment variables that hold keys (os.Getenv).
	Getenv func(string) string
	// Logger receives access logs and errors (slog.Default()).
	Logger *slog.Logger
	// Now is the clock of token creation times (time.Now).
	Now func() time.Time
	// Rand is the randomness of access tokens (crypto/rand.Reader).
	Rand io.Reader
	// Dialers are the guest transports by address scheme (DefaultDialers()).
	Dialers map[string]Dialer
}

// Server is hostproxy: the registry, the guest client and the HTTP API.
type Server struct {
	// attached are the exec sessions' attachments open (sessions.go),
	// transfers the file transfers under way (files.go).
	attached  attachments
	transfers transfers
	// inbound are the budgets of large bodies of calls from inside
	// sandboxes (inbound.go).
	inbound inbound

	log      *slog.Logger
	reg      *Registry
	guests   *GuestClient
	limits   *limiters // per credential
	failures *limiters // failed authentications per client address
	metrics  *metrics
	handler  http.Handler
	router   *echo.Echo // the routes (Routes)
	now      func() time.Time
	timeouts timeouts

	randMu sync.Mutex
	rand   io.Reader

	publicURL string

	// machines runs the microVM sandboxes (nil without a machines
	// configuration); ctx ends with Close, for the servers of guest calls.
	machines *sandbox.Manager
	// owed are the access tokens owed to microVM guests that were not
	// running when they were issued (credentials.go).
	owed   owedTokens
	ctx    context.Context
	cancel context.CancelFunc
}

type timeouts struct {
	readHeader, read, write, idle, shutdown time.Duration
}

// New validates the configuration, opens the registry under its data
// directory and seeds it. It fails before serving anything when no key is
// configured, a guest address cannot be dialled, or the data directory is
// unusable.
func New(ctx context.Context, opts Options) (*Server, error) {
	cfg := opts.Config
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	sd, err := cfg.resolve(getenv)
	if err != nil {
		return nil, err
	}
	dialers := opts.Dialers
	if dialers == nil {
		dialers = DefaultDialers()
	}
	// The vm:// scheme reaches a microVM's guestd through its channel;
	// the dialer finds the manager once it exists (Recover already dials).
	machines := &atomic.Pointer[sandbox.Manager]{}
	if cfg.VMs != nil {
		dialers[sandbox.GuestScheme] = func(ctx context.Context, id string) (net.Conn, error) {
			m := machines.Load()
			if m == nil {
				return nil, &net.OpError{Op: "dial", Net: sandbox.GuestScheme, Err: errors.New("not started")}
			}
			return m.Dial(ctx, id)
		}
	}
	t := cfg.Timeouts
	guestRequest := t.GuestRequest.or(defaultGuestRequest)
	guests := NewGuestClient(dialers, t.GuestDial.or(defaultGuestDial), guestRequest)
	for _, sb := range sd.sandboxes {
		if err := guests.Check(sb.Guest); err != nil {
			return nil, fmt.Errorf("config: sandbox %q: %w", sb.ID, err)
		}
	}
	reg, err := OpenRegistry(ctx, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := reg.seed(ctx, sd); err != nil {
		reg.Close()
		return nil, fmt.Errorf("registry: seed from config: %w", err)
	}
	perSec, burst := cfg.RateLimit.PerSecond, cfg.RateLimit.Burst
	if perSec == 0 {
		perSec = DefaultRatePerSec
	}
	if burst == 0 {
		burst = DefaultRateBurst
	}
	s := &Server{
		log:      opts.Logger,
		reg:      reg,
		guests:   guests,
		limits:   newLimiters(perSec, burst),
		failures: newLimiters(perSec, burst),
		metrics:  newMetrics(),
		now:      opts.Now,
		rand:     opts.Rand,
		timeouts: timeouts{
			readHeader: t.ReadHeader.or(defaultReadHeader),
			read:       t.Read.or(defaultRead),
			write:      t.Write.or(guestRequest + 10*time.Second),
			idle:       t.Idle.or(defaultIdle),
			shutdown:   t.Shutdown.or(defaultShutdown),
		},
		publicURL: cfg.PublicURL,
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if s.publicURL == "" {
		s.publicURL = "http://" + cmp.Or(cfg.Listen, DefaultListen)
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.rand == nil {
		s.rand = rand.Reader
	}
	s.handler = s.routes()
	if cfg.VMs != nil {
		if err := s.openVMs(ctx, *cfg.VMs, machines.Store); err != nil {
			s.cancel()
			reg.Close()
			return nil, err
		}
	}
	return s, nil
}

// Registry is the server's registry (sandbox states, tokens).
func (s *Server) Registry() *Registry { return s.reg }

// Handler is the HTTP API, for a server of the caller's own.
func (s *Server) Handler() http.Handler { return s.handler }

// Close releases the registry and idle guest connections. Call it after
// Serve has returned.
func (s *Server) Close() error {
	s.cancel()
	if s.machines != nil {
		s.machines.Close()
	}
	s.guests.Close()
	return s.reg.Close()
}

// Machines is the microVM sandboxes' manager, nil when there is none.
func (s *Server) Machines() *sandbox.Manager { return s.machines }

// Serve answers requests on ln until ctx is done, then stops accepting,
// waits for requests in flight (at most the shutdown timeout) and returns.
// Requests in flight keep running when ctx is cancelled.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	return httpx.Serve(ctx, ln, s.handler, httpx.ServeConfig{
		Log:               s.log,
		ReadHeaderTimeout: s.timeouts.readHeader,
		ReadTimeout:       s.timeouts.read,
		WriteTimeout:      s.timeouts.write,
		IdleTimeout:       s.timeouts.idle,
		ShutdownTimeout:   s.timeouts.shutdown,
	})
}

// routes is the API: echo routes the requests, httpx.Edge around it gives
// every request, matched or not, its id, its access log line and its
// metrics, the same way guestd's are.
func (s *Server) routes() http.Handler {
	e := echo.New()
	s.router = e
	e.HideBanner, e.HidePort = true, true
	e.IPExtractor = echo.ExtractIPDirect()
	e.HTTPErrorHandler = func(err error, c echo.Context) { s.writeError(c, err) }
	e.Use(s.edge)

	// Authorization is per route (authz.go), not on a group: a group's
	// middleware would also catch unknown paths and methods below it,
	// turning their 404 and 405 into 401.
	add := func(method, path string, h echo.HandlerFunc) {
		e.Add(method, path, h, s.authorize(method, path))
	}
	add(http.MethodGet, "/v1/health", s.data(s.health))
	add(http.MethodGet, "/v1/openapi.json", s.openapi)
	add(http.MethodGet, "/metrics", echo.WrapHandler(s.metrics.handler()))

	const sb, cp = sbRoute, cpRoute
	add(http.MethodPost, sb+"/checkpoints", s.data(s.createCheckpoint))
	add(http.MethodGet, sb+"/checkpoints", s.data(s.listCheckpoints))
	add(http.MethodGet, sb+"/directories", s.data(s.listDirectories))
	add(http.MethodPost, cp+"/restore", s.data(s.restoreCheckpoint))
	add(http.MethodDelete, cp, s.data(s.deleteCheckpoint))
	add(http.MethodGet, cp+"/changes", s.data(s.checkpointChanges))
	add(http.MethodGet, cp+"/files", s.data(s.checkpointFile))
	add(http.MethodGet, cp+"/files/*", s.data(s.checkpointFile))
	add(http.MethodPost, cp+"/restore-paths", s.data(s.restorePaths))
	add(http.MethodPost, cp+"/clone", s.data(s.cloneCheckpoint))
	add(http.MethodPost, sb+"/directories/release", s.data(s.releaseDirectory))
	add(http.MethodPost, sb+"/access-token", s.data(s.issueToken))
	add(http.MethodGet, sb+"/access-token", s.data(s.showToken))
	add(http.MethodDelete, sb+"/access-token", s.data(s.revokeToken))
	add(http.MethodPost, sb+"/access-token/rotate", s.data(s.rotateToken))

	add(http.MethodPost, "/v1/sandboxes", s.createSandbox)
	add(http.MethodGet, "/v1/sandboxes", s.data(s.listSandboxes))
	add(http.MethodGet, sb, s.data(s.getSandbox))
	add(http.MethodDelete, sb, s.data(s.deleteSandbox))
	add(http.MethodPost, sb+"/pause", s.lifecycle(s.pauseSandbox, sandbox.Paused))
	add(http.MethodPost, sb+"/resume", s.lifecycle(s.resumeSandbox, sandbox.Running))
	add(http.MethodPost, sb+"/start", s.lifecycle(s.startSandbox, sandbox.Running))
	add(http.MethodPost, sb+"/stop", s.data(s.stopSandbox))
	add(http.MethodPut, sb+"/access", s.data(s.setAccess))
	add(http.MethodPut, sb+"/labels", s.data(s.setLabels))
	add(http.MethodGet, sb+"/network", s.data(s.getNetwork))
	add(http.MethodPut, sb+"/network", s.data(s.setNetwork))
	add(http.MethodPost, sb+"/exec", s.data(s.execInSandbox))
	add(http.MethodPost, sb+"/sessions", s.startSession)
	add(http.MethodGet, sb+"/sessions", s.data(s.sessionCall(http.MethodGet, false)))
	add(http.MethodGet, sb+"/sessions/:sid", s.data(s.sessionCall(http.MethodGet, true)))
	add(http.MethodDelete, sb+"/sessions/:sid", s.data(s.sessionCall(http.MethodDelete, true)))
	add(http.MethodGet, sb+"/sessions/:sid/attach", s.attachSession)
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete} {
		add(m, sb+"/files", s.file)
		add(m, sb+"/files/*", s.file)
	}
	const snap = snapRoute
	add(http.MethodPost, sb+"/snapshots", s.data(s.createSnapshot))
	add(http.MethodGet, sb+"/snapshots", s.data(s.listSnapshots))
	add(http.MethodGet, snap, s.data(s.getSnapshot))
	add(http.MethodDelete, snap, s.data(s.deleteSnapshot))
	add(http.MethodPost, snap+"/restore", s.data(s.restoreSnapshot))
	add(http.MethodPost, snap+"/pin", s.data(s.pinSnapshot(true)))
	add(http.MethodPost, snap+"/unpin", s.data(s.pinSnapshot(false)))
	add(http.MethodPost, snap+"/fork", s.forkSnapshot)

	edge := &httpx.Edge{
		Log: s.log,
		// The public edge makes its own ids: see httpx.Edge.
		AcceptRequestID: false,
		Observe: func(r httpx.Summary) {
			s.metrics.observe(r.Route, r.Method, r.Status, r.Duration)
		},
	}
	return edge.Handler(e)
}

// data adapts a handler that returns data or an error: data is written as
// JSend success, an error goes up to edge, which writes it.
func (s *Server) data(h func(c echo.Context) (any, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		v, err := h(c)
		if err != nil {
			return err
		}
		if d, ok := v.(*GuestData); ok {
			// A guest's answer, held until written, and written
			// without a copy.
			defer d.Release()
			d.write(c.Response(), http.StatusOK)
			return nil
		}
		jsend.Success(c.Response(), v)
		return nil
	}
}

// edge adapts echo to the httpx.Edge around it, for every request, matched
// or not: it passes the request id on to guest calls, counts the request
// in flight, writes an error through writeError, and gives the access log
// line the route template, the client address, the principal and the
// sandbox. The log line itself, the id and panics are httpx's.
func (s *Server) edge(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		ctx := req.Context()
		c.SetRequest(req.WithContext(withRequestID(ctx, httpx.RequestID(ctx))))
		s.metrics.inFlight.Inc()
		// Deferred so that a request whose handler panics (httpx.Edge
		// recovers it, after this) is still logged with its route and
		// principal.
		defer func() {
			s.metrics.inFlight.Dec()
			httpx.SetRoute(ctx, c.Path())
			attrs := []slog.Attr{slog.String("remote", c.RealIP())}
			if p, ok := c.Get(keyPrincipal).(Principal); ok {
				attrs = append(attrs, slog.String("credential", p.ID), slog.String("account", p.Account))
			}
			// The sandbox by its id, whether the path named it by its id
			// or by its name.
			if sb := sandboxOf(c).ID; sb != "" {
				attrs = append(attrs, slog.String("sandbox", sb))
			} else if sb := c.Param("id"); sb != "" {
				attrs = append(attrs, slog.String("sandbox", sb))
			}
			httpx.Annotate(ctx, attrs...)
		}()
		err := refuseOptions(c)
		if err == nil {
			err = next(c)
		}
		if err != nil {
			s.writeError(c, err)
		}
		return nil
	}
}

// refuseOptions makes an OPTIONS request on a known route a 405: echo
// answers it itself with an empty 204, but the API has no OPTIONS.
func refuseOptions(c echo.Context) error {
	if c.Request().Method == http.MethodOptions {
		if allow, ok := c.Get(echo.ContextKeyHeaderAllow).(string); ok && allow != "" {
			c.Response().Header().Set(echo.HeaderAllow, withoutOptions(allow))
			return httpx.ErrMethodNotAllowed
		}
	}
	return nil
}

// writeError turns echo's own errors into the API's and writes every error
// of a request through httpx.WriteError, the one path to jsend.Error.
func (s *Server) writeError(c echo.Context, err error) {
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			err = httpx.ErrNoRoute
		case http.StatusMethodNotAllowed:
			err = httpx.ErrMethodNotAllowed
			// echo lists OPTIONS, which this API answers with 405 too.
			h := c.Response().Header()
			if allow := h.Get(echo.HeaderAllow); allow != "" {
				h.Set(echo.HeaderAllow, withoutOptions(allow))
			}
		default:
			err = fmt.Errorf("echo: %w", err)
		}
	}
	httpx.WriteError(c.Response(), c.Request(), err)
}

func (s *Server) rateLimited(c echo.Context, limit *fault.Error, wait time.Duration) error {
	secs := retryAfterSeconds(wait)
	c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
	return limit.With("retry_after", secs)
}

func withoutOptions(allow string) string {
	var keep []string
	for _, m := range strings.Split(allow, ",") {
		if m = strings.TrimSpace(m); m != "" && m != http.MethodOptions {
			keep = append(keep, m)
		}
	}
	return strings.Join(keep, ", ")
}
