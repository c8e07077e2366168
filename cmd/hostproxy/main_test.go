package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRunBootstrap starts hostproxy from flags alone, as make run does,
// answers a request with the key from the environment, and stops cleanly
// when its context ends; its log is in the daemons' shared text format
// (internal/logx): a short listening line, one line per request, a stopped
// line, each naming daemon=hostproxy.
func TestRunBootstrap(t *testing.T) {
	key := "sk_bootstrap_test_key_0123456789"
	getenv := func(k string) string {
		if k == "CREATEOS_API_KEY" {
			return key
		}
		return ""
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncWriter
	done := make(chan error, 1)
	args := []string{"--listen", "127.0.0.1:0", "--data", t.TempDir(), "--key-env", "CREATEOS_API_KEY",
		"--sandbox", "sb-local=unix:///nonexistent/guestd.sock"}
	go func() { done <- run(ctx, args, &bytes.Buffer{}, &stderr, getenv) }()

	var url string
	re := regexp.MustCompile(`(?m)^time=\S+ level=INFO msg=listening daemon=hostproxy url=(http://\S+) data=\S+ sandboxes=1$`)
	for deadline := time.Now().Add(30 * time.Second); url == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			url = m[1]
		}
	}
	if url == "" {
		cancel()
		t.Fatalf("no listening line in logs:\n%s", stderr.String())
	}
	req, _ := http.NewRequest("GET", url+"/v1/sandboxes/sb-local/access-token", nil)
	req.Header.Set("X-Api-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	logged := stderr.String()
	for _, want := range []string{
		`(?m)^time=\S+ level=INFO msg=request daemon=hostproxy request_id=\S+ method=GET route=/v1/sandboxes/:id/access-token status=200 `,
		`(?m)^time=\S+ level=INFO msg=stopped daemon=hostproxy$`,
	} {
		if !regexp.MustCompile(want).MatchString(logged) {
			t.Errorf("no line matching %s in the log:\n%s", want, logged)
		}
	}
}

func TestRunRefuses(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "hostproxy.json")
	if err := os.WriteFile(cfg, []byte(`{"data_dir":"`+dir+`","accounts":[{"id":"a","keys":[]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		args []string
		want string
	}{
		"no key":          {[]string{"--data", dir}, "no account API key"},
		"config no key":   {[]string{"--config", cfg}, "no account API key"},
		"missing config":  {[]string{"--config", filepath.Join(dir, "nope.json")}, "no such file"},
		"bad sandbox":     {[]string{"--data", dir, "--sandbox", "sb-local"}, "want ID=GUEST"},
		"stray argument":  {[]string{"--data", dir, "serve"}, "unexpected arguments"},
		"bad log format":  {[]string{"--data", dir, "--log-format", "xml"}, "want text or json"},
		"key env not set": {[]string{"--data", dir, "--key-env", "STRATA_UNSET_FOR_TEST"}, "STRATA_UNSET_FOR_TEST is empty"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), tc.args, &bytes.Buffer{}, &bytes.Buffer{}, func(string) string { return "" })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run %v: %v, want an error saying %q", tc.args, err, tc.want)
			}
		})
	}
}

func TestPrintNewKey(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--print-new-key"}, &out, &bytes.Buffer{}, os.Getenv); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^sk_[A-Za-z0-9_-]{43}\n$`).MatchString(out.String()) {
		t.Errorf("printed %q", out.String())
	}
}

type syncWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestRunConfigUnderFlags: --vms and --image go over the configuration's
// vms and keep its other keys (make run's CONFIG=path): a broken
// vms.egress in the file is still read, and refused.
func TestRunConfigUnderFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "hostproxy.json")
	if err := os.WriteFile(cfg, []byte(`{"vms":{"dir":"/nowhere","image":"/nowhere","egress":{"resolver":"not an address"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", cfg, "--data", filepath.Join(dir, "data"), "--key-env", "K", "--vms", filepath.Join(dir, "vms"), "--image", filepath.Join(dir, "img")}
	err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}, func(string) string { return "sk_" + strings.Repeat("a", 43) })
	if err == nil || !strings.Contains(err.Error(), "vms.egress.resolver") {
		t.Fatalf("run %v: %v, want the configuration's vms.egress.resolver refused", args, err)
	}
}
