package hostproxy_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"strata/hostproxy/hostproxytest"
)

// withTrees makes two checkpoints of /workspace/project with file trees
// (the second edits, adds and deletes) and a live tree, and builds the
// request from their ids.
func withTrees(build func(first, second string) request) func(*stack) request {
	return func(s *stack) request {
		g := s.guests["sb-a1"]
		a := s.create(keyA, "sb-a1", "/workspace/project", "first")
		g.SetTree(a.ID, hostproxytest.Tree{"README.md": {Content: "hello\n"}, "src/main.go": {Content: "package main\n"}, "old.txt": {Content: "x"}})
		b := s.create(keyA, "sb-a1", "/workspace/project", "second")
		g.SetTree(b.ID, hostproxytest.Tree{"README.md": {Content: "hello, world\n"}, "src/main.go": {Content: "package main\n"},
			"src/util.go": {Content: "package main\n\nfunc util() {}\n"}, "link": {Type: "symlink", Target: "README.md"}, "a?b": {Content: ""}})
		g.SetLiveTree("/workspace/project", hostproxytest.Tree{"README.md": {Content: "changed live\n"}})
		return build(a.ID, b.ID)
	}
}

// beyondCases are the cases of issue 8's routes in TestAPI: a success of
// each (golden), and what the edge refuses before the guest sees it.
func beyondCases() []apiCase {
	get := func(p string) request { return request{method: "GET", path: cpsA1 + "/" + p, key: keyA} }
	post := func(p, body string) request {
		return request{method: "POST", path: cpsA1 + "/" + p, key: keyA, body: body}
	}
	release := func(body string) request {
		return request{method: "POST", path: "/v1/sandboxes/sb-a1/directories/release", key: keyA, body: body}
	}
	return []apiCase{
		{name: "changes", setup: withTrees(func(_, b string) request { return get(b + "/changes") }), status: 200, reachesGuest: true},
		{name: "changes_against_live", setup: withTrees(func(_, b string) request { return get(b + "/changes?against=live") }), status: 200, reachesGuest: true},
		{name: "changes_against_checkpoint", setup: withTrees(func(a, b string) request { return get(a + "/changes?against=" + b) }), status: 200, reachesGuest: true},
		{name: "changes_against_bad", setup: fixed(get(unknownCP + "/changes?against=yesterday")), status: 400, code: "invalid_field"},
		{name: "changes_other_query", setup: fixed(get(unknownCP + "/changes?limit=3")), status: 400, code: "query_not_allowed"},
		{name: "changes_unknown", setup: fixed(get(unknownCP + "/changes")), status: 404, code: "checkpoint_not_found", reachesGuest: true},
		{name: "changes_paused", setup: fixed(request{method: "GET", path: "/v1/sandboxes/sb-paused/checkpoints/" + unknownCP + "/changes", key: keyA}), status: 409, code: "sandbox_not_running"},
		{name: "file", setup: withTrees(func(_, b string) request { return get(b + "/files/src/util.go") }), status: 200, reachesGuest: true},
		{name: "file_escaped", setup: withTrees(func(_, b string) request { return get(b + "/files/a%3Fb") }), status: 200, reachesGuest: true},
		{name: "file_symlink", setup: withTrees(func(_, b string) request { return get(b + "/files/link") }), status: 200, reachesGuest: true},
		{name: "file_dir", setup: withTrees(func(_, b string) request { return get(b + "/files/src") }), status: 200, reachesGuest: true},
		{name: "file_root", setup: withTrees(func(_, b string) request { return get(b + "/files/") }), status: 200, reachesGuest: true},
		{name: "file_root_without_slash", setup: withTrees(func(_, b string) request { return get(b + "/files") }), status: 200, reachesGuest: true},
		{name: "entry_not_found", setup: withTrees(func(_, b string) request { return get(b + "/files/old.txt") }), status: 404, code: "entry_not_found", reachesGuest: true},
		{name: "file_too_large", setup: withTrees(func(_, b string) request {
			return get(b + "/files/README.md")
		}), status: 413, code: "file_too_large", reachesGuest: true},
		{name: "file_escaping", setup: fixed(get(unknownCP + "/files/../../etc/passwd")), status: 400, code: "invalid_field"},
		{name: "file_escaping_encoded", setup: fixed(get(unknownCP + "/files/..%2F..%2Fetc%2Fpasswd")), status: 400, code: "invalid_field"},
		{name: "file_not_clean", setup: fixed(get(unknownCP + "/files/a//b")), status: 400, code: "invalid_field"},
		{name: "file_query", setup: fixed(get(unknownCP + "/files/a?raw=1")), status: 400, code: "query_not_allowed"},
		{name: "restore_paths", setup: withTrees(func(a, _ string) request { return post(a+"/restore-paths", `{"paths":["README.md","src"]}`) }), status: 200, reachesGuest: true},
		{name: "restore_paths_empty", setup: fixed(post(unknownCP+"/restore-paths", `{"paths":[]}`)), status: 400, code: "invalid_field"},
		{name: "restore_paths_absolute", setup: fixed(post(unknownCP+"/restore-paths", `{"paths":["/etc/passwd"]}`)), status: 400, code: "invalid_field"},
		{name: "restore_paths_no_body", setup: fixed(post(unknownCP+"/restore-paths", ``)), status: 400, code: "invalid_json"},
		{name: "restore_paths_busy", setup: withTrees(func(a, _ string) request {
			return post(a+"/restore-paths", `{"paths":["README.md"]}`)
		}), status: 409, code: "directory_busy", reachesGuest: true},
		{name: "clone", setup: withTrees(func(a, _ string) request { return post(a+"/clone", `{"path":"/workspace/copy"}`) }), status: 200, reachesGuest: true},
		{name: "clone_not_absolute", setup: fixed(post(unknownCP+"/clone", `{"path":"copy"}`)), status: 422, code: "path_not_absolute"},
		{name: "clone_protected", setup: fixed(post(unknownCP+"/clone", `{"path":"/usr/copy"}`)), status: 422, code: "path_protected"},
		{name: "clone_no_path", setup: fixed(post(unknownCP+"/clone", `{}`)), status: 400, code: "invalid_field"},
		{name: "clone_malformed_checkpoint", setup: fixed(post("nope/clone", `{"path":"/workspace/copy"}`)), status: 404, code: "checkpoint_not_found"},
		{name: "release", setup: withTrees(func(string, string) request { return release(`{"path":"/workspace/project"}`) }), status: 200, reachesGuest: true},
		{name: "release_not_clean", setup: fixed(release(`{"path":"/workspace/project/"}`)), status: 422, code: "path_not_clean"},
		{name: "release_query", setup: fixed(request{method: "POST", path: "/v1/sandboxes/sb-a1/directories/release?force=1", key: keyA, body: `{"path":"/w"}`}), status: 400, code: "query_not_allowed"},
		{name: "release_by_get", setup: fixed(request{method: "GET", path: "/v1/sandboxes/sb-a1/directories/release", key: keyA}), status: 405, code: "method_not_allowed"},
		{name: "create_retention", setup: fixed(request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project","retention":{"mode":"delete_oldest","max_count":2}}`}), status: 200, reachesGuest: true},
		{name: "create_retention_bad", setup: fixed(request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project","retention":{"mode":"delete_oldest","max_count":10001}}`}), status: 400, code: "invalid_field"},
		// A token may use the four and read its own sandbox's changes
		// and files; not the routes that change something.
		{name: "changes_with_token", setup: func(s *stack) request {
			r := withTrees(func(_, b string) request { return get(b + "/changes") })(s)
			r.key = s.issueToken(keyA, "sb-a1")
			return r
		}, status: 200, reachesGuest: true},
		{name: "files_with_token", setup: func(s *stack) request {
			r := withTrees(func(_, b string) request { return get(b + "/files/src/util.go") })(s)
			r.key = s.issueToken(keyA, "sb-a1")
			return r
		}, status: 200, reachesGuest: true},
		{name: "changes_token_of_other_sandbox", setup: func(s *stack) request {
			r := withTrees(func(_, b string) request { return get(b + "/changes") })(s)
			r.key = s.issueToken(keyA, "sb-a2")
			return r
		}, status: 403, code: "forbidden"},
		{name: "restore_paths_with_token", setup: func(s *stack) request {
			r := withTrees(func(a, _ string) request { return post(a+"/restore-paths", `{"paths":["README.md"]}`) })(s)
			r.key = s.issueToken(keyA, "sb-a1")
			return r
		}, status: 403, code: "forbidden"},
		{name: "release_with_token", setup: func(s *stack) request {
			return request{method: "POST", path: "/v1/sandboxes/sb-a1/directories/release", key: s.issueToken(keyA, "sb-a1"), body: `{"path":"/workspace/project"}`}
		}, status: 403, code: "forbidden"},
		{name: "release_token_of_other_sandbox", setup: func(s *stack) request {
			return request{method: "POST", path: "/v1/sandboxes/sb-a2/directories/release", key: s.issueToken(keyA, "sb-a1"), body: `{"path":"/w"}`}
		}, status: 403, code: "forbidden"},
		{name: "checkpoint_limit", setup: guestFault(hostproxytest.OpCreate, "/workspace/full", hostproxytest.Fail(409, "checkpoint_limit", "the directory holds the most checkpoints it may", map[string]any{"limit": 10000}),
			request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/full"}`}), status: 409, code: "checkpoint_limit", reachesGuest: true},
	}
}

// beyondFaults set, after a case's setup, the guest faults of the cases
// above that need one (the trees and checkpoints come first).
var beyondFaults = map[string]func(s *stack){
	"file_too_large": func(s *stack) {
		s.guests["sb-a1"].SetFault(hostproxytest.OpFiles, "/workspace/project", hostproxytest.Fail(413, "file_too_large", "the file is larger than 4 MiB", map[string]any{"size": 5 << 20, "path": "README.md"}))
	},
	"restore_paths_busy": func(s *stack) {
		s.guests["sb-a1"].SetFault(hostproxytest.OpRestorePaths, "/workspace/project", hostproxytest.Fail(409, "directory_busy", "processes use the directory", map[string]any{
			"path": "/workspace/project", "holders": []map[string]any{{"pid": 7, "command": "vim", "kind": "fd"}},
		}))
	},
}

// TestRetentionForwarded pins that create forwards retention: the guest
// deletes the oldest checkpoint of the directory past max_count.
func TestRetentionForwarded(t *testing.T) {
	s := startStack(t, nil)
	for range 3 {
		s.mustData(request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project","retention":{"mode":"delete_oldest","max_count":2}}`}, nil)
	}
	var list []json.RawMessage
	s.mustData(request{method: "GET", path: cpsA1, key: keyA}, &list)
	if len(list) != 2 {
		t.Fatalf("%d checkpoints after 3 captures with max_count 2", len(list))
	}
}

// TestCloneAndReleaseForwarded pins the bodies guestd gets: a clone
// makes a directory that release then frees with its checkpoints.
func TestCloneAndReleaseForwarded(t *testing.T) {
	s := startStack(t, nil)
	cp := s.create(keyA, "sb-a1", "/workspace/project", "first")
	var cl struct {
		Path             string `json:"path"`
		FromCheckpointID string `json:"from_checkpoint_id"`
	}
	s.mustData(request{method: "POST", path: cpsA1 + "/" + cp.ID + "/clone", key: keyA, body: `{"path":"/workspace/copy"}`}, &cl)
	if cl.Path != "/workspace/copy" || cl.FromCheckpointID != cp.ID {
		t.Fatalf("clone answered %+v", cl)
	}
	if got := s.guests["sb-a1"].Head("/workspace/copy"); got != cp.ID {
		t.Fatalf("clone's head %q, want %q", got, cp.ID)
	}
	var rel struct {
		Path string   `json:"path"`
		IDs  []string `json:"deleted_checkpoint_ids"`
	}
	s.mustData(request{method: "POST", path: "/v1/sandboxes/sb-a1/directories/release", key: keyA, body: `{"path":"/workspace/project"}`}, &rel)
	if rel.Path != "/workspace/project" || len(rel.IDs) != 1 || rel.IDs[0] != cp.ID {
		t.Fatalf("release answered %+v", rel)
	}
	if rep := s.do(request{method: "GET", path: "/v1/sandboxes/sb-a1/checkpoints/" + cp.ID + "/changes", key: keyA}); rep.status != http.StatusNotFound {
		t.Fatalf("changes of a released checkpoint: %d %s", rep.status, rep.body)
	}
}

// TestRetentionIsPartOfTheRequest pins that an Idempotency-Key sent
// again with another retention names another request, as guestd says.
func TestRetentionIsPartOfTheRequest(t *testing.T) {
	s := startStack(t, nil)
	key := http.Header{"Idempotency-Key": {"retry-1"}}
	s.mustData(request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project","retention":{"mode":"delete_oldest","max_count":2}}`, more: key}, nil)
	rep := s.do(request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project","retention":{"mode":"delete_oldest","max_count":3}}`, more: key})
	if rep.status != 422 || !strings.Contains(string(rep.body), "idempotency_key_reused") {
		t.Fatalf("another retention under the same key: %d %s", rep.status, rep.body)
	}
}
