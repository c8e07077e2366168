package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/jsend"
)

const fakeKey = "sk_fake_api_key_0123456789abcdef"

// pending is where a sandbox is going: after polls more GETs in its
// transient state, it reaches target, or error with reason when reason is
// set.
type pending struct {
	target, reason string
	polls          int
	// failed, when set, is the last_error the sandbox gets as it
	// reaches target (an operation that failed after its 202).
	failed *api.FailedOperation
}

// fakeAPI is the sandbox routes of the public API as API.md states them,
// on an httptest server: records kept in memory, every request recorded.
// A sandbox whose name starts with "broken" fails to boot. The VM
// snapshot routes and forks are in snapshot_test.go.
type fakeAPI struct {
	t   *testing.T
	url string

	mu        sync.Mutex
	sandboxes map[string]*api.Sandbox
	order     []string
	pending   map[string]*pending
	requests  []string // "METHOD /path?query"
	bodies    []string // the request bodies, in order
	polls     int      // GETs a transition takes
	pollAfter string   // X-Poll-After of 202 answers and GETs in a transient state
	exec      func(req api.ExecRequest) (api.ExecResult, error)
	// sessions run exec at their start; an attachment gets its result.
	sessions map[string]api.ExecResult
	// restored are the sessions of a command "restored": their first
	// attachment gets "before\n" and is ended by an operation (1011), and
	// the sandbox is restored meanwhile: its generation is another, and an
	// attachment naming the old one is session_restored.
	restored map[string]int // attachments opened

	snaps        map[string]*fakeSnapshots // by sandbox id
	snapLimit    map[bool]int              // by memory: 10 memory, 100 disk-only
	snapStatus   string                    // of new snapshots: ready unless a test says
	incompatible bool                      // memory snapshots cannot be restored
}

func startFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{t: t, sandboxes: map[string]*api.Sandbox{}, pending: map[string]*pending{}, polls: 2, pollAfter: "0",
		snaps: map[string]*fakeSnapshots{}, sessions: map[string]api.ExecResult{}, restored: map[string]int{}, snapLimit: map[bool]int{true: 10, false: 100}, snapStatus: "ready"}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// add puts a sandbox in the fake's records.
func (f *fakeAPI) add(sb api.Sandbox) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes[sb.ID] = &sb
	f.order = append(f.order, sb.ID)
}

func (f *fakeAPI) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// lastBody is the body of the last request that started with prefix
// ("POST /v1/sandboxes").
func (f *fakeAPI) lastBody(prefix string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.requests) - 1; i >= 0; i-- {
		if strings.HasPrefix(f.requests[i], prefix) {
			return f.bodies[i]
		}
	}
	f.t.Fatalf("no request %s", prefix)
	return ""
}

func writeFile(name, content string) error { return os.WriteFile(name, []byte(content), 0o600) }

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	target := r.URL.Path
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	f.requests = append(f.requests, r.Method+" "+target)
	f.bodies = append(f.bodies, string(body))
	if r.Header.Get("X-Api-Key") != fakeKey {
		jsend.Error(w, nil, "", fault.New(fault.Unauthorized, "unauthorized", "a valid account API key is required"))
		return
	}
	if strings.Contains(r.URL.Path, "/sessions") {
		f.session(w, r, body)
		return
	}
	data, status, err := f.route(r, body)
	switch {
	case err != nil:
		jsend.Error(w, nil, "", err)
	case status == http.StatusAccepted:
		w.Header().Set("X-Poll-After", f.pollAfter)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": data})
	default:
		if sb, ok := data.(api.Sandbox); ok && api.SandboxTransient(sb.State) {
			w.Header().Set("X-Poll-After", f.pollAfter)
		}
		jsend.Success(w, data)
	}
}

var errNoSandbox = fault.New(fault.NotFound, "sandbox_not_found", "no such sandbox")

// The fake's generations: its sandboxes', and a "restored" session's
// after its first attachment.
const (
	fakeGeneration         = "00000000000000a1"
	fakeGenerationRestored = "00000000000000b2"
)

