package guestd

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"strata/internal/api"
)

// execAnswer is one answer of POST /v1/exec.
type execAnswer struct {
	status int
	allow  string
	result api.ExecResult
	fail   map[string]any // data of a fail envelope
}

// postExec sends body to the server's POST /v1/exec with ctx. It fails
// the test only on an answer that is not JSend.
func postExec(ctx context.Context, t *testing.T, s *Server, body string) execAnswer {
	t.Helper()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/exec", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	a := execAnswer{status: w.Code, allow: w.Header().Get("Allow")}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil {
		t.Fatalf("answer %d is not JSON: %q", w.Code, w.Body)
	}
	switch env.Status {
	case "success":
		if err := json.Unmarshal(env.Data, &a.result); err != nil {
			t.Fatal(err)
		}
	case "fail":
		if err := json.Unmarshal(env.Data, &a.fail); err != nil {
			t.Fatal(err)
		}
	case "error": // a 5xx: the status says enough
	default:
		t.Fatalf("answer %d: %s", w.Code, w.Body)
	}
	return a
}

func execBody(t *testing.T, req map[string]any) string {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestExec runs programs and checks what comes back: output, exit code,
// stdin, environment, cwd, encodings. The program gets its argv as sent,
// without a shell.
func TestExec(t *testing.T) {
	s := storelessServer(t, &bytes.Buffer{})
	if err := os.WriteFile(s.credentialsPath, []byte("CREATEOS_API_URL='http://127.0.0.1:9'\nCREATEOS_SANDBOX_ID='sb-a1'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\necho script \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name           string
		req            map[string]any
		exit           int
		stdout, stderr string
	}{
		{name: "echo", req: map[string]any{"cmd": []string{"echo", "hello"}}, stdout: "hello\n"},
		{name: "no shell", req: map[string]any{"cmd": []string{"echo", "$HOME", "*", "a;b"}}, stdout: "$HOME * a;b\n"},
		{name: "exit code", req: map[string]any{"cmd": []string{"sh", "-c", "exit 3"}}, exit: 3},
		{name: "stderr", req: map[string]any{"cmd": []string{"sh", "-c", "echo out; echo oops >&2; exit 1"}}, exit: 1, stdout: "out\n", stderr: "oops\n"},
		{name: "killed by a signal", req: map[string]any{"cmd": []string{"sh", "-c", "kill -TERM $$"}}, exit: 128 + 15},
		{name: "stdin", req: map[string]any{"cmd": []string{"cat"}, "stdin": "line 1\nline 2"}, stdout: "line 1\nline 2"},
		{name: "no stdin is empty", req: map[string]any{"cmd": []string{"cat"}}},
		{name: "stdin not read", req: map[string]any{"cmd": []string{"true"}, "stdin": strings.Repeat("x", 1<<20)}},
		{name: "base environment", req: map[string]any{"cmd": []string{"sh", "-c", `echo "$HOME $LANG $PATH"`}},
			stdout: "/root C.UTF-8 /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"},
		{name: "nothing of guestd's own environment", req: map[string]any{"cmd": []string{"sh", "-c", `echo "[$GUESTD_TEST_SECRET]"`}}, stdout: "[]\n"},
		{name: "env", req: map[string]any{"cmd": []string{"sh", "-c", `echo "$FOO|$HOME|$EMPTY|"`}, "env": map[string]string{"FOO": "a b=c", "HOME": "/tmp", "EMPTY": ""}},
			stdout: "a b=c|/tmp||\n"},
		{name: "credentials", req: map[string]any{"cmd": []string{"sh", "-c", `echo "$CREATEOS_SANDBOX_ID $CREATEOS_API_URL"`}}, stdout: "sb-a1 http://127.0.0.1:9\n"},
		{name: "env wins over credentials", req: map[string]any{"cmd": []string{"sh", "-c", `echo "$CREATEOS_SANDBOX_ID"`}, "env": map[string]string{"CREATEOS_SANDBOX_ID": "mine"}}, stdout: "mine\n"},
		{name: "PATH of the request", req: map[string]any{"cmd": []string{"run.sh", "x"}, "env": map[string]string{"PATH": "/nonexistent:" + dir}}, stdout: "script x\n"},
		{name: "cwd", req: map[string]any{"cmd": []string{"pwd"}, "cwd": dir}, stdout: dir + "\n"},
		{name: "default cwd", req: map[string]any{"cmd": []string{"pwd"}}, stdout: "/\n"},
		{name: "program relative to cwd", req: map[string]any{"cmd": []string{"./run.sh", "rel"}, "cwd": dir}, stdout: "script rel\n"},
		{name: "argv[0] as sent", req: map[string]any{"cmd": []string{"sh", "-c", `echo "$0"`}}, stdout: "sh\n"},
		{name: "base64", req: map[string]any{"cmd": []string{"printf", `\000\377a`}, "encoding": "base64"}, stdout: "AP9h"},
		{name: "base64 stderr", req: map[string]any{"cmd": []string{"sh", "-c", `printf '\377' >&2`}, "encoding": "base64"}, stderr: "/w=="},
		{name: "invalid UTF-8 replaced", req: map[string]any{"cmd": []string{"printf", `a\377\376b\303`}}, stdout: "a\ufffdb\ufffd"},
		{name: "UTF-8 kept", req: map[string]any{"cmd": []string{"printf", "été 日本"}}, stdout: "été 日本"},
	}
	t.Setenv("GUESTD_TEST_SECRET", "leaked")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := postExec(context.Background(), t, s, execBody(t, tc.req))
			if a.status != http.StatusOK {
				t.Fatalf("status %d: %v", a.status, a.fail)
			}
			r := a.result
			if r.ExitCode != tc.exit || r.Stdout != tc.stdout || r.Stderr != tc.stderr || r.TimedOut || r.Truncated {
				t.Fatalf("got %+v, want exit %d stdout %q stderr %q", r, tc.exit, tc.stdout, tc.stderr)
			}
			if r.DurationMS < 0 || r.DurationMS > 10_000 {
				t.Errorf("duration_ms %d", r.DurationMS)
			}
		})
	}
}

