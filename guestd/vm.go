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
			splice(ctx, c, up)
		}()
	}
}

// After the host has answered and ended its stream, splice reads what the
// client still sends for as long as it keeps sending (each read within
// drainIdle, drainMax in all) and drops it: a client that writes its
// whole body before it reads (most do) then reads the answer (a 413 for a
// body over the limit) at once, where closing under it would reset the
// answer away, and waiting for it would stall it.
const (
	drainIdle = time.Second
	drainMax  = 10 * time.Second
)

// splice carries one call: client is the process's connection, server
// the stream to the host. It ends when the host has answered and ended
// its stream (the host's server decides how long a call lasts), or when
// ctx ends.
func splice(ctx context.Context, client, server net.Conn) {
	served := make(chan struct{})
	go func() {
		io.Copy(client, server)
		if cw, ok := client.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		close(served)
	}()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		io.Copy(server, client)
		// The host stopped reading (it answered, or ended the stream):
		// what the client still sends is dropped until served ends
		// both.
		drain(client)
	}()
	select {
	case <-served:
	case <-ctx.Done():
	}
	server.Close()
	client.SetReadDeadline(time.Now().Add(drainIdle))
	select {
	case <-sent:
	case <-time.After(drainMax):
	}
	client.Close()
	<-sent
}

// drain reads and drops what c sends until it ends or stays silent for
// drainIdle.
func drain(c net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
		c.SetReadDeadline(time.Now().Add(drainIdle))
	}
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
