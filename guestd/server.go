package guestd

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"strata/internal/api"
	"strata/internal/httpx"
	"strata/internal/jsend"
	"strata/layers"
	"strata/pathpolicy"
)

// Config configures a guestd.
type Config struct {
	// Store is the layer store directory.
	Store string
	// Logger receives operation steps and request logs.
	Logger *slog.Logger
	// LegacyMount forces mount(2) instead of the new mount API.
	LegacyMount bool
	// Policy overrides the default path policy (tests).
	Policy *pathpolicy.Policy
	// NoCompaction turns background compaction off (tests).
	NoCompaction bool
	// MinFree is the free space a capture leaves on a store's filesystem
	// (0: 1% of the filesystem, 1 to 64 MiB); see layers.Config.
	MinFree uint64
	// Credentials is the env file written for processes in the sandbox
	// (DefaultCredentials when empty).
	Credentials string
	// CredentialsCopy, when set, is a durable copy of the credentials
	// file, put back at start when the file is gone (inside a microVM,
	// /run is empty after each boot).
	CredentialsCopy string
	// ShutdownTimeout bounds the wait for requests in flight when Serve's
	// context ends (30 s when zero); inside a microVM it is short, so
	// that a running exec does not outlast the host's clean stop.
	ShutdownTimeout time.Duration
	// AutoCheckpoints is how many automatic checkpoints (a restore's
	// safety checkpoints of unsaved changes) each directory keeps; 0
	// turns them off. The guestd command's default is
	// layers.DefaultAutoCheckpoints.
	AutoCheckpoints int
	// PowerOff, set only inside a strata microVM, ends the machine; it
	// enables POST /v1/shutdown, the host's clean stop, and POST
	// /v1/resync, the host's call after a restore from a memory snapshot
	// or a fork.
	PowerOff func()
	// Cgroup, set only inside a strata microVM, is the cgroup2 mount
	// (/sys/fs/cgroup) where guestd puts itself and each exec in cgroups
	// of their own, with limits that leave guestd its share of the
	// guest's memory and tasks (see cgroup.go), and makes itself exempt
	// from the out-of-memory killer. When that cannot be done guestd
	// says why in its log and runs execs without limits.
	Cgroup string
}

// Server is a running guestd: its stores and its HTTP handler.
type Server struct {
	engine  *engine
	log     *slog.Logger
	reg     *prometheus.Registry
	metrics *metrics
	handler http.Handler

	credentialsPath string
	credentialsCopy string
	powerOff        func()
	shutdownTimeout time.Duration

	// cgroups, when set, are the exec cgroups (Config.Cgroup).
	cgroups *execCgroups

	// sessions are the exec sessions (session.go).
	sessions *sessionSet

	// kernel is what POST /v1/resync changes; resyncMu serializes it.
	kernel   resyncKernel
	resyncMu sync.Mutex
}

// New opens the store (recovering every managed root) and builds the API.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newMetrics(reg)
	if cfg.Policy == nil {
		cfg.Policy = &pathpolicy.Policy{}
	}
	e, err := openEngine(ctx, cfg, m.observeStep)
	if err != nil {
		return nil, err
	}
	s := &Server{engine: e, log: cfg.Logger, reg: reg, metrics: m, credentialsPath: cfg.Credentials, credentialsCopy: cfg.CredentialsCopy, powerOff: cfg.PowerOff, shutdownTimeout: cfg.ShutdownTimeout, kernel: linuxKernel{}}
	if s.credentialsPath == "" {
		s.credentialsPath = DefaultCredentials
	}
	if err := restoreCredentials(s.credentialsPath, s.credentialsCopy); err != nil {
		e.closeAll()
		return nil, fmt.Errorf("credentials: %w", err)
	}
	if cfg.Cgroup != "" {
		if s.cgroups, err = setupCgroups(cfg.Cgroup, s.log); err != nil {
			s.log.Error("exec cgroups cannot be set up: execs run without memory and task limits", "err", err)
		} else {
			s.log.Info("exec cgroups", "memory_max", s.cgroups.limits.MemoryMax, "pids_max", s.cgroups.limits.PidsMax, "cpu", s.cgroups.limits.CPU)
		}
	}
	s.handler = s.routes()
	return s, nil
}

// Close releases the stores. Mounts stay: they are the live directories.
func (s *Server) Close() error {
	s.engine.closeAll()
	return nil
}

// Mounter names the mount implementation in use.
func (s *Server) Mounter() string { return s.engine.main.Mounter() }

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve answers requests on ln until ctx is done, then finishes the
// requests in flight (up to 30 s) and returns (httpx.Serve).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	return httpx.Serve(ctx, ln, s.handler, httpx.ServeConfig{Log: s.log, ShutdownTimeout: s.shutdownTimeout})
}

