package guestd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/jsend"
)

// shutdown handles POST /v1/shutdown, served only inside a strata microVM
// (Config.PowerOff set): the host's clean stop. The answer goes out first;
// then the file systems are synced and PowerOff asks init to end the
// machine, which stops guestd (SIGTERM), syncs, unmounts and powers off.
func (s *Server) shutdown(r *http.Request) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	if err := jsend.RejectBody(r); err != nil {
		return nil, err
	}
	s.log.Info("shutdown asked by the host")
	go func() {
		// Once the handler has returned. The machine goes down through
		// init, which stops guestd first, and guestd's graceful shutdown
		// finishes writing this answer before it exits.
		<-r.Context().Done()
		unix.Sync()
		s.powerOff()
	}()
	return struct{}{}, nil
}

// ForwardAPI serves ln (a loopback TCP listener inside the guest, the
// CREATEOS_API_URL that processes call) by carrying each connection to
// the host through a stream that open opens (the channel), until ctx is
// done. The host serves those streams as calls from this sandbox: the
// guest needs no network to reach the API.
func ForwardAPI(ctx context.Context, ln net.Listener, open func(context.Context) (net.Conn, error), log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			octx, cancel := context.WithTimeout(ctx, 10*time.Second)
			up, err := open(octx)
			cancel()
			if err != nil {
				log.Warn("api forward: the host cannot be reached", "err", err)
				return
			}
			defer up.Close()
			splice(c, up)
		}()
	}
}

// splice copies both ways until either side ends, then closes both.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	// One direction ended: give the other a moment to drain, then end
	// both (a stream may not support half-close).
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	a.Close()
	b.Close()
}

// storeCheck is one store's answer to GET /v1/check.
type storeCheck struct {
	Roots       []string `json:"roots"`
	Checkpoints int      `json:"checkpoints"`
	Layers      int      `json:"layers"`
	Dirs        int      `json:"dirs"`
	Problems    []string `json:"problems"`
}

// check handles GET /v1/check: every store's consistency report (layers
// dirs the metadata does not know, records without dirs, roots not
// ready, mounts that are not the recorded stack). Root in the guest and
// the host's tests call it; the public API does not forward it. Run it
// when no operation is under way: one in flight shows as problems.
func (s *Server) check(r *http.Request) (any, error) {
	if err := jsend.RejectQueryAndBody(r); err != nil {
		return nil, err
	}
	out := []storeCheck{}
	for _, st := range s.engine.stores() {
		rep, err := st.Check(r.Context())
		if err != nil {
			return nil, err
		}
		problems := rep.Problems
		if problems == nil {
			problems = []string{}
		}
		out = append(out, storeCheck{Roots: rep.Roots, Checkpoints: rep.Checkpoints, Layers: rep.Layers, Dirs: rep.Dirs, Problems: problems})
	}
	return out, nil
}
