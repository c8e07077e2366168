package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"strata/internal/api"
)

// TestSessions drives exec sessions through the real hostproxy and guestd
// with the CLI: exec streams (a line arrives before the command ends, and
// stdin sent after it reaches the command), keeps stdout and stderr apart
// and exits with the command's status; -t gives a terminal; a detached
// session is listed, attached to, and killed; an attachment made with the
// key as a WebSocket subprotocol (as a browser's WebSocket must) works,
// and an unknown session is refused with its code.
func TestSessions(t *testing.T) {
	s := startStack(t)
	createos := func(args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bins, "createos"), args...)
		cmd.Env = append(os.Environ(), "CREATEOS_API_URL="+s.url, "CREATEOS_API_KEY="+s.key, "CREATEOS_SANDBOX_ID=sb-local")
		return cmd
	}

	// Streams, both ways.
	cmd := createos("sandbox", "exec", "-i", "sb-local", "--", "sh", "-c", `echo first; read x; echo "second $x"; echo oops >&2; exit 4`)
	in, _ := cmd.StdinPipe()
	outPipe, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(outPipe)
	if line, err := out.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("first line: %q, %v", line, err)
	}
	// The command waits on its stdin: the line came while it ran.
	io.WriteString(in, "go\n")
	in.Close()
	rest, _ := io.ReadAll(out)
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 4 || string(rest) != "second go\n" || stderr.String() != "oops\n" {
		t.Fatalf("exec -i: %v, stdout %q, stderr %q; want exit 4, second go, oops", err, rest, stderr.String())
	}

	// Without -i the command's stdin is empty: cat ends at once.
	if b, err := createos("sandbox", "exec", "sb-local", "--", "cat").CombinedOutput(); err != nil || len(b) != 0 {
		t.Fatalf("exec cat without -i: %v: %q", err, b)
	}

	// A terminal.
	b, err := createos("sandbox", "exec", "-t", "sb-local", "--", "sh", "-c", "tty; stty size").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(b), "/dev/pts/") || !strings.Contains(string(b), "24 80") {
		t.Fatalf("exec -t: %v: %q", err, b)
	}

	// Detached: listed, attached to, killed.
	b, err = createos("sandbox", "exec", "--detach", "sb-local", "--", "sh", "-c", "echo hi; exec sleep 100").Output()
	id := strings.TrimSpace(string(b))
	if err != nil || !api.ValidSessionID(id) {
		t.Fatalf("exec --detach: %v: %q", err, b)
	}
	if b, err := createos("sandbox", "session", "list", "sb-local").CombinedOutput(); err != nil || !strings.Contains(string(b), id+"  running") {
		t.Fatalf("session list: %v:\n%s", err, b)
	}
	attach := createos("sandbox", "session", "attach", "sb-local", id)
	aout, _ := attach.StdoutPipe()
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(aout).ReadString('\n'); err != nil || line != "hi\n" {
		t.Fatalf("attach: %q, %v", line, err)
	}
	if b, err := createos("sandbox", "session", "kill", "sb-local", id).CombinedOutput(); err != nil {
		t.Fatalf("session kill: %v: %s", err, b)
	}
	if err := attach.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 128+15 {
		t.Fatalf("attach of a killed session: %v, want exit 143", err)
	}

	// The key as a subprotocol, no header.
	var se api.Session
	req, _ := http.NewRequest("POST", s.url+"/v1/sandboxes/sb-local/sessions", strings.NewReader(`{"cmd":["echo","sub"]}`))
	req.Header.Set("X-Api-Key", s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var env struct {
		Data api.Session `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&env)
	resp.Body.Close()
	se = env.Data
	if resp.StatusCode != http.StatusCreated || se.Sandbox != "sb-local" || !api.ValidSessionID(se.ID) {
		t.Fatalf("POST sessions: %d %+v", resp.StatusCode, se)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws := strings.Replace(s.url, "http", "ws", 1) + "/v1/sandboxes/sb-local/sessions/" + se.ID + "/attach?since=0"
	c, r, err := websocket.Dial(ctx, ws, &websocket.DialOptions{Subprotocols: []string{"strata.v1", "key." + s.key}})
	if err != nil {
		t.Fatalf("attach with the key as a subprotocol: %v", err)
	}
	if p := r.Header.Get("Sec-WebSocket-Protocol"); p != "strata.v1" {
		t.Errorf("subprotocol %q, want strata.v1", p)
	}
	var got strings.Builder
	exited := false
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure || !exited {
				t.Fatalf("attachment ended: %v (exit seen %v)", err, exited)
			}
			break
		}
		if typ == websocket.MessageBinary && b[0] == api.StreamStdout {
			got.Write(b[1:])
		}
		if typ == websocket.MessageText && strings.Contains(string(b), `"exit"`) {
			exited = true
		}
	}
	if got.String() != "sub\n" {
		t.Fatalf("output %q", got.String())
	}
	if _, _, err := websocket.Dial(ctx, ws, nil); err == nil {
		t.Fatal("an attachment without a key was let in")
	}

	// An unknown session: its code, no upgrade.
	if b, err := createos("sandbox", "session", "attach", "sb-local", "se-0000000000000000").CombinedOutput(); err == nil || !strings.Contains(string(b), "session_not_found") {
		t.Fatalf("attach of an unknown session: %v: %s", err, b)
	}
}
