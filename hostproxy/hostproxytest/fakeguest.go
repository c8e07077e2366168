// Package hostproxytest holds test doubles for tests of hostproxy and of
// the clients that talk to it. It is imported by tests only.
//
// FakeGuest is a TEST DOUBLE of guestd: a real HTTP server on a unix
// socket that answers guestd's local API (POST/GET /v1/checkpoints,
// POST /v1/checkpoints/{id}/restore, DELETE /v1/checkpoints/{id},
// GET /v1/health) with guestd's envelopes and codes, keeping checkpoints
// in memory. It implements the lineage rules of the API (parent_id is the
// checkpoint the live directory continues from: the newest capture of the
// path, or the checkpoint last restored) and path_nested, and it fails on
// demand (SetFault) or stalls (SetDelay). It never touches a filesystem.
// The real guestd is exercised by the integration tests.
//
// It answers the routes of issue 8 too (beyond.go): changes, files,
// restore-paths, clone and release over in-memory file trees, and
// retention on create; and POST and GET /v1/sessions with records only
// (no process runs), for the tests of who may call them. Any other route,
// or any answer at all, is set with SetRoute: a hostile guest's, or
// guestd's sessions and files.
//
// Like guestd, it honours the Idempotency-Key header of create and
// restore: the first successful answer under a key is kept for
// IdempotencyWindow (on the double's clock, SetClock); a retry with the
// same key and the same request (create: path, name and retention; restore: the
// checkpoint id) gets that answer again and changes nothing; the same key
// with another request is 422 idempotency_key_reused. A request that
// failed did nothing and is not kept: its retry runs again.
package hostproxytest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/jsend"
	"strata/pathpolicy"
)

// Op names a guest operation, for SetFault.
type Op string

// The operations of guestd's local API.
const (
	OpCreate  Op = "create"
	OpList    Op = "list"
	OpRestore Op = "restore"
	OpDelete  Op = "delete"
)

// Fault is an answer the double gives instead of doing the operation.
type Fault struct {
	Status int
	// Body is sent as is, with Content-Type application/json unless
	// Header says otherwise.
	Body   string
	Header map[string]string
}

// Fail is the fault of a JSend fail envelope with code, message and fields.
func Fail(status int, code, message string, fields map[string]any) Fault {
	data := map[string]any{"code": code, "message": message}
	for k, v := range fields {
		data[k] = v
	}
	b, _ := json.Marshal(map[string]any{"status": "fail", "data": data})
	return Fault{Status: status, Body: string(b)}
}

// Error is the fault of a JSend error envelope (5xx) with message.
func Error(status int, message string) Fault {
	b, _ := json.Marshal(map[string]any{"status": "error", "message": message, "code": status})
	return Fault{Status: status, Body: string(b)}
}

// Checkpoint is a checkpoint record as guestd returns it.
type Checkpoint = api.Checkpoint

// IdempotencyWindow is how long an answer is kept under its
// Idempotency-Key.
const IdempotencyWindow = 24 * time.Hour

// errIdempotencyKeyReused is guestd's answer to a key sent again with
// another request.
var errIdempotencyKeyReused = fault.New(fault.Unprocessable, "idempotency_key_reused",
	"This Idempotency-Key was already used with a different request.")

// kept is an answer kept under an Idempotency-Key: what was asked, what
// was answered, and when.
type kept struct {
	request string
	data    any
	at      time.Time
}

type faultKey struct {
	op   Op
	path string
}

// FakeGuest is the guestd test double; see the package comment.
type FakeGuest struct {
	// Addr is the guest address to put in hostproxy's registry:
	// unix:///…/guestd.sock.
	Addr string
	// Socket is the path of the unix socket.
	Socket string

	name string
	srv  *http.Server
	done chan struct{}

	mu          sync.Mutex
	checkpoints []Checkpoint // oldest first
	credentials api.Credentials
	head        map[string]string // path -> checkpoint the live directory continues from
	faults      map[faultKey]Fault
	routes      map[string]Fault        // by "METHOD /path" (SetRoute)
	handlers    map[string]http.Handler // by "METHOD /path" (SetHandler)
	delay       time.Duration
	seq         uint64
	requests    int
	sessions    int
	lastHeader  http.Header
	answers     map[string]kept // by Idempotency-Key
	now         func() time.Time
	trees       map[string]Tree // by checkpoint id (beyond.go)
	live        map[string]Tree // by path
}

