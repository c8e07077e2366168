package hostproxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"strata/hostproxy"
	"strata/hostproxy/hostproxytest"
)

const (
	cpsA1   = "/v1/sandboxes/sb-a1/checkpoints"
	tokenA1 = "/v1/sandboxes/sb-a1/access-token"
	// unknownCP has the shape of a checkpoint id but names none.
	unknownCP = "cp_AAAAAAAAAAAAAAAAAAAAAA"
)

// apiCase is one request through the public API and what must come back.
type apiCase struct {
	name string
	// config edits the stack's configuration before it starts.
	config func(*hostproxy.Config)
	// setup prepares state (checkpoints, tokens, guest faults) and returns
	// the request under test.
	setup  func(s *stack) request
	status int
	// code is the JSend fail code; "" for success and 5xx errors.
	code string
	// reachesGuest tells whether the request may be forwarded to sb-a1's
	// guest; edge validation must stop the others before it.
	reachesGuest bool
	// notInBody are strings that must not appear in the answer (internals).
	notInBody []string
}

func fixed(r request) func(*stack) request { return func(*stack) request { return r } }

func withCheckpoint(build func(id string) request) func(*stack) request {
	return func(s *stack) request {
		cp := s.create(keyA, "sb-a1", "/workspace/project", "first")
		return build(cp.ID)
	}
}

func guestFault(op hostproxytest.Op, path string, f hostproxytest.Fault, r request) func(*stack) request {
	return func(s *stack) request {
		s.guests["sb-a1"].SetFault(op, path, f)
		return r
	}
}

