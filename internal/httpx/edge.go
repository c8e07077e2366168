package httpx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"strata/internal/fault"
	"strata/internal/jsend"
	"strata/internal/servertiming"
)

// HeaderRequestID names the header that carries the request id, both ways.
const HeaderRequestID = jsend.HeaderRequestID

// MaxRequestIDLen is the longest request id a caller may send.
const MaxRequestIDLen = 64

// The errors of the edge itself, the same in both daemons. Codes are part of
// the API (docs/api.md).
var (
	ErrNoRoute          = fault.New(fault.NotFound, "not_found", "no such route")
	ErrMethodNotAllowed = fault.New(fault.MethodNotAllowed, "method_not_allowed", "this method is not allowed on this route")
)

// unmatched is the route of a request that matched no pattern.
const unmatched = "unmatched"

// ValidRequestID reports whether id may be taken from a caller: 1 to
// MaxRequestIDLen characters of A-Z a-z 0-9 - _ . : (what a UUID, a hex id
// or a "service:id" uses), so that it is one word in any log format.
func ValidRequestID(id string) bool {
	if id == "" || len(id) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '-', c == '_', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

// NewRequestID returns a fresh request id: 24 hex digits from crypto/rand.
func NewRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Summary is one finished request, as the access log line has it.
type Summary struct {
	RequestID string
	Method    string
	Route     string // the matched pattern, or "unmatched"
	Status    int
	Duration  time.Duration
	Err       error // what WriteError was given, if anything
}

// Edge wraps a daemon's routes: request id, errors, panics, access log.
type Edge struct {
	// Log receives the access log lines and the causes of 5xx
	// (slog.Default() when nil).
	Log *slog.Logger
	// AcceptRequestID keeps a sane X-Request-Id sent by the caller. Set it
	// where the caller is trusted (guestd, called by hostproxy, so one id
	// names a request in both logs); the public edge makes its own, so a
	// client cannot file its requests under an id another one quotes.
	AcceptRequestID bool
	// Observe, when set, is called once per request after its log line
	// (metrics).
	Observe func(Summary)
}

// Handler returns next wrapped in the edge.
func (e *Edge) Handler(next http.Handler) http.Handler {
	log := e.Log
	if log == nil {
		log = slog.Default()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := e.requestID(r)
		w.Header().Set(HeaderRequestID, id)
		ctx, rec := servertiming.With(r.Context())
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		sw.start = func() {
			// The daemon's own time so far first, then its steps.
			ms := append([]servertiming.Metric{{Name: "total", Dur: time.Since(start)}}, rec.Metrics()...)
			w.Header().Set(servertiming.Header, servertiming.Format(ms))
		}
		x := &exchange{id: id, log: log, w: sw}
		rr := r.WithContext(context.WithValue(ctx, exchangeKey{}, x))

		aborted := x.serve(next, rr)

		s := Summary{RequestID: id, Method: r.Method, Route: x.route, Status: x.w.status, Duration: time.Since(start), Err: x.err}
		if s.Route == "" {
			s.Route = rr.Pattern // set by a ServeMux
		}
		// A catch-all pattern ("/" in a ServeMux) that answers ErrNoRoute
		// matched nothing of the API.
		if s.Route == "" || errors.Is(s.Err, ErrNoRoute) {
			s.Route = unmatched
		}
		attrs := make([]slog.Attr, 0, 6+len(x.attrs))
		attrs = append(attrs,
			slog.String("request_id", s.RequestID), slog.String("method", s.Method),
			slog.String("route", s.Route), slog.Int("status", s.Status),
			slog.Float64("duration_ms", float64(s.Duration.Microseconds())/1000))
		attrs = append(attrs, x.attrs...)
		if code := fault.CodeOf(s.Err); code != "" {
			attrs = append(attrs, slog.String("code", code))
		}
		log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
		if e.Observe != nil {
			e.Observe(s)
		}
		if aborted {
			panic(http.ErrAbortHandler)
		}
	})
}

func (e *Edge) requestID(r *http.Request) string {
	if e.AcceptRequestID {
		if ids := r.Header.Values(HeaderRequestID); len(ids) == 1 && ValidRequestID(ids[0]) {
			return ids[0]
		}
	}
	return NewRequestID()
}

// exchange is the edge's state of one request, in its context.
type exchange struct {
	id    string
	log   *slog.Logger
	w     *statusWriter
	route string
	attrs []slog.Attr
	err   error
}

type exchangeKey struct{}

func exchangeOf(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	return x
}

// serve runs next, turning a panic into an internal error. It reports
// whether the handler aborted with http.ErrAbortHandler, which the edge
// passes on to net/http once the request is logged.
func (x *exchange) serve(next http.Handler, r *http.Request) (aborted bool) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				aborted = true
				return
			}
			WriteError(x.w, r, fmt.Errorf("panic: %v\n%s", p, debug.Stack()))
		}
	}()
	next.ServeHTTP(x.w, r)
	return false
}

// RequestID is the id of the request whose context is ctx ("" outside an
// Edge).
func RequestID(ctx context.Context) string {
	if x := exchangeOf(ctx); x != nil {
		return x.id
	}
	return ""
}

// SetRoute names the pattern the request matched, for a router that is not
// a ServeMux (echo's c.Path()). Outside an Edge it does nothing.
func SetRoute(ctx context.Context, route string) {
	if x := exchangeOf(ctx); x != nil {
		x.route = route
	}
}

// Annotate adds attributes to the request's access log line, after the
// common keys and in the order given. Outside an Edge it does nothing.
func Annotate(ctx context.Context, attrs ...slog.Attr) {
	if x := exchangeOf(ctx); x != nil {
		x.attrs = append(x.attrs, attrs...)
	}
}

// WriteError answers r with err as JSend (jsend.Error: fault kind to
// status; a 5xx's cause logged with the request id, an internal error's
// never shown) and keeps err for the access log. Once the response has
// started, err is logged instead. Outside an Edge it writes the envelope
// without a request id or a log.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeOf(r.Context())
	if x == nil {
		jsend.Error(w, nil, "", err)
		return
	}
	x.err = err
	if x.w.wroteHeader {
		x.log.Error("error after the response was sent", "request_id", x.id, "err", err)
		return
	}
	jsend.Error(w, x.log, x.id, err)
}

// Respond answers r with data as JSend success, or with err (WriteError)
// when err is not nil: the end of a handler that returns data or an error.
func Respond(w http.ResponseWriter, r *http.Request, data any, err error) {
	if err != nil {
		WriteError(w, r, err)
		return
	}
	jsend.Success(w, data)
}

// statusWriter remembers the status for the access log and whether the
// response has started.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
	start       func() // once, just before the status is written
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader && code >= 200 { // 1xx are interim, not the status
		w.started()
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.started()
	}
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) started() {
	if w.start != nil {
		w.start()
		w.start = nil
	}
}

// Unwrap lets http.ResponseController reach the connection (flush,
// deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
