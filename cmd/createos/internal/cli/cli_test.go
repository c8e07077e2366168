package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"strata/hostproxy"
	"strata/hostproxy/hostproxytest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

const (
	keyA = "sk_cli_test_account_a_0123456789"
	keyB = "sk_cli_test_account_b_0123456789"
)

// env is a CLI test's world: a hostproxy on 127.0.0.1:0 with fake guests
// (hostproxytest.FakeGuest, the guestd test double) for sb-a1 and sb-a2 of
// account A, sb-b1 of account B, and the environment variables createos
// reads. Its credentials file is in t.TempDir() and absent, never the
// machine's /run/strata/credentials.env.
type env struct {
	t      *testing.T
	url    string
	guests map[string]*hostproxytest.FakeGuest
	vars   map[string]string
}

func startEnv(t *testing.T) *env {
	t.Helper()
	sha := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	e := &env{t: t, guests: map[string]*hostproxytest.FakeGuest{}}
	cfg := hostproxy.Config{
		DataDir: t.TempDir(),
		Accounts: []hostproxy.AccountConfig{
			{ID: "acct-a", Keys: []hostproxy.KeyConfig{{ID: "key-a", SHA256: sha(keyA)}}},
			{ID: "acct-b", Keys: []hostproxy.KeyConfig{{ID: "key-b", SHA256: sha(keyB)}}},
		},
		RateLimit: hostproxy.RateLimit{PerSecond: 1000, Burst: 1000},
	}
	for _, sb := range []struct{ id, account string }{{"sb-a1", "acct-a"}, {"sb-a2", "acct-a"}, {"sb-b1", "acct-b"}} {
		g := hostproxytest.StartFakeGuest(t, sb.id)
		e.guests[sb.id] = g
		cfg.Sandboxes = append(cfg.Sandboxes, hostproxy.SandboxConfig{ID: sb.id, Account: sb.account, Guest: g.Addr})
	}
	cfg.Sandboxes = append(cfg.Sandboxes, hostproxy.SandboxConfig{ID: "sb-dead", Account: "acct-a", Guest: "unix:///nonexistent/guestd.sock"})
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := hostproxy.New(ctx, hostproxy.Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		srv.Close()
	})
	e.url = "http://" + ln.Addr().String()
	e.vars = map[string]string{
		EnvAPIURL: e.url, EnvAPIKey: keyA, EnvSandboxID: "sb-a1",
		EnvCredentials: filepath.Join(t.TempDir(), "credentials.env"),
	}
	return e
}

// run runs one createos command line in-process.
func (e *env) run(args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	checkHermetic(e.t, e.vars)
	var out, errb bytes.Buffer
	code = Run(context.Background(), args, &out, &errb, func(k string) string { return e.vars[k] })
	return out.String(), errb.String(), code
}

// ok runs a command that must succeed and returns its stdout.
func (e *env) ok(args ...string) string {
	e.t.Helper()
	out, errOut, code := e.run(args...)
	if code != 0 {
		e.t.Fatalf("createos %s: exit %d\n%s", strings.Join(args, " "), code, errOut)
	}
	return out
}

// create captures path through the CLI with -o json and parses the answer.
func (e *env) create(sandbox, path, name string) Checkpoint {
	e.t.Helper()
	var cp Checkpoint
	out := e.ok("sandbox", "checkpoint", "create", sandbox, "--path", path, "--name", name, "-o", "json")
	if err := json.Unmarshal([]byte(out), &cp); err != nil {
		e.t.Fatalf("create -o json printed %q: %v", out, err)
	}
	return cp
}

// checkHermetic fails a test whose createos would read the machine's own
// credentials file: left by `make run` or a real sandbox, it would make
// the test's outcome depend on the machine (issue 6, defect 8).
func checkHermetic(t *testing.T, vars map[string]string) {
	t.Helper()
	f := vars[EnvCredentials]
	if f == "" || !filepath.IsAbs(f) || filepath.Clean(f) == DefaultCredentials || strings.HasPrefix(f, "/run/strata/") || strings.HasPrefix(f, "/var/lib/strata/") {
		t.Fatalf("%s=%q: point it at a file under t.TempDir()", EnvCredentials, f)
	}
}

