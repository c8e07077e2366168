package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBeyondThroughTheStack drives issue 8's routes end to end: createos
// through hostproxy to the real guestd and its store. diff (table and
// patch), cat, restore --only, the undo of a restore, clone, release
// and, with guestd stopped, guestd export.
func TestBeyondThroughTheStack(t *testing.T) {
	s := startStack(t)
	base := t.TempDir()
	cleanupMounts(t, base)
	project := filepath.Join(base, "workspace/project")
	writeFile(t, project+"/README.md", "hello\nsecond line\nthird\n")
	writeFile(t, project+"/old.txt", "gone\n")
	writeFile(t, project+"/src/main.go", "package main\n")
	run := func(args ...string) string {
		t.Helper()
		out, err := s.createos(args...)
		if err != nil {
			t.Fatalf("createos %s: %v\n%s\n%s", strings.Join(args, " "), err, out, s.g.log)
		}
		return out
	}
	capture := func(name string) string {
		var cp struct{ ID string }
		if err := json.Unmarshal([]byte(run("sandbox", "checkpoint", "create", "--path", project, "--name", name, "-o", "json")), &cp); err != nil {
			t.Fatal(err)
		}
		return cp.ID
	}
	a := capture("A")
	writeFile(t, project+"/README.md", "hello\nsecond line, edited\nthird\n")
	os.Remove(project + "/old.txt")
	writeFile(t, project+"/src/util.go", "package main\n")
	b := capture("B")

	table := run("sandbox", "checkpoint", "diff", b)
	for _, want := range []string{`modified\s+file\s+\S+ B\s+README.md`, `deleted\s+file\s+5 B\s+old.txt`, `added\s+file\s+13 B\s+src/util.go`} {
		if !regexp.MustCompile(want).MatchString(table) {
			t.Errorf("diff table lacks %s:\n%s", want, table)
		}
	}
	patch := run("sandbox", "checkpoint", "diff", b, "--patch")
	for _, want := range []string{"--- a/README.md\t" + a, "+++ b/README.md\t" + b, "-second line\n", "+second line, edited\n", "+++ /dev/null", "-gone\n", "--- /dev/null", "+package main\n"} {
		if !strings.Contains(patch, want) {
			t.Errorf("diff --patch lacks %q:\n%s", want, patch)
		}
	}
	if got := run("sandbox", "checkpoint", "cat", a, "old.txt"); got != "gone\n" {
		t.Errorf("cat old.txt from A: %q", got)
	}
	if got := run("sandbox", "checkpoint", "cat", b, "."); got != "README.md\nsrc/\n" {
		t.Errorf("cat . of B: %q", got)
	}

	// Unsaved work, then a restore of one path, then of everything.
	writeFile(t, project+"/README.md", "unsaved\n")
	writeFile(t, project+"/notes.txt", "unsaved notes\n")
	if live := run("sandbox", "checkpoint", "diff", b, "--live"); !strings.Contains(live, "notes.txt") || !strings.Contains(live, "README.md") {
		t.Errorf("diff --live:\n%s", live)
	}
	// The live side of a patch is read in the sandbox (exec).
	livePatch := run("sandbox", "checkpoint", "diff", b, "--live", "--patch")
	for _, want := range []string{"+++ b/README.md\tlive", "+unsaved\n", "--- /dev/null\n+++ b/notes.txt\tlive", "+unsaved notes\n"} {
		if !strings.Contains(livePatch, want) {
			t.Errorf("diff --live --patch lacks %q:\n%s", want, livePatch)
		}
	}
	run("sandbox", "checkpoint", "restore", a, "--only", "old.txt")
	if got, _ := os.ReadFile(project + "/old.txt"); string(got) != "gone\n" {
		t.Errorf("old.txt after restore --only: %q", got)
	}
	if got, _ := os.ReadFile(project + "/README.md"); string(got) != "unsaved\n" {
		t.Errorf("restore --only touched README.md: %q", got)
	}
	out := run("sandbox", "checkpoint", "restore", b)
	m := regexp.MustCompile(`Unsaved changes kept as (cp_\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("restore printed no automatic checkpoint:\n%s", out)
	}
	if got, _ := os.ReadFile(project + "/README.md"); string(got) != "hello\nsecond line, edited\nthird\n" {
		t.Errorf("README.md after restoring B: %q", got)
	}
	if list := run("sandbox", "checkpoint", "list"); !strings.Contains(list, "[auto] before restoring "+b) {
		t.Errorf("list does not mark the automatic checkpoint:\n%s", list)
	}
	run("sandbox", "checkpoint", "restore", m[1])
	if got, _ := os.ReadFile(project + "/notes.txt"); string(got) != "unsaved notes\n" {
		t.Errorf("undo lost notes.txt: %q", got)
	}

	// A clone of A, then the source released: the clone is intact.
	clone := filepath.Join(base, "workspace/clone")
	run("sandbox", "checkpoint", "clone", a, "--to", clone)
	if got, _ := os.ReadFile(clone + "/old.txt"); string(got) != "gone\n" {
		t.Errorf("clone's old.txt: %q", got)
	}
	out = run("sandbox", "directory", "release", "--path", project)
	if !strings.Contains(out, "Released "+project) || !strings.Contains(out, a) {
		t.Errorf("release printed:\n%s", out)
	}
	if got, _ := os.ReadFile(project + "/notes.txt"); string(got) != "unsaved notes\n" {
		t.Errorf("released directory lost its live content: %q", got)
	}
	writeFile(t, project+"/after.txt", "plain\n")
	if got, _ := os.ReadFile(clone + "/README.md"); string(got) != "hello\nsecond line\nthird\n" {
		t.Errorf("clone after the release: %q", got)
	}

	// guestd stopped: export the clone's live state.
	s.g.stop()
	to := filepath.Join(base, "exported")
	cmd := exec.Command(filepath.Join(bins, "guestd"), "export", "--store", s.g.store, "--path", clone, "--to", to)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("guestd export: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(to + "/src/main.go"); string(got) != "package main\n" {
		t.Errorf("exported src/main.go: %q", got)
	}
}
