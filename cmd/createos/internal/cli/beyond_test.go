package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"strata/hostproxy/hostproxytest"
)

// history makes two checkpoints of /workspace/project with trees: the
// second edits README.md, adds src/util.go, a symlink and a binary file,
// and deletes old.txt.
func history(e *env) (a, b Checkpoint) {
	g := e.guests["sb-a1"]
	a = e.create("sb-a1", "/workspace/project", "first")
	g.SetTree(a.ID, hostproxytest.Tree{
		"README.md": {Content: "hello\nsecond line\nthird\n"}, "src/main.go": {Content: "package main\n"},
		"old.txt": {Content: "gone\n"}, "blob.bin": {Content: "a\x00b"},
	})
	b = e.create("sb-a1", "/workspace/project", "second")
	g.SetTree(b.ID, hostproxytest.Tree{
		"README.md": {Content: "hello\nsecond line, edited\nthird\n"}, "src/main.go": {Content: "package main\n"},
		"src/util.go": {Content: "package main\n\nfunc util() {}"}, "link": {Type: "symlink", Target: "README.md"},
		"blob.bin": {Content: "a\x00c"},
	})
	g.SetLiveTree("/workspace/project", hostproxytest.Tree{"README.md": {Content: "live\n"}})
	return a, b
}

// TestDiff pins diff's table, -o json, --against, --live and --patch.
func TestDiff(t *testing.T) {
	e := startEnv(t)
	a, b := history(e)

	table := e.ok("sandbox", "checkpoint", "diff", b.ID)
	want := `CHANGE    TYPE     SIZE  PATH
modified  file     32 B  README.md
modified  file     3 B   blob.bin
added     symlink  9 B   link
deleted   file     5 B   old.txt
added     file     28 B  src/util.go
`
	if table != want {
		t.Errorf("diff table:\n%s\nwant:\n%s", table, want)
	}
	var changes []Change
	if err := json.Unmarshal([]byte(e.ok("sandbox", "checkpoint", "diff", "sb-a1", b.ID, "-o", "json")), &changes); err != nil || len(changes) != 5 {
		t.Fatalf("diff -o json: %v %+v", err, changes)
	}
	if out := e.ok("sandbox", "checkpoint", "diff", a.ID, "--against", a.ID); out != "No changes.\n" {
		t.Errorf("diff against itself: %q", out)
	}

	patch := e.ok("sandbox", "checkpoint", "diff", b.ID, "--patch")
	wantPatch := `--- a/README.md	` + a.ID + `
+++ b/README.md	` + b.ID + `
@@ -1,3 +1,3 @@
 hello
-second line
+second line, edited
 third
Binary files a/blob.bin and b/blob.bin differ
--- a/old.txt	` + a.ID + `
+++ /dev/null
@@ -1 +0,0 @@
-gone
--- /dev/null
+++ b/src/util.go	` + b.ID + `
@@ -0,0 +1,3 @@
+package main
+
+func util() {}
\ No newline at end of file
`
	if patch != wantPatch {
		t.Errorf("diff --patch:\n%s\nwant:\n%s", patch, wantPatch)
	}
	// --against names the older side: the same patch.
	if got := e.ok("sandbox", "checkpoint", "diff", b.ID, "--against", a.ID, "--patch"); got != wantPatch {
		t.Errorf("diff --against --patch:\n%s", got)
	}

	// --live --patch: the live side read with exec.
	out, errOut, code := e.run("sandbox", "checkpoint", "diff", b.ID, "--live", "--patch")
	wantLive := `--- a/README.md	` + b.ID + `
+++ b/README.md	live
@@ -1,3 +1 @@
-hello
-second line, edited
-third
+live
`
	if code != 0 || !strings.HasPrefix(out, wantLive) || !strings.Contains(out, "Binary files a/blob.bin and /dev/null differ") {
		t.Errorf("diff --live --patch: exit %d\n%s\nwant it to start with:\n%s\n%s", code, out, wantLive, errOut)
	}

	for _, args := range [][]string{
		{b.ID, "--live", "--against", a.ID},
		{b.ID, "--patch", "-o", "json"},
		{b.ID, "--against", ""},
	} {
		if _, errOut, code := e.run(append([]string{"sandbox", "checkpoint", "diff"}, args...)...); code != 2 {
			t.Errorf("diff %q: exit %d, want a usage error\n%s", args, code, errOut)
		}
	}

	// A checkpoint may be given by its name, when one checkpoint of the
	// sandbox has it.
	if byName := e.ok("sandbox", "checkpoint", "diff", "sb-a1", "second", "--against", "first"); byName != table {
		t.Errorf("diff second --against first:\n%s\nwant\n%s", byName, table)
	}
	if _, errOut, code := e.run("sandbox", "checkpoint", "diff", "sb-a1", "second", "--against", "yesterday"); code != 1 ||
		errOut != "createos: checkpoint_not_found: no checkpoint of this sandbox has this id or name\n  checkpoint: yesterday\n" {
		t.Errorf("diff --against a name no checkpoint has: exit %d\n%s", code, errOut)
	}
	if out := e.ok("sandbox", "checkpoint", "restore", "sb-a1", "first"); !strings.HasPrefix(out, "Restored "+a.ID+" at /workspace/project\n") {
		t.Errorf("restore first: %q", out)
	}
	again := e.create("sb-a1", "/workspace/project", "second")
	if _, errOut, code := e.run("sandbox", "checkpoint", "diff", "sb-a1", "second"); code != 2 ||
		!strings.Contains(errOut, "2 checkpoints of sb-a1 are named \"second\" ("+b.ID+", "+again.ID+"): give one's id") {
		t.Errorf("diff of a name two checkpoints have: exit %d\n%s", code, errOut)
	}
}

