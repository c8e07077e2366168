package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
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

// TestVMSessions: a memory snapshot ends a microVM sandbox's attachments
// with close code 1011 and a reason; the detachable session runs on
// through it and is attached again from its first byte; the session
// that was not detachable is held for an attachment to come again, and
// ends (SIGHUP) when that one closes. A pause ends attachments the same
// way, and the detachable session is there after the resume. createos
// sandbox exec outlives a memory snapshot taken from inside its own
// command: it attaches again where it was.
func TestVMSessions(t *testing.T) {
	s := startVMStack(t, "60s")
	id := s.create(s.key, `{"name":"sessions"}`)
	start := func(body string) string {
		t.Helper()
		r := s.call(s.key, "POST", "/v1/sandboxes/"+id+"/sessions", body)
		if r.Status != http.StatusCreated {
			t.Fatalf("POST sessions %s: %d %s", body, r.Status, r.Raw)
		}
		return r.data()["id"].(string)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	attach := func(sid, query string) *websocket.Conn {
		t.Helper()
		h := http.Header{}
		h.Set("X-Api-Key", s.key)
		c, _, err := websocket.Dial(ctx, strings.Replace(s.url, "http", "ws", 1)+"/v1/sandboxes/"+id+"/sessions/"+sid+"/attach"+query, &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			t.Fatalf("attach %s: %v", sid, err)
		}
		c.SetReadLimit(api.MaxSessionFrame)
		return c
	}
	// readUntil reads c's stdout until it holds want, and returns it.
	readUntil := func(c *websocket.Conn, want string) string {
		t.Helper()
		var out strings.Builder
		for !strings.Contains(out.String(), want) {
			typ, b, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("reading for %q (got %q): %v", want, out.String(), err)
			}
			if typ == websocket.MessageBinary && b[0] == api.StreamStdout {
				out.Write(b[1:])
			}
		}
		return out.String()
	}
	// ended waits for c's end and checks its code.
	ended := func(c *websocket.Conn, what string) {
		t.Helper()
		for {
			_, _, err := c.Read(ctx)
			if err == nil {
				continue
			}
			var ce websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != websocket.StatusInternalError || ce.Reason == "" {
				t.Fatalf("%s: the attachment ended with %v, want 1011 and a reason", what, err)
			}
			return
		}
	}

	keep := start(`{"cmd":["sh","-c","i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done"],"detachable":true}`)
	drop := start(`{"cmd":["sleep","1000"]}`)
	a, b := attach(keep, ""), attach(drop, "")
	readUntil(a, "tick 2")

	s.must(200, "POST", "/v1/sandboxes/"+id+"/snapshots", `{}`)
	ended(a, "memory snapshot")
	ended(b, "memory snapshot")
	list := func() map[string]api.Session {
		t.Helper()
		var l struct {
			Sessions []api.Session `json:"sessions"`
		}
		bs, _ := json.Marshal(s.must(200, "GET", "/v1/sandboxes/"+id+"/sessions", "").Body["data"])
		json.Unmarshal(bs, &l)
		m := map[string]api.Session{}
		for _, se := range l.Sessions {
			m[se.ID] = se
		}
		return m
	}
	sessions := list()
	if se := sessions[keep]; se.State != api.SessionRunning || se.Sandbox != id {
		t.Fatalf("the detachable session after the snapshot: %+v", se)
	}
	if se := sessions[drop]; se.State != api.SessionRunning {
		t.Fatalf("the session that was not detachable, held after the snapshot: %+v", se)
	}
	b = attach(drop, "")
	b.Close(websocket.StatusNormalClosure, "")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		se := list()[drop]
		if se.State == api.SessionExited {
			if se.ExitCode == nil || *se.ExitCode != 128+1 {
				t.Fatalf("the session that was not detachable after its attachment closed: %+v, want exited 129", se)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session that was not detachable, a minute after its attachment closed: %+v", se)
		}
	}
	again := attach(keep, "?since=0")
	if out := readUntil(again, "tick 1\n"); !strings.HasPrefix(out, "tick 1\n") {
		t.Fatalf("again from 0: %q", out)
	}

	// A pause ends it too; the session is there after the resume.
	s.call(s.key, "POST", "/v1/sandboxes/"+id+"/pause", "")
	ended(again, "pause")
	s.waitState(s.key, id, "paused", 2*time.Minute)
	s.call(s.key, "POST", "/v1/sandboxes/"+id+"/resume", "")
	s.waitState(s.key, id, "running", 2*time.Minute)
	c := attach(keep, "")
	n := len(readUntil(c, "tick"))
	if n == 0 {
		t.Fatal("no output after the resume")
	}
	c.Close(websocket.StatusNormalClosure, "")
	s.must(200, "DELETE", "/v1/sandboxes/"+id+"/sessions/"+keep, "")

	// createos sandbox exec, whose command takes a memory snapshot of its
	// own sandbox from inside: the snapshot ends its attachment, and it
	// attaches again and gets the rest.
	cmd := exec.CommandContext(ctx, filepath.Join(bins, "createos"), "sandbox", "exec", id, "--",
		"sh", "-c", "echo before; createos sandbox snapshot create >/dev/null; echo after; exit 5")
	cmd.Env = append(os.Environ(), "CREATEOS_API_URL="+s.url, "CREATEOS_API_KEY="+s.key)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 5 || out.String() != "before\nafter\n" || errb.Len() != 0 {
		t.Fatalf("createos exec across a snapshot from inside: %v, stdout %q, stderr %q; want exit 5, before and after", err, out.String(), errb.String())
	}

	// A file in and out through the channel, streamed.
	data := make([]byte, 8<<20)
	rand.Read(data)
	req, _ := http.NewRequest("PUT", s.url+"/v1/sandboxes/"+id+"/files/workspace/blob.bin", bytes.NewReader(data))
	req.Header.Set("X-Api-Key", s.key)
	req.Header.Set("Content-Type", api.MediaOctetStream)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("PUT a file into the VM: %v %v", resp, err)
	}
	resp.Body.Close()
	if out := s.sh(id, "sha256sum /workspace/blob.bin | cut -c1-64"); strings.TrimSpace(out) != fmt.Sprintf("%x", sha256.Sum256(data)) {
		t.Fatalf("the file in the VM: %q", out)
	}
	req, _ = http.NewRequest("GET", s.url+"/v1/sandboxes/"+id+"/files/workspace/blob.bin", nil)
	req.Header.Set("X-Api-Key", s.key)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, data) {
		t.Fatalf("GET the file from the VM: %d, %d bytes", resp.StatusCode, len(got))
	}
}