// session is POST …/sessions (the command run by f.exec at once) and GET
// …/sessions/{sid}/attach (a WebSocket with the command's stdout, stderr
// and exit), with f.mu held until the attachment is accepted.
func (f *fakeAPI) session(w http.ResponseWriter, r *http.Request, body []byte) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"), "/")
	sb := f.sandboxes[parts[0]]
	switch {
	case sb == nil:
		jsend.Error(w, nil, "", errNoSandbox)
	case sb.State != api.SandboxRunning:
		jsend.Error(w, nil, "", fault.New(fault.Conflict, "sandbox_not_running", "the sandbox is not running").With("state", sb.State))
	case len(parts) == 2 && r.Method == http.MethodPost:
		req, err := api.ParseSession(body)
		if err != nil {
			jsend.Error(w, nil, "", err)
			return
		}
		res, err := f.exec(api.ExecRequest{Cmd: req.Cmd, Cwd: req.Cwd, Env: req.Env, TimeoutS: req.TimeoutS})
		if err != nil {
			jsend.Error(w, nil, "", err)
			return
		}
		id := fmt.Sprintf("se-%016x", len(f.sessions)+1)
		f.sessions[id] = res
		if req.Cmd[0] == "restored" {
			f.restored[id] = 0
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": api.Session{ID: id, Sandbox: sb.ID, Cmd: req.Cmd, TTY: req.TTY, State: api.SessionRunning, Generation: fakeGeneration}})
	case len(parts) == 4 && parts[3] == "attach":
		res, ok := f.sessions[parts[2]]
		if !ok {
			jsend.Error(w, nil, "", api.ErrSessionNotFound)
			return
		}
		n, restored := f.restored[parts[2]]
		current := fakeGeneration
		if restored && n > 0 {
			current = fakeGenerationRestored
		}
		if g := r.URL.Query().Get("generation"); g != "" && g != current {
			jsend.Error(w, nil, "", api.ErrSessionRestored.With("generation", current))
			return
		}
		w.Header().Set(api.HeaderSessionGeneration, current)
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		f.mu.Unlock()
		defer f.mu.Lock()
		ctx := r.Context()
		if restored {
			f.mu.Lock()
			f.restored[parts[2]]++
			f.mu.Unlock()
			if n == 0 {
				c.Write(ctx, websocket.MessageBinary, append([]byte{api.StreamStdout}, "before\n"...))
				c.Close(websocket.StatusInternalError, "the sandbox is being restored")
				return
			}
		}
		for _, out := range []struct {
			stream byte
			data   string
		}{{api.StreamStdout, res.Stdout}, {api.StreamStderr, res.Stderr}} {
			b, _ := base64.StdEncoding.DecodeString(out.data)
			if len(b) > 0 {
				c.Write(ctx, websocket.MessageBinary, append([]byte{out.stream}, b...))
			}
		}
		code := res.ExitCode
		if res.TimedOut {
			code = -1
		}
		m, _ := json.Marshal(api.SessionControl{Type: "exit", ExitCode: &code})
		c.Write(ctx, websocket.MessageText, m)
		c.Close(websocket.StatusNormalClosure, "exited")
	default:
		jsend.Error(w, nil, "", fault.New(fault.NotFound, "not_found", "no such route in the fake"))
	}
}

