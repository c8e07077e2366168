package guestd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"strata/internal/api"
	"strata/internal/fault"
)

// sessionStack is a guestd without a store behind a real HTTP server
// (attachments are WebSockets).
type sessionStack struct {
	t   *testing.T
	url string
	srv *Server
}

func newSessionStack(t *testing.T) *sessionStack {
	s := storelessServer(t, &bytes.Buffer{})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		// Nothing a test starts outlives it.
		s.sessions.mu.Lock()
		for _, se := range s.sessions.byID {
			se.kill()
		}
		s.sessions.mu.Unlock()
		srv.Close()
	})
	return &sessionStack{t: t, url: srv.URL, srv: s}
}

// call sends one request and decodes the JSend answer's data into out
// (when not nil); it returns the status and the fail data, if any.
func (st *sessionStack) call(method, path, body string, out any) (int, map[string]any) {
	st.t.Helper()
	req, _ := http.NewRequest(method, st.url+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		st.t.Fatal(err)
	}
	defer resp.Body.Close()
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &env); err != nil {
		st.t.Fatalf("%s %s: %d %q is not JSend", method, path, resp.StatusCode, b)
	}
	if env.Status != "success" {
		var fail map[string]any
		json.Unmarshal(env.Data, &fail)
		return resp.StatusCode, fail
	}
	if out != nil {
		if err := json.Unmarshal(env.Data, out); err != nil {
			st.t.Fatal(err)
		}
	}
	return resp.StatusCode, nil
}

func (st *sessionStack) start(req map[string]any) api.Session {
	st.t.Helper()
	body, _ := json.Marshal(req)
	var se api.Session
	if code, fail := st.call("POST", "/v1/sessions", string(body), &se); code != 200 {
		st.t.Fatalf("POST /v1/sessions %s: %d %v", body, code, fail)
	}
	if !api.ValidSessionID(se.ID) || se.State != api.SessionRunning {
		st.t.Fatalf("started %+v", se)
	}
	return se
}

func (st *sessionStack) get(id string) api.Session {
	st.t.Helper()
	var se api.Session
	if code, fail := st.call("GET", "/v1/sessions/"+id, "", &se); code != 200 {
		st.t.Fatalf("GET %s: %d %v", id, code, fail)
	}
	return se
}

// waitExited waits until session id exited and returns its record.
func (st *sessionStack) waitExited(id string) api.Session {
	st.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		se := st.get(id)
		if se.State == api.SessionExited {
			return se
		}
		if time.Now().After(deadline) {
			st.t.Fatalf("session %s still %s", id, se.State)
		}
	}
}

// attachment is one WebSocket attachment, read in the background.
type attachment struct {
	c       *websocket.Conn
	mu      sync.Mutex   // guards the fields below
	out     bytes.Buffer // stdout, and the terminal's output
	err     bytes.Buffer
	control []api.SessionControl
	closed  chan struct{}
	status  websocket.StatusCode
}

func (st *sessionStack) attach(id, query string) *attachment {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	st.t.Cleanup(cancel)
	c, _, err := websocket.Dial(ctx, strings.Replace(st.url, "http", "ws", 1)+"/v1/sessions/"+id+"/attach"+query, nil)
	if err != nil {
		st.t.Fatalf("attach %s: %v", id, err)
	}
	c.SetReadLimit(api.MaxSessionFrame)
	a := &attachment{c: c, closed: make(chan struct{})}
	go func() {
		defer close(a.closed)
		for {
			typ, b, err := c.Read(ctx)
			a.mu.Lock()
			if err != nil {
				a.status = websocket.CloseStatus(err)
				a.mu.Unlock()
				return
			}
			switch {
			case typ == websocket.MessageText:
				var m api.SessionControl
				json.Unmarshal(b, &m)
				a.control = append(a.control, m)
			case b[0] == api.StreamStdout:
				a.out.Write(b[1:])
			case b[0] == api.StreamStderr:
				a.err.Write(b[1:])
			}
			a.mu.Unlock()
		}
	}()
	return a
}

func (a *attachment) stdin(t *testing.T, s string) {
	t.Helper()
	if err := a.c.Write(context.Background(), websocket.MessageBinary, append([]byte{api.StreamStdin}, s...)); err != nil {
		t.Fatal(err)
	}
}

