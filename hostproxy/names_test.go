package hostproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"strata/internal/api"
	"strata/internal/boltjson"
	"strata/internal/fault"
	"strata/sandbox"
)

// record inserts a microVM sandbox of account, running, with name ("":
// none) and what more sets.
func (h *authzHarness) record(id, account, name string, more func(*Sandbox)) {
	h.t.Helper()
	rec := Sandbox{ID: id, Account: account, Name: name, Guest: guestAddress(id), State: sandbox.Running, Machine: &sandbox.Machine{}}
	if more != nil {
		more(&rec)
	}
	if err := h.s.reg.Insert(h.t.Context(), rec); err != nil {
		h.t.Fatal(err)
	}
}

// TestSandboxNames: a sandbox's name works wherever its id does, for its
// account only, and for a token or a channel only on their own sandbox;
// a name never means another sandbox than an id would.
func TestSandboxNames(t *testing.T) {
	h := newAuthzHarness(t)
	h.record("sb-scratch1", "acct-a", "scratch", nil)
	h.record("sb-other1", "acct-a", "other", nil)
	h.record("sb-b1", "acct-b", "bee", nil)
	tokScratch := h.token("sb-scratch1", api.ScopeSnapshots)
	tests := []struct {
		name string
		c    call
		want int
		// id is data.id of a 200, when not "".
		id string
	}{
		{"by id", call{method: "GET", path: "/v1/sandboxes/sb-scratch1", key: testKey}, 200, "sb-scratch1"},
		{"by name", call{method: "GET", path: "/v1/sandboxes/scratch", key: testKey}, 200, "sb-scratch1"},
		{"by another account's name", call{method: "GET", path: "/v1/sandboxes/bee", key: testKey}, 404, ""},
		{"by another account's id", call{method: "GET", path: "/v1/sandboxes/sb-b1", key: testKey}, 404, ""},
		{"the other account by its name", call{method: "GET", path: "/v1/sandboxes/bee", key: testKeyB}, 200, "sb-b1"},
		{"by no name", call{method: "GET", path: "/v1/sandboxes/nothing", key: testKey}, 404, ""},
		{"by a name of another case", call{method: "GET", path: "/v1/sandboxes/Scratch", key: testKey}, 404, ""},
		{"a route below it, by name", call{method: "GET", path: "/v1/sandboxes/scratch/access-token", key: testKey}, 200, ""},
		{"a token, its sandbox by name", call{method: "GET", path: "/v1/sandboxes/scratch/snapshots", key: tokScratch}, 409, ""},
		{"a token, its sandbox by id", call{method: "GET", path: "/v1/sandboxes/sb-scratch1/snapshots", key: tokScratch}, 409, ""},
		{"a token, another sandbox by name", call{method: "GET", path: "/v1/sandboxes/other/snapshots", key: tokScratch}, 403, ""},
		{"a token, a name of nothing", call{method: "GET", path: "/v1/sandboxes/nothing/snapshots", key: tokScratch}, 403, ""},
		{"through its channel, by name", call{method: "GET", path: "/v1/sandboxes/scratch/snapshots", key: testKey, via: "sb-scratch1"}, 409, ""},
		{"through its channel, another by name", call{method: "GET", path: "/v1/sandboxes/other/snapshots", key: testKey, via: "sb-scratch1"}, 403, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, data := h.do(tc.c)
			if status != tc.want {
				t.Fatalf("%s %s: %d %v, want %d", tc.c.method, tc.c.path, status, data, tc.want)
			}
			if tc.want == 404 && data["code"] != "sandbox_not_found" {
				t.Fatalf("404 %v", data)
			}
			if tc.want == 409 && data["code"] != "sandbox_not_a_vm" {
				// This harness runs no microVMs: a snapshot route that got
				// past authorization says so.
				t.Fatalf("409 %v", data)
			}
			if tc.id != "" && data["id"] != tc.id {
				t.Fatalf("id %v, want %s", data["id"], tc.id)
			}
		})
	}
}