// TestCat pins cat: a file's bytes, a directory's names, a symlink's
// target, an absolute path inside the directory, and the API's codes.
func TestCat(t *testing.T) {
	e := startEnv(t)
	_, b := history(e)
	cat := func(p string) string { return e.ok("sandbox", "checkpoint", "cat", b.ID, p) }
	if got := cat("README.md"); got != "hello\nsecond line, edited\nthird\n" {
		t.Errorf("cat file: %q", got)
	}
	if got := cat("/workspace/project/README.md"); got != "hello\nsecond line, edited\nthird\n" {
		t.Errorf("cat absolute: %q", got)
	}
	if got := cat("."); got != "README.md\nblob.bin\nlink@\nsrc/\n" {
		t.Errorf("cat root: %q", got)
	}
	if got := cat("link"); got != "README.md\n" {
		t.Errorf("cat symlink: %q", got)
	}
	var entry Entry
	if err := json.Unmarshal([]byte(e.ok("sandbox", "checkpoint", "cat", "sb-a1", b.ID, "src/util.go", "-o", "json")), &entry); err != nil {
		t.Fatal(err)
	}
	if entry.Type != "file" || entry.Mode != "0644" || entry.Content == nil || string(*entry.Content) != "package main\n\nfunc util() {}" {
		t.Errorf("cat -o json: %+v", entry)
	}
	for _, tc := range []struct {
		path, stderr string
		code         int
	}{
		{"old.txt", "entry_not_found", 1},
		{"../etc/passwd", "invalid_field", 1},
		{"/etc/passwd", "is not in /workspace/project", 2},
	} {
		_, errOut, code := e.run("sandbox", "checkpoint", "cat", b.ID, tc.path)
		if code != tc.code || !strings.Contains(errOut, tc.stderr) {
			t.Errorf("cat %s: exit %d, stderr %q; want %d with %q", tc.path, code, errOut, tc.code, tc.stderr)
		}
	}
}