// groupAlive lists the processes of group pgid that are not zombies (a
// zombie has exited; it waits only for its parent, which in a test may
// be an init that does not reap).
func groupAlive(t *testing.T, pgid int) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var alive []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			alive = append(alive, e.Name()+" "+string(stat[:i+1]))
		}
	}
	return alive
}

// waitGroupGone fails unless no process of group pgid is left alive
// within a few seconds (SIGKILL is delivered at once, the exit takes a
// moment).
func waitGroupGone(t *testing.T, pgid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		alive := groupAlive(t, pgid)
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process group %d survived: %q", pgid, alive)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readPID waits for the pid a program writes to file.
func readPID(t *testing.T, file string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(file)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s", file)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// groupTree is a shell that writes its pid (its process group's id, as
// the leader) to file, then waits on a sleeping child while another
// sleeps in the background: a tree that only killing the group ends.
func groupTree(file string) []string {
	return []string{"sh", "-c", `echo $$ > "$1"; sleep 100 & sleep 100`, "sh", file}
}

// TestExecTimeout: when timeout_s passes, the whole process group dies
// (the shell and both sleeps), and the answer says timed_out with
// exit_code -1 and the output written before.
func TestExecTimeout(t *testing.T) {
	s := storelessServer(t, &bytes.Buffer{})
	file := filepath.Join(t.TempDir(), "pid")
	cmd := groupTree(file)
	cmd[2] = "echo started; " + cmd[2]
	start := time.Now()
	// 3 s, so that a busy machine runs the echo well within it.
	a := postExec(context.Background(), t, s, execBody(t, map[string]any{"cmd": cmd, "timeout_s": 3}))
	if a.status != http.StatusOK {
		t.Fatalf("status %d: %v", a.status, a.fail)
	}
	r := a.result
	if !r.TimedOut || r.ExitCode != -1 || r.Stdout != "started\n" || r.Truncated {
		t.Fatalf("got %+v, want timed_out, exit -1, stdout started", r)
	}
	// A bound of kind (the group's sleep would hold it for 30 s), not of speed.
	if took := time.Since(start); took > 3*time.Second+execKillGrace+5*time.Second || r.DurationMS < 3000 {
		t.Errorf("took %v, duration_ms %d", took, r.DurationMS)
	}
	waitGroupGone(t, readPID(t, file))
}

// TestExecClientGone: a request whose context ends (the client went
// away) kills the process group and returns at once.
func TestExecClientGone(t *testing.T) {
	s := storelessServer(t, &bytes.Buffer{})
	file := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan execAnswer, 1)
	go func() {
		done <- postExec(ctx, t, s, execBody(t, map[string]any{"cmd": groupTree(file), "timeout_s": 600}))
	}()
	pgid := readPID(t, file)
	if len(groupAlive(t, pgid)) < 3 {
		time.Sleep(100 * time.Millisecond) // the sleeps are being started
	}
	cancel()
	select {
	case a := <-done:
		if a.status != http.StatusInternalServerError {
			t.Errorf("status %d after the client left", a.status)
		}
	case <-time.After(execKillGrace + 5*time.Second):
		t.Fatal("the request did not end with its context")
	}
	waitGroupGone(t, pgid)
}

// TestExecLeftRunning: a process the program leaves running in the
// background with its output sent elsewhere does not hold the answer and
// is not killed when the program exits; one that holds the program's
// stdout keeps the exec running until its timeout, when it is killed
// with the rest of the process group (the exec is its program and its
// output: issue 17 wants a runaway that forked away killed too).
func TestExecLeftRunning(t *testing.T) {
	s := storelessServer(t, &bytes.Buffer{})
	t.Run("output elsewhere", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "pid")
		a := postExec(context.Background(), t, s, execBody(t, map[string]any{
			"cmd": []string{"sh", "-c", `echo $$ > "$1"; sleep 30 >/dev/null 2>&1 & echo done`, "sh", file}, "timeout_s": 600,
		}))
		pgid := readPID(t, file)
		t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
		if a.status != http.StatusOK || a.result.Stdout != "done\n" || a.result.ExitCode != 0 || a.result.TimedOut {
			t.Fatalf("got %d %+v", a.status, a.result)
		}
		if len(groupAlive(t, pgid)) == 0 {
			t.Errorf("the background process was killed")
		}
	})
	t.Run("holding stdout", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "pid")
		a := postExec(context.Background(), t, s, execBody(t, map[string]any{
			"cmd": []string{"sh", "-c", `echo $$ > "$1"; sleep 30 & echo done`, "sh", file}, "timeout_s": 3,
		}))
		if a.status != http.StatusOK || a.result.Stdout != "done\n" || a.result.ExitCode != -1 || !a.result.TimedOut {
			t.Fatalf("got %d %+v", a.status, a.result)
		}
		waitGroupGone(t, readPID(t, file))
	})
}