// Epoch is the created_at of a FakeGuest's first checkpoint; each next one
// is a minute later, so that outputs are reproducible.
var Epoch = time.Date(2026, 11, 5, 10, 0, 0, 0, time.UTC)

// StartFakeGuest starts a double named name (which seeds its checkpoint
// ids) on a fresh unix socket, and stops it when the test ends.
func StartFakeGuest(t testing.TB, name string) *FakeGuest {
	t.Helper()
	// Socket paths are limited to 108 bytes; t.TempDir() can be longer.
	dir, err := os.MkdirTemp("", "fakeguest")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "guestd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := &FakeGuest{
		Addr: "unix://" + sock, Socket: sock, name: name,
		head: map[string]string{}, faults: map[faultKey]Fault{}, done: make(chan struct{}),
		answers: map[string]kept{}, now: time.Now,
		trees: map[string]Tree{}, live: map[string]Tree{},
	}
	g.srv = &http.Server{Handler: g, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(g.done)
		_ = g.srv.Serve(ln)
	}()
	t.Cleanup(func() {
		g.Stop()
		os.RemoveAll(dir)
	})
	return g
}

// Stop closes the double's server and its connections; the socket stops
// answering, as a dead guestd's would.
func (g *FakeGuest) Stop() {
	_ = g.srv.Close()
	<-g.done
}

// SetFault makes op answer f. For create, path is the requested path; for
// restore and delete, the path of the checkpoint; for list, "".
func (g *FakeGuest) SetFault(op Op, path string, f Fault) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.faults[faultKey{op, path}] = f
}

// SetRoute makes the double answer every request of method on path (the
// path alone, no query) with f, whatever it is: a route guestd has and
// the double does not (sessions, files), or any answer a hostile guest
// could give.
func (g *FakeGuest) SetRoute(method, path string, f Fault) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.routes == nil {
		g.routes = map[string]Fault{}
	}
	g.routes[method+" "+path] = f
}

// SetHandler makes h serve every request of method on path (the path
// alone, no query): a route the double does not have that a test needs
// served whole, such as a session's attachment (a WebSocket).
func (g *FakeGuest) SetHandler(method, path string, h http.Handler) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.handlers == nil {
		g.handlers = map[string]http.Handler{}
	}
	g.handlers[method+" "+path] = h
}

// ClearFaults removes every fault.
func (g *FakeGuest) ClearFaults() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.faults = map[faultKey]Fault{}
}

// SetDelay makes every request wait d (or until its client goes away)
// before it is answered.
func (g *FakeGuest) SetDelay(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.delay = d
}

// SetClock sets the clock that ages answers kept under an
// Idempotency-Key (time.Now by default).
func (g *FakeGuest) SetClock(now func() time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now = now
}

// Requests is how many requests reached the double.
func (g *FakeGuest) Requests() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.requests
}

// LastHeader is the header of the last request that reached the double.
func (g *FakeGuest) LastHeader() http.Header {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastHeader.Clone()
}

// Checkpoints is the double's records, oldest first.
func (g *FakeGuest) Checkpoints() []Checkpoint {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Checkpoint(nil), g.checkpoints...)
}

// Credentials returns what the host last handed over with PUT
// /v1/credentials.
func (g *FakeGuest) Credentials() api.Credentials {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.credentials
}

// Head is the checkpoint the live directory at path continues from.
func (g *FakeGuest) Head(path string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.head[path]
}

func (g *FakeGuest) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.requests++
	g.lastHeader = r.Header.Clone()
	delay := g.delay
	route, routed := g.routes[r.Method+" "+r.URL.Path]
	handler := g.handlers[r.Method+" "+r.URL.Path]
	g.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	if handler != nil {
		handler.ServeHTTP(w, r)
		return
	}
	if routed {
		writeFault(w, route)
		return
	}
	data, err := g.route(r)
	if err != nil {
		var f *faultError
		if errors.As(err, &f) {
			writeFault(w, f.Fault)
			return
		}
		jsend.Error(w, nil, r.Header.Get(jsend.HeaderRequestID), err)
		return
	}
	jsend.Success(w, data)
}