// TestRestoreOnlyCloneRelease pins restore --only, clone and directory
// release, and create --retain.
func TestRestoreOnlyCloneRelease(t *testing.T) {
	e := startEnv(t)
	a, _ := history(e)
	g := e.guests["sb-a1"]

	out := e.ok("sandbox", "checkpoint", "restore", a.ID, "--only", "old.txt", "--only", "src")
	if out != "Restored old.txt, src from "+a.ID+" at /workspace/project\n" {
		t.Errorf("restore --only printed %q", out)
	}
	live := g.LiveTree("/workspace/project")
	if live["old.txt"].Content != "gone\n" || live["README.md"].Content != "live\n" || live["src/main.go"].Content != "package main\n" {
		t.Errorf("live after restore --only: %+v", live)
	}
	if _, errOut, code := e.run("sandbox", "checkpoint", "restore", a.ID, "--only", "/abs"); code != 1 || !strings.Contains(errOut, "invalid_field") {
		t.Errorf("restore --only /abs: exit %d %s", code, errOut)
	}
	if _, _, code := e.run("sandbox", "checkpoint", "restore", a.ID, "--only", "x", "--idempotency-key", "k"); code != 2 {
		t.Errorf("restore --only with a key: exit %d, want 2", code)
	}

	if out := e.ok("sandbox", "checkpoint", "clone", a.ID, "--to", "/workspace/copy"); out != "Cloned "+a.ID+" to /workspace/copy\n" {
		t.Errorf("clone printed %q", out)
	}
	if g.Head("/workspace/copy") != a.ID {
		t.Errorf("clone did not reach the guest")
	}
	if _, errOut, code := e.run("sandbox", "checkpoint", "clone", a.ID, "--to", "relative"); code != 1 || !strings.Contains(errOut, "path_not_absolute") {
		t.Errorf("clone --to relative: exit %d %s", code, errOut)
	}

	dirs := e.ok("sandbox", "directory", "list")
	if !strings.Contains(dirs, "PATH") || !strings.Contains(dirs, "/workspace/copy") || !strings.Contains(dirs, "SIZE") {
		t.Errorf("directory list:\n%s", dirs)
	}
	out = e.ok("sandbox", "directory", "release", "--path", "/workspace/project")
	if !strings.HasPrefix(out, "Released /workspace/project; deleted 2 checkpoint(s)\n  "+a.ID+"\n") {
		t.Errorf("release printed %q", out)
	}
	if _, errOut, code := e.run("sandbox", "directory", "release", "--path", "/workspace/project"); code != 1 || !strings.Contains(errOut, "directory_not_managed") {
		t.Errorf("second release: exit %d %s", code, errOut)
	}

	for range 3 {
		e.ok("sandbox", "checkpoint", "create", "--path", "/workspace/kept", "--retain", "2")
	}
	var list []Checkpoint
	if err := json.Unmarshal([]byte(e.ok("sandbox", "checkpoint", "list", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, cp := range list {
		if cp.Path == "/workspace/kept" {
			kept++
		}
	}
	if kept != 2 {
		t.Errorf("%d checkpoints kept with --retain 2", kept)
	}
	if _, _, code := e.run("sandbox", "checkpoint", "create", "--path", "/workspace/kept", "--retain", "0"); code != 2 {
		t.Errorf("--retain 0: exit %d, want 2", code)
	}
}

// TestListShowsAutoAndSize pins the list table's SIZE column and the
// mark of an automatic checkpoint.
func TestListShowsAutoAndSize(t *testing.T) {
	var out bytes.Buffer
	a := &app{stdout: &out}
	err := a.writeCheckpoints([]Checkpoint{
		{ID: "cp_1", Path: "/w", Name: "first", CreatedAt: "T1", SizeBytes: 2048},
		{ID: "cp_2", Path: "/w", Name: "before restoring cp_1", CreatedAt: "T2", ParentID: "cp_1", Auto: true, SizeBytes: 10},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `ID    PATH  NAME                          CREATED  PARENT  SIZE
cp_1  /w    first                         T1       -       2.0 KiB
cp_2  /w    [auto] before restoring cp_1  T2       cp_1    10 B
`
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestPatchWithDeletedParent pins diff --patch of a checkpoint whose
// parent was deleted: the files route cannot read the parent, so the
// added files are shown and the others named on stderr, instead of the
// whole command failing on checkpoint_not_found.
func TestPatchWithDeletedParent(t *testing.T) {
	e := startEnv(t)
	a, b := history(e)
	e.ok("sandbox", "checkpoint", "delete", a.ID)
	out, errOut, code := e.run("sandbox", "checkpoint", "diff", b.ID, "--patch")
	if code != 0 || !strings.Contains(out, "+++ b/src/util.go") || strings.Contains(out, "README.md") ||
		!strings.Contains(errOut, "note: README.md: "+b.ID+" has no listed parent checkpoint") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if got := e.ok("sandbox", "checkpoint", "cat", b.ID, "src/"); got != "main.go\nutil.go\n" {
		t.Errorf("cat src/: %q", got)
	}
}