// TestExecStrayHoldsOutput: a process that left the program's process
// group (setsid) and holds its stdout is out of reach of the kill at the
// timeout outside a microVM (no cgroup), and does not hold the answer
// for more than execKillGrace.
func TestExecStrayHoldsOutput(t *testing.T) {
	s := storelessServer(t, &bytes.Buffer{})
	file := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	a := postExec(context.Background(), t, s, execBody(t, map[string]any{
		"cmd": []string{"sh", "-c", `setsid sh -c 'echo $$ > "$1"; echo stray; exec sleep 30' sh "$1" & wait`, "sh", file}, "timeout_s": 3,
	}))
	pid := readPID(t, file)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if a.status != http.StatusOK || !a.result.TimedOut || a.result.ExitCode != -1 || a.result.Stdout != "stray\n" {
		t.Fatalf("got %d %+v", a.status, a.result)
	}
	// A bound of kind (the stray's sleep would hold it for 30 s).
	if took := time.Since(start); took > 3*time.Second+execKillGrace+5*time.Second {
		t.Errorf("took %v", took)
	}
}

// TestExecTruncated: each stream keeps its first MiB and says truncated;
// the program writes 3 MiB to both at once and is never blocked.
func TestExecTruncated(t *testing.T) {
	s := storelessServer(t, &bytes.Buffer{})
	both := []string{"sh", "-c", "head -c 3145728 /dev/zero; head -c 3145728 /dev/zero >&2; echo tail >&2"}
	for _, encoding := range []string{"utf-8", "base64"} {
		t.Run(encoding, func(t *testing.T) {
			a := postExec(context.Background(), t, s, execBody(t, map[string]any{"cmd": both, "encoding": encoding, "timeout_s": 30}))
			r := a.result
			if a.status != http.StatusOK || !r.Truncated || r.ExitCode != 0 || r.TimedOut {
				t.Fatalf("got %d %+v", a.status, r)
			}
			for name, got := range map[string]string{"stdout": r.Stdout, "stderr": r.Stderr} {
				b := []byte(got)
				if encoding == "base64" {
					var err error
					if b, err = base64.StdEncoding.DecodeString(got); err != nil {
						t.Fatal(err)
					}
				}
				if !bytes.Equal(b, make([]byte, 1<<20)) {
					t.Errorf("%s: %d bytes, want 1 MiB of zeros", name, len(b))
				}
			}
		})
	}
	t.Run("one stream", func(t *testing.T) {
		a := postExec(context.Background(), t, s, execBody(t, map[string]any{"cmd": []string{"sh", "-c", "head -c 3145728 /dev/zero; echo small >&2"}}))
		if r := a.result; !r.Truncated || len(r.Stdout) != 1<<20 || r.Stderr != "small\n" {
			t.Fatalf("truncated %v, stdout %d bytes, stderr %q", r.Truncated, len(r.Stdout), r.Stderr)
		}
	})
	t.Run("a character cut in two", func(t *testing.T) {
		// "a" then "é" (two bytes) over and over: the cut at 1 MiB falls
		// in the middle of an "é", which is dropped, not replaced.
		a := postExec(context.Background(), t, s, execBody(t, map[string]any{"cmd": []string{"sh", "-c", `printf a; yes é | tr -d '\n' | head -c 2000000`}}))
		r := a.result
		if !r.Truncated || !utf8.ValidString(r.Stdout) || strings.Contains(r.Stdout, "\ufffd") || len(r.Stdout) != 1<<20-1 || !strings.HasSuffix(r.Stdout, "é") {
			t.Fatalf("truncated %v, %d bytes, ends %q", r.Truncated, len(r.Stdout), r.Stdout[max(0, len(r.Stdout)-8):])
		}
	})
}

