package httpx

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Defaults of ServeConfig's zero fields.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultShutdownTimeout   = 30 * time.Second
	// MaxHeaderBytes bounds a request's header block (Go answers a
	// plain-text 431 beyond).
	MaxHeaderBytes = 64 << 10
)

// ServeConfig is how Serve runs its server. A zero timeout takes its
// default; WriteTimeout has none (no limit) unless set.
type ServeConfig struct {
	// Log receives the shutdown line and net/http's own errors, at warn
	// (slog.Default() when nil).
	Log                                          *slog.Logger
	ReadHeaderTimeout, ReadTimeout, WriteTimeout time.Duration
	IdleTimeout                                  time.Duration
	ShutdownTimeout                              time.Duration
}

// Serve answers requests on ln with h until ctx is done, then stops
// accepting, waits for the requests in flight (at most ShutdownTimeout),
// closes the connections still open and returns. It returns nil after a
// clean shutdown, an error when requests were still running at the end of
// the wait, and the server's error if it stopped on its own. Requests in
// flight are not cancelled by ctx.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, c ServeConfig) error {
	log := c.Log
	if log == nil {
		log = slog.Default()
	}
	shutdown := or(c.ShutdownTimeout, DefaultShutdownTimeout)
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: or(c.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		ReadTimeout:       or(c.ReadTimeout, DefaultReadTimeout),
		WriteTimeout:      c.WriteTimeout,
		IdleTimeout:       or(c.IdleTimeout, DefaultIdleTimeout),
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "wait", shutdown)
	sctx, cancel := context.WithTimeout(context.Background(), shutdown)
	defer cancel()
	err := srv.Shutdown(sctx)
	<-errc // http.ErrServerClosed, as soon as Shutdown began
	if err != nil {
		srv.Close()
		return fmt.Errorf("shutdown: requests still running after %s: %w", shutdown, err)
	}
	return nil
}

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
