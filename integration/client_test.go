package integration

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"strata/client"
	"strata/hostproxy"
	"strata/internal/openapicheck"
)

// TestClient drives the real hostproxy and guestd through the exported
// Go client, as a program would: exec, a session's attachment, files in
// and out, a listing, a removal, a checkpoint, and a refusal as *Error.
func TestClient(t *testing.T) {
	s := startStack(t)
	c := client.New(s.url, s.key)
	// Every exchange holds to openapi.json: the routes the hostproxy
	// tests cannot reach without a real guest (exec, sessions, files).
	doc, derr := openapicheck.Load(hostproxy.OpenAPI)
	if derr != nil {
		t.Fatal(derr)
	}
	c.HTTP = &http.Client{Transport: &openapicheck.Transport{Doc: doc, Fail: func(err error) { t.Errorf("openapi.json: %v", err) }}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	res, err := c.Exec(ctx, "sb-local", client.ExecRequest{Cmd: []string{"sh", "-c", "echo out; exit 2"}})
	if err != nil || res.ExitCode != 2 || res.Stdout != "out\n" {
		t.Fatalf("Exec: %+v, %v", res, err)
	}

	se, err := c.StartSession(ctx, "sb-local", client.SessionRequest{Cmd: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.Attach(ctx, "sb-local", se.ID, 0, se.Generation)
	if err != nil {
		t.Fatal(err)
	}
	if conn.Generation == "" || conn.Generation != se.Generation {
		t.Fatalf("the attachment's generation %q, the record's %q", conn.Generation, se.Generation)
	}
	conn.Write(ctx, websocket.MessageBinary, append([]byte{client.StreamStdin}, "ping\n"...))
	conn.Write(ctx, websocket.MessageText, []byte(`{"type":"eof"}`))
	var got strings.Builder
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			break
		}
		if typ == websocket.MessageBinary && b[0] == client.StreamStdout {
			got.Write(b[1:])
		}
	}
	if got.String() != "ping\n" {
		t.Fatalf("cat through an attachment: %q", got.String())
	}

	dir := t.TempDir()
	mtime := time.Date(2023, 3, 4, 5, 6, 7, 0, time.UTC)
	w, err := c.WriteFile(ctx, "sb-local", dir+"/sub/f.txt", strings.NewReader("hello"), 5, client.FileOptions{Mode: 0o600, Mtime: mtime, Parents: true})
	if err != nil || w.SizeBytes != 5 {
		t.Fatalf("WriteFile: %+v, %v", w, err)
	}
	rc, mode, mt, err := c.ReadFile(ctx, "sb-local", dir+"/sub/f.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello" || mode != 0o600 || !mt.Equal(mtime) {
		t.Fatalf("ReadFile: %q %v %v", b, mode, mt)
	}
	l, err := c.ListDir(ctx, "sb-local", dir+"/sub")
	if err != nil || len(l.Entries) != 1 || l.Entries[0].Name != "f.txt" {
		t.Fatalf("ListDir: %+v, %v", l, err)
	}
	tr, err := c.ReadTar(ctx, "sb-local", dir)
	if err != nil {
		t.Fatal(err)
	}
	var tarball bytes.Buffer
	tarball.ReadFrom(tr)
	tr.Close()
	if _, err := c.WriteTar(ctx, "sb-local", dir+"/copy", &tarball, false); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "copy", "sub", "f.txt")); string(b) != "hello" {
		t.Fatalf("the tar copied: %q", b)
	}
	if err := c.RemoveFile(ctx, "sb-local", dir+"/copy", true); err != nil {
		t.Fatal(err)
	}
	_, _, _, err = c.ReadFile(ctx, "sb-local", dir+"/copy/sub/f.txt")
	var e *client.Error
	if !errors.As(err, &e) || e.Code != "file_not_found" || e.Status != 404 {
		t.Fatalf("a removed file: %v", err)
	}

	// A checkpoint of a directory through the client.
	base := t.TempDir()
	cleanupMounts(t, base)
	work := filepath.Join(base, "project")
	writeFile(t, work+"/main.go", "package main")
	cp, err := c.CreateCheckpoint(ctx, "sb-local", work, nil, nil, "")
	if err != nil || cp.ID == "" {
		t.Fatalf("CreateCheckpoint: %+v, %v", cp, err)
	}
}