// TestExecFailed: a program that cannot be started is 422 exec_failed
// with a sentence saying why.
func TestExecFailed(t *testing.T) {
	s := storelessServer(t, &bytes.Buffer{})
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain := write("plain.txt", "not a program\n", 0o644)
	noInterp := write("nointerp.sh", "#!/nonexistent/interpreter\n", 0o755)
	garbage := write("garbage", "\x7fELF garbage that is no binary", 0o755)
	tests := []struct {
		name string
		req  map[string]any
		want string // in the message
	}{
		{"not in PATH", map[string]any{"cmd": []string{"no-such-program-strata"}}, "program no-such-program-strata is not found in PATH"},
		{"not in the request's PATH", map[string]any{"cmd": []string{"sh"}, "env": map[string]string{"PATH": "/nonexistent"}}, "not found in PATH (/nonexistent)"},
		{"no such path", map[string]any{"cmd": []string{"/nonexistent/prog"}}, "program /nonexistent/prog does not exist"},
		{"not executable", map[string]any{"cmd": []string{plain}}, "is not executable"},
		{"a directory", map[string]any{"cmd": []string{dir}}, "is a directory"},
		{"not a regular file", map[string]any{"cmd": []string{"/dev/null"}}, "is not a regular file"},
		{"interpreter missing", map[string]any{"cmd": []string{noInterp}}, "or its interpreter does not exist"},
		{"not a binary", map[string]any{"cmd": []string{garbage}}, "executable format"},
		{"empty program", map[string]any{"cmd": []string{""}}, "cmd[0] is empty"},
		{"cwd missing", map[string]any{"cmd": []string{"pwd"}, "cwd": "/nonexistent/dir"}, "the working directory /nonexistent/dir does not exist"},
		{"cwd a file", map[string]any{"cmd": []string{"pwd"}, "cwd": plain}, "is not a directory"},
		{"relative program, missing", map[string]any{"cmd": []string{"./nope"}, "cwd": dir}, "program ./nope does not exist"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := postExec(context.Background(), t, s, execBody(t, tc.req))
			if a.status != http.StatusUnprocessableEntity || a.fail["code"] != "exec_failed" {
				t.Fatalf("got %d %v %+v, want 422 exec_failed", a.status, a.fail, a.result)
			}
			if msg, _ := a.fail["message"].(string); !strings.Contains(msg, tc.want) {
				t.Errorf("message %q lacks %q", msg, tc.want)
			}
		})
	}
}