func writeFault(w http.ResponseWriter, f Fault) {
	w.Header().Set("Content-Type", "application/json")
	for k, v := range f.Header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(f.Status)
	_, _ = io.WriteString(w, f.Body)
}

type faultError struct{ Fault }

func (f *faultError) Error() string { return f.Body }

var errNotFound = fault.New(fault.NotFound, "not_found", "no such route")

func (g *FakeGuest) route(r *http.Request) (any, error) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/")
	if !ok {
		return nil, errNotFound
	}
	parts := strings.Split(rest, "/")
	if data, ok, err := g.routeBeyond(r, parts); ok {
		return data, err
	}
	switch {
	case len(parts) == 1 && parts[0] == "health" && r.Method == http.MethodGet:
		return map[string]string{"status": "ok"}, nil
	case len(parts) == 1 && parts[0] == "credentials" && r.Method == http.MethodPut:
		var c api.Credentials
		if err := jsend.DecodeObject(r, &c); err != nil {
			return nil, err
		}
		g.mu.Lock()
		g.credentials = c
		g.mu.Unlock()
		return struct{}{}, nil
	case len(parts) == 1 && parts[0] == "sessions" && r.Method == http.MethodPost:
		// Enough of a session for the tests of who may start one: its
		// record, never a process.
		var req api.SessionRequest
		if err := jsend.DecodeObject(r, &req); err != nil {
			return nil, err
		}
		g.mu.Lock()
		g.sessions++
		n := g.sessions
		g.mu.Unlock()
		return api.Session{ID: "se-" + strconv.FormatUint(0xa000000000000000+uint64(n), 16), Cmd: req.Cmd, State: "running", CreatedAt: time.Unix(0, 0).UTC()}, nil
	case len(parts) == 1 && parts[0] == "sessions" && r.Method == http.MethodGet:
		return map[string][]api.Session{"sessions": {}}, nil
	case len(parts) == 1 && parts[0] == "directories" && r.Method == http.MethodGet:
		if err := jsend.RejectQueryAndBody(r); err != nil {
			return nil, err
		}
		return g.directories(), nil
	case len(parts) == 1 && parts[0] == "checkpoints":
		if err := jsend.RejectQuery(r); err != nil {
			return nil, err
		}
		switch r.Method {
		case http.MethodPost:
			return g.create(r)
		case http.MethodGet:
			if err := jsend.RejectBody(r); err != nil {
				return nil, err
			}
			return g.list()
		}
	case len(parts) == 3 && parts[0] == "checkpoints" && parts[2] == "restore" && r.Method == http.MethodPost:
		if err := jsend.RejectQueryAndBody(r); err != nil {
			return nil, err
		}
		key, err := api.IdempotencyKey(r.Header.Values(api.HeaderIdempotencyKey))
		if err != nil {
			return nil, err
		}
		return g.restore(parts[1], key)
	case len(parts) == 2 && parts[0] == "checkpoints" && r.Method == http.MethodDelete:
		if err := jsend.RejectQueryAndBody(r); err != nil {
			return nil, err
		}
		return g.delete(parts[1])
	}
	return nil, errNotFound
}

func (g *FakeGuest) faultFor(op Op, path string) error {
	if f, ok := g.faults[faultKey{op, path}]; ok {
		return &faultError{f}
	}
	return nil
}

