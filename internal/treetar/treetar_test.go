package treetar

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func tarOf(t testing.TB, hs ...tar.Header) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hs {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// TestRoundTrip: a tree written and extracted elsewhere is the same tree:
// contents, modes, times, symlinks.
func TestRoundTrip(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o750)
	os.WriteFile(filepath.Join(src, "a", "b", "f"), []byte("data"), 0o640)
	os.Symlink("a/b/f", filepath.Join(src, "l"))
	mt := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	os.Chtimes(filepath.Join(src, "a", "b", "f"), mt, mt)
	os.Chtimes(filepath.Join(src, "a"), mt, mt)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := Write(tw, src); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	dst := t.TempDir()
	root, _ := os.OpenRoot(dst)
	defer root.Close()
	n, err := Extract(&buf, root, KeepAll)
	if err != nil || n != 4 {
		t.Fatalf("Extract: %d, %v", n, err)
	}
	fi, err := os.Stat(filepath.Join(dst, "a", "b", "f"))
	if err != nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mt) {
		t.Fatalf("f: %v %v", fi, err)
	}
	if di, _ := os.Stat(filepath.Join(dst, "a")); di == nil || di.Mode().Perm() != 0o750 || !di.ModTime().Equal(mt) {
		t.Fatalf("a: %v", di)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "l")); l != "a/b/f" {
		t.Fatalf("l -> %q", l)
	}
}

// TestOutside: entries named outside, and writes through a symlink an
// earlier entry made, never land outside the directory.
func TestOutside(t *testing.T) {
	base := t.TempDir()
	for name, hs := range map[string][]tar.Header{
		"dotdot":         {{Name: "../x", Typeflag: tar.TypeReg, Mode: 0o644}},
		"deep dotdot":    {{Name: "a/../../x", Typeflag: tar.TypeReg, Mode: 0o644}},
		"absolute up":    {{Name: "/../x", Typeflag: tar.TypeReg, Mode: 0o644}},
		"through a link": {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: base}, {Name: "l/x", Typeflag: tar.TypeReg, Mode: 0o644}},
		"abs link":       {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}, {Name: "l/" + base[1:] + "/x", Typeflag: tar.TypeReg, Mode: 0o644}},
		"hard link out":  {{Name: "h", Typeflag: tar.TypeLink, Linkname: "../x"}},
	} {
		dir := filepath.Join(base, "d-"+filepath.Base(name))
		os.Mkdir(dir, 0o755)
		root, _ := os.OpenRoot(dir)
		_, err := Extract(bytes.NewReader(tarOf(t, hs...)), root, LocalModes(0))
		root.Close()
		var out *OutsideError
		var entry *EntryError
		if err == nil || !errors.As(err, &out) && !errors.As(err, &entry) {
			t.Errorf("%s: %v; want a refusal", name, err)
		}
		if _, err := os.Lstat(filepath.Join(base, "x")); err == nil {
			t.Fatalf("%s wrote outside", name)
		}
	}
	root, _ := os.OpenRoot(base)
	defer root.Close()
	if _, err := Extract(bytes.NewReader([]byte("not a tar at all, not at all")), root, LocalModes(0)); !errors.Is(err, ErrNotTar) {
		t.Errorf("garbage: %v", err)
	}
}

// FuzzExtract: whatever the stream, nothing is written outside the
// directory, and a failure is one of the package's errors.
func FuzzExtract(f *testing.F) {
	f.Add(tarOf(f, tar.Header{Name: "a/b", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644}))
	f.Add(tarOf(f, tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: ".."}, tar.Header{Name: "l/z", Typeflag: tar.TypeReg, Mode: 0o644}))
	f.Add([]byte{})
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		dir, err := os.MkdirTemp(base, "d")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		root, err := os.OpenRoot(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		_, err = Extract(bytes.NewReader(data), root, LocalModes(0o022))
		var out *OutsideError
		var entry *EntryError
		if err != nil && !errors.Is(err, ErrNotTar) && !errors.As(err, &out) && !errors.As(err, &entry) {
			t.Fatalf("unclassified error %v", err)
		}
		ents, _ := os.ReadDir(base)
		if len(ents) != 1 {
			t.Fatalf("written beside the directory: %v", ents)
		}
	})
}

// TestModesKept pins issue 30 item 6's cp of a guest's files (a file the
// guest made 0777 landed 0777 on the host, and a setuid bit could land
// too): with LocalModes the caller's umask clears bits and setuid,
// setgid and sticky are never set, on files and directories alike;
// KeepAll (guestd) keeps every bit.
func TestModesKept(t *testing.T) {
	cases := []struct {
		name string
		keep fs.FileMode
		typ  byte
		mode int64
		want fs.FileMode
	}{
		{"a file, every bit kept", KeepAll, tar.TypeReg, 0o4755, 0o755 | fs.ModeSetuid},
		{"a setgid directory, every bit kept", KeepAll, tar.TypeDir, 0o2775, 0o775 | fs.ModeSetgid},
		{"a 0777 file under umask 022", LocalModes(0o022), tar.TypeReg, 0o777, 0o755},
		{"a 0777 file under umask 027", LocalModes(0o027), tar.TypeReg, 0o777, 0o750},
		{"a setuid file under umask 022", LocalModes(0o022), tar.TypeReg, 0o4755, 0o755},
		{"a setgid file under umask 0", LocalModes(0), tar.TypeReg, 0o2777, 0o777},
		{"a 0777 directory under umask 077", LocalModes(0o077), tar.TypeDir, 0o777, 0o700},
		{"a sticky directory under umask 022", LocalModes(0o022), tar.TypeDir, 0o1777, 0o755},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			root, _ := os.OpenRoot(dir)
			defer root.Close()
			want := tc.want
			if tc.typ == tar.TypeDir {
				want |= fs.ModeDir
			}
			_, err := Extract(bytes.NewReader(tarOf(t, tar.Header{Name: "e", Typeflag: tc.typ, Mode: tc.mode})), root, tc.keep)
			fi, _ := os.Lstat(filepath.Join(dir, "e"))
			if err != nil || fi == nil || fi.Mode() != want {
				t.Fatalf("mode %v, want %v (%v)", fi.Mode(), want, err)
			}
		})
	}
}

// TestSymlinkedRoot: a root reached through a symlink is walked.
func TestSymlinkedRoot(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "real"), 0o755)
	os.WriteFile(filepath.Join(dir, "real", "f"), []byte("x"), 0o644)
	os.Symlink("real", filepath.Join(dir, "link"))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := Write(tw, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	h, err := tar.NewReader(&buf).Next()
	if err != nil || h.Name != "f" {
		t.Fatalf("the first entry: %+v, %v", h, err)
	}
}
