package cli

import (
	"strings"
	"testing"

	"strata/internal/api"
)

// usageHint ends the output of a usage error.
const usageHint = "Run 'createos --help' for usage.\n"

// TestSandboxEnvAndLabels: create sends --env and --label; list filters
// with --label and shows a LABELS column when any sandbox has labels;
// get shows labels and env; labels shows, replaces and clears them; a
// sandbox is named by its name wherever its id goes.
func TestSandboxEnvAndLabels(t *testing.T) {
	pinClock(t, "2026-11-05T10:00:00Z")
	f := startFakeAPI(t)
	f.polls = 0
	f.add(api.Sandbox{ID: "sb-a1", Name: "plain", State: api.SandboxRunning, MemoryMiB: 512, VCPUs: 1, DiskGiB: 4, CreatedAt: "2026-11-05T10:00:00Z", Labels: map[string]string{}})
	tests := []struct {
		name    string
		args    []string
		request string // the last request, when not ""
		body    string // its body, when not ""
		stdout  string
		stderr  string
		code    int
	}{
		{name: "create", args: []string{"create", "scratch", "--env", "CI=1", "--env", "X=a=b", "--label", "owner=docs", "--no-wait"},
			request: "POST /v1/sandboxes", body: `{"name":"scratch","env":{"CI":"1","X":"a=b"},"labels":{"owner":"docs"}}`,
			stdout: "ID    NAME     STATE     MEMORY   VCPUS  DISK   AGE  LABELS\nsb-2  scratch  creating  512 MiB  1      4 GiB  0s   owner=docs\n"},
		{name: "list by label", args: []string{"list", "--label", "owner=docs"}, request: "GET /v1/sandboxes?label=owner%3Ddocs",
			stdout: "ID    NAME     STATE     MEMORY   VCPUS  DISK   AGE  LABELS\nsb-2  scratch  creating  512 MiB  1      4 GiB  0s   owner=docs\n"},
		{name: "list, no label column without labels", args: []string{"list", "--label", "owner=none"}, request: "GET /v1/sandboxes?label=owner%3Dnone",
			stdout: "No sandboxes.\n"},
		{name: "get by name", args: []string{"get", "scratch"}, request: "GET /v1/sandboxes/scratch",
			stdout: "ID    NAME     STATE    MEMORY   VCPUS  DISK   AGE  LABELS\nsb-2  scratch  running  512 MiB  1      4 GiB  0s   owner=docs\n" +
				"created: 2026-11-05T10:00:00.000Z\nlabels: owner=docs\nenv: CI=1\nenv: X=a=b\n"},
		{name: "labels shown", args: []string{"labels", "scratch"}, request: "GET /v1/sandboxes/scratch", stdout: "owner=docs\n"},
		{name: "labels replaced", args: []string{"labels", "scratch", "tier=a", "team=x y"}, request: "PUT /v1/sandboxes/scratch/labels",
			body: `{"team":"x y","tier":"a"}`, stdout: "team=x y\ntier=a\n"},
		{name: "labels as JSON", args: []string{"labels", "scratch", "-o", "json"}, request: "GET /v1/sandboxes/scratch",
			stdout: "{\n  \"team\": \"x y\",\n  \"tier\": \"a\"\n}\n"},
		{name: "labels cleared", args: []string{"labels", "scratch", "--clear"}, request: "PUT /v1/sandboxes/scratch/labels", body: `{}`},
		{name: "a bad label", args: []string{"labels", "scratch", "Owner=x"}, request: "PUT /v1/sandboxes/scratch/labels", code: 1,
			stderr: "createos: invalid_field: label key \"Owner\": want 1 to 63 lowercase letters, digits, '.', '_', '/' and '-', starting and ending with a letter or digit\n  field: labels\n  key: Owner\n"},
		{name: "stop by name", args: []string{"stop", "scratch"}, request: "POST /v1/sandboxes/scratch/stop", stdout: "scratch is stopped\n"},
		// Usage errors (exit 2), before any call.
		{name: "a name like an id", args: []string{"create", "sb-web"}, code: 2,
			stderr: "createos: sandbox name \"sb-web\": want 1 to 63 lowercase letters, digits and '-', starting with a letter, not ending with '-' and not starting with sb- (an id's prefix)\n" + usageHint},
		{name: "an env without =", args: []string{"create", "--env", "CI"}, code: 2, stderr: "createos: --env \"CI\": want NAME=VALUE\n" + usageHint},
		{name: "a label twice", args: []string{"create", "--label", "a=1", "--label", "a=2"}, code: 2, stderr: "createos: --label: a is given twice\n" + usageHint},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := len(f.log())
			out, errOut, code := runFake(t, f, append([]string{"sandbox"}, tc.args...)...)
			if code != tc.code || tc.stdout != "" && out != tc.stdout || tc.stderr != "" && errOut != tc.stderr {
				t.Fatalf("exit %d, stdout\n%s\nstderr\n%s\nwant exit %d, stdout\n%s\nstderr\n%s", code, out, errOut, tc.code, tc.stdout, tc.stderr)
			}
			log := f.log()
			if tc.request == "" {
				if len(log) != n {
					t.Fatalf("requests sent: %v", log[n:])
				}
				return
			}
			if len(log) == n || log[len(log)-1] != tc.request {
				t.Fatalf("requests %v, want the last %s", log[n:], tc.request)
			}
			if tc.body != "" {
				if body := f.lastBody(tc.request); body != tc.body {
					t.Fatalf("sent %s, want %s", body, tc.body)
				}
			}
		})
	}
	if strings.Contains(strings.Join(f.log(), "\n"), "sb-web") {
		t.Fatal("a name like an id was sent")
	}
}
