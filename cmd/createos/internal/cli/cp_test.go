package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"strata/internal/api"
)

// cpGuest is the files routes of one sandbox, sb-a1, on a stand-in
// server: /f is a file the guest made 4777, /d a directory whose tar
// holds a 0777 file, a setuid file and a sticky 1777 directory.
func cpGuest(t *testing.T) string {
	t.Helper()
	var tarBody bytes.Buffer
	tw := tar.NewWriter(&tarBody)
	for _, h := range []tar.Header{
		{Name: "open", Typeflag: tar.TypeReg, Mode: 0o777, Size: 1},
		{Name: "suid", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 1},
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
	} {
		tw.WriteHeader(&h)
		if h.Size > 0 {
			tw.Write([]byte("x"))
		}
	}
	tw.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/sb-a1/files/f":
			w.Header().Set("Content-Type", api.MediaOctetStream)
			w.Header().Set(api.HeaderFileMode, "4777")
			w.Write([]byte("file"))
		case "/v1/sandboxes/sb-a1/files/d":
			if r.Header.Get("Accept") != api.MediaTar {
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"status":"success","data":{"path":"/d","entries":[]}}`))
				return
			}
			w.Header().Set("Content-Type", api.MediaTar)
			w.Write(tarBody.Bytes())
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"status":"fail","data":{"code":"file_not_found","message":"no"}}`))
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestCpDownloadModes pins issue 30 item 6's first defect: createos
// sandbox cp SANDBOX:/f . gave the file the guest's mode without the
// umask (a 0777 file landed 0777), and could set setuid. A download's
// files and directories get the sandbox's permissions less the caller's
// umask, and never setuid, setgid or sticky.
func TestCpDownloadModes(t *testing.T) {
	url := cpGuest(t)
	old := umask
	umask = func() fs.FileMode { return 0o027 }
	t.Cleanup(func() { umask = old })
	dst := t.TempDir()
	vars := map[string]string{EnvAPIURL: url, EnvAPIKey: fakeKey, EnvCredentials: filepath.Join(t.TempDir(), "credentials.env")}
	cp := func(src, dst string) {
		t.Helper()
		var out, errb bytes.Buffer
		if code := Run(context.Background(), []string{"sandbox", "cp", src, dst}, &out, &errb, func(k string) string { return vars[k] }); code != 0 {
			t.Fatalf("cp %s %s: exit %d: %s", src, dst, code, errb.String())
		}
	}
	cp("sb-a1:/f", dst)
	cp("sb-a1:/d", dst)
	for name, want := range map[string]fs.FileMode{
		"f":      0o750,
		"d/open": 0o750,
		"d/suid": 0o750,
		"d/tmp":  fs.ModeDir | 0o750,
	} {
		fi, err := os.Lstat(filepath.Join(dst, name))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: %v, want %v (%v)", name, fi.Mode(), want, err)
		}
	}
}

// TestProcessUmask: the mask is read without being changed, whatever it
// is.
func TestProcessUmask(t *testing.T) {
	for _, m := range []int{0o027, 0o002, 0o077} {
		old := syscall.Umask(m)
		got := processUmask()
		after := syscall.Umask(old)
		if got != fs.FileMode(m) || after != m {
			t.Errorf("umask %#o: read %#o, and it was %#o after", m, got, after)
		}
	}
	status := filepath.Join(t.TempDir(), "status")
	for text, want := range map[string]int{
		"Name:\tcreateos\nUmask:\t0022\nState:\tR\n": 0o022,
		"Umask:\t0777\n":          0o777,
		"Umask:\t9\n":             -1,
		"Name:\tcreateos\n":       -1,
		"Umask:\t01000\nUmask:\n": -1,
	} {
		os.WriteFile(status, []byte(text), 0o644)
		m, ok := statusUmask(status)
		if ok != (want >= 0) || ok && m != fs.FileMode(want) {
			t.Errorf("%q: %#o %v, want %#o", text, m, ok, want)
		}
	}
}
