package integration

import (
	"bytes"
	"crypto/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFiles copies files and directories into and out of a sandbox
// through the real hostproxy and guestd with createos cp: a 64 MiB file
// (streamed: no side holds it whole) keeps its bytes, mode and time both
// ways, a directory tree goes in and comes out the same, - reads stdin
// and writes stdout, and a missing path is file_not_found.
func TestFiles(t *testing.T) {
	s := startStack(t)
	createos := func(stdin []byte, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bins, "createos"), args...)
		cmd.Env = append(os.Environ(), "CREATEOS_API_URL="+s.url, "CREATEOS_API_KEY="+s.key)
		cmd.Stdin = bytes.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if err != nil {
			return out.String() + errb.String(), err
		}
		return out.String(), nil
	}
	local := t.TempDir()
	guest := t.TempDir() // the guest's filesystem is this host's here

	big := make([]byte, 64<<20)
	rand.Read(big)
	src := filepath.Join(local, "big.bin")
	os.WriteFile(src, big, 0o640)
	mtime := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	os.Chtimes(src, mtime, mtime)
	if out, err := createos(nil, "sandbox", "cp", src, "sb-local:"+guest+"/"); err != nil {
		t.Fatalf("cp in: %v: %s", err, out)
	}
	in := filepath.Join(guest, "big.bin")
	if got, _ := os.ReadFile(in); !bytes.Equal(got, big) {
		t.Fatalf("the file in the sandbox differs (%d bytes)", len(got))
	}
	if fi, _ := os.Stat(in); fi == nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mtime) {
		t.Fatalf("mode and time in the sandbox: %v", fi)
	}
	back := filepath.Join(local, "back.bin")
	if out, err := createos(nil, "sandbox", "cp", "sb-local:"+in, back); err != nil {
		t.Fatalf("cp out: %v: %s", err, out)
	}
	if got, _ := os.ReadFile(back); !bytes.Equal(got, big) {
		t.Fatal("the file copied back differs")
	}
	if fi, _ := os.Stat(back); fi == nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mtime) {
		t.Fatalf("mode and time copied back: %v", fi)
	}

	// A tree.
	tree := filepath.Join(local, "proj")
	os.MkdirAll(filepath.Join(tree, "src", "deep"), 0o755)
	os.WriteFile(filepath.Join(tree, "src", "deep", "main.go"), []byte("package main\n"), 0o644)
	os.WriteFile(filepath.Join(tree, "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.Symlink("run.sh", filepath.Join(tree, "start"))
	if out, err := createos(nil, "sandbox", "cp", tree, "sb-local:"+guest+"/work"); err != nil {
		t.Fatalf("cp a tree in: %v: %s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(guest, "work", "src", "deep", "main.go")); string(b) != "package main\n" {
		t.Fatalf("the tree in the sandbox: %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(guest, "work", "run.sh")); fi == nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("run.sh's mode: %v", fi)
	}
	out := filepath.Join(local, "out")
	os.Mkdir(out, 0o755)
	if o, err := createos(nil, "sandbox", "cp", "sb-local:"+guest+"/work", out); err != nil {
		t.Fatalf("cp a tree out: %v: %s", err, o)
	}
	if l, _ := os.Readlink(filepath.Join(out, "work", "start")); l != "run.sh" {
		t.Fatalf("the symlink copied out: %q", l)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "work", "src", "deep", "main.go")); string(b) != "package main\n" {
		t.Fatalf("the tree copied out: %q", b)
	}

	// - both ways.
	if o, err := createos([]byte("from stdin\n"), "sandbox", "cp", "-", "sb-local:"+guest+"/in.txt"); err != nil {
		t.Fatalf("cp -: %v: %s", err, o)
	}
	if o, err := createos(nil, "sandbox", "cp", "sb-local:"+guest+"/in.txt", "-"); err != nil || o != "from stdin\n" {
		t.Fatalf("cp to -: %v: %q", err, o)
	}

	// A missing path.
	if o, err := createos(nil, "sandbox", "cp", "sb-local:"+guest+"/nope", local); err == nil || !strings.Contains(o, "file_not_found") {
		t.Fatalf("cp of a missing path: %v: %s", err, o)
	}
	// A listing through the API.
	req, _ := http.NewRequest("GET", s.url+"/v1/sandboxes/sb-local/files"+guest, nil)
	req.Header.Set("X-Api-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(b.String(), `"name":"big.bin"`) {
		t.Fatalf("listing: %d %s", resp.StatusCode, b.String())
	}
	// A range past the end: 416 with the size, through hostproxy.
	req, _ = http.NewRequest("GET", s.url+"/v1/sandboxes/sb-local/files"+guest+"/in.txt", nil)
	req.Header.Set("X-Api-Key", s.key)
	req.Header.Set("Range", "bytes=100-200")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestedRangeNotSatisfiable || resp.Header.Get("Content-Range") != "bytes */11" {
		t.Fatalf("a range past the end: %d %q", resp.StatusCode, resp.Header.Get("Content-Range"))
	}
}