// resolve is the id of the sandbox seg names, as hostproxy resolves it:
// an id first, then a name; seg itself when neither.
func (f *fakeAPI) resolve(seg string) string {
	if f.sandboxes[seg] != nil {
		return seg
	}
	for _, id := range f.order {
		if sb := f.sandboxes[id]; sb != nil && sb.Name == seg {
			return id
		}
	}
	return seg
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// boot records a new sandbox with sb's resources, in state creating, on
// its way to running (or to error, for a name starting with "broken").
func (f *fakeAPI) boot(sb api.Sandbox, name *string) api.Sandbox {
	sb.ID, sb.State, sb.CreatedAt = fmt.Sprintf("sb-%d", len(f.order)+1), api.SandboxCreating, "2026-11-05T10:00:00.000Z"
	if name != nil {
		sb.Name = *name
	}
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	f.sandboxes[sb.ID] = &sb
	f.order = append(f.order, sb.ID)
	p := &pending{target: api.SandboxRunning, polls: f.polls}
	if strings.HasPrefix(sb.Name, "broken") {
		p.reason = "the guest did not answer within 120 s of boot"
	}
	f.pending[sb.ID] = p
	return sb
}

func (f *fakeAPI) route(r *http.Request, body []byte) (any, int, error) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/sandboxes"), "/")
	switch {
	case r.URL.Path == "/v1/sandboxes" && r.Method == http.MethodPost:
		req, err := api.ParseSandboxCreate(body)
		if err != nil {
			return nil, 0, err
		}
		if req.From != nil {
			src, err := f.snapshotOf(f.resolve(req.From.Sandbox), req.From.Snapshot)
			if err != nil {
				return nil, 0, err
			}
			fork := f.fork(src, req.From.Snapshot, req.Name)
			f.sandboxes[fork.ID].Env, f.sandboxes[fork.ID].Labels = req.Env, orEmpty(req.Labels)
			return *f.sandboxes[fork.ID], http.StatusAccepted, nil
		}
		return f.boot(api.Sandbox{MemoryMiB: *req.MemoryMiB, VCPUs: *req.VCPUs, DiskGiB: *req.DiskGiB, Env: req.Env, Labels: req.Labels}, req.Name), http.StatusAccepted, nil
	case r.URL.Path == "/v1/sandboxes" && r.Method == http.MethodGet:
		limit, offset := 50, 0
		var sel api.LabelSelector
		for k, v := range r.URL.Query() {
			n, err := strconv.Atoi(v[0])
			switch {
			case k == "label":
				if sel, err = api.ParseLabelSelector(v); err != nil {
					return nil, 0, err
				}
			case k == "limit" && err == nil && n >= 1 && n <= 500:
				limit = n
			case k == "offset" && err == nil && n >= 0:
				offset = n
			default:
				return nil, 0, jsend.InvalidField(k, "limit must be 1 to 500 and offset 0 or more")
			}
		}
		all := []api.Sandbox{}
		for _, id := range f.order {
			if sb := f.sandboxes[id]; sb != nil && sel.Matches(sb.Labels) {
				v := *sb
				v.Env = nil // as hostproxy: lists without env
				all = append(all, v)
			}
		}
		page := all[min(offset, len(all)):min(offset+limit, len(all))]
		return api.SandboxList{Data: page, Pagination: api.Pagination{Total: len(all), Limit: limit, Offset: offset, Count: len(page)}}, 0, nil
	case len(parts) < 2:
		return nil, 0, fault.New(fault.NotFound, "not_found", "no such route")
	}
	sb := f.sandboxes[f.resolve(parts[1])]
	if sb == nil {
		return nil, 0, errNoSandbox.With("sandbox_id", parts[1])
	}
	if len(parts) > 2 && parts[2] == "snapshots" {
		return f.snapshotRoute(r, sb, parts[3:], body)
	}
	op := strings.Join(parts[2:], "/")
	state := func() map[string]string { return map[string]string{"id": sb.ID, "state": sb.State} }
	move := func(via, target string) (any, int, error) {
		sb.State = via
		f.pending[sb.ID] = &pending{target: target, polls: f.polls}
		return state(), http.StatusAccepted, nil
	}
	switch {
	case op == "" && r.Method == http.MethodGet:
		if p := f.pending[sb.ID]; p != nil {
			if p.polls > 0 {
				p.polls--
			} else {
				sb.State, sb.Error = p.target, ""
				if p.failed != nil {
					sb.LastError = p.failed
				}
				if p.reason != "" {
					sb.State, sb.Error = api.SandboxError, p.reason
				}
				delete(f.pending, sb.ID)
			}
		}
		return *sb, 0, nil
	case op == "" && r.Method == http.MethodDelete:
		delete(f.sandboxes, sb.ID)
		return map[string]string{"id": sb.ID, "state": api.SandboxDestroyed}, 0, nil
	case op == "pause" && sb.State == api.SandboxPaused, op == "resume" && sb.State == api.SandboxRunning:
		return state(), 0, nil
	case op == "pause" && sb.State == api.SandboxRunning && strings.HasPrefix(sb.Name, "full"):
		// The host's store fills up during the save: back to running.
		ret, status, err := move(api.SandboxPausing, api.SandboxRunning)
		f.pending[sb.ID].failed = &api.FailedOperation{Operation: "pause", Code: "insufficient_storage", Message: "not enough free space on the host's store to proceed safely; delete snapshots or sandboxes", At: "2026-11-05T10:01:00.000Z"}
		return ret, status, err
	case op == "pause" && sb.State == api.SandboxRunning:
		return move(api.SandboxPausing, api.SandboxPaused)
	case op == "resume" && sb.State == api.SandboxPaused:
		return move(api.SandboxResuming, api.SandboxRunning)
	case op == "start" && (sb.State == api.SandboxStopped || sb.State == api.SandboxError):
		return move(api.SandboxCreating, api.SandboxRunning)
	case op == "stop":
		sb.State = api.SandboxStopped
		return state(), 0, nil
	case op == "labels" && r.Method == http.MethodPut:
		labels, err := api.ParseLabelsBody(body)
		if err != nil {
			return nil, 0, err
		}
		sb.Labels = labels
		return *sb, 0, nil
	case op == "access" && r.Method == http.MethodPut:
		acc, err := api.ParseAccessBody(body)
		if err != nil {
			return nil, 0, err
		}
		sb.Access = &acc
		return *sb, 0, nil
	case op == "exec":
		req, err := api.ParseExec(body)
		if err != nil {
			return nil, 0, err
		}
		if sb.State != api.SandboxRunning {
			return nil, 0, fault.New(fault.Conflict, "sandbox_not_running", "the sandbox is not running").With("state", sb.State)
		}
		res, err := f.exec(req)
		return res, 0, err
	}
	return nil, 0, fault.New(fault.Conflict, "sandbox_not_running", "the sandbox is not running").With("state", sb.State)
}

// runFake runs one createos command line against f, with the key and
// address in the environment.
func runFake(t *testing.T, f *fakeAPI, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runFakeEnv(t, f, nil, args...)
}

// runFakeEnv is runFake with more variables in the environment (set
// over the key, address and credentials file).
func runFakeEnv(t *testing.T, f *fakeAPI, more map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	vars := map[string]string{EnvAPIURL: f.url, EnvAPIKey: fakeKey, EnvCredentials: filepath.Join(t.TempDir(), "credentials.env")}
	maps.Copy(vars, more)
	checkHermetic(t, vars)
	var out, errb bytes.Buffer
	code = Run(context.Background(), args, &out, &errb, func(k string) string { return vars[k] })
	return out.String(), errb.String(), code
}

func okFake(t *testing.T, f *fakeAPI, args ...string) string {
	t.Helper()
	out, errOut, code := runFake(t, f, args...)
	if code != 0 {
		t.Fatalf("createos %s: exit %d\n%s", strings.Join(args, " "), code, errOut)
	}
	return out
}