func (a *attachment) send(t *testing.T, m api.SessionControl) {
	t.Helper()
	b, _ := json.Marshal(m)
	if err := a.c.Write(context.Background(), websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

// waitOut waits until the attachment's stdout holds want.
func (a *attachment) waitOut(t *testing.T, want string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		a.mu.Lock()
		got := a.out.String()
		a.mu.Unlock()
		if strings.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stdout %q has no %q", got, want)
		}
	}
}

// end waits for the attachment's close and returns what it got.
func (a *attachment) end(t *testing.T) (stdout, stderr string, control []api.SessionControl, status websocket.StatusCode) {
	t.Helper()
	select {
	case <-a.closed:
	case <-time.After(20 * time.Second):
		t.Fatal("the attachment did not close")
	}
	return a.out.String(), a.err.String(), a.control, a.status
}

func exitOf(control []api.SessionControl) (int, bool) {
	for _, m := range control {
		if m.Type == "exit" && m.ExitCode != nil {
			return *m.ExitCode, true
		}
	}
	return 0, false
}

// TestSession: a session's stdout and stderr come as separate frames,
// stdin goes in, and its exit status ends the attachment (1000); a
// terminal has the size asked and takes resizes; a detachable session
// runs on without attachments and replays its output to the next; one
// that is not detachable ends (SIGHUP) with its last attachment; DELETE
// ends one; its timeout kills it.
func TestSession(t *testing.T) {
	st := newSessionStack(t)

	t.Run("streams", func(t *testing.T) {
		se := st.start(map[string]any{"cmd": []string{"sh", "-c", `read x; echo "got $x"; echo oops >&2; exit 3`}})
		a := st.attach(se.ID, "")
		a.stdin(t, "hello\n")
		out, errOut, control, status := a.end(t)
		if code, ok := exitOf(control); out != "got hello\n" || errOut != "oops\n" || !ok || code != 3 || status != websocket.StatusNormalClosure {
			t.Fatalf("stdout %q stderr %q control %+v status %d; want got hello, oops, exit 3, 1000", out, errOut, control, status)
		}
		if rec := st.waitExited(se.ID); rec.ExitCode == nil || *rec.ExitCode != 3 || rec.EndedAt == nil || rec.OutputBytes != int64(len("got hello\noops\n")) {
			t.Fatalf("record %+v", rec)
		}
	})

	t.Run("eof", func(t *testing.T) {
		se := st.start(map[string]any{"cmd": []string{"wc", "-c"}})
		a := st.attach(se.ID, "")
		a.stdin(t, "12345")
		a.send(t, api.SessionControl{Type: "eof"})
		if out, _, control, _ := a.end(t); strings.TrimSpace(out) != "5" {
			t.Fatalf("wc -c of 5 bytes then eof: %q %+v", out, control)
		}
	})

	t.Run("terminal", func(t *testing.T) {
		se := st.start(map[string]any{"cmd": []string{"sh", "-c", `stty size; [ -t 0 ] && echo tty; read x; stty size; echo "[$x]"`}, "tty": true, "rows": 30, "cols": 100})
		a := st.attach(se.ID, "")
		a.waitOut(t, "30 100")
		a.waitOut(t, "tty")
		a.send(t, api.SessionControl{Type: "resize", Rows: 40, Cols: 120})
		a.stdin(t, "abc\r")
		out, _, control, _ := a.end(t)
		if code, _ := exitOf(control); !strings.Contains(out, "40 120") || !strings.Contains(out, "[abc]") || code != 0 {
			t.Fatalf("terminal output %q, control %+v", out, control)
		}
	})

	t.Run("terminal held by a background process", func(t *testing.T) {
		// The leader exits; a process of its own session keeps the
		// terminal open: the session still ends (a second after).
		se := st.start(map[string]any{"cmd": []string{"sh", "-c", "setsid sleep 30 & echo bye"}, "tty": true, "detachable": true})
		if rec := st.waitExited(se.ID); *rec.ExitCode != 0 {
			t.Fatalf("%+v", rec)
		}
	})

	t.Run("stdin nobody reads", func(t *testing.T) {
		// More stdin than a pipe holds, to a program that never reads
		// it: the writes wait, and the session still ends.
		se := st.start(map[string]any{"cmd": []string{"sleep", "1"}})
		a := st.attach(se.ID, "")
		for range 8 {
			a.c.Write(context.Background(), websocket.MessageBinary, append([]byte{api.StreamStdin}, make([]byte, 60<<10)...))
		}
		if rec := st.waitExited(se.ID); *rec.ExitCode != 0 {
			t.Fatalf("%+v", rec)
		}
	})

	t.Run("signal", func(t *testing.T) {
		se := st.start(map[string]any{"cmd": []string{"sh", "-c", `trap 'echo int; exit 7' INT; echo ready; while :; do sleep 0.05; done`}})
		a := st.attach(se.ID, "")
		a.waitOut(t, "ready")
		a.send(t, api.SessionControl{Type: "signal", Signal: "INT"})
		if _, _, control, _ := a.end(t); !exitedWith(control, 7) {
			t.Fatalf("after INT: %+v", control)
		}
	})

	t.Run("detachable", func(t *testing.T) {
		se := st.start(map[string]any{"cmd": []string{"sh", "-c", `echo one; read x; echo "two $x"`}, "detachable": true})
		a := st.attach(se.ID, "")
		a.waitOut(t, "one")
		a.c.Close(websocket.StatusNormalClosure, "")
		<-a.closed
		time.Sleep(200 * time.Millisecond)
		if rec := st.get(se.ID); rec.State != api.SessionRunning || rec.Attached != 0 {
			t.Fatalf("detached session: %+v", rec)
		}
		b := st.attach(se.ID, "?since=0")
		b.waitOut(t, "one\n")
		b.stdin(t, "x\n")
		out, _, control, _ := b.end(t)
		if code, _ := exitOf(control); out != "one\ntwo x\n" || code != 0 {
			t.Fatalf("again from 0: %q %+v", out, control)
		}
		c := st.attach(se.ID, "?since=4")
		if out, _, control, _ := c.end(t); out != "two x\n" || !exitedWith(control, 0) {
			t.Fatalf("an exited session from 4: %q %+v", out, control)
		}
	})

	t.Run("not detachable ends with its attachment", func(t *testing.T) {
		se := st.start(map[string]any{"cmd": []string{"sh", "-c", `echo up; exec sleep 100`}})
		a := st.attach(se.ID, "")
		a.waitOut(t, "up")
		a.c.Close(websocket.StatusNormalClosure, "")
		if rec := st.waitExited(se.ID); *rec.ExitCode != 128+1 {
			t.Fatalf("after its last attachment: %+v, want exit 129 (SIGHUP)", rec)
		}
	})

	t.Run("held by an operation on the sandbox", func(t *testing.T) {
		// hostproxy ends an attachment for a memory snapshot with
		// FrameHold: the session waits for an attachment to come again,
		// and ends (SIGHUP) only when none came in time; closed the
		// ordinary way after that, it ends at once.
		// Long enough that the attach below lands within it however
		// slow the machine.
		st.srv.sessions.attachWait = 3 * time.Second
		defer func() { st.srv.sessions.attachWait = 0 }()
		se := st.start(map[string]any{"cmd": []string{"sh", "-c", `echo up; exec sleep 100`}})
		hold := func(a *attachment) {
			t.Helper()
			if err := a.c.Write(context.Background(), websocket.MessageBinary, []byte{api.FrameHold}); err != nil {
				t.Fatal(err)
			}
			a.c.CloseNow()
			<-a.closed
		}
		a := st.attach(se.ID, "")
		a.waitOut(t, "up")
		hold(a)
		time.Sleep(200 * time.Millisecond)
		if rec := st.get(se.ID); rec.State != api.SessionRunning {
			t.Fatalf("held, before its wait is over: %+v", rec)
		}
		b := st.attach(se.ID, "?since=3")
		time.Sleep(3500 * time.Millisecond) // past the first hold's wait, attached
		if rec := st.get(se.ID); rec.State != api.SessionRunning || rec.Attached != 1 {
			t.Fatalf("attached again within the wait, after it: %+v", rec)
		}
		hold(b)
		if rec := st.waitExited(se.ID); *rec.ExitCode != 128+1 {
			t.Fatalf("held, with no attachment in time: %+v, want exit 129 (SIGHUP)", rec)
		}

		// With a wait longer than the test's, only the ordinary close
		// can end it.
		st.srv.sessions.attachWait = time.Hour
		se = st.start(map[string]any{"cmd": []string{"sh", "-c", `echo up; exec sleep 100`}})
		a = st.attach(se.ID, "")
		a.waitOut(t, "up")
		hold(a)
		b = st.attach(se.ID, "")
		b.waitOut(t, "up")
		b.c.Close(websocket.StatusNormalClosure, "")
		if rec := st.waitExited(se.ID); *rec.ExitCode != 128+1 {
			t.Fatalf("closed after a hold: %+v, want exit 129 (SIGHUP)", rec)
		}
	})

	t.Run("delete", func(t *testing.T) {
		se := st.start(map[string]any{"cmd": []string{"sleep", "100"}, "detachable": true})
		var rec api.Session
		if code, fail := st.call("DELETE", "/v1/sessions/"+se.ID, "", &rec); code != 200 || rec.ID != se.ID {
			t.Fatalf("DELETE: %d %v %+v", code, fail, rec)
		}
		if rec := st.waitExited(se.ID); *rec.ExitCode != 128+15 {
			t.Fatalf("after DELETE: %+v, want 143", rec)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		se := st.start(map[string]any{"cmd": []string{"sleep", "100"}, "detachable": true, "timeout_s": 1})
		if rec := st.waitExited(se.ID); *rec.ExitCode != -1 || !rec.TimedOut {
			t.Fatalf("after its timeout: %+v", rec)
		}
	})

	t.Run("dropped", func(t *testing.T) {
		se := st.start(map[string]any{"cmd": []string{"head", "-c", "3000000", "/dev/zero"}, "detachable": true})
		st.waitExited(se.ID)
		a := st.attach(se.ID, "?since=0")
		out, _, control, _ := a.end(t)
		if len(control) != 2 || control[0].Type != "dropped" || control[0].Bytes+int64(len(out)) != 3000000 || len(out) < api.SessionBuffer || !exitedWith(control, 0) {
			t.Fatalf("3 MB with a 1 MiB buffer: %d bytes, control %+v", len(out), control)
		}
	})

	t.Run("list and refusals", func(t *testing.T) {
		var list struct {
			Sessions []api.Session `json:"sessions"`
		}
		if code, _ := st.call("GET", "/v1/sessions", "", &list); code != 200 || len(list.Sessions) < 8 {
			t.Fatalf("list: %d %+v", code, list)
		}
		for _, tc := range []struct {
			method, path, body string
			status             int
			code               string
		}{
			{"GET", "/v1/sessions/se-0000000000000000", "", 404, api.CodeSessionNotFound},
			{"GET", "/v1/sessions/nope", "", 404, api.CodeSessionNotFound},
			{"DELETE", "/v1/sessions/se-0000000000000000", "", 404, api.CodeSessionNotFound},
			{"GET", "/v1/sessions/se-0000000000000000/attach", "", 404, api.CodeSessionNotFound},
			{"POST", "/v1/sessions", `{"cmd":[]}`, 400, "invalid_field"},
			{"POST", "/v1/sessions", `{"cmd":["true"],"rows":3}`, 400, "invalid_field"},
			{"POST", "/v1/sessions", `{"cmd":["true"],"tty":true,"cols":5000}`, 400, "invalid_field"},
			{"POST", "/v1/sessions", `{"cmd":["/no/such/program"]}`, 422, api.CodeExecFailed},
		} {
			code, fail := st.call(tc.method, tc.path, tc.body, nil)
			if code != tc.status || fail["code"] != tc.code && !(tc.status == 422 && code == 422) {
				t.Errorf("%s %s %s: %d %v; want %d %s", tc.method, tc.path, tc.body, code, fail, tc.status, tc.code)
			}
		}
	})

	t.Run("limit", func(t *testing.T) {
		var list struct {
			Sessions []api.Session `json:"sessions"`
		}
		st.call("GET", "/v1/sessions", "", &list)
		live := 0
		for _, se := range list.Sessions {
			if se.State == api.SessionRunning {
				live++
			}
		}
		for range api.MaxSessions - live {
			st.start(map[string]any{"cmd": []string{"sleep", "100"}, "detachable": true})
		}
		code, fail := st.call("POST", "/v1/sessions", `{"cmd":["true"]}`, nil)
		if code != 409 || fail["code"] != api.CodeSessionLimit {
			t.Fatalf("session %d: %d %v; want 409 session_limit", api.MaxSessions+1, code, fail)
		}
	})
}

func exitedWith(control []api.SessionControl, want int) bool {
	code, ok := exitOf(control)
	return ok && code == want
}

// TestSessionOutput: the buffer keeps the last bytes, in order, with
// their offsets; a read from an offset gets what follows it and how much
// before it is gone.
func TestSessionOutput(t *testing.T) {
	o := newSessionOutput(8)
	o.write(api.StreamStdout, []byte("abcd"))
	o.write(api.StreamStderr, []byte("efgh"))
	o.write(api.StreamStdout, []byte("ijkl"))
	for _, tc := range []struct {
		from        int64
		want        string
		dropped     int64
		next        int64
		firstStream byte
	}{
		{from: -1, want: "efghijkl", next: 12, firstStream: api.StreamStderr},
		{from: 0, want: "efghijkl", dropped: 4, next: 12, firstStream: api.StreamStderr},
		{from: 3, want: "efghijkl", dropped: 1, next: 12, firstStream: api.StreamStderr},
		{from: 6, want: "ghijkl", next: 12, firstStream: api.StreamStderr},
		{from: 9, want: "jkl", next: 12, firstStream: api.StreamStdout},
		{from: 12, want: "", next: 12},
		{from: 99, want: "", next: 12},
	} {
		chunks, dropped, next, _, closed := o.read(tc.from)
		var got strings.Builder
		for _, c := range chunks {
			got.Write(c.data)
		}
		if got.String() != tc.want || dropped != tc.dropped || next != tc.next || closed || len(chunks) > 0 && chunks[0].stream != tc.firstStream {
			t.Errorf("read(%d): %q dropped %d next %d closed %v; want %q %d %d", tc.from, got.String(), dropped, next, closed, tc.want, tc.dropped, tc.next)
		}
	}
	_, _, _, more, _ := o.read(12)
	o.close()
	select {
	case <-more:
	default:
		t.Fatal("close did not wake a reader")
	}
	if _, _, _, _, closed := o.read(12); !closed {
		t.Fatal("not closed")
	}
	// One write larger than a frame is cut into frames.
	big := newSessionOutput(1 << 20)
	big.write(api.StreamStdout, make([]byte, 3*api.MaxSessionFrame))
	chunks, _, _, _, _ := big.read(0)
	for _, c := range chunks {
		if len(c.data) >= api.MaxSessionFrame {
			t.Fatalf("a chunk of %d bytes: over one frame", len(c.data))
		}
	}
	if len(chunks) < 3 {
		t.Fatalf("%d chunks of 3 frames' bytes", len(chunks))
	}
}

// TestSessionsListedBound pins what guestd keeps for its lists (issue 30:
// hostproxy relays a list of at most api.MaxSessionsListed records, and
// guestd kept every session exited in the last 10 minutes): past that
// many, the exited sessions that ended first are forgotten; running ones
// never are.
func TestSessionsListedBound(t *testing.T) {
	ss := &sessionSet{byID: map[string]*session{}}
	now := time.Now()
	add := func(id string, ended time.Time) {
		s := &session{id: id, done: make(chan struct{})}
		if !ended.IsZero() {
			code := 0
			s.exitCode, s.ended = &code, ended
			close(s.done)
		}
		ss.byID[id] = s
	}
	for i := range api.MaxSessions {
		add(fmt.Sprintf("running-%d", i), time.Time{})
	}
	exited := api.MaxSessionsListed // more than may be kept with the running ones
	for i := range exited {
		add(fmt.Sprintf("exited-%03d", i), now.Add(-time.Minute+time.Duration(i)*time.Millisecond))
	}
	add("old", now.Add(-api.SessionKeep-time.Minute))
	ss.prune()
	if len(ss.byID) != api.MaxSessionsListed {
		t.Fatalf("%d sessions kept, want %d", len(ss.byID), api.MaxSessionsListed)
	}
	for i := range api.MaxSessions {
		if ss.byID[fmt.Sprintf("running-%d", i)] == nil {
			t.Fatalf("running session %d forgotten", i)
		}
	}
	gone := api.MaxSessions // the exited sessions that ended first
	for i := range exited {
		if kept := ss.byID[fmt.Sprintf("exited-%03d", i)] != nil; kept != (i >= gone) {
			t.Fatalf("exited session %d kept: %v", i, kept)
		}
	}
}

// TestSessionGeneration pins issue 30 item 6.2: after a VM restore, a
// session's reattach with ?since= went on in the snapshot's run with no
// mark (another run's output spliced after the client's, its stdin sent
// to another process). Each record and attach handshake names the guest's
// generation; a resync (what the host calls after every load of the
// guest's memory) draws a new one, and an attachment naming the old one
// is 409 session_restored.
func TestSessionGeneration(t *testing.T) {
	s := vmServer(t, &bytes.Buffer{}, &fakeKernel{now: 1, name: "sb"})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		s.sessions.mu.Lock()
		for _, se := range s.sessions.byID {
			se.kill()
		}
		s.sessions.mu.Unlock()
		srv.Close()
	})
	st := &sessionStack{t: t, url: srv.URL, srv: s}
	se := st.start(map[string]any{"cmd": []string{"sh", "-c", "echo a; exec sleep 60"}, "detachable": true})
	first := se.Generation
	if !api.ValidGeneration(first) || st.get(se.ID).Generation != first {
		t.Fatalf("generation of the record %q, then %q", first, st.get(se.ID).Generation)
	}
	// attach dials with query and returns the handshake's status, its
	// generation header and its fail's code and generation field.
	attach := func(query string) (int, string, map[string]any) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, strings.Replace(srv.URL, "http", "ws", 1)+"/v1/sessions/"+se.ID+"/attach"+query, nil)
		if err == nil {
			c.Close(websocket.StatusNormalClosure, "")
			return resp.StatusCode, resp.Header.Get(api.HeaderSessionGeneration), nil
		}
		if resp == nil {
			t.Fatalf("attach%s: %v", query, err)
		}
		var env struct{ Data map[string]any }
		b, _ := io.ReadAll(resp.Body)
		json.Unmarshal(b, &env)
		return resp.StatusCode, "", env.Data
	}
	if code, gen, _ := attach("?since=0&generation=" + first); code != http.StatusSwitchingProtocols || gen != first {
		t.Fatalf("attach with the current generation: %d, %q", code, gen)
	}
	seed, _ := seedOf(32)
	if code, fail := st.call("POST", "/v1/resync", fmt.Sprintf(`{"time_unix_nano":2,"seed":%q}`, seed), nil); code != 200 {
		t.Fatalf("resync: %d %v", code, fail)
	}
	second := st.get(se.ID).Generation
	if !api.ValidGeneration(second) || second == first {
		t.Fatalf("generation after a resync %q, before %q", second, first)
	}
	for _, tc := range []struct {
		name, query string
		status      int
		code, gen   string
	}{
		{"the old generation", "?since=2&generation=" + first, http.StatusConflict, api.CodeSessionRestored, second},
		{"the new generation", "?since=2&generation=" + second, http.StatusSwitchingProtocols, "", second},
		{"no generation", "?since=2", http.StatusSwitchingProtocols, "", second},
		{"a generation of another shape", "?generation=" + strings.ToUpper(second), http.StatusBadRequest, "invalid_field", ""},
		{"two generations", "?generation=" + second + "&generation=" + second, http.StatusBadRequest, "invalid_field", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, gen, fail := attach(tc.query)
			if code != tc.status {
				t.Fatalf("status %d, want %d: %v", code, tc.status, fail)
			}
			if tc.code != "" && (fail["code"] != tc.code || tc.gen != "" && fail["generation"] != tc.gen) {
				t.Fatalf("fail %v, want %s naming %s", fail, tc.code, tc.gen)
			}
			if tc.code == "" && gen != tc.gen {
				t.Fatalf("handshake's generation %q, want %q", gen, tc.gen)
			}
		})
	}
	if got := api.GuestFailCodes[api.CodeSessionRestored]; got != fault.Conflict {
		t.Errorf("session_restored is not relayed as a 409 by hostproxy: %v", got)
	}
	// A resync of a guest that continues its own run (a resume of its
	// pause, a heal) keeps the generation: a client attaches again where
	// it was.
	if code, fail := st.call("POST", "/v1/resync", fmt.Sprintf(`{"time_unix_nano":3,"seed":%q,"continues":true}`, seed), nil); code != 200 {
		t.Fatalf("resync that continues: %d %v", code, fail)
	}
	if got := st.get(se.ID).Generation; got != second {
		t.Fatalf("generation after a resync that continues %q, want %q", got, second)
	}
	if code, gen, fail := attach("?since=2&generation=" + second); code != http.StatusSwitchingProtocols || gen != second {
		t.Fatalf("attach after a resume: %d %q %v", code, gen, fail)
	}
}