// Listen opens a listener for addr: "unix:///path/to.sock" (a stale
// socket file is replaced; the socket is made 0600) or "tcp://host:port".
func Listen(addr string) (net.Listener, error) {
	u, err := url.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", addr, err)
	}
	switch u.Scheme {
	case "unix":
		p := u.Path
		if p == "" {
			p = u.Opaque
		}
		if p == "" {
			return nil, fmt.Errorf("listen address %q: no socket path", addr)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
				c.Close()
				return nil, fmt.Errorf("socket %s is in use by another guestd", p)
			}
			os.Remove(p)
		}
		return listenPrivate(p)
	case "tcp":
		return net.Listen("tcp", u.Host)
	default:
		return nil, fmt.Errorf("listen address %q: scheme must be unix:// or tcp://", addr)
	}
}

// listenPrivate listens on the unix socket p, which no one but root can
// connect to from its first instant: the socket is made in a private
// directory beside p, given mode 0600, and only then renamed to p.
func listenPrivate(p string) (net.Listener, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(p), ".guestd-sock-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	staged := filepath.Join(tmp, "s")
	ln, err := net.Listen("unix", staged)
	if err != nil {
		return nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(staged, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(staged, p); err != nil {
		ln.Close()
		return nil, err
	}
	return &unlinkOnClose{Listener: ln, path: p}, nil
}

// unlinkOnClose removes the socket file at its final name when the
// listener closes.
type unlinkOnClose struct {
	net.Listener
	path string
}

func (l *unlinkOnClose) Close() error {
	err := l.Listener.Close()
	os.Remove(l.path)
	return err
}

func (s *Server) routes() http.Handler {
	s.sessions = &sessionSet{cg: s.cgroups, credentialsPath: s.credentialsPath, log: s.log, byID: map[string]*session{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/checkpoints", s.method(map[string]handler{
		http.MethodPost: s.create,
		http.MethodGet:  s.list,
	}))
	mux.HandleFunc("/v1/checkpoints/{id}", s.method(map[string]handler{http.MethodDelete: s.delete}))
	mux.HandleFunc("/v1/checkpoints/{id}/restore", s.method(map[string]handler{http.MethodPost: s.restore}))
	mux.HandleFunc("/v1/checkpoints/{id}/changes", s.method(map[string]handler{http.MethodGet: s.changes}))
	// The root's listing is files/ and, without the slash, files: the
	// mux would answer the latter with a redirect that is not JSON.
	mux.HandleFunc("/v1/checkpoints/{id}/files", s.method(map[string]handler{http.MethodGet: s.readEntry}))
	mux.HandleFunc("/v1/checkpoints/{id}/files/{path...}", s.method(map[string]handler{http.MethodGet: s.readEntry}))
	mux.HandleFunc("/v1/checkpoints/{id}/restore-paths", s.method(map[string]handler{http.MethodPost: s.restorePaths}))
	mux.HandleFunc("/v1/checkpoints/{id}/clone", s.method(map[string]handler{http.MethodPost: s.clone}))
	mux.HandleFunc("/v1/directories/release", s.method(map[string]handler{http.MethodPost: s.release}))
	mux.HandleFunc("/v1/credentials", s.method(map[string]handler{http.MethodPut: s.credentials}))
	mux.HandleFunc("/v1/directories", s.method(map[string]handler{http.MethodGet: s.directories}))
	mux.HandleFunc("/v1/check", s.method(map[string]handler{http.MethodGet: s.check}))
	mux.HandleFunc("/v1/exec", s.method(map[string]handler{http.MethodPost: s.execute}))
	mux.HandleFunc("/v1/files", s.files)
	mux.HandleFunc("/v1/files/{path...}", s.files)
	mux.HandleFunc("/v1/sessions", s.method(map[string]handler{http.MethodPost: s.sessions.start, http.MethodGet: s.sessions.list}))
	mux.HandleFunc("/v1/sessions/{sid}", s.method(map[string]handler{http.MethodGet: s.sessions.get, http.MethodDelete: s.sessions.end}))
	mux.HandleFunc("/v1/sessions/{sid}/attach", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			httpx.WriteError(w, r, httpx.ErrMethodNotAllowed)
			return
		}
		s.sessions.attach(w, r)
	})
	mux.HandleFunc("/v1/health", s.method(map[string]handler{http.MethodGet: s.health}))
	if s.powerOff != nil {
		mux.HandleFunc("/v1/shutdown", s.method(map[string]handler{http.MethodPost: s.shutdown}))
		mux.HandleFunc("/v1/resync", s.method(map[string]handler{http.MethodPost: s.resync}))
	}
	metricsHandler := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			httpx.WriteError(w, r, httpx.ErrMethodNotAllowed)
			return
		}
		metricsHandler.ServeHTTP(w, r)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { httpx.WriteError(w, r, httpx.ErrNoRoute) })
	// The caller is hostproxy (or root in the sandbox): its request id is
	// kept, so one id names a request in both daemons' logs.
	edge := &httpx.Edge{Log: s.log, AcceptRequestID: true}
	return edge.Handler(mux)
}