func pinClock(t *testing.T, at string) {
	t.Helper()
	tm, err := time.Parse(time.RFC3339, at)
	if err != nil {
		t.Fatal(err)
	}
	old := now
	now = func() time.Time { return tm }
	t.Cleanup(func() { now = old })
}

// TestSandboxCreateWaits: create sends only the resources given, then
// asks for the record with wait_s at once (the server waits), and again,
// never faster than every 200 ms, while the server answers it still on
// its way, until it runs; and prints the running record.
func TestSandboxCreateWaits(t *testing.T) {
	f := startFakeAPI(t)
	start := time.Now()
	out := okFake(t, f, "sandbox", "create", "web-1", "--memory-mib", "1024", "-o", "json")
	took := time.Since(start)
	var sb Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if sb.ID != "sb-1" || sb.Name != "web-1" || sb.State != "running" || sb.MemoryMiB != 1024 || sb.VCPUs != 1 || sb.DiskGiB != 4 {
		t.Errorf("printed %+v", sb)
	}
	want := []string{"POST /v1/sandboxes", "GET /v1/sandboxes/sb-1?wait_s=20", "GET /v1/sandboxes/sb-1?wait_s=20", "GET /v1/sandboxes/sb-1?wait_s=20"}
	if got := f.log(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if took < 2*minPoll {
		t.Errorf("three asks in %v: the second and third came sooner than %v after the one before", took, minPoll)
	}
	if body := f.lastBody("POST /v1/sandboxes"); body != `{"name":"web-1","memory_mib":1024}` {
		t.Errorf("sent %s", body)
	}

	pinClock(t, "2026-11-05T10:03:30Z")
	f.polls = 0
	table := okFake(t, f, "sandbox", "create")
	for _, want := range []string{"ID", "NAME", "STATE", "MEMORY", "VCPUS", "DISK", "AGE", "sb-2", "running", "512 MiB", "4 GiB", "3m"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if body := f.lastBody("POST /v1/sandboxes"); body != "{}" {
		t.Errorf("create without flags sent %s", body)
	}
}

// TestSandboxCreateWaitFitsTheTimeout: the wait_s asked is at most half
// of --timeout (the HTTP client's), so that the server's answer comes
// before the client gives up on the call.
func TestSandboxCreateWaitFitsTheTimeout(t *testing.T) {
	f := startFakeAPI(t)
	f.polls, f.pollAfter = 0, "10"
	okFake(t, f, "sandbox", "create", "--timeout", "9s")
	want := []string{"POST /v1/sandboxes", "GET /v1/sandboxes/sb-1?wait_s=4"}
	if got := f.log(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestSandboxCreateNoWait: --no-wait prints the record in creating after
// one call.
func TestSandboxCreateNoWait(t *testing.T) {
	f := startFakeAPI(t)
	out := okFake(t, f, "sandbox", "create", "--no-wait", "--vcpus", "2", "--disk-gib", "8", "-o", "json")
	var sb Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.State != "creating" || sb.VCPUs != 2 || sb.DiskGiB != 8 {
		t.Errorf("printed %+v", sb)
	}
	if got := f.log(); len(got) != 1 {
		t.Errorf("requests %q, want the create alone", got)
	}
}

// TestSandboxCreateFails: a sandbox that goes to error fails the command
// with the record's reason; a name the API would refuse is a usage error.
func TestSandboxCreateFails(t *testing.T) {
	f := startFakeAPI(t)
	out, errOut, code := runFake(t, f, "sandbox", "create", "broken")
	if code != 1 || out != "" || !strings.Contains(errOut, "sandbox sb-1 went to state error: the guest did not answer within 120 s of boot") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	_, errOut, code = runFake(t, f, "sandbox", "create", "Web_1")
	if code != 2 || !strings.Contains(errOut, `sandbox name "Web_1"`) {
		t.Errorf("bad name: exit %d: %s", code, errOut)
	}
	_, errOut, code = runFake(t, f, "sandbox", "create", "--memory-mib", "99999")
	if code != 1 || !strings.Contains(errOut, "invalid_field: memory_mib must be 128 to 8192") || !strings.Contains(errOut, "field: memory_mib") {
		t.Errorf("memory out of range: exit %d: %s", code, errOut)
	}
}

// TestSandboxLifecycle: pause, resume, stop, start wait for their final
// state (unless --no-wait); get shows the record; rm destroys.
func TestSandboxLifecycle(t *testing.T) {
	f := startFakeAPI(t)
	f.polls = 1
	f.add(api.Sandbox{ID: "sb-a1", Name: "web", State: "running", MemoryMiB: 512, VCPUs: 1, DiskGiB: 4, CreatedAt: "2026-11-05T10:00:00.000Z"})
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"pause", "sb-a1"}, "sb-a1 is paused\n"},
		{[]string{"pause", "sb-a1"}, "sb-a1 is paused\n"}, // already: 200 at once
		{[]string{"resume", "sb-a1"}, "sb-a1 is running\n"},
		{[]string{"stop", "sb-a1"}, "sb-a1 is stopped\n"},
		{[]string{"start", "sb-a1", "--no-wait"}, "sb-a1 is creating\n"},
	}
	for i, s := range steps {
		if out := okFake(t, f, append([]string{"sandbox"}, s.args...)...); out != s.want {
			t.Errorf("step %d %q printed %q, want %q", i, s.args, out, s.want)
		}
	}
	get := okFake(t, f, "sandbox", "get", "sb-a1")
	if !strings.Contains(get, "creating") || !strings.Contains(get, "created: 2026-11-05T10:00:00.000Z") {
		t.Errorf("get while creating:\n%s", get)
	}
	get = okFake(t, f, "sandbox", "get", "sb-a1", "-o", "json")
	if !strings.Contains(get, `"state": "running"`) {
		t.Errorf("get -o json:\n%s", get)
	}
	okFake(t, f, "sandbox", "pause", "sb-a1", "--no-wait")
	if _, errOut, code := runFake(t, f, "sandbox", "resume", "sb-a1"); code != 1 || !strings.Contains(errOut, "sandbox_not_running") || !strings.Contains(errOut, "state: pausing") {
		t.Errorf("resume while pausing: exit %d: %s", code, errOut)
	}
	if out := okFake(t, f, "sandbox", "rm", "sb-a1"); out != "Destroyed sb-a1\n" {
		t.Errorf("rm printed %q", out)
	}
	if _, errOut, code := runFake(t, f, "sandbox", "get", "sb-a1"); code != 1 || !strings.Contains(errOut, "createos: sandbox_not_found: no such sandbox") {
		t.Errorf("get after rm: exit %d: %s", code, errOut)
	}
	if _, errOut, code := runFake(t, f, "sandbox", "pause"); code != 2 || !strings.Contains(errOut, "accepts 1 arg") {
		t.Errorf("pause without a sandbox: exit %d: %s", code, errOut)
	}
}

// TestSandboxList: --limit and --offset are sent only when given; the
// table says where the page is and how to get the next one.
func TestSandboxList(t *testing.T) {
	f := startFakeAPI(t)
	if out := okFake(t, f, "sandbox", "list"); out != "No sandboxes.\n" {
		t.Errorf("empty list printed %q", out)
	}
	for i := 1; i <= 5; i++ {
		f.add(api.Sandbox{ID: fmt.Sprintf("sb-%d", i), State: "running", MemoryMiB: 512, VCPUs: 1, DiskGiB: 4, CreatedAt: "2026-11-05T10:00:00.000Z"})
	}
	all := okFake(t, f, "sandbox", "list")
	if strings.Count(all, "\n") != 6 || strings.Contains(all, "next page") {
		t.Errorf("list:\n%s", all)
	}
	page := okFake(t, f, "sandbox", "ls", "--limit", "2", "--offset", "1")
	if !strings.Contains(page, "sb-2") || !strings.Contains(page, "sb-3") || strings.Contains(page, "sb-4") ||
		!strings.Contains(page, "2 to 3 of 5; next page: --offset 3") {
		t.Errorf("page:\n%s", page)
	}
	if out := okFake(t, f, "sandbox", "list", "--offset", "9"); out != "No sandboxes at offset 9 (5 in all).\n" {
		t.Errorf("past the end printed %q", out)
	}
	var list api.SandboxList
	if err := json.Unmarshal([]byte(okFake(t, f, "sandbox", "list", "--limit", "3", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Data) != 3 || list.Pagination != (api.Pagination{Total: 5, Limit: 3, Offset: 0, Count: 3}) {
		t.Errorf("list -o json: %+v", list)
	}
	want := []string{"GET /v1/sandboxes", "GET /v1/sandboxes", "GET /v1/sandboxes?limit=2&offset=1", "GET /v1/sandboxes?offset=9", "GET /v1/sandboxes?limit=3"}
	if got := f.log(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, errOut, code := runFake(t, f, "sandbox", "list", "--limit", "0"); code != 1 || !strings.Contains(errOut, "invalid_field") || !strings.Contains(errOut, "field: limit") {
		t.Errorf("--limit 0: exit %d: %s", code, errOut)
	}
}

// TestSandboxExec: exec starts the command as a session and streams its
// attachment (with -o json or --stdin-file: the API's one-shot exec, base64
// asked for), writes stdout and stderr byte for byte, and exits with the
// command's status; 124 on a timeout.
func TestSandboxExec(t *testing.T) {
	f := startFakeAPI(t)
	f.add(api.Sandbox{ID: "sb-a1", State: "running"})
	f.add(api.Sandbox{ID: "sb-off", State: "stopped"})
	var got api.ExecRequest
	b64 := base64.StdEncoding.EncodeToString
	binary := []byte{0, 0xff, 0xfe, '\n', 0xc3}
	f.exec = func(req api.ExecRequest) (api.ExecResult, error) {
		got = req
		switch req.Cmd[0] {
		case "fail":
			return api.ExecResult{ExitCode: 3, Stdout: b64([]byte("out\n")), Stderr: b64([]byte("err\n"))}, nil
		case "binary":
			return api.ExecResult{Stdout: b64(binary), Stderr: b64([]byte{0xff})}, nil
		case "killed":
			return api.ExecResult{ExitCode: 137}, nil
		case "slow":
			return api.ExecResult{ExitCode: -1, TimedOut: true, Stdout: b64([]byte("partial"))}, nil
		case "big":
			return api.ExecResult{Stdout: b64([]byte("x")), Truncated: true}, nil
		case "nope":
			return api.ExecResult{}, api.ExecFailed("program nope is not found in PATH (/usr/bin)").With("program", "nope")
		}
		return api.ExecResult{Stdout: b64([]byte(strings.Join(req.Cmd, " ")))}, nil
	}
	stdin := filepath.Join(t.TempDir(), "in.txt")
	if err := writeFile(stdin, "input\n"); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name           string
		args           []string
		code           int
		stdout, stderr string
		check          func(t *testing.T)
	}{
		{name: "every flag", args: []string{"sb-a1", "--cwd", "/work", "--env", "A=1", "--env", "B=x=y", "--timeout", "5m", "--stdin-file", stdin, "--", "echo", "-n", "--flag"},
			stdout: "echo -n --flag", check: func(t *testing.T) {
				want := api.ExecRequest{Cmd: []string{"echo", "-n", "--flag"}, Cwd: "/work", Env: map[string]string{"A": "1", "B": "x=y"}, Stdin: "input\n", TimeoutS: 300, Encoding: "base64"}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("sent %+v, want %+v", got, want)
				}
			}},
		{name: "defaults", args: []string{"sb-a1", "--", "true"}, stdout: "true", check: func(t *testing.T) {
			if body := f.lastBody("POST /v1/sandboxes/sb-a1/sessions"); body != `{"cmd":["true"],"timeout_s":60}` {
				t.Errorf("sent %s", body)
			}
			if log := f.log(); log[len(log)-1] != "GET /v1/sandboxes/sb-a1/sessions/se-"+fmt.Sprintf("%016x", len(f.sessions))+"/attach?generation="+fakeGeneration+"&since=0" {
				t.Errorf("then %s", log[len(log)-1])
			}
		}},
		{name: "interactive, no timeout", args: []string{"sb-a1", "-i", "--", "cat"}, stdout: "cat", check: func(t *testing.T) {
			if body := f.lastBody("POST /v1/sandboxes/sb-a1/sessions"); body != `{"cmd":["cat"]}` {
				t.Errorf("sent %s", body)
			}
		}},
		{name: "detach", args: []string{"sb-a1", "--detach", "--", "sleep", "9"}, stdout: "se-0000000000000003\n", check: func(t *testing.T) {
			if body := f.lastBody("POST /v1/sandboxes/sb-a1/sessions"); body != `{"cmd":["sleep","9"],"detachable":true}` {
				t.Errorf("sent %s", body)
			}
		}},
		{name: "timeout in seconds", args: []string{"sb-a1", "--timeout", "90", "--", "true"}, stdout: "true", check: func(t *testing.T) {
			if got.TimeoutS != 90 {
				t.Errorf("timeout_s %d", got.TimeoutS)
			}
		}},
		{name: "exit code", args: []string{"sb-a1", "--", "fail"}, code: 3, stdout: "out\n", stderr: "err\n"},
		{name: "binary output", args: []string{"sb-a1", "--", "binary"}, stdout: string(binary), stderr: "\xff"},
		{name: "killed by a signal", args: []string{"sb-a1", "--", "killed"}, code: 137},
		{name: "timed out", args: []string{"sb-a1", "--timeout", "5", "--", "slow"}, code: 124, stdout: "partial",
			stderr: "createos: the command timed out after 5 s; every process it started was killed\n"},
		{name: "truncated, in one call", args: []string{"sb-a1", "--stdin-file", stdin, "--", "big"}, stdout: "x", stderr: "createos: the output was cut at 1048576 bytes per stream (truncated)\n"},
		{name: "exec_failed", args: []string{"sb-a1", "--", "nope"}, code: 1,
			stderr: "createos: exec_failed: program nope is not found in PATH (/usr/bin)\n  program: nope\n"},
		// Issue 30 item 6.2: after an operation ended the attachment, the
		// sandbox was restored; the reattach names the generation the
		// session started in, is refused, and nothing of the restored
		// run is printed after "before".
		{name: "restored while detached", args: []string{"sb-a1", "--", "restored"}, code: 1, stdout: "before\n",
			stderr: "createos: session_restored: the sandbox was restored or forked while the attachment was ended: session se-0000000000000009 is another run's now, whose output from byte 7 is not what followed here; attach to that run with: createos sandbox session attach sb-a1 se-0000000000000009\n",
			check: func(t *testing.T) {
				log := f.log()
				want := "GET /v1/sandboxes/sb-a1/sessions/se-0000000000000009/attach?generation=" + fakeGeneration + "&since="
				if !strings.HasPrefix(log[len(log)-2], want+"0") || !strings.HasPrefix(log[len(log)-1], want+"7") {
					t.Errorf("the attachments: %q, %q; want %s0 then %s7", log[len(log)-2], log[len(log)-1], want, want)
				}
			}},
		{name: "not running", args: []string{"sb-off", "--", "true"}, code: 1,
			stderr: "createos: sandbox_not_running: the sandbox is not running\n  state: stopped\n"},
		{name: "invalid body", args: []string{"sb-a1", "--cwd", "relative", "--", "true"}, code: 1,
			stderr: "createos: invalid_field: cwd must be an absolute path without NUL bytes\n  field: cwd\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runFake(t, f, append([]string{"sandbox", "exec"}, tc.args...)...)
			if code != tc.code || out != tc.stdout || errOut != tc.stderr {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d, %q, %q", code, out, errOut, tc.code, tc.stdout, tc.stderr)
			}
			if tc.check != nil {
				tc.check(t)
			}
		})
	}

	t.Run("-o json", func(t *testing.T) {
		out, _, code := runFake(t, f, "sandbox", "exec", "sb-a1", "-o", "json", "--", "fail")
		var res api.ExecResult
		if err := json.Unmarshal([]byte(out), &res); err != nil || code != 3 || res.Stdout != b64([]byte("out\n")) {
			t.Errorf("exit %d, %q (%v)", code, out, err)
		}
	})

	before := len(f.log())
	for _, bad := range [][]string{
		{"sb-a1"},
		{"sb-a1", "--env", "NOEQUALS", "--", "true"},
		{"sb-a1", "--env", "=v", "--", "true"},
		{"sb-a1", "--timeout", "0", "--", "true"},
		{"sb-a1", "--timeout", "3601", "--", "true"},
		{"sb-a1", "--timeout", "1.5s", "--", "true"},
		{"sb-a1", "--stdin-file", "/nonexistent/in", "--", "true"},
	} {
		if _, errOut, code := runFake(t, f, append([]string{"sandbox", "exec"}, bad...)...); code != 2 {
			t.Errorf("exec %q: exit %d, want 2: %s", bad, code, errOut)
		}
	}
	notText := filepath.Join(t.TempDir(), "bin")
	if err := writeFile(notText, "\xff\xfe"); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runFake(t, f, "sandbox", "exec", "sb-a1", "--stdin-file", notText, "--", "cat"); code != 2 || !strings.Contains(errOut, "not UTF-8 text") {
		t.Errorf("binary stdin file: exit %d: %s", code, errOut)
	}
	if n := len(f.log()); n != before {
		t.Errorf("a usage error reached the API (%d requests)", n-before)
	}
}

// TestSandboxErrorOutput: a fail envelope prints its code, message and
// fields and exits 1; with -o json the answer as is; a 5xx names the
// request id.
func TestSandboxErrorOutput(t *testing.T) {
	f := startFakeAPI(t)
	_, errOut, code := runFake(t, f, "sandbox", "get", "sb-nope")
	if code != 1 || errOut != "createos: sandbox_not_found: no such sandbox\n  sandbox_id: sb-nope\n" {
		t.Errorf("exit %d: %q", code, errOut)
	}
	_, errOut, code = runFake(t, f, "sandbox", "rm", "sb-nope", "-o", "json")
	if code != 1 || !strings.HasPrefix(errOut, `{"data":{"code":"sandbox_not_found"`) || !strings.Contains(errOut, `"status":"fail"`) {
		t.Errorf("-o json: exit %d: %q", code, errOut)
	}
	vars := map[string]string{EnvAPIURL: f.url, EnvAPIKey: "sk_wrong", EnvCredentials: filepath.Join(t.TempDir(), "c.env")}
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"sandbox", "list"}, &out, &errb, func(k string) string { return vars[k] }); code != 1 || !strings.Contains(errb.String(), "unauthorized") {
		t.Errorf("bad key: exit %d: %s", code, errb.String())
	}

	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req-123")
		jsend.Error(w, nil, "", fault.New(fault.Unavailable, "host_capacity", "the host cannot fit this sandbox now"))
	}))
	defer down.Close()
	f.url = down.URL
	_, errOut, code = runFake(t, f, "sandbox", "create")
	if code != 1 || !strings.Contains(errOut, "server error 503: host_capacity: the host cannot fit this sandbox now") || !strings.Contains(errOut, "request id: req-123") {
		t.Errorf("503: exit %d: %q", code, errOut)
	}
}