// TestNameUniqueness: a name is unique per account among the sandboxes
// not destroyed, freed at once by a delete (the old id then unknown); no
// name is the id of another sandbox, and none looks like an id.
func TestNameUniqueness(t *testing.T) {
	h := newAuthzHarness(t)
	reg := h.s.reg
	ctx := t.Context()
	h.record("sb-one", "acct-a", "dev", nil)
	code := func(err error) string { return fault.CodeOf(err) }

	if err := reg.Insert(ctx, Sandbox{ID: "sb-two", Account: "acct-a", Name: "dev", Machine: &sandbox.Machine{}}); code(err) != "name_taken" {
		t.Fatalf("a second dev of acct-a: %v", err)
	}
	if err := reg.Insert(ctx, Sandbox{ID: "sb-three", Account: "acct-b", Name: "dev", Machine: &sandbox.Machine{}}); err != nil {
		t.Fatalf("dev of acct-b: %v", err)
	}
	// A configured sandbox's id, taken as a name, would be two sandboxes.
	if err := reg.Insert(ctx, Sandbox{ID: "cfg", Account: "acct-a", Guest: "tcp://127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if err := reg.Insert(ctx, Sandbox{ID: "sb-four", Account: "acct-a", Name: "cfg", Machine: &sandbox.Machine{}}); code(err) != "name_taken" {
		t.Fatalf("a name that is an id: %v", err)
	}
	// A name that looks like an id never reaches the registry.
	if err := api.ValidateSandboxName("sb-one"); code(err) != "invalid_field" {
		t.Fatalf("sb-one as a name: %v", err)
	}

	// After a delete the name is free, and the old id is unknown.
	if err := reg.Delete(ctx, "sb-one"); err != nil {
		t.Fatal(err)
	}
	if status, _ := h.do(call{method: "GET", path: "/v1/sandboxes/sb-one", key: testKey}); status != 404 {
		t.Fatalf("the deleted id: %d", status)
	}
	if status, _ := h.do(call{method: "GET", path: "/v1/sandboxes/dev", key: testKey}); status != 404 {
		t.Fatalf("the deleted name: %d", status)
	}
	h.record("sb-five", "acct-a", "dev", nil)
	if status, data := h.do(call{method: "GET", path: "/v1/sandboxes/dev", key: testKey}); status != 200 || data["id"] != "sb-five" {
		t.Fatalf("dev again: %d %v", status, data)
	}

	// A destroyed sandbox holds no name; a taken one from the pool gets
	// its name checked as it is taken.
	if _, err := reg.Update(ctx, "sb-five", func(r *Sandbox) error { r.State = sandbox.Destroyed; return nil }); err != nil {
		t.Fatal(err)
	}
	h.record("sb-pool", "", "", func(r *Sandbox) { r.Pooled = true })
	if _, err := reg.Take(ctx, "sb-pool", func(r *Sandbox) error { r.Account, r.Name, r.Pooled = "acct-a", "dev", false; return nil }); err != nil {
		t.Fatalf("taking dev from the pool after the destroyed one: %v", err)
	}
	h.record("sb-pool2", "", "", func(r *Sandbox) { r.Pooled = true })
	if _, err := reg.Take(ctx, "sb-pool2", func(r *Sandbox) error { r.Account, r.Name, r.Pooled = "acct-a", "dev", false; return nil }); code(err) != "name_taken" {
		t.Fatalf("taking a second dev from the pool: %v", err)
	}
	if rec, _ := reg.Sandbox(ctx, "sb-pool2"); rec.Account != "" || !rec.Pooled {
		t.Fatalf("a refused take changed the record: %+v", rec)
	}
}

// fixedRand reads its bytes over and over: every ref drawn from it is the
// same.
type fixedRand byte

func (f fixedRand) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(f)
	}
	return len(p), nil
}