func (g *FakeGuest) create(r *http.Request) (any, error) {
	var body api.CreateRequest
	if err := jsend.DecodeObject(r, &body); err != nil {
		return nil, err
	}
	p, name, err := body.Validate()
	if err != nil {
		return nil, err
	}
	if err := pathpolicy.CheckSyntax(p, nil); err != nil {
		return nil, err
	}
	key, err := api.IdempotencyKey(r.Header.Values(api.HeaderIdempotencyKey))
	if err != nil {
		return nil, err
	}
	request := "create\x00" + p + "\x00" + name
	if n := body.RetentionCount(); n > 0 {
		request += "\x00retain " + strconv.Itoa(n)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if data, ok, err := g.replay(key, request); ok {
		return data, err
	}
	if err := g.faultFor(OpCreate, p); err != nil {
		return nil, err
	}
	for _, cp := range g.checkpoints {
		if m := cp.Path; m != p && (strings.HasPrefix(p, m+"/") || strings.HasPrefix(m, p+"/")) {
			return nil, fault.New(fault.Unprocessable, "path_nested", "The directory is a parent or child of another managed directory.").With("path", p).With("offending", m)
		}
	}
	g.seq++
	cp := Checkpoint{
		ID:        g.newID(),
		Path:      p,
		Name:      name,
		CreatedAt: api.FormatTime(Epoch.Add(time.Duration(g.seq-1) * time.Minute)),
		ParentID:  g.head[p],
	}
	g.head[p] = cp.ID
	g.checkpoints = append(g.checkpoints, cp)
	g.retain(p, body.RetentionCount())
	g.keep(key, request, cp)
	return cp, nil
}

// retain deletes the oldest checkpoints of path (automatic ones aside)
// until it holds at most max; 0 keeps them all.
func (g *FakeGuest) retain(path string, max int) {
	if max == 0 {
		return
	}
	n := 0
	for _, cp := range g.checkpoints {
		if cp.Path == path && !cp.Auto {
			n++
		}
	}
	kept := g.checkpoints[:0]
	for _, cp := range g.checkpoints {
		if n > max && cp.Path == path && !cp.Auto {
			n--
			continue
		}
		kept = append(kept, cp)
	}
	g.checkpoints = kept
}

// replay answers a request that carries an Idempotency-Key already used:
// with the kept answer when the request is the same, with 422
// idempotency_key_reused when it is not. ok is false when the request
// must run (no key, or none kept under it within IdempotencyWindow).
func (g *FakeGuest) replay(key, request string) (data any, ok bool, err error) {
	if key == "" {
		return nil, false, nil
	}
	k, found := g.answers[key]
	if !found || g.now().Sub(k.at) > IdempotencyWindow {
		return nil, false, nil
	}
	if k.request != request {
		return nil, true, errIdempotencyKeyReused.With("idempotency_key", key)
	}
	return k.data, true, nil
}

// keep records the successful answer to request under key.
func (g *FakeGuest) keep(key, request string, data any) {
	if key != "" {
		g.answers[key] = kept{request: request, data: data, at: g.now()}
	}
}

// newID is cp_ and 16 bytes in base64url, derived from the double's name
// and a counter so that runs are reproducible.
func (g *FakeGuest) newID() string {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], g.seq)
	sum := sha256.Sum256(append([]byte(g.name), n[:]...))
	return "cp_" + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// directories answers like guestd's extension: each path and its head.
func (g *FakeGuest) directories() []map[string]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	paths := make([]string, 0, len(g.head))
	for p := range g.head {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	out := []map[string]string{}
	for _, p := range paths {
		out = append(out, map[string]string{"path": p, "checkpoint_id": g.head[p]})
	}
	return out
}

func (g *FakeGuest) list() (any, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.faultFor(OpList, ""); err != nil {
		return nil, err
	}
	return append([]Checkpoint{}, g.checkpoints...), nil
}

func (g *FakeGuest) find(id string) (int, error) {
	for i, cp := range g.checkpoints {
		if cp.ID == id {
			return i, nil
		}
	}
	return -1, fault.New(fault.NotFound, "checkpoint_not_found", "no checkpoint has this id").With("checkpoint_id", id)
}

func (g *FakeGuest) restore(id, key string) (any, error) {
	request := "restore\x00" + id
	g.mu.Lock()
	defer g.mu.Unlock()
	if data, ok, err := g.replay(key, request); ok {
		return data, err
	}
	i, err := g.find(id)
	if err != nil {
		return nil, err
	}
	cp := g.checkpoints[i]
	if err := g.faultFor(OpRestore, cp.Path); err != nil {
		return nil, err
	}
	g.head[cp.Path] = cp.ID
	data := map[string]string{"checkpoint_id": cp.ID, "path": cp.Path}
	g.keep(key, request, data)
	return data, nil
}

// delete removes the record only. The live directory still continues from
// the deleted checkpoint, so the next capture's parent_id names it.
func (g *FakeGuest) delete(id string) (any, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	i, err := g.find(id)
	if err != nil {
		return nil, err
	}
	if err := g.faultFor(OpDelete, g.checkpoints[i].Path); err != nil {
		return nil, err
	}
	g.checkpoints = append(g.checkpoints[:i], g.checkpoints[i+1:]...)
	return struct{}{}, nil
}