// TestSandboxWaitTimeout: a sandbox that stays on its way fails the wait
// after --wait-timeout, naming its state.
func TestSandboxWaitTimeout(t *testing.T) {
	f := startFakeAPI(t)
	f.polls = 1000
	start := time.Now()
	_, errOut, code := runFake(t, f, "sandbox", "create", "--wait-timeout", "700ms")
	if code != 1 || !strings.Contains(errOut, "sandbox sb-1 is still creating, not running, after 700ms") || time.Since(start) > 5*time.Second {
		t.Errorf("exit %d after %v: %s", code, time.Since(start), errOut)
	}
}

// TestAge: the AGE column in its largest unit.
func TestAge(t *testing.T) {
	pinClock(t, "2026-11-05T10:00:00Z")
	for created, want := range map[string]string{
		"2026-11-05T09:59:15.000Z": "45s", "2026-11-05T09:48:00Z": "12m", "2026-11-05T05:00:00Z": "5h",
		"2026-11-03T11:00:00Z": "47h", "2026-11-03T10:00:00Z": "2d", "2026-11-02T09:00:00Z": "3d", "2026-11-05T10:00:05Z": "0s", "": "-", "yesterday": "-",
	} {
		if got := age(created); got != want {
			t.Errorf("age(%q) = %q, want %q", created, got, want)
		}
	}
}