// TestSnapshotRefs: every snapshot gets a ref as it is first recorded,
// keeps it through every update (package sandbox's copies without it
// too), and a deleted snapshot's ref is never given again.
func TestSnapshotRefs(t *testing.T) {
	h := newAuthzHarness(t)
	reg := h.s.reg
	ctx := t.Context()
	h.record("sb-snap", "acct-a", "snap", nil)
	add := func(ids ...string) Sandbox {
		t.Helper()
		rec, err := reg.Update(ctx, "sb-snap", func(r *Sandbox) error {
			for _, id := range ids {
				r.Snapshots = append(r.Snapshots, sandbox.Snapshot{ID: id, Status: sandbox.SnapshotReady})
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	rec := add("v1", "v2")
	v1, v2 := rec.Snapshots[0].Ref, rec.Snapshots[1].Ref
	if !api.ValidSnapshotRef(v1) || !api.ValidSnapshotRef(v2) || v1 == v2 {
		t.Fatalf("refs %q %q", v1, v2)
	}
	for ref, id := range map[string]string{v1: "v1", v2: "v2"} {
		if e, ok, err := reg.snapshotByRef(ctx, ref); err != nil || !ok || e.Sandbox != "sb-snap" || e.Snapshot != id {
			t.Fatalf("%s: %+v %v %v", ref, e, ok, err)
		}
	}
	// A snapshot rebuilt without its ref keeps it.
	rec, err := reg.Update(ctx, "sb-snap", func(r *Sandbox) error {
		r.Snapshots[0] = sandbox.Snapshot{ID: "v1", Status: sandbox.SnapshotReady, Pinned: true}
		return nil
	})
	if err != nil || rec.Snapshots[0].Ref != v1 {
		t.Fatalf("rebuilt v1: %+v %v", rec.Snapshots, err)
	}
	// Found by its ref as by its id.
	if sn, ok := findSnapshot(rec, v2); !ok || sn.ID != "v2" {
		t.Fatalf("findSnapshot(%s) = %+v %v", v2, sn, ok)
	}
	// Deleted: gone, and never given again, even by a source that draws
	// it again.
	if _, err := reg.Update(ctx, "sb-snap", func(r *Sandbox) error { r.Snapshots = r.Snapshots[:1]; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := reg.snapshotByRef(ctx, v2); ok {
		t.Fatalf("%s still found", v2)
	}
	reg.rand = fixedRand(7)
	rec = add("v3")
	first := rec.Snapshots[1].Ref
	if _, err := reg.Update(ctx, "sb-snap", func(r *Sandbox) error { r.Snapshots = r.Snapshots[:1]; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := reg.db.Update(func(tx *bolt.Tx) error { _, err := reg.freshRef(tx.Bucket(bucketRefs)); return err }); err == nil {
		t.Fatalf("a source that draws only %s gave another ref", first)
	}
	if err := reg.Delete(ctx, "sb-snap"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := reg.snapshotByRef(ctx, v1); ok {
		t.Fatalf("%s found after its sandbox's delete", v1)
	}
}

// TestReindex: a registry opened again rebuilds its names from the
// records, gives a ref to each snapshot recorded before refs existed, and
// marks gone what no record names.
func TestReindex(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	reg, err := OpenRegistry(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	old := Sandbox{ID: "sb-old", Account: "acct-a", Name: "old", State: sandbox.Running, Machine: &sandbox.Machine{},
		Snapshots: []sandbox.Snapshot{{ID: "v1"}, {ID: "v2", Ref: "sn-aaaaaaaaaaaaaaaaaaaaaaaa"}}}
	if err := reg.db.Update(func(tx *bolt.Tx) error {
		// As an older hostproxy left it: no index entries at all, and a
		// stray ref.
		if err := boltjson.Put(tx.Bucket(bucketSandboxes), []byte(old.ID), old); err != nil {
			return err
		}
		return boltjson.Put(tx.Bucket(bucketRefs), []byte("sn-bbbbbbbbbbbbbbbbbbbbbbbb"), refEntry{Sandbox: "sb-x", Snapshot: "v9"})
	}); err != nil {
		t.Fatal(err)
	}
	reg.Close()
	if reg, err = OpenRegistry(ctx, dir); err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	sb, found, err := reg.resolveSandbox(ctx, "acct-a", "old")
	if err != nil || !found || sb.ID != "sb-old" {
		t.Fatalf("old: %+v %v %v", sb, found, err)
	}
	ref := sb.Snapshots[0].Ref
	if !api.ValidSnapshotRef(ref) || sb.Snapshots[1].Ref != "sn-aaaaaaaaaaaaaaaaaaaaaaaa" {
		t.Fatalf("refs %+v", sb.Snapshots)
	}
	for r, id := range map[string]string{ref: "v1", "sn-aaaaaaaaaaaaaaaaaaaaaaaa": "v2"} {
		if e, ok, _ := reg.snapshotByRef(ctx, r); !ok || e.Snapshot != id {
			t.Fatalf("%s: %+v %v", r, e, ok)
		}
	}
	if _, ok, _ := reg.snapshotByRef(ctx, "sn-bbbbbbbbbbbbbbbbbbbbbbbb"); ok {
		t.Fatal("a stray ref is found")
	}
}

// TestForkSource: what a fork's from names, by the sandbox's id or name
// and the snapshot's id, name or ref, or by the ref alone; another
// account's is unknown.
func TestForkSource(t *testing.T) {
	h := newAuthzHarness(t)
	ctx := t.Context()
	snaps := func(r *Sandbox) {
		r.Snapshots = []sandbox.Snapshot{{ID: "v1", Name: "after-build"}, {ID: "v2"}}
	}
	h.record("sb-src", "acct-a", "scratch", snaps)
	h.record("sb-bsrc", "acct-b", "bee", snaps)
	rec, _ := h.s.reg.Sandbox(ctx, "sb-src")
	ref := rec.Snapshots[0].Ref
	brec, _ := h.s.reg.Sandbox(ctx, "sb-bsrc")
	bref := brec.Snapshots[0].Ref
	a := Principal{Kind: KindAccountKey, Account: "acct-a"}
	tests := []struct {
		name      string
		from      api.SandboxFrom
		src, snap string
		code      string
	}{
		{"id and id", api.SandboxFrom{Sandbox: "sb-src", Snapshot: "v1"}, "sb-src", "v1", ""},
		{"name and name", api.SandboxFrom{Sandbox: "scratch", Snapshot: "after-build"}, "sb-src", "v1", ""},
		{"name and ref", api.SandboxFrom{Sandbox: "scratch", Snapshot: ref}, "sb-src", "v1", ""},
		{"ref alone", api.SandboxFrom{Snapshot: ref}, "sb-src", "v1", ""},
		{"another sandbox's ref", api.SandboxFrom{Sandbox: "sb-src", Snapshot: bref}, "", "", "snapshot_not_found"},
		{"another account's ref alone", api.SandboxFrom{Snapshot: bref}, "", "", "snapshot_not_found"},
		{"another account's sandbox", api.SandboxFrom{Sandbox: "bee", Snapshot: "v1"}, "", "", "sandbox_not_found"},
		{"no such snapshot", api.SandboxFrom{Sandbox: "scratch", Snapshot: "v7"}, "", "", "snapshot_not_found"},
		{"no such ref", api.SandboxFrom{Snapshot: "sn-zzzzzzzzzzzzzzzzzzzzzzzz"}, "", "", "snapshot_not_found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src, snap, err := h.s.forkSource(ctx, a, tc.from)
			if tc.code != "" {
				if fault.CodeOf(err) != tc.code {
					t.Fatalf("got %v, want %s", err, tc.code)
				}
				return
			}
			if err != nil || src != tc.src || snap != tc.snap {
				t.Fatalf("got %s %s %v, want %s %s", src, snap, err, tc.src, tc.snap)
			}
		})
	}
}

// TestSandboxEnvInExec: the sandbox's env is under every exec's and
// session's own, as guestd receives them; a merge of more than 64
// entries never reaches the guest.
func TestSandboxEnvInExec(t *testing.T) {
	h := newAuthzHarness(t)
	h.record("sb-env", "acct-a", "envy", func(r *Sandbox) { r.Env = map[string]string{"A": "base", "B": "<base>"} })
	var seen []map[string]string
	capture := func(answer string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			var req struct {
				Env map[string]string `json:"env"`
			}
			json.Unmarshal(b, &req)
			seen = append(seen, req.Env)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, answer)
		})
	}
	h.guest.SetHandler("POST", "/v1/exec", capture(`{"status":"success","data":{"exit_code":0,"stdout":"","stderr":"","timed_out":false,"truncated":false,"duration_ms":1}}`))
	h.guest.SetHandler("POST", "/v1/sessions", capture(`{"status":"success","data":{"id":"se-0123456789abcdef","cmd":["env"],"tty":false,"detachable":false,"state":"running","attached":0,"created_at":"2026-01-01T00:00:00Z","output_bytes":0}}`))
	want := map[string]string{"A": "call", "B": "<base>"}
	for _, path := range []string{"/v1/sandboxes/envy/exec", "/v1/sandboxes/envy/sessions"} {
		status, data := h.do(call{method: "POST", path: path, key: testKey, body: `{"cmd":["env"],"env":{"A":"call"}}`})
		if status != 200 && status != 201 {
			t.Fatalf("%s: %d %v", path, status, data)
		}
		if got := seen[len(seen)-1]; len(got) != 2 || got["A"] != want["A"] || got["B"] != want["B"] {
			t.Fatalf("%s: the guest saw env %v, want %v", path, got, want)
		}
	}
	var many bytes.Buffer
	many.WriteString(`{"cmd":["env"],"env":{`)
	for i := range 63 {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`"C` + strings.Repeat("x", i) + `":"1"`)
	}
	many.WriteString(`}}`)
	n := len(seen)
	status, data := h.do(call{method: "POST", path: "/v1/sandboxes/envy/exec", key: testKey, body: many.String()})
	if status != 400 || data["code"] != "invalid_field" || data["field"] != "env" || len(seen) != n {
		t.Fatalf("65 entries: %d %v (guest calls %d)", status, data, len(seen)-n)
	}
}

// TestLabels: PUT …/labels replaces them; GET shows them and the env; a
// list filters by label= and never shows env.
func TestLabels(t *testing.T) {
	h := newAuthzHarness(t)
	h.record("sb-l1", "acct-a", "docs-1", func(r *Sandbox) {
		r.Labels = map[string]string{"owner": "docs", "tier": "a"}
		r.Env = map[string]string{"SECRETISH": "not a secret store"}
	})
	h.record("sb-l2", "acct-a", "docs-2", func(r *Sandbox) { r.Labels = map[string]string{"owner": "docs"} })
	h.record("sb-l3", "acct-a", "ops-1", func(r *Sandbox) { r.Labels = map[string]string{"owner": "ops"} })
	h.record("sb-lb", "acct-b", "docs-b", func(r *Sandbox) { r.Labels = map[string]string{"owner": "docs"} })
	ids := func(query string) []string {
		t.Helper()
		status, data := h.do(call{method: "GET", path: "/v1/sandboxes" + query, key: testKey})
		if status != 200 {
			t.Fatalf("list %s: %d %v", query, status, data)
		}
		var out []string
		for _, r := range data["data"].([]any) {
			rec := r.(map[string]any)
			if _, ok := rec["env"]; ok {
				t.Fatalf("a list shows env: %v", rec)
			}
			if _, ok := rec["labels"].(map[string]any); !ok {
				t.Fatalf("a record without labels: %v", rec)
			}
			out = append(out, rec["id"].(string))
		}
		return out
	}
	for query, want := range map[string]string{
		"":                                  "sb-l1 sb-l2 sb-l3",
		"?label=owner=docs":                 "sb-l1 sb-l2",
		"?label=owner=docs&label=tier=a":    "sb-l1",
		"?label=owner=docs&label=owner=ops": "",
		"?label=owner=nobody":               "",
		"?label=owner%3Ddocs&limit=1":       "sb-l1",
	} {
		if got := strings.Join(ids(query), " "); got != want {
			t.Errorf("list %q: %s, want %s", query, got, want)
		}
	}
	for _, bad := range []string{"?label=owner", "?label=Owner=x", "?label=a=%0a", "?labels=owner=docs"} {
		if status, data := h.do(call{method: "GET", path: "/v1/sandboxes" + bad, key: testKey}); status != 400 || data["code"] != "invalid_field" {
			t.Errorf("list %q: %d %v", bad, status, data)
		}
	}
	status, data := h.do(call{method: "GET", path: "/v1/sandboxes/docs-1", key: testKey})
	if status != 200 || data["env"].(map[string]any)["SECRETISH"] != "not a secret store" || data["labels"].(map[string]any)["tier"] != "a" {
		t.Fatalf("get: %d %v", status, data)
	}
	status, data = h.do(call{method: "PUT", path: "/v1/sandboxes/docs-1/labels", key: testKey, body: `{"owner":"ops"}`})
	if status != 200 || len(data["labels"].(map[string]any)) != 1 {
		t.Fatalf("put: %d %v", status, data)
	}
	if got := strings.Join(ids("?label=owner=ops"), " "); got != "sb-l1 sb-l3" {
		t.Fatalf("after the put: %s", got)
	}
	status, data = h.do(call{method: "PUT", path: "/v1/sandboxes/docs-1/labels", key: testKey, body: `{}`})
	if status != 200 || len(data["labels"].(map[string]any)) != 0 {
		t.Fatalf("put {}: %d %v", status, data)
	}
	for _, bad := range []struct{ body, code string }{
		{`{"Owner":"x"}`, "invalid_field"}, {`{"a":1}`, "invalid_field"}, {`[]`, "invalid_json"}, {`null`, "invalid_json"},
	} {
		if status, data := h.do(call{method: "PUT", path: "/v1/sandboxes/docs-1/labels", key: testKey, body: bad.body}); status != 400 || data["code"] != bad.code {
			t.Errorf("put %s: %d %v", bad.body, status, data)
		}
	}
	tok := h.token("sb-l2", api.ScopeSnapshots, api.ScopeExec)
	if status, _ := h.do(call{method: "PUT", path: "/v1/sandboxes/docs-2/labels", key: tok, body: `{}`}); status != 403 {
		t.Fatalf("a token put labels: %d", status)
	}
}

// FuzzResolveSandbox holds the resolution policy on any path segment:
// what it finds is the caller's account's sandbox whose id is the
// segment, else the one of that account named so (never destroyed); an
// id of the account is never shadowed by a name; and a segment that
// looks like an id the API makes never resolves by name.
func FuzzResolveSandbox(f *testing.F) {
	reg, err := OpenRegistry(context.Background(), f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { reg.Close() })
	records := []Sandbox{
		{ID: "sb-a1", Account: "acct-a", Name: "dev"},
		{ID: "sb-a2", Account: "acct-a", Name: "web-1"},
		{ID: "sb-a3", Account: "acct-a", Name: "gone", State: sandbox.Destroyed},
		{ID: "sb-b1", Account: "acct-b", Name: "dev"},
		{ID: "local", Account: "acct-a"},
		{ID: "sb-pool", Name: "pooled", Pooled: true},
	}
	for _, r := range records {
		r.Machine = &sandbox.Machine{}
		if err := reg.Insert(context.Background(), r); err != nil {
			f.Fatal(err)
		}
	}
	for _, s := range []string{"dev", "sb-a1", "sb-b1", "web-1", "gone", "local", "pooled", "", "sb-", "Dev", "dev\x00"} {
		f.Add("acct-a", s)
		f.Add("acct-b", s)
	}
	f.Fuzz(func(t *testing.T, account, seg string) {
		sb, found, err := reg.resolveSandbox(context.Background(), account, seg)
		if err != nil {
			t.Fatal(err)
		}
		var want *Sandbox
		for i, r := range records {
			if r.Account == account && r.ID == seg {
				want = &records[i]
			}
		}
		if want == nil && !api.MintedSandboxID(seg) {
			for i, r := range records {
				if r.Account == account && account != "" && r.Name != "" && r.Name == seg && r.State != sandbox.Destroyed {
					want = &records[i]
				}
			}
		}
		switch {
		case want == nil && found:
			t.Fatalf("(%q, %q) found %s", account, seg, sb.ID)
		case want != nil && (!found || sb.ID != want.ID):
			t.Fatalf("(%q, %q) = %s %v, want %s", account, seg, sb.ID, found, want.ID)
		}
	})
}