func checkGoldenText(t *testing.T, name, got string) {
	t.Helper()
	file := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("output differs from %s:\n--- got\n%s--- want\n%s", file, got, want)
	}
}

// TestCheckpointCommands drives create, list, restore and delete through
// the CLI, parsing -o json back, with SANDBOX given and from the environment.
func TestCheckpointCommands(t *testing.T) {
	e := startEnv(t)
	a := e.create("sb-a1", "/workspace/project", "first")
	if !strings.HasPrefix(a.ID, "cp_") || a.Path != "/workspace/project" || a.Name != "first" || a.ParentID != "" {
		t.Fatalf("created %+v", a)
	}
	// SANDBOX from $CREATEOS_SANDBOX_ID; --name left out.
	var b Checkpoint
	if err := json.Unmarshal([]byte(e.ok("sandbox", "checkpoint", "create", "--path", "/workspace/project", "-o", "json")), &b); err != nil {
		t.Fatal(err)
	}
	if b.ParentID != a.ID {
		t.Errorf("second capture's parent %q, want %q", b.ParentID, a.ID)
	}

	var list []Checkpoint
	if err := json.Unmarshal([]byte(e.ok("sandbox", "checkpoint", "list", "sb-a1", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != a.ID || list[1].ID != b.ID {
		t.Fatalf("list: %+v", list)
	}
	table := e.ok("sandbox", "checkpoint", "list")
	for _, want := range []string{"ID", "PATH", "NAME", "CREATED", "PARENT", a.ID, b.ID, "/workspace/project", "first"} {
		if !strings.Contains(table, want) {
			t.Errorf("list table lacks %q:\n%s", want, table)
		}
	}

	var restored Restored
	if err := json.Unmarshal([]byte(e.ok("sandbox", "checkpoint", "restore", "sb-a1", a.ID, "-o", "json")), &restored); err != nil {
		t.Fatal(err)
	}
	if restored.CheckpointID != a.ID || restored.Path != "/workspace/project" {
		t.Errorf("restore: %+v", restored)
	}
	if out := e.ok("sandbox", "checkpoint", "restore", a.ID); out != "Restored "+a.ID+" at /workspace/project\n" {
		t.Errorf("restore printed %q", out)
	}
	if out := e.ok("sandbox", "checkpoint", "delete", "sb-a1", b.ID, "-o", "json"); strings.TrimSpace(out) != "{}" {
		t.Errorf("delete -o json printed %q", out)
	}
	if out := e.ok("sandbox", "checkpoint", "delete", a.ID); out != "Deleted "+a.ID+"\n" {
		t.Errorf("delete printed %q", out)
	}
	if out := e.ok("sandbox", "checkpoint", "list"); out != "No checkpoints.\n" {
		t.Errorf("empty list printed %q", out)
	}
	if out := e.ok("sandbox", "checkpoint", "list", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("empty list -o json printed %q", out)
	}

	// Flags win over the environment.
	e.vars[EnvAPIKey] = "sk_wrong_wrong_wrong_wrong"
	e.vars[EnvAPIURL] = "http://127.0.0.1:1"
	e.ok("sandbox", "checkpoint", "list", "sb-a2", "--api-key", keyA, "--api-url", e.url)
}

// branchedHistory builds, in sb-a1:
//
//	/workspace/project: A, B, C; restore B; D; restore A; E; F
//	/home/user/app:     X; Y; delete X
func branchedHistory(e *env) {
	a := e.create("sb-a1", "/workspace/project", "A")
	b := e.create("sb-a1", "/workspace/project", "B")
	e.create("sb-a1", "/workspace/project", "C")
	x := e.create("sb-a1", "/home/user/app", "X")
	e.ok("sandbox", "checkpoint", "restore", "sb-a1", b.ID)
	e.create("sb-a1", "/workspace/project", "D")
	e.ok("sandbox", "checkpoint", "restore", "sb-a1", a.ID)
	e.create("sb-a1", "/workspace/project", "E")
	e.create("sb-a1", "/home/user/app", "Y")
	e.create("sb-a1", "/workspace/project", "F")
	e.ok("sandbox", "checkpoint", "delete", "sb-a1", x.ID)
}

// TestTreeGolden draws a branched history; its table and JSON forms are
// golden files.
func TestTreeGolden(t *testing.T) {
	e := startEnv(t)
	branchedHistory(e)
	checkGoldenText(t, "tree.txt", e.ok("sandbox", "checkpoint", "tree", "sb-a1"))
	out := e.ok("sandbox", "checkpoint", "tree", "sb-a1", "-o", "json")
	var parsed []Lineage
	if err := json.Unmarshal([]byte(out), &parsed); err != nil {
		t.Fatalf("tree -o json: %v", err)
	}
	if len(parsed) != 2 || parsed[0].Path != "/workspace/project" {
		t.Errorf("tree -o json: %+v", parsed)
	}
	checkGoldenText(t, "tree.json", out)
	if out := e.ok("sandbox", "checkpoint", "tree", "sb-a2"); out != "No checkpoints.\n" {
		t.Errorf("empty tree printed %q", out)
	}
}

// TestErrors: a failed call prints the server's code and message (and
// what the answer names) and exits 1; a usage error exits 2.
func TestErrors(t *testing.T) {
	e := startEnv(t)
	e.guests["sb-a1"].SetFault(hostproxytest.OpCreate, "/workspace/busy", hostproxytest.Fail(409, "directory_busy", "processes use the directory", map[string]any{
		"path": "/workspace/busy", "holders": []map[string]any{{"pid": 4242, "command": "bash", "kind": "cwd"}},
	}))
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr []string
	}{
		{"unknown checkpoint", []string{"sandbox", "checkpoint", "restore", "sb-a1", "cp_AAAAAAAAAAAAAAAAAAAAAA"}, 1,
			[]string{"createos: checkpoint_not_found: no checkpoint has this id", "checkpoint_id: cp_AAAAAAAAAAAAAAAAAAAAAA"}},
		{"busy", []string{"sandbox", "checkpoint", "create", "--path", "/workspace/busy"}, 1,
			[]string{"createos: directory_busy: processes use the directory", "pid 4242  bash  (cwd)", "path: /workspace/busy"}},
		{"relative path", []string{"sandbox", "checkpoint", "create", "--path", "workspace"}, 1, []string{"path_not_absolute"}},
		{"other account", []string{"sandbox", "checkpoint", "list", "sb-b1"}, 1, []string{"sandbox_not_found"}},
		{"bad key", []string{"sandbox", "checkpoint", "list", "--api-key", "sk_nobody_nobody_nobody"}, 1, []string{"unauthorized"}},
		{"dead guest", []string{"sandbox", "checkpoint", "list", "sb-dead"}, 1, []string{"server error 503", "request id: "}},
		{"json error", []string{"sandbox", "checkpoint", "list", "sb-b1", "-o", "json"}, 1, []string{`"code":"sandbox_not_found"`, `"status":"fail"`}},
		{"unreachable API", []string{"sandbox", "checkpoint", "list", "--api-url", "http://127.0.0.1:1"}, 1, []string{"connection refused"}},
		{"missing --path", []string{"sandbox", "checkpoint", "create"}, 2, []string{`"path" not set`}},
		{"too many args", []string{"sandbox", "checkpoint", "list", "a", "b"}, 2, []string{"accepts at most 1 arg"}},
		{"bad output", []string{"sandbox", "checkpoint", "list", "-o", "yaml"}, 2, []string{"want table or json"}},
		{"unknown command", []string{"sandbox", "bogus"}, 2, []string{`unknown command "bogus"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := e.run(tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, errOut)
			}
			if out != "" && tc.code != 2 {
				t.Errorf("stdout on failure: %q", out)
			}
			for _, want := range tc.stderr {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q:\n%s", want, errOut)
				}
			}
		})
	}
	// No sandbox anywhere.
	delete(e.vars, EnvSandboxID)
	if _, errOut, code := e.run("sandbox", "checkpoint", "list"); code != 2 || !strings.Contains(errOut, EnvSandboxID) {
		t.Errorf("without a sandbox: exit %d: %s", code, errOut)
	}
}

// TestTokenCommands issues, shows, uses, rotates and revokes a token.
func TestTokenCommands(t *testing.T) {
	e := startEnv(t)
	var issued Token
	if err := json.Unmarshal([]byte(e.ok("sandbox", "access-token", "issue", "sb-a1", "-o", "json")), &issued); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(issued.Token, "sbt_") || issued.Hint == "" {
		t.Fatalf("issued %+v", issued)
	}
	show := e.ok("sandbox", "access-token", "show", "sb-a1")
	if !strings.Contains(show, issued.Hint) || strings.Contains(show, issued.Token) {
		t.Errorf("show printed %q", show)
	}
	// The token works on its sandbox, is refused on another and on management.
	e.ok("sandbox", "checkpoint", "list", "sb-a1", "--api-key", issued.Token)
	if _, errOut, code := e.run("sandbox", "checkpoint", "list", "sb-a2", "--api-key", issued.Token); code != 1 || !strings.Contains(errOut, "forbidden") {
		t.Errorf("token on sb-a2: %d %s", code, errOut)
	}
	if _, errOut, code := e.run("sandbox", "access-token", "show", "sb-a1", "--api-key", issued.Token); code != 1 || !strings.Contains(errOut, "forbidden") {
		t.Errorf("token on management: %d %s", code, errOut)
	}
	if _, errOut, code := e.run("sandbox", "access-token", "issue", "sb-a1"); code != 1 || !strings.Contains(errOut, "token_exists") {
		t.Errorf("second issue: %d %s", code, errOut)
	}
	rotated := e.ok("sandbox", "access-token", "rotate", "sb-a1")
	if !strings.Contains(rotated, "sbt_") || strings.Contains(rotated, issued.Token) {
		t.Errorf("rotate printed %q", rotated)
	}
	if _, _, code := e.run("sandbox", "checkpoint", "list", "sb-a1", "--api-key", issued.Token); code != 1 {
		t.Errorf("old token still works after rotate")
	}
	e.ok("sandbox", "access-token", "revoke", "sb-a1")
	if out := e.ok("sandbox", "access-token", "revoke", "sb-a1"); !strings.Contains(out, "revoked") {
		t.Errorf("second revoke printed %q", out)
	}
	if out := e.ok("sandbox", "access-token", "show", "sb-a1"); !strings.Contains(out, "no access token") {
		t.Errorf("show after revoke printed %q", out)
	}
	if _, errOut, code := e.run("sandbox", "access-token", "rotate", "sb-a1"); code != 1 || !strings.Contains(errOut, "token_not_found") {
		t.Errorf("rotate after revoke: %d %s", code, errOut)
	}

	// Scopes: named with --scope (repeated or joined), shown, kept by a
	// rotate; a call outside them says which scope it needs.
	if out := e.ok("sandbox", "access-token", "issue", "sb-a2", "--scope", "snapshots", "--scope", "watch,ports"); !strings.Contains(out, "scopes: snapshots,ports,watch") {
		t.Errorf("issue --scope printed %q", out)
	}
	if out := e.ok("sandbox", "access-token", "show", "sb-a2"); !strings.Contains(out, "with scopes snapshots,ports,watch") {
		t.Errorf("show printed %q", out)
	}
	if out := e.ok("sandbox", "access-token", "rotate", "sb-a2"); !strings.Contains(out, "scopes: snapshots,ports,watch") {
		t.Errorf("rotate printed %q", out)
	}
	e.ok("sandbox", "access-token", "revoke", "sb-a2")
	var scoped Token
	if err := json.Unmarshal([]byte(e.ok("sandbox", "access-token", "issue", "sb-a2", "--scope", "snapshots", "-o", "json")), &scoped); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := e.run("sandbox", "checkpoint", "list", "sb-a2", "--api-key", scoped.Token); code != 1 || !strings.Contains(errOut, "forbidden") || !strings.Contains(errOut, "checkpoints") {
		t.Errorf("a token without checkpoints listing them: %d %s", code, errOut)
	}
	// A configured sandbox's guest may be the host: no exec, no files.
	if _, errOut, code := e.run("sandbox", "access-token", "issue", "sb-b1", "--api-key", keyB, "--scope", "exec"); code != 1 || !strings.Contains(errOut, "invalid_field") {
		t.Errorf("exec on a configured sandbox: %d %s", code, errOut)
	}
	if _, errOut, code := e.run("sandbox", "access-token", "issue", "sb-b1", "--api-key", keyB, "--scope", "root"); code != 2 || !strings.Contains(errOut, "unknown scope") {
		t.Errorf("an unknown scope: %d %s", code, errOut)
	}
}

// TestCompletion: cobra's completion scripts, and checkpoint ids offered
// for restore.
func TestCompletion(t *testing.T) {
	e := startEnv(t)
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		if out := e.ok("completion", shell); len(out) < 100 {
			t.Errorf("completion %s printed %d bytes", shell, len(out))
		}
	}
	cp := e.create("sb-a1", "/workspace/project", "first")
	out := e.ok("__complete", "sandbox", "checkpoint", "restore", "sb-a1", "")
	if !strings.Contains(out, cp.ID+"\t/workspace/project first") {
		t.Errorf("completion of restore:\n%s", out)
	}
}

// TestTimeout: --timeout bounds a call to a server that does not answer.
func TestTimeout(t *testing.T) {
	e := startEnv(t)
	e.guests["sb-a1"].SetDelay(10 * time.Second)
	start := time.Now()
	_, errOut, code := e.run("sandbox", "checkpoint", "list", "--timeout", "300ms")
	if code != 1 || time.Since(start) > 3*time.Second || !strings.Contains(errOut, "Timeout") {
		t.Errorf("exit %d after %v: %s", code, time.Since(start), errOut)
	}
}

// TestCredentialsFileIsNamed pins defect 8 of issue 6: createos read
// /run/strata/credentials.env without a word, so a stale key left there
// by `make run` failed as though the user had given it, and a CLI test
// passed or failed with the machine's state. The file is
// $CREATEOS_CREDENTIALS (here in a temp dir), and an error names every
// value that came from it.
func TestCredentialsFileIsNamed(t *testing.T) {
	e := startEnv(t)
	file := filepath.Join(t.TempDir(), "credentials.env")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("CREATEOS_API_URL='" + e.url + "'\nCREATEOS_API_KEY='sk_stale_key_stale_key_stale_key'\nCREATEOS_SANDBOX_ID='sb-a1'\n")
	e.vars = map[string]string{EnvCredentials: file}
	note := func(what, name string) string {
		return "note: " + what + " came from " + file + " (" + name + " there)"
	}
	keyNote, urlNote, sbNote := note("the API key", EnvAPIKey), note("the API address", EnvAPIURL), note("the sandbox", EnvSandboxID)

	cases := []struct {
		name    string
		vars    map[string]string // added to the environment
		args    []string
		code    int
		want    []string
		wantNot []string
	}{
		{"stale key from the file", nil, []string{"sandbox", "checkpoint", "list"}, 1,
			[]string{"unauthorized", keyNote, urlNote, sbNote}, nil},
		{"key from the flag", nil, []string{"sandbox", "checkpoint", "list", "sb-b1", "--api-key", keyA}, 1,
			[]string{"sandbox_not_found", urlNote}, []string{keyNote, sbNote}},
		{"key from the environment", map[string]string{EnvAPIKey: "sk_env_key_env_key_env_key_env"}, []string{"sandbox", "checkpoint", "list", "sb-a1"}, 1,
			[]string{"unauthorized", urlNote}, []string{keyNote, sbNote}},
		{"everything from flags", nil, []string{"sandbox", "checkpoint", "list", "sb-a1", "--api-key", "sk_flag_key_flag_key_flag_key", "--api-url", e.url}, 1,
			[]string{"unauthorized"}, []string{"note:"}},
		{"-o json keeps stderr the server's answer", nil, []string{"sandbox", "checkpoint", "list", "-o", "json"}, 1,
			[]string{`"code":"unauthorized"`}, []string{"note:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e.vars = map[string]string{EnvCredentials: file}
			for k, v := range tc.vars {
				e.vars[k] = v
			}
			_, errOut, code := e.run(tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(errOut, w) {
					t.Errorf("stderr has %q:\n%s", w, errOut)
				}
			}
		})
	}

	// The file's values work when they are right, silently.
	write("CREATEOS_API_URL='" + e.url + "'\nCREATEOS_API_KEY='" + keyA + "'\nCREATEOS_SANDBOX_ID='sb-a1'\n")
	e.vars = map[string]string{EnvCredentials: file}
	if out, errOut, code := e.run("sandbox", "checkpoint", "list"); code != 0 || out != "No checkpoints.\n" || errOut != "" {
		t.Errorf("with a good file: exit %d, %q, %q", code, out, errOut)
	}
	// A missing value names the file that lacked it too.
	write("")
	if _, errOut, code := e.run("sandbox", "checkpoint", "list"); code != 2 || !strings.Contains(errOut, "no API address") || !strings.Contains(errOut, file) {
		t.Errorf("empty file: exit %d: %s", code, errOut)
	}
}

// TestIdempotencyKeyFlag: --idempotency-key on create and restore sends
// the Idempotency-Key header (issue 6), so running the same command again
// prints the first run's answer instead of acting twice; a key the API
// would refuse is a usage error before any call.
func TestIdempotencyKeyFlag(t *testing.T) {
	e := startEnv(t)
	g := e.guests["sb-a1"]
	create := func(name, key string) []string {
		return []string{"sandbox", "checkpoint", "create", "sb-a1", "--path", "/workspace/project", "--name", name, "--idempotency-key", key, "-o", "json"}
	}
	first := e.ok(create("first", "create-1")...)
	if got := g.LastHeader().Get("Idempotency-Key"); got != "create-1" {
		t.Errorf("the guest got Idempotency-Key %q", got)
	}
	if again := e.ok(create("first", "create-1")...); again != first {
		t.Errorf("retry printed %s, want the first answer %s", again, first)
	}
	if n := len(g.Checkpoints()); n != 1 {
		t.Errorf("%d checkpoints after a retry, want 1", n)
	}
	if _, errOut, code := e.run(create("second", "create-1")...); code != 1 || !strings.Contains(errOut, "idempotency_key_reused") {
		t.Errorf("same key, another name: exit %d: %s", code, errOut)
	}
	// Without the flag, no header.
	e.ok("sandbox", "checkpoint", "create", "--path", "/workspace/project")
	if _, ok := g.LastHeader()["Idempotency-Key"]; ok {
		t.Errorf("Idempotency-Key sent without the flag")
	}

	var cp Checkpoint
	if err := json.Unmarshal([]byte(first), &cp); err != nil {
		t.Fatal(err)
	}
	restored := e.ok("sandbox", "checkpoint", "restore", cp.ID, "--idempotency-key", "restore-1")
	if got := g.LastHeader().Get("Idempotency-Key"); got != "restore-1" {
		t.Errorf("restore: the guest got Idempotency-Key %q", got)
	}
	latest := e.create("sb-a1", "/workspace/project", "latest")
	if again := e.ok("sandbox", "checkpoint", "restore", cp.ID, "--idempotency-key", "restore-1"); again != restored {
		t.Errorf("restore retry printed %q, want %q", again, restored)
	}
	if h := g.Head("/workspace/project"); h != latest.ID {
		t.Errorf("the restore retry restored again: head %s, want %s", h, latest.ID)
	}

	before := g.Requests()
	for _, bad := range []string{"", strings.Repeat("k", 256), "clé", "a\tb"} {
		if _, errOut, code := e.run("sandbox", "checkpoint", "create", "--path", "/workspace/project", "--idempotency-key", bad); code != 2 || !strings.Contains(errOut, "--idempotency-key") {
			t.Errorf("--idempotency-key %q: exit %d: %s", bad, code, errOut)
		}
		if _, _, code := e.run("sandbox", "checkpoint", "restore", cp.ID, "--idempotency-key", bad); code != 2 {
			t.Errorf("restore --idempotency-key %q: exit %d", bad, code)
		}
	}
	if g.Requests() != before {
		t.Errorf("a refused --idempotency-key reached the guest")
	}
}
