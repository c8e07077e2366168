package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"strata/hostproxy"
	"strata/internal/openapicheck"
)

// TestEveryRoute: one description, three clients. Every public route of
// hostproxy's OpenAPI document is reached by some method of this client
// (as the TypeScript and Python SDKs' tests check of theirs), and every
// request the client makes is a route of the document. The service's own
// routes (/metrics, /v1/health, /v1/openapi.json) are no sandbox's and
// not the client's.
func TestEveryRoute(t *testing.T) {
	doc, err := openapicheck.Load(hostproxy.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	reached := map[string]bool{}
	var strays []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if op, ok := doc.Match(r.Method, r.URL.EscapedPath()); ok {
			reached[op] = true
		} else {
			strays = append(strays, r.Method+" "+r.URL.Path)
		}
		mu.Unlock()
		// Any answer: only the requests count here.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"status":"fail","data":{"code":"x_not_found","message":"a double"}}`))
	}))
	defer srv.Close()
	c := New(srv.URL, "sk_test")
	ctx := context.Background()
	sb, cp, sn, se := "sb-a1", "cp_AAAAAAAAAAAAAAAAAAAAAA", "v1", "se-0123456789abcdef"
	name := "x"
	calls := []func(){
		func() { c.CreateSandbox(ctx, SandboxCreateRequest{}) },
		func() { c.ListSandboxes(ctx, ListOptions{Labels: map[string]string{"owner": "docs"}}) },
		func() { c.Fork(ctx, sb, sn, "fork-1") },
		func() { c.SetLabels(ctx, sb, map[string]string{"owner": "docs"}) },
		func() { c.GetNetwork(ctx, sb) },
		func() { c.SetNetwork(ctx, sb, NetworkSetting{Egress: "list", Allow: []string{"pypi.org"}}) },
		func() { c.GetSandbox(ctx, sb) },
		func() { c.SetAccess(ctx, sb, Access{None: true}) },
		func() {
			for op := range sandboxOps {
				c.SandboxOp(ctx, op, sb)
			}
		},
		func() { c.Exec(ctx, sb, ExecRequest{Cmd: []string{"true"}}) },
		func() { c.StartSession(ctx, sb, SessionRequest{Cmd: []string{"true"}}) },
		func() { c.ListSessions(ctx, sb) },
		func() { c.GetSession(ctx, sb, se) },
		func() { c.KillSession(ctx, sb, se) },
		func() { c.Attach(ctx, sb, se, 0, "") },
		func() { c.WriteFile(ctx, sb, "/a/b", strings.NewReader("x"), 1, FileOptions{}) },
		func() { c.WriteTar(ctx, sb, "/a", strings.NewReader(""), false) },
		func() { c.WriteTar(ctx, sb, "/", strings.NewReader(""), false) },
		func() { c.ReadFile(ctx, sb, "/a/b") },
		func() { c.ReadTar(ctx, sb, "/a") },
		func() { c.ReadTar(ctx, sb, "/") },
		func() { c.ListDir(ctx, sb, "/a") },
		func() { c.ListDir(ctx, sb, "/") },
		func() { c.Stat(ctx, sb, "/a/b") },
		func() { c.Stat(ctx, sb, "/") },
		func() { c.RemoveFile(ctx, sb, "/a/b", false) },
		func() { c.RemoveFile(ctx, sb, "/", true) },
		func() { c.CreateCheckpoint(ctx, sb, "/w", &name, nil, "") },
		func() { c.ListCheckpoints(ctx, sb) },
		func() { c.ListDirectories(ctx, sb) },
		func() { c.RestoreCheckpoint(ctx, sb, cp, "") },
		func() { c.DeleteCheckpoint(ctx, sb, cp) },
		func() { c.Changes(ctx, sb, cp, "") },
		func() { c.ReadEntry(ctx, sb, cp, "") },
		func() { c.ReadEntry(ctx, sb, cp, "a/b") },
		func() { c.RestorePaths(ctx, sb, cp, []string{"a"}) },
		func() { c.Clone(ctx, sb, cp, "/w2") },
		func() { c.Release(ctx, sb, "/w") },
		func() {
			for op := range tokenOps {
				c.TokenCall(ctx, op, sb)
			}
		},
		func() { c.IssueToken(ctx, sb, []Scope{"exec"}) },
		func() { c.CreateSnapshot(ctx, sb, SnapshotCreateRequest{}) },
		func() { c.ListSnapshots(ctx, sb) },
		func() { c.GetSnapshot(ctx, sb, sn) },
		func() { c.DeleteSnapshot(ctx, sb, sn) },
		func() { c.RestoreSnapshot(ctx, sb, sn, false) },
		func() { c.PinSnapshot(ctx, sb, sn, true) },
		func() { c.PinSnapshot(ctx, sb, sn, false) },
		func() { c.ForkSnapshot(ctx, sb, sn, ForkRequest{Count: 1}, "") },
	}
	for _, call := range calls {
		call()
	}
	service := []string{"GET /metrics", "GET /v1/health", "GET /v1/openapi.json"}
	var missing []string
	for _, op := range doc.Operations() {
		if !reached[op] && !slices.Contains(service, op) {
			missing = append(missing, op)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("routes no method of the client reaches: %s", strings.Join(missing, ", "))
	}
	if len(strays) > 0 {
		t.Errorf("requests that are no route of the document: %s", strings.Join(strays, ", "))
	}
}
