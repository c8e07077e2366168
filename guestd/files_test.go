package guestd

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/api"
	"strata/internal/testenv"
)

type filesStack struct {
	t   *testing.T
	url string
}

func newFilesStack(t *testing.T) *filesStack {
	s := storelessServer(t, &bytes.Buffer{})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &filesStack{t: t, url: srv.URL}
}

// do sends one files request for guest path p (absolute).
func (st *filesStack) do(method, p, query string, h map[string]string, body io.Reader) (*http.Response, []byte) {
	st.t.Helper()
	u := st.url + "/v1/files" + p
	if query != "" {
		u += "?" + query
	}
	req, _ := http.NewRequest(method, u, body)
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		st.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// failCode is the code of a JSend fail answer.
func failCode(b []byte) string {
	var env struct {
		Data struct {
			Code string `json:"code"`
		} `json:"data"`
	}
	json.Unmarshal(b, &env)
	return env.Data.Code
}

// TestFiles: a file goes in with its mode and time and comes out whole
// (and by ranges); a directory lists, goes out as a tar and comes back in
// from one, the same tree; uploads are refused with their codes where
// they cannot be made, and no tar entry lands outside its directory.
func TestFiles(t *testing.T) {
	testenv.RequiresRoot(t)
	st := newFilesStack(t)
	dir := t.TempDir()
	f := filepath.Join(dir, "a.txt")
	mtime := time.Date(2025, 5, 6, 7, 8, 9, 123456789, time.UTC)

	resp, b := st.do("PUT", f, "", map[string]string{"Content-Type": api.MediaOctetStream, api.HeaderFileMode: "0751", api.HeaderFileMtime: mtime.Format(time.RFC3339Nano)}, strings.NewReader("abcdefgh"))
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"size_bytes":8`) {
		t.Fatalf("PUT: %d %s", resp.StatusCode, b)
	}
	if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o751 || !fi.ModTime().Equal(mtime) {
		t.Fatalf("the file written: %v, %v", fi, err)
	}
	resp, b = st.do("GET", f, "", nil, nil)
	if resp.StatusCode != 200 || string(b) != "abcdefgh" || resp.Header.Get(api.HeaderFileMode) != "0751" || resp.Header.Get(api.HeaderFileMtime) != mtime.Format(time.RFC3339Nano) || resp.Header.Get("Content-Type") != api.MediaOctetStream {
		t.Fatalf("GET: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	resp, b = st.do("GET", f, "", map[string]string{"Range": "bytes=2-4"}, nil)
	if resp.StatusCode != 206 || string(b) != "cde" {
		t.Fatalf("GET a range: %d %q", resp.StatusCode, b)
	}
	// Replaced whole; no temporary file left beside it.
	st.do("PUT", f, "", nil, strings.NewReader("new"))
	if got, _ := os.ReadFile(f); string(got) != "new" {
		t.Fatalf("replaced: %q", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("files beside the upload: %v", ents)
	}

	// A tree out as a tar, and in again.
	tree := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(tree, "sub"), 0o755)
	os.WriteFile(filepath.Join(tree, "sub", "x"), []byte("xx"), 0o600)
	os.WriteFile(filepath.Join(tree, "big"), bytes.Repeat([]byte("z"), 3<<20), 0o644)
	os.Symlink("sub/x", filepath.Join(tree, "link"))
	resp, b = st.do("GET", tree, "", nil, nil)
	var list struct {
		Data api.FileListing `json:"data"`
	}
	json.Unmarshal(b, &list)
	if resp.StatusCode != 200 || len(list.Data.Entries) != 3 || list.Data.Path != tree {
		t.Fatalf("listing: %d %s", resp.StatusCode, b)
	}
	resp, tarball := st.do("GET", tree, "", map[string]string{"Accept": api.MediaTar}, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != api.MediaTar {
		t.Fatalf("GET a tar: %d", resp.StatusCode)
	}
	copyDir := filepath.Join(dir, "copy")
	resp, b = st.do("PUT", copyDir, "", map[string]string{"Content-Type": api.MediaTar}, bytes.NewReader(tarball))
	if resp.StatusCode != 200 {
		t.Fatalf("PUT a tar: %d %s", resp.StatusCode, b)
	}
	if x, err := os.ReadFile(filepath.Join(copyDir, "sub", "x")); err != nil || string(x) != "xx" {
		t.Fatalf("sub/x: %q %v", x, err)
	}
	if fi, _ := os.Stat(filepath.Join(copyDir, "sub", "x")); fi == nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("sub/x mode: %v", fi)
	}
	if big, _ := os.ReadFile(filepath.Join(copyDir, "big")); len(big) != 3<<20 {
		t.Fatalf("big: %d bytes", len(big))
	}
	if l, err := os.Readlink(filepath.Join(copyDir, "link")); err != nil || l != "sub/x" {
		t.Fatalf("link: %q %v", l, err)
	}

	// Tars that reach out.
	outside := filepath.Join(dir, "outside")
	for name, entries := range map[string][]tar.Header{
		"dotdot":          {{Name: "../outside", Typeflag: tar.TypeReg, Mode: 0o644}},
		"through a link":  {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: dir}, {Name: "l/outside", Typeflag: tar.TypeReg, Mode: 0o644}},
		"hard link out":   {{Name: "h", Typeflag: tar.TypeLink, Linkname: "../a.txt"}},
		"absolute parent": {{Name: "/../../outside", Typeflag: tar.TypeReg, Mode: 0o644}},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			tw.WriteHeader(&h)
		}
		tw.Close()
		resp, b := st.do("PUT", filepath.Join(dir, "evil-"+strings.ReplaceAll(name, " ", "-")), "", map[string]string{"Content-Type": api.MediaTar}, &buf)
		if resp.StatusCode < 400 {
			t.Errorf("tar %s: %d %s, want a refusal", name, resp.StatusCode, b)
		}
		if _, err := os.Lstat(outside); err == nil {
			t.Fatalf("tar %s wrote %s", name, outside)
		}
	}

	// Refusals.
	for _, tc := range []struct {
		method, p, query string
		h                map[string]string
		status           int
		code             string
	}{
		{"PUT", filepath.Join(dir, "no", "such", "f"), "", nil, 404, api.CodeFileNotFound},
		{"PUT", tree, "", nil, 409, api.CodeNotAFile},
		{"PUT", f, "", map[string]string{api.HeaderFileMode: "999"}, 400, "invalid_field"},
		{"PUT", f, "", map[string]string{"Content-Type": "text/plain"}, 400, "invalid_field"},
		{"PUT", f, "force=1", nil, 400, "invalid_field"},
		{"GET", filepath.Join(dir, "missing"), "", nil, 404, api.CodeFileNotFound},
		{"GET", "/dev/null", "", nil, 409, api.CodeNotAFile},
		{"DELETE", tree, "", nil, 409, "directory_not_empty"},
		{"DELETE", filepath.Join(dir, "missing"), "", nil, 404, api.CodeFileNotFound},
		{"DELETE", "/", "", nil, 400, "invalid_field"},
		{"GET", dir + "/x%01y", "", nil, 400, "invalid_field"},
	} {
		resp, b := st.do(tc.method, tc.p, tc.query, tc.h, strings.NewReader("x"))
		if resp.StatusCode != tc.status || failCode(b) != tc.code {
			t.Errorf("%s %s?%s %v: %d %s; want %d %s", tc.method, tc.p, tc.query, tc.h, resp.StatusCode, b, tc.status, tc.code)
		}
	}
	// With parents=true the missing directories are made.
	if resp, b := st.do("PUT", filepath.Join(dir, "no", "such", "f"), "parents=true", nil, strings.NewReader("p")); resp.StatusCode != 200 {
		t.Fatalf("PUT with parents: %d %s", resp.StatusCode, b)
	}
	if resp, _ := st.do("DELETE", tree, "recursive=true", nil, nil); resp.StatusCode != 200 {
		t.Fatalf("DELETE recursive: %d", resp.StatusCode)
	}
	if _, err := os.Stat(tree); err == nil {
		t.Fatal("the tree is still there")
	}
}

// TestFilesDiskFull: an upload the disk has no room for is 507
// insufficient_storage, and leaves no partial file.
func TestFilesDiskFull(t *testing.T) {
	testenv.RequiresRootMounts(t)
	st := newFilesStack(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	resp, b := st.do("PUT", filepath.Join(dir, "big"), "", nil, bytes.NewReader(make([]byte, 2<<20)))
	if resp.StatusCode != 507 || failCode(b) != "insufficient_storage" {
		t.Fatalf("2 MiB into 1 MiB: %d %s", resp.StatusCode, b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left: %v", ents)
	}
}