// TestExecBadRequests: the body is judged as the contract says before
// anything runs.
func TestExecBadRequests(t *testing.T) {
	s := storelessServer(t, &bytes.Buffer{})
	marker := filepath.Join(t.TempDir(), "ran")
	touch := `"cmd":["touch","` + marker + `"]`
	tests := []struct {
		name, method, target, contentType, body string
		status                                  int
		code, field, allow                      string
	}{
		{name: "no cmd", body: `{}`, status: 400, code: "invalid_field", field: "cmd"},
		{name: "cmd not an array", body: `{"cmd":"touch x"}`, status: 400, code: "invalid_field", field: "cmd"},
		{name: "relative cwd", body: `{` + touch + `,"cwd":"tmp"}`, status: 400, code: "invalid_field", field: "cwd"},
		{name: "timeout 0", body: `{` + touch + `,"timeout_s":0}`, status: 400, code: "invalid_field", field: "timeout_s"},
		{name: "bad encoding", body: `{` + touch + `,"encoding":"hex"}`, status: 400, code: "invalid_field", field: "encoding"},
		{name: "unknown field", body: `{` + touch + `,"shell":true}`, status: 400, code: "unknown_field", field: "shell"},
		{name: "trailing data", body: `{` + touch + `} {}`, status: 400, code: "invalid_json"},
		{name: "not JSON", body: `touch x`, status: 400, code: "invalid_json"},
		{name: "empty body", body: ``, status: 400, code: "invalid_json"},
		{name: "over 8 MiB", body: `{` + touch + `}` + strings.Repeat(" ", api.MaxExecBody), status: 413, code: "body_too_large"},
		{name: "text/plain", contentType: "text/plain", body: `{` + touch + `}`, status: 415, code: "unsupported_media_type"},
		{name: "query", target: "/v1/exec?x=1", body: `{` + touch + `}`, status: 400, code: "query_not_allowed"},
		{name: "GET", method: "GET", status: 405, code: "method_not_allowed", allow: "POST"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method, target, ct := tc.method, tc.target, tc.contentType
			if method == "" {
				method = http.MethodPost
			}
			if target == "" {
				target = "/v1/exec"
			}
			if ct == "" {
				ct = "application/json"
			}
			r := httptest.NewRequest(method, target, strings.NewReader(tc.body))
			r.Header.Set("Content-Type", ct)
			w := httptest.NewRecorder()
			s.Handler().ServeHTTP(w, r)
			var env struct {
				Status string         `json:"status"`
				Data   map[string]any `json:"data"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil {
				t.Fatalf("%d %q", w.Code, w.Body)
			}
			if w.Code != tc.status || env.Status != "fail" || env.Data["code"] != tc.code {
				t.Fatalf("got %d %s, want %d %s", w.Code, w.Body, tc.status, tc.code)
			}
			if tc.field != "" && env.Data["field"] != tc.field {
				t.Errorf("field %v, want %s", env.Data["field"], tc.field)
			}
			if got := w.Header().Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatalf("the program ran")
			}
		})
	}
}

// TestCredentialsEnv reads the file that credentials writes.
func TestCredentialsEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), "credentials.env")
	if got := credentialsEnv(file, nil); got != nil {
		t.Errorf("missing file: %v", got)
	}
	if err := os.WriteFile(file, []byte("CREATEOS_API_URL='http://h:1/x?a=b'\nCREATEOS_SANDBOX_ID='sb-a1'\nCREATEOS_API_KEY='sbt_k='\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := credentialsEnv(file, nil)
	want := map[string]string{"CREATEOS_API_URL": "http://h:1/x?a=b", "CREATEOS_SANDBOX_ID": "sb-a1", "CREATEOS_API_KEY": "sbt_k="}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}
