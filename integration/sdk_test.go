package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestSDKs runs the TypeScript and the Python SDK's own suites (npm test
// in sdk/typescript, pytest in sdk/python) against a real stack whose
// sandboxes are microVMs, one suite after the other: each covers every
// route group, an error of each class, its check of the OpenAPI document
// against its own table of routes, and the seeds' parallel exploration.
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
