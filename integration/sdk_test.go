package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSDKs runs the TypeScript and the Python SDK's own suites (npm test
// in sdk/typescript, pytest in sdk/python) against a real stack whose
// sandboxes are microVMs, one suite after the other: each covers every
// route group, an error of each class, its check of the OpenAPI document
// against its own table of routes, and the seeds' examples as written
// (sdk/typescript/examples, sdk/python/examples: OpenComputer's page and
// loam's, sync and asyncio in Python), each run as its own program would.
// make test installs what they need (npm ci from the lockfile, Debian's
// python3-pytest); a suite that cannot run fails.
func TestSDKs(t *testing.T) {
	s := startVMStack(t, "60s")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, suite := range []struct {
		name, dir string
		cmd       []string
	}{
		{"typescript", "sdk/typescript", []string{"npm", "test", "--silent"}},
		{"python", "sdk/python", []string{"/usr/bin/python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"}},
	} {
		t.Run(suite.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, suite.cmd[0], suite.cmd[1:]...)
			cmd.Dir = filepath.Join(root, suite.dir)
			// The stack's, and no credentials file of this machine's.
			cmd.Env = append(os.Environ(), "CREATEOS_API_URL="+s.url, "CREATEOS_API_KEY="+s.key,
				"CREATEOS_SANDBOX_ID=", "CREATEOS_CREDENTIALS="+filepath.Join(t.TempDir(), "none.env"),
				"PYTHONDONTWRITEBYTECODE=1")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			t0 := time.Now()
			err := cmd.Run()
			t.Logf("%s suite: %v", suite.name, time.Since(t0).Round(time.Second))
			if err != nil {
				t.Fatalf("%v in %s: %v\n%s", suite.cmd, suite.dir, err, out.String())
			}
			if testing.Verbose() {
				t.Log(out.String())
			}
		})
	}
	// Nothing a suite made outlives it.
	if left := s.sandboxes("acct-a"); len(left) != 0 {
		t.Errorf("sandboxes left by the suites: %v", left)
	}
}

// TestSDKsInstall: each SDK installs as docs/sdk.md says, in a new project
// outside the repository, with nothing done first: the TypeScript SDK by
// its one command (npm install --install-links ./sdk/typescript: a copy
// of the package, its built dist included, and its dependency ws from the
// registry), imported by node, ws with it; the Python SDK by pip install
// ./sdk/python into a new venv, with no package index. It needs no stack.
// The regression it pins: npm install ./sdk/typescript linked the folder,
// whose dist was never built (Cannot find module …/dist/index.js).
func TestSDKsInstall(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, dir string, env []string, name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out.String())
		}
		return out.String()
	}
	t.Run("typescript", func(t *testing.T) {
		project := t.TempDir()
		// npm's cache where make keeps it, else one of the test's own.
		cache := filepath.Join(t.TempDir(), "npm-cache")
		if c := os.Getenv("STRATA_IMAGE_CACHE"); c != "" {
			cache = filepath.Join(c, "npm-cache")
		}
		env := []string{"npm_config_cache=" + cache, "npm_config_audit=false", "npm_config_fund=false", "npm_config_update_notifier=false"}
		run(t, project, env, "npm", "init", "-y")
		// The one command docs/sdk.md gives.
		run(t, project, env, "npm", "install", "--install-links", filepath.Join(root, "sdk", "typescript"))
		if _, err := os.Lstat(filepath.Join(project, "node_modules", "@strata", "sdk", "dist", "index.js")); err != nil {
			t.Fatalf("the SDK's dist is not installed: %v", err)
		}
		check := `import { Sandbox, Strata, StrataError, checkpointInfo } from "@strata/sdk";
const ws = await import("ws");
console.log([typeof Sandbox.create, typeof Sandbox.createFromCheckpoint, typeof Strata, typeof StrataError, typeof checkpointInfo, typeof ws.default].join(" "));
`
		if err := os.WriteFile(filepath.Join(project, "check.mjs"), []byte(check), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(run(t, project, nil, "node", "check.mjs")); got != "function function function function function function" {
			t.Fatalf("node imported @strata/sdk and ws as: %q", got)
		}
	})
	t.Run("python", func(t *testing.T) {
		project := t.TempDir()
		run(t, project, nil, "/usr/bin/python3", "-m", "venv", "venv")
		// As docs/sdk.md says, and with no index at all.
		run(t, project, nil, filepath.Join(project, "venv", "bin", "pip"), "install", "--no-index", "--disable-pip-version-check", "-q", filepath.Join(root, "sdk", "python"))
		check := "import sys, strata, strata.aio; print(strata.__file__.startswith(sys.argv[1]), callable(strata.Sandbox.create_from_checkpoint), callable(strata.checkpoint_info))"
		got := run(t, project, []string{"PYTHONPATH="}, filepath.Join(project, "venv", "bin", "python"), "-c", check, project)
		if strings.TrimSpace(got) != "True True True" {
			t.Fatalf("the venv's python imported strata as: %q", got)
		}
	})
}