type handler func(r *http.Request) (any, error)

// method dispatches by HTTP method and writes the handler's data or error
// as JSend (httpx.Respond).
func (s *Server) method(hs map[string]handler) http.HandlerFunc {
	allowed := strings.Join(slices.Sorted(maps.Keys(hs)), ", ")
	return func(w http.ResponseWriter, r *http.Request) {
		h, ok := hs[r.Method]
		if !ok {
			w.Header().Set("Allow", allowed)
			httpx.WriteError(w, r, httpx.ErrMethodNotAllowed)
			return
		}
		data, err := h(r)
		httpx.Respond(w, r, data, err)
	}
}

func (s *Server) health(r *http.Request) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	return map[string]string{"status": "ok", "mounter": s.Mounter()}, nil
}

func toAPI(c layers.Checkpoint) api.Checkpoint {
	return api.Checkpoint{ID: c.ID, Path: c.Path, Name: c.Name, CreatedAt: api.FormatTime(c.CreatedAt), ParentID: c.ParentID,
		Auto: c.Auto, SizeBytes: c.SizeBytes}
}

func (s *Server) create(r *http.Request) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	var req api.CreateRequest
	if err := jsend.DecodeObject(r, &req); err != nil {
		return nil, err
	}
	path, name, err := req.Validate()
	if err != nil {
		return nil, err
	}
	key, err := api.IdempotencyKey(r.Header.Values(api.HeaderIdempotencyKey))
	if err != nil {
		return nil, err
	}
	retention := req.RetentionCount()
	cp, err := s.observe("create", func() (layers.Checkpoint, error) {
		return s.engine.capture(r.Context(), path, name, key, retention)
	})
	if err != nil {
		return nil, err
	}
	return toAPI(cp), nil
}

func (s *Server) list(r *http.Request) (any, error) {
	if err := jsend.RejectQueryAndBody(r); err != nil {
		return nil, err
	}
	cps, err := s.engine.list(r.Context())
	if err != nil {
		return nil, err
	}
	out := make([]api.Checkpoint, len(cps))
	for i, c := range cps {
		out[i] = toAPI(c)
	}
	return out, nil
}

// checkpointID validates the {id} path segment; an id of the wrong shape
// cannot name a checkpoint.
func checkpointID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if !api.ValidCheckpointID(id) {
		return "", layers.ErrCheckpointNotFound.With("checkpoint_id", id)
	}
	return id, nil
}

// directories is an extension: each managed directory and the checkpoint
// its live content continues from.
func (s *Server) directories(r *http.Request) (any, error) {
	if err := jsend.RejectQueryAndBody(r); err != nil {
		return nil, err
	}
	ds, err := s.engine.directories()
	if err != nil {
		return nil, err
	}
	out := make([]api.Directory, len(ds))
	for i, d := range ds {
		out[i] = api.Directory{Path: d.Path, CheckpointID: d.CheckpointID, State: d.State, NowAt: d.NowAt, Problem: d.Problem, SizeBytes: d.SizeBytes}
	}
	return out, nil
}

func (s *Server) restore(r *http.Request) (any, error) {
	if err := jsend.RejectQueryAndBody(r); err != nil {
		return nil, err
	}
	id, err := checkpointID(r)
	if err != nil {
		return nil, err
	}
	key, err := api.IdempotencyKey(r.Header.Values(api.HeaderIdempotencyKey))
	if err != nil {
		return nil, err
	}
	cp, err := s.observe("restore", func() (layers.Checkpoint, error) { return s.engine.restore(r.Context(), id, key) })
	if err != nil {
		return nil, err
	}
	return api.RestoreResult{CheckpointID: cp.ID, Path: cp.Path, SafetyCheckpointID: cp.SafetyCheckpointID}, nil
}

func (s *Server) delete(r *http.Request) (any, error) {
	if err := jsend.RejectQueryAndBody(r); err != nil {
		return nil, err
	}
	id, err := checkpointID(r)
	if err != nil {
		return nil, err
	}
	_, err = s.observe("delete", func() (layers.Checkpoint, error) {
		return layers.Checkpoint{}, s.engine.delete(r.Context(), id)
	})
	if err != nil {
		return nil, err
	}
	return struct{}{}, nil
}