// TestSandboxPauseThatFailsSaysWhy: a pause answered 202 whose save then
// failed on the host (the sandbox runs on) fails the command with the
// record's last_error, and get shows it.
func TestSandboxPauseThatFailsSaysWhy(t *testing.T) {
	f := startFakeAPI(t)
	f.polls = 1
	f.add(api.Sandbox{ID: "sb-a1", Name: "full-disk", State: "running", MemoryMiB: 512, VCPUs: 1, DiskGiB: 4, CreatedAt: "2026-11-05T10:00:00.000Z"})
	_, errOut, code := runFake(t, f, "sandbox", "pause", "sb-a1")
	if code != 1 || !strings.Contains(errOut, "sandbox sb-a1 is running, not paused: its pause failed: insufficient_storage: not enough free space") {
		t.Errorf("exit %d: %s", code, errOut)
	}
	get := okFake(t, f, "sandbox", "get", "sb-a1")
	if !strings.Contains(get, "last error: pause at 2026-11-05T10:01:00.000Z: insufficient_storage: not enough free space") {
		t.Errorf("get:\n%s", get)
	}
}

// TestSandboxAccess: --access on create and fork is sent as the API's
// access setting ("none" or {"scopes":[…]}); createos sandbox access sets
// it and prints it; a setting the API would refuse is a usage error (exit
// 2) that sends nothing.
func TestSandboxAccess(t *testing.T) {
	f := startFakeAPI(t)
	f.polls = 0
	okFake(t, f, "sandbox", "create", "a", "--access", "none")
	if body := f.lastBody("POST /v1/sandboxes"); body != `{"name":"a","access":"none"}` {
		t.Errorf("create --access none sent %s", body)
	}
	okFake(t, f, "sandbox", "create", "b", "--access", "exec,checkpoints")
	if body := f.lastBody("POST /v1/sandboxes"); body != `{"name":"b","access":{"scopes":["checkpoints","exec"]}}` {
		t.Errorf("create --access exec,checkpoints sent %s", body)
	}
	out := okFake(t, f, "sandbox", "access", "sb-1", "files,exec")
	if body := f.lastBody("PUT /v1/sandboxes/sb-1/access"); body != `{"scopes":["exec","files"]}` {
		t.Errorf("access sent %s", body)
	}
	if !strings.Contains(out, "The access of sb-1 is exec,files.") {
		t.Errorf("access printed %q", out)
	}
	if out := okFake(t, f, "sandbox", "access", "sb-1", "none"); !strings.Contains(out, "is none") {
		t.Errorf("access none printed %q", out)
	}
	if out := okFake(t, f, "sandbox", "get", "sb-1"); !strings.Contains(out, "access: none") {
		t.Errorf("get printed %q", out)
	}
	before := len(f.log())
	for _, args := range [][]string{
		{"sandbox", "access", "sb-1", "root"},
		{"sandbox", "access", "sb-1", "exec,exec"},
		{"sandbox", "access", "sb-1", ""},
		{"sandbox", "create", "--access", "all"},
		{"sandbox", "fork", "sb-1", "v1", "--access", "exec,"},
	} {
		if _, errOut, code := runFake(t, f, args...); code != 2 || errOut == "" {
			t.Errorf("%q: exit %d %q, want a usage error", args, code, errOut)
		}
	}
	if got := f.log(); len(got) != before {
		t.Errorf("refused settings were sent: %q", got[before:])
	}
}

// TestSessionAttachLearnsTheGeneration: session attach, which has no
// record, takes the generation its first attachment's handshake names,
// and sends it on the next (issue 30 item 6.2).
func TestSessionAttachLearnsTheGeneration(t *testing.T) {
	f := startFakeAPI(t)
	f.add(api.Sandbox{ID: "sb-a1", State: "running"})
	f.exec = func(req api.ExecRequest) (api.ExecResult, error) { return api.ExecResult{}, nil }
	id := strings.TrimSpace(okFake(t, f, "sandbox", "exec", "sb-a1", "--detach", "--", "restored"))
	out, errOut, code := runFake(t, f, "sandbox", "session", "attach", "sb-a1", id)
	if code != 1 || out != "before\n" || !strings.HasPrefix(errOut, "createos: session_restored: ") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	log := f.log()
	first, again := log[len(log)-2], log[len(log)-1]
	if first != "GET /v1/sandboxes/sb-a1/sessions/"+id+"/attach?since=0" || again != "GET /v1/sandboxes/sb-a1/sessions/"+id+"/attach?generation="+fakeGeneration+"&since=7" {
		t.Errorf("the attachments: %q, then %q", first, again)
	}
}