func pathFault(code string) apiCase {
	p := "/workspace/" + code
	return apiCase{
		name:   code,
		setup:  guestFault(hostproxytest.OpCreate, p, hostproxytest.Fail(422, code, "the directory breaks a path rule ("+code+")", map[string]any{"path": p}), request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"` + p + `"}`}),
		status: 422, code: code, reachesGuest: true,
	}
}

// apiCases provoke every code of API.md (and the extension codes) through
// the real HTTP server, plus the successes of each route.
func apiCases() []apiCase {
	create := func(body string) request { return request{method: "POST", path: cpsA1, key: keyA, body: body} }
	cases := []apiCase{
		// Successes.
		{name: "create", setup: fixed(create(`{"path":"/workspace/project","name":"before-update"}`)), status: 200, reachesGuest: true},
		{name: "create_without_name", setup: fixed(create(`{"path":"/workspace/project"}`)), status: 200, reachesGuest: true},
		{name: "create_with_parent", setup: withCheckpoint(func(string) request { return create(`{"path":"/workspace/project","name":"second"}`) }), status: 200, reachesGuest: true},
		{name: "create_charset_json", setup: fixed(request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project"}`, header: map[string]string{"Content-Type": "application/json; charset=utf-8"}}), status: 200, reachesGuest: true},
		{name: "list_empty", setup: fixed(request{method: "GET", path: cpsA1, key: keyA}), status: 200, reachesGuest: true},
		{name: "list", setup: withCheckpoint(func(string) request { return request{method: "GET", path: cpsA1, key: keyA} }), status: 200, reachesGuest: true},
		{name: "restore", setup: withCheckpoint(func(id string) request {
			return request{method: "POST", path: cpsA1 + "/" + id + "/restore", key: keyA}
		}), status: 200, reachesGuest: true},
		{name: "delete", setup: withCheckpoint(func(id string) request { return request{method: "DELETE", path: cpsA1 + "/" + id, key: keyA} }), status: 200, reachesGuest: true},
		// Issuing, rotating and revoking hand the guest its credentials.
		{name: "token_issue", setup: fixed(request{method: "POST", path: tokenA1, key: keyA}), status: 200, reachesGuest: true},
		{name: "token_issue_scopes", setup: fixed(request{method: "POST", path: tokenA1, key: keyA, body: `{"scopes":["snapshots","checkpoints","watch"]}`}), status: 200, reachesGuest: true},
		{name: "token_show_none", setup: fixed(request{method: "GET", path: tokenA1, key: keyA}), status: 200},
		{name: "token_show", setup: func(s *stack) request {
			s.issueToken(keyA, "sb-a1")
			return request{method: "GET", path: tokenA1, key: keyA}
		}, status: 200},
		{name: "token_rotate", setup: func(s *stack) request {
			s.issueToken(keyA, "sb-a1")
			return request{method: "POST", path: tokenA1 + "/rotate", key: keyA}
		}, status: 200, reachesGuest: true},
		{name: "token_revoke", setup: func(s *stack) request {
			s.issueToken(keyA, "sb-a1")
			return request{method: "DELETE", path: tokenA1, key: keyA}
		}, status: 200, reachesGuest: true},
		{name: "token_revoke_none", setup: fixed(request{method: "DELETE", path: tokenA1, key: keyA}), status: 200, reachesGuest: true},
		{name: "token_lists", setup: func(s *stack) request {
			return request{method: "GET", path: cpsA1, key: s.issueToken(keyA, "sb-a1")}
		}, status: 200, reachesGuest: true},
		{name: "health", setup: fixed(request{method: "GET", path: "/v1/health"}), status: 200},

		// 400
		{name: "invalid_json_malformed", setup: fixed(create(`{"path":`)), status: 400, code: "invalid_json"},
		{name: "invalid_json_trailing", setup: fixed(create(`{"path":"/workspace/project"} {}`)), status: 400, code: "invalid_json"},
		{name: "invalid_json_array", setup: fixed(create(`[{"path":"/workspace/project"}]`)), status: 400, code: "invalid_json"},
		{name: "invalid_json_no_body", setup: fixed(request{method: "POST", path: cpsA1, key: keyA}), status: 400, code: "invalid_json"},
		{name: "invalid_json_null", setup: fixed(create(`null`)), status: 400, code: "invalid_json"},
		{name: "unknown_field", setup: fixed(create(`{"path":"/workspace/project","parent_id":"cp_AAAAAAAAAAAAAAAAAAAAAA"}`)), status: 400, code: "unknown_field"},
		{name: "unknown_field_case", setup: fixed(create(`{"path":"/workspace/project","Path":"/etc"}`)), status: 400, code: "unknown_field"},
		{name: "invalid_json_utf8", setup: fixed(create("{\"path\":\"/workspace/\xff\"}")), status: 400, code: "invalid_json"},
		{name: "invalid_field_path_type", setup: fixed(create(`{"path":42}`)), status: 400, code: "invalid_field"},
		{name: "invalid_field_path_missing", setup: fixed(create(`{"name":"x"}`)), status: 400, code: "invalid_field"},
		{name: "invalid_field_path_null", setup: fixed(create(`{"path":null}`)), status: 400, code: "invalid_field"},
		{name: "invalid_field_path_empty", setup: fixed(create(`{"path":""}`)), status: 400, code: "invalid_field"},
		{name: "invalid_field_path_nul", setup: fixed(create(`{"path":"/workspace/a\u0000b"}`)), status: 400, code: "invalid_field"},
		{name: "invalid_field_path_too_long", setup: fixed(create(`{"path":"/` + strings.Repeat("a", 4096) + `"}`)), status: 400, code: "invalid_field"},
		{name: "invalid_field_name_type", setup: fixed(create(`{"path":"/workspace/project","name":["x"]}`)), status: 400, code: "invalid_field"},
		{name: "invalid_field_name_too_long", setup: fixed(create(`{"path":"/workspace/project","name":"` + strings.Repeat("n", 129) + `"}`)), status: 400, code: "invalid_field"},
		{name: "invalid_field_name_control", setup: fixed(create(`{"path":"/workspace/project","name":"a\nb"}`)), status: 400, code: "invalid_field"},
		{name: "invalid_field_name_bidi", setup: fixed(create(`{"path":"/workspace/project","name":"invoice\u202Egpj.exe"}`)), status: 400, code: "invalid_field"},
		{name: "invalid_field_idempotency_key", setup: fixed(request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project"}`, more: http.Header{"Idempotency-Key": {"k1", "k2"}}}), status: 400, code: "invalid_field"},
		{name: "query_not_allowed_create", setup: fixed(request{method: "POST", path: cpsA1 + "?path=/x", key: keyA, body: `{"path":"/workspace/project"}`}), status: 400, code: "query_not_allowed"},
		{name: "query_not_allowed_list", setup: fixed(request{method: "GET", path: cpsA1 + "?limit=10", key: keyA}), status: 400, code: "query_not_allowed"},
		{name: "query_not_allowed_list_empty", setup: fixed(request{method: "GET", path: cpsA1 + "?", key: keyA}), status: 400, code: "query_not_allowed"},
		{name: "query_not_allowed_restore", setup: fixed(request{method: "POST", path: cpsA1 + "/" + unknownCP + "/restore?force=1", key: keyA}), status: 400, code: "query_not_allowed"},
		{name: "query_not_allowed_delete", setup: fixed(request{method: "DELETE", path: cpsA1 + "/" + unknownCP + "?x", key: keyA}), status: 400, code: "query_not_allowed"},
		{name: "query_not_allowed_token", setup: fixed(request{method: "GET", path: tokenA1 + "?x=1", key: keyA}), status: 400, code: "query_not_allowed"},
		{name: "body_not_allowed_restore", setup: withCheckpoint(func(id string) request {
			return request{method: "POST", path: cpsA1 + "/" + id + "/restore", key: keyA, body: `{"path":"/elsewhere"}`}
		}), status: 400, code: "body_not_allowed"},
		{name: "body_not_allowed_delete", setup: fixed(request{method: "DELETE", path: cpsA1 + "/" + unknownCP, key: keyA, body: `{}`}), status: 400, code: "body_not_allowed"},
		{name: "body_not_allowed_list", setup: fixed(request{method: "GET", path: cpsA1, key: keyA, body: `{}`}), status: 400, code: "body_not_allowed"},
		{name: "body_not_allowed_token", setup: fixed(request{method: "POST", path: tokenA1 + "/rotate", key: keyA, body: `{"hint":"abcd"}`}), status: 400, code: "body_not_allowed"},
		// An issue takes {"scopes":[…]}, nothing else; a configured
		// sandbox's token never gets exec or files (its guest daemon may
		// be the host's: make run-local).
		{name: "unknown_field_token", setup: fixed(request{method: "POST", path: tokenA1, key: keyA, body: `{"hint":"abcd"}`}), status: 400, code: "unknown_field"},
		{name: "invalid_field_token_scope", setup: fixed(request{method: "POST", path: tokenA1, key: keyA, body: `{"scopes":["checkpoints","root"]}`}), status: 400, code: "invalid_field"},
		{name: "invalid_field_token_scope_twice", setup: fixed(request{method: "POST", path: tokenA1, key: keyA, body: `{"scopes":["exec","exec"]}`}), status: 400, code: "invalid_field"},
		{name: "invalid_field_token_no_scope", setup: fixed(request{method: "POST", path: tokenA1, key: keyA, body: `{"scopes":[]}`}), status: 400, code: "invalid_field"},
		{name: "invalid_field_token_host_scopes", setup: fixed(request{method: "POST", path: tokenA1, key: keyA, body: `{"scopes":["checkpoints","files"]}`}), status: 400, code: "invalid_field"},
		// X-Api-Key and Authorization: Bearer with two different keys.
		{name: "invalid_field_two_keys", setup: fixed(request{method: "GET", path: cpsA1, key: keyA, header: map[string]string{"Authorization": "Bearer " + keyB}}), status: 400, code: "invalid_field"},

		// 401, 403
		{name: "unauthorized_missing", setup: fixed(request{method: "GET", path: cpsA1}), status: 401, code: "unauthorized"},
		{name: "unauthorized_unknown", setup: fixed(request{method: "GET", path: cpsA1, key: "sk_not_a_key_of_anyone_at_all_00"}), status: 401, code: "unauthorized"},
		{name: "unauthorized_revoked_token", setup: func(s *stack) request {
			tok := s.issueToken(keyA, "sb-a1")
			s.mustData(request{method: "DELETE", path: tokenA1, key: keyA}, nil)
			return request{method: "GET", path: cpsA1, key: tok}
		}, status: 401, code: "unauthorized"},
		{name: "forbidden_token_of_other_sandbox", setup: func(s *stack) request {
			return request{method: "GET", path: "/v1/sandboxes/sb-a2/checkpoints", key: s.issueToken(keyA, "sb-a1")}
		}, status: 403, code: "forbidden"},
		{name: "forbidden_token_on_management", setup: func(s *stack) request {
			return request{method: "GET", path: tokenA1, key: s.issueToken(keyA, "sb-a1")}
		}, status: 403, code: "forbidden"},
		// A token without the scope a route needs: data.scope names it.
		{name: "forbidden_scope", setup: func(s *stack) request {
			return request{method: "POST", path: "/v1/sandboxes/sb-a1/sessions", key: s.issueToken(keyA, "sb-a1"), body: `{"cmd":["sh"]}`}
		}, status: 403, code: "forbidden"},
		{name: "forbidden_scope_checkpoints", setup: func(s *stack) request {
			var tok struct{ Token string }
			s.mustData(request{method: "POST", path: tokenA1, key: keyA, body: `{"scopes":["snapshots"]}`}, &tok)
			return request{method: "GET", path: cpsA1, key: tok.Token}
		}, status: 403, code: "forbidden"},

		// 404
		{name: "sandbox_not_found", setup: fixed(request{method: "GET", path: "/v1/sandboxes/sb-nope/checkpoints", key: keyA}), status: 404, code: "sandbox_not_found"},
		{name: "sandbox_not_found_other_account", setup: fixed(request{method: "GET", path: "/v1/sandboxes/sb-b1/checkpoints", key: keyA}), status: 404, code: "sandbox_not_found"},
		{name: "sandbox_not_found_other_account_token_route", setup: fixed(request{method: "POST", path: "/v1/sandboxes/sb-b1/access-token", key: keyA}), status: 404, code: "sandbox_not_found"},
		{name: "sandbox_not_found_bad_id", setup: fixed(request{method: "GET", path: "/v1/sandboxes/..%2F..%2Fetc/checkpoints", key: keyA}), status: 404, code: "sandbox_not_found"},
		{name: "checkpoint_not_found", setup: fixed(request{method: "POST", path: cpsA1 + "/" + unknownCP + "/restore", key: keyA}), status: 404, code: "checkpoint_not_found", reachesGuest: true},
		{name: "checkpoint_not_found_delete", setup: fixed(request{method: "DELETE", path: cpsA1 + "/" + unknownCP, key: keyA}), status: 404, code: "checkpoint_not_found", reachesGuest: true},
		{name: "checkpoint_not_found_malformed", setup: fixed(request{method: "POST", path: cpsA1 + "/first/restore", key: keyA}), status: 404, code: "checkpoint_not_found"},
		{name: "checkpoint_not_found_of_other_sandbox", setup: func(s *stack) request {
			cp := s.create(keyA, "sb-a2", "/workspace/project", "in a2")
			return request{method: "POST", path: cpsA1 + "/" + cp.ID + "/restore", key: keyA}
		}, status: 404, code: "checkpoint_not_found", reachesGuest: true},
		{name: "not_found_route", setup: fixed(request{method: "GET", path: "/v1/sandboxes/sb-a1/volumes", key: keyA}), status: 404, code: "not_found"},
		{name: "not_found_root", setup: fixed(request{method: "GET", path: "/"}), status: 404, code: "not_found"},
		{name: "token_not_found", setup: fixed(request{method: "POST", path: tokenA1 + "/rotate", key: keyA}), status: 404, code: "token_not_found"},

		// 405
		{name: "method_not_allowed", setup: fixed(request{method: "PUT", path: cpsA1, key: keyA, body: `{}`}), status: 405, code: "method_not_allowed"},
		{name: "method_not_allowed_restore", setup: fixed(request{method: "GET", path: cpsA1 + "/" + unknownCP + "/restore", key: keyA}), status: 405, code: "method_not_allowed"},
		{name: "method_not_allowed_options", setup: fixed(request{method: "OPTIONS", path: cpsA1}), status: 405, code: "method_not_allowed"},
		{name: "method_not_allowed_token", setup: fixed(request{method: "PATCH", path: tokenA1, key: keyA}), status: 405, code: "method_not_allowed"},

		// 409
		{name: "sandbox_not_running_paused", setup: fixed(request{method: "GET", path: "/v1/sandboxes/sb-paused/checkpoints", key: keyA}), status: 409, code: "sandbox_not_running"},
		{name: "sandbox_not_running_stopped", setup: fixed(request{method: "POST", path: "/v1/sandboxes/sb-stopped/checkpoints", key: keyA, body: `{"path":"/workspace/project"}`}), status: 409, code: "sandbox_not_running"},
		{name: "sandbox_not_running_after_pause", setup: func(s *stack) request {
			if err := s.srv.Registry().SetSandboxState(context.Background(), "sb-a1", hostproxy.StatePaused); err != nil {
				s.t.Fatal(err)
			}
			return request{method: "GET", path: cpsA1, key: keyA}
		}, status: 409, code: "sandbox_not_running"},
		{name: "directory_busy", setup: guestFault(hostproxytest.OpCreate, "/workspace/project", hostproxytest.Fail(409, "directory_busy", "processes use the directory", map[string]any{
			"path":    "/workspace/project",
			"holders": []map[string]any{{"pid": 4242, "command": "bash", "kind": "cwd"}, {"pid": 4243, "command": "python3", "kind": "fd"}},
		}), create(`{"path":"/workspace/project"}`)), status: 409, code: "directory_busy", reachesGuest: true},
		{name: "directory_busy_restore", setup: func(s *stack) request {
			cp := s.create(keyA, "sb-a1", "/workspace/project", "first")
			s.guests["sb-a1"].SetFault(hostproxytest.OpRestore, "/workspace/project", hostproxytest.Fail(409, "directory_busy", "processes use the directory", map[string]any{
				"path": "/workspace/project", "holders": []map[string]any{{"pid": 7, "command": "vim", "kind": "mmap"}},
			}))
			return request{method: "POST", path: cpsA1 + "/" + cp.ID + "/restore", key: keyA}
		}, status: 409, code: "directory_busy", reachesGuest: true},
		{name: "operation_in_progress", setup: guestFault(hostproxytest.OpCreate, "/workspace/project", hostproxytest.Fail(409, "operation_in_progress", "another operation on this directory is under way", map[string]any{"path": "/workspace/project"}), create(`{"path":"/workspace/project"}`)), status: 409, code: "operation_in_progress", reachesGuest: true},
		// 422 from the guest: an Idempotency-Key used for another request.
		{name: "idempotency_key_reused", setup: func(s *stack) request {
			s.mustData(request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project","name":"first"}`, more: http.Header{"Idempotency-Key": {"retry-1"}}}, nil)
			return request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project","name":"second"}`, more: http.Header{"Idempotency-Key": {"retry-1"}}}
		}, status: 422, code: "idempotency_key_reused", reachesGuest: true},
		{name: "token_exists", setup: func(s *stack) request {
			s.issueToken(keyA, "sb-a1")
			return request{method: "POST", path: tokenA1, key: keyA}
		}, status: 409, code: "token_exists"},

		// 413, 415
		{name: "body_too_large", setup: fixed(create(`{"path":"/workspace/project","name":"` + strings.Repeat("x", 17<<10) + `"}`)), status: 413, code: "body_too_large"},
		{name: "body_too_large_chunked", setup: fixed(request{method: "POST", path: cpsA1, key: keyA, body: strings.Repeat(" ", 17<<10) + `{}`, header: map[string]string{"Transfer-Encoding": "chunked"}}), status: 413, code: "body_too_large"},
		{name: "unsupported_media_type", setup: fixed(request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project"}`, header: map[string]string{"Content-Type": "text/plain"}}), status: 415, code: "unsupported_media_type"},
		{name: "unsupported_media_type_form", setup: fixed(request{method: "POST", path: cpsA1, key: keyA, body: `path=/workspace/project`, header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}}), status: 415, code: "unsupported_media_type"},

		// 422: checked at the edge, then relayed from the guest.
		{name: "path_not_absolute", setup: fixed(create(`{"path":"workspace/project"}`)), status: 422, code: "path_not_absolute"},
		{name: "path_not_clean", setup: fixed(create(`{"path":"/workspace/project/"}`)), status: 422, code: "path_not_clean"},
		{name: "path_not_clean_dotdot", setup: fixed(create(`{"path":"/workspace/../etc"}`)), status: 422, code: "path_not_clean"},
		{name: "path_protected_at_edge", setup: fixed(create(`{"path":"/usr/local"}`)), status: 422, code: "path_protected"},
		{name: "path_protected_root", setup: fixed(create(`{"path":"/"}`)), status: 422, code: "path_protected"},
		pathFault("path_not_found"),
		pathFault("path_not_directory"),
		pathFault("path_protected"),
		pathFault("path_symlink"),
		pathFault("path_mount"),
		pathFault("path_hardlink"),
		pathFault("path_special_file"),
		{name: "path_nested", setup: func(s *stack) request {
			s.create(keyA, "sb-a1", "/workspace/project", "first")
			return create(`{"path":"/workspace/project/src"}`)
		}, status: 422, code: "path_nested", reachesGuest: true},

		// 429
		{name: "rate_limited", config: func(c *hostproxy.Config) { c.RateLimit = hostproxy.RateLimit{PerSecond: 0.001, Burst: 1} }, setup: func(s *stack) request {
			s.mustData(request{method: "GET", path: tokenA1, key: keyA}, nil)
			return request{method: "GET", path: tokenA1, key: keyA}
		}, status: 429, code: "rate_limited"},

		// 5xx: fixed messages, never the guest's text.
		{name: "insufficient_storage", setup: guestFault(hostproxytest.OpCreate, "/workspace/big", hostproxytest.Error(507, "need 10 GiB free on /var/lib/strata/layers, have 1 GiB"), create(`{"path":"/workspace/big"}`)),
			status: 507, code: "insufficient_storage", reachesGuest: true, notInBody: []string{"/var/lib/strata"}},
		{name: "guest_internal_error", setup: guestFault(hostproxytest.OpCreate, "/workspace/project", hostproxytest.Error(500, "rename /var/lib/strata/layers/17/upper: input/output error"), create(`{"path":"/workspace/project"}`)),
			status: 500, reachesGuest: true, notInBody: []string{"/var/lib/strata", "input/output"}},
		// 502: a guest's answer that is not guestd's, whatever it says.
		{name: "guest_garbage", setup: guestFault(hostproxytest.OpList, "", hostproxytest.Fault{Status: 200, Body: "<html>oops</html>"}, request{method: "GET", path: cpsA1, key: keyA}),
			status: 502, code: "guest_error", reachesGuest: true, notInBody: []string{"html"}},
		{name: "guest_fail_without_code", setup: guestFault(hostproxytest.OpList, "", hostproxytest.Fault{Status: 409, Body: `{"status":"fail","data":{}}`}, request{method: "GET", path: cpsA1, key: keyA}),
			status: 502, code: "guest_error", reachesGuest: true},
		// Issue 30: a guest spoke for the edge through hostproxy.
		{name: "guest_unauthorized", setup: guestFault(hostproxytest.OpList, "", hostproxytest.Fail(401, "unauthorized", "log in again at https://evil.example", nil), request{method: "GET", path: cpsA1, key: keyA}),
			status: 502, code: "guest_error", reachesGuest: true, notInBody: []string{"evil"}},
		{name: "guest_sandbox_not_found", setup: guestFault(hostproxytest.OpList, "", hostproxytest.Fail(404, "sandbox_not_found", "no such sandbox", nil), request{method: "GET", path: cpsA1, key: keyA}),
			status: 502, code: "guest_error", reachesGuest: true},
		{name: "guest_code_of_another_status", setup: guestFault(hostproxytest.OpList, "", hostproxytest.Fail(429, "directory_busy", "slow down", map[string]any{"retry_after": 1}), request{method: "GET", path: cpsA1, key: keyA}),
			status: 502, code: "guest_error", reachesGuest: true},
		{name: "guest_made_up_code", setup: guestFault(hostproxytest.OpList, "", hostproxytest.Fail(409, "please_upgrade", "visit https://evil.example", nil), request{method: "GET", path: cpsA1, key: keyA}),
			status: 502, code: "guest_error", reachesGuest: true, notInBody: []string{"evil"}},
		{name: "guest_unreachable", setup: fixed(request{method: "GET", path: "/v1/sandboxes/sb-dead/checkpoints", key: keyA}), status: 503, code: "guest_unavailable", notInBody: []string{"nonexistent"}},
		{name: "guest_stopped", setup: func(s *stack) request {
			s.guests["sb-a1"].Stop()
			return request{method: "GET", path: cpsA1, key: keyA}
		}, status: 503, code: "guest_unavailable"},
		{name: "guest_timeout", config: func(c *hostproxy.Config) { c.Timeouts.GuestRequest = hostproxy.Duration(300 * time.Millisecond) }, setup: func(s *stack) request {
			s.guests["sb-a1"].SetDelay(5 * time.Second)
			return request{method: "GET", path: cpsA1, key: keyA}
		}, status: 503, code: "guest_timeout", reachesGuest: true},
	}
	return append(cases, beyondCases()...)
}

// TestAPI provokes every code of the API through hostproxy's HTTP server
// and compares status and body with the golden files.
func TestAPI(t *testing.T) {
	for _, tc := range apiCases() {
		t.Run(tc.name, func(t *testing.T) {
			s := startStack(t, tc.config)
			req := tc.setup(s)
			if f := beyondFaults[tc.name]; f != nil {
				f(s)
			}
			guest := s.guests["sb-a1"]
			before := guest.Requests()
			start := time.Now()
			rep := s.do(req)
			// A hang would last the 60 s guest request timeout.
			if elapsed := time.Since(start); elapsed > 15*time.Second {
				t.Errorf("answered in %v", elapsed)
			}
			if rep.status != tc.status {
				t.Errorf("status %d, want %d: %s", rep.status, tc.status, rep.body)
			}
			if code := checkJSend(t, rep); code != tc.code {
				t.Errorf("code %q, want %q", code, tc.code)
			}
			if reached := guest.Requests() > before; reached && !tc.reachesGuest {
				t.Errorf("the request reached the guest; it must be refused at the edge")
			}
			for _, s := range tc.notInBody {
				if strings.Contains(string(rep.body), s) {
					t.Errorf("body leaks %q: %s", s, rep.body)
				}
			}
			if tc.status == 429 && rep.header.Get("Retry-After") == "" {
				t.Errorf("429 without Retry-After")
			}
			if tc.status == 405 && rep.header.Get("Allow") == "" {
				t.Errorf("405 without Allow")
			}
			checkGolden(t, tc.name, rep)
		})
	}
}

// TestAPICoversEveryCode fails when a code of the contract has no case in
// TestAPI, so that a new code cannot go untested.
func TestAPICoversEveryCode(t *testing.T) {
	contract := []string{
		"invalid_json", "unknown_field", "query_not_allowed", "body_not_allowed", "invalid_field",
		"unauthorized", "forbidden", "sandbox_not_found", "checkpoint_not_found", "not_found",
		"method_not_allowed", "directory_busy", "sandbox_not_running", "operation_in_progress",
		"body_too_large", "unsupported_media_type",
		"path_not_absolute", "path_not_clean", "path_not_found", "path_not_directory", "path_protected",
		"path_symlink", "path_mount", "path_nested", "path_hardlink", "path_special_file",
		"token_exists", "token_not_found", "rate_limited", "idempotency_key_reused",
		"entry_not_found", "file_too_large", "checkpoint_limit", "guest_error",
	}
	have := map[string]bool{}
	statuses := map[int]bool{}
	for _, tc := range apiCases() {
		have[tc.code] = true
		statuses[tc.status] = true
	}
	for _, c := range contract {
		if !have[c] {
			t.Errorf("no case provokes %q", c)
		}
	}
	for _, st := range []int{http.StatusInsufficientStorage, http.StatusServiceUnavailable, http.StatusInternalServerError, http.StatusBadGateway} {
		if !statuses[st] {
			t.Errorf("no case provokes status %d", st)
		}
	}
}
