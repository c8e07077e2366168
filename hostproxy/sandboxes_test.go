package hostproxy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"strata/hostproxy"
)

// The sandbox routes on a hostproxy without a vms configuration:
// every refusal of API.md that needs no VM, checked at the edge.

const sandboxes = "/v1/sandboxes"

// sandboxCase is one request on the sandbox routes and its answer.
type sandboxCase struct {
	name string
	req  request
	// token sends sb-a1's access token in place of req.key.
	token  bool
	status int
	code   string
	// state is data.state of the answer, when not "".
	state string
	// field is data.field of the answer (the field an invalid_field
	// names), when not "".
	field string
	// message is data.message of the answer, when not "".
	message string
	// scope is data.scope of the answer (the scope a 403 says the
	// credential lacks), when not "".
	scope string
	// golden names the golden file of the answer, when not "".
	golden string
}

// sandboxCases are the refusals of the sandbox routes without VMs.
func sandboxCases() []sandboxCase {
	create := func(body string) request { return request{method: "POST", path: sandboxes, key: keyA, body: body} }
	exec := func(sb, body string) request {
		return request{method: "POST", path: sandboxes + "/" + sb + "/exec", key: keyA, body: body}
	}
	list := func(query string) request { return request{method: "GET", path: sandboxes + query, key: keyA} }
	lifecycle := func(method, path string) request { return request{method: method, path: sandboxes + path, key: keyA} }
	many := func(n int, s string) string { return strings.TrimSuffix(strings.Repeat(s+",", n), ",") }
	env := func(n, size int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"K%d":"%s"`, i, strings.Repeat("v", size))
		}
		return `{"cmd":["true"],"env":{` + b.String() + `}}`
	}

	cases := []sandboxCase{
		// POST /v1/sandboxes: the body is checked first; a valid one
		// finds no machines here.
		{name: "create_valid", req: create(`{"name":"web-1","memory_mib":1024,"vcpus":2,"disk_gib":8}`), status: 409, code: "sandboxes_disabled", golden: "sandboxes_disabled"},
		{name: "create_defaults", req: create(`{}`), status: 409, code: "sandboxes_disabled"},
		{name: "create_nulls", req: create(`{"name":null,"memory_mib":null}`), status: 409, code: "sandboxes_disabled"},
		{name: "create_bounds", req: create(`{"memory_mib":128,"vcpus":4,"disk_gib":64}`), status: 409, code: "sandboxes_disabled"},
		{name: "create_json_suffix", req: request{method: "POST", path: sandboxes, key: keyA, body: `{}`, header: map[string]string{"Content-Type": "application/vnd.api+json"}}, status: 409, code: "sandboxes_disabled"},
		{name: "create_unknown_field", req: create(`{"name":"a","memory":512}`), status: 400, code: "unknown_field"},
		{name: "create_field_case", req: create(`{"Name":"a"}`), status: 400, code: "unknown_field"},
		{name: "create_memory_string", req: create(`{"memory_mib":"512"}`), status: 400, code: "invalid_field"},
		{name: "create_memory_fraction", req: create(`{"memory_mib":512.5}`), status: 400, code: "invalid_field"},
		{name: "create_vcpus_bool", req: create(`{"vcpus":true}`), status: 400, code: "invalid_field"},
		{name: "create_name_number", req: create(`{"name":7}`), status: 400, code: "invalid_field"},
		{name: "create_memory_low", req: create(`{"memory_mib":127}`), status: 400, code: "invalid_field"},
		{name: "create_memory_high", req: create(`{"memory_mib":8193}`), status: 400, code: "invalid_field"},
		{name: "create_memory_huge", req: create(`{"memory_mib":99999999999999999999}`), status: 400, code: "invalid_field"},
		{name: "create_vcpus_zero", req: create(`{"vcpus":0}`), status: 400, code: "invalid_field"},
		{name: "create_vcpus_high", req: create(`{"vcpus":5}`), status: 400, code: "invalid_field"},
		{name: "create_disk_zero", req: create(`{"disk_gib":0}`), status: 400, code: "invalid_field"},
		{name: "create_disk_negative", req: create(`{"disk_gib":-4}`), status: 400, code: "invalid_field"},
		{name: "create_disk_high", req: create(`{"disk_gib":65}`), status: 400, code: "invalid_field"},
		{name: "create_name_empty", req: create(`{"name":""}`), status: 400, code: "invalid_field"},
		{name: "create_name_upper", req: create(`{"name":"Web"}`), status: 400, code: "invalid_field"},
		{name: "create_name_digit_first", req: create(`{"name":"1web"}`), status: 400, code: "invalid_field"},
		{name: "create_name_dash_first", req: create(`{"name":"-web"}`), status: 400, code: "invalid_field"},
		{name: "create_name_dash_last", req: create(`{"name":"web-"}`), status: 400, code: "invalid_field"},
		{name: "create_name_underscore", req: create(`{"name":"web_1"}`), status: 400, code: "invalid_field"},
		{name: "create_name_dot", req: create(`{"name":"web.1"}`), status: 400, code: "invalid_field"},
		{name: "create_name_space", req: create(`{"name":"web 1"}`), status: 400, code: "invalid_field"},
		{name: "create_name_unicode", req: create(`{"name":"wéb"}`), status: 400, code: "invalid_field"},
		{name: "create_name_64", req: create(`{"name":"` + strings.Repeat("a", 64) + `"}`), status: 400, code: "invalid_field"},
		{name: "create_name_63", req: create(`{"name":"` + strings.Repeat("a", 63) + `"}`), status: 409, code: "sandboxes_disabled"},
		{name: "create_fork_with_resources", req: create(`{"from":{"sandbox":"sb-a1","snapshot":"v1"},"memory_mib":512}`), status: 400, code: "invalid_field", field: "memory_mib"},
		// A well-formed fork: this host runs no microVMs, so it has no
		// snapshots to fork from, as it has no sandboxes to create.
		{name: "create_fork", req: create(`{"from":{"sandbox":"sb-a1","snapshot":"v1"}}`), status: 409, code: "sandboxes_disabled"},
		{name: "create_fork_named", req: create(`{"name":"web","from":{"sandbox":"sb-a1","snapshot":"auto-1"}}`), status: 409, code: "sandboxes_disabled"},
		{name: "create_fork_bad_snapshot", req: create(`{"from":{"sandbox":"sb-a1","snapshot":"v0"}}`), status: 400, code: "invalid_field"},
		{name: "create_fork_of_a_name", req: create(`{"from":{"sandbox":"sb-a1","snapshot":"after-build"}}`), status: 409, code: "sandboxes_disabled"},
		{name: "create_trailing_object", req: create(`{} {}`), status: 400, code: "invalid_json"},
		{name: "create_trailing_garbage", req: create(`{"vcpus":1}x`), status: 400, code: "invalid_json"},
		{name: "create_array", req: create(`[{}]`), status: 400, code: "invalid_json"},
		{name: "create_null", req: create(`null`), status: 400, code: "invalid_json"},
		{name: "create_malformed", req: create(`{"vcpus":`), status: 400, code: "invalid_json"},
		{name: "create_duplicate_key", req: create(`{"vcpus":1,"vcpus":2}`), status: 400, code: "invalid_json"},
		// Every field is optional, so no body at all is a create with
		// every default, as {} is (it was 400 invalid_json).
		{name: "create_no_body", req: request{method: "POST", path: sandboxes, key: keyA}, status: 409, code: "sandboxes_disabled"},
		{name: "create_no_body_json", req: request{method: "POST", path: sandboxes, key: keyA, header: map[string]string{"Content-Type": "application/json"}}, status: 409, code: "sandboxes_disabled"},
		{name: "create_whitespace_body", req: create(" "), status: 400, code: "invalid_json"},
		{name: "create_text_plain", req: request{method: "POST", path: sandboxes, key: keyA, body: `{}`, header: map[string]string{"Content-Type": "text/plain"}}, status: 415, code: "unsupported_media_type"},
		{name: "create_form", req: request{method: "POST", path: sandboxes, key: keyA, body: `name=a`, header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}}, status: 415, code: "unsupported_media_type"},
		// A create takes up to 2 MiB (the largest env), no more.
		{name: "create_17k", req: create(`{"name":"` + strings.Repeat("a", 17<<10) + `"}`), status: 400, code: "invalid_field", field: "name"},
		{name: "create_2m", req: create(`{"name":"` + strings.Repeat("a", 2<<20) + `"}`), status: 413, code: "body_too_large"},
		{name: "create_2m_chunked", req: request{method: "POST", path: sandboxes, key: keyA, body: `{"name":"` + strings.Repeat("a", 2<<20) + `"}`, header: map[string]string{"Transfer-Encoding": "chunked"}}, status: 413, code: "body_too_large"},
		{name: "create_env_and_labels", req: create(`{"env":{"CI":"1"},"labels":{"owner":"docs"}}`), status: 409, code: "sandboxes_disabled"},
		{name: "create_env_bad_name", req: create(`{"env":{"1CI":"1"}}`), status: 400, code: "invalid_field", field: "env"},
		{name: "create_label_bad_key", req: create(`{"labels":{"Owner":"docs"}}`), status: 400, code: "invalid_field", field: "labels"},
		{name: "create_name_like_an_id", req: create(`{"name":"sb-web"}`), status: 400, code: "invalid_field", field: "name"},
		{name: "create_fork_of_a_ref", req: create(`{"from":{"snapshot":"sn-0123456789abcdefghijklmn"}}`), status: 409, code: "sandboxes_disabled"},
		{name: "create_fork_without_sandbox", req: create(`{"from":{"snapshot":"v1"}}`), status: 400, code: "invalid_field", field: "from.sandbox"},
		{name: "create_query", req: request{method: "POST", path: sandboxes + "?name=a", key: keyA, body: `{}`}, status: 400, code: "query_not_allowed"},
		{name: "create_empty_query", req: request{method: "POST", path: sandboxes + "?", key: keyA, body: `{}`}, status: 400, code: "query_not_allowed"},
		{name: "create_token", req: create(`{}`), token: true, status: 403, code: "forbidden"},
		{name: "create_no_key", req: request{method: "POST", path: sandboxes, body: `{}`}, status: 401, code: "unauthorized"},

		// GET /v1/sandboxes: the CreateOS pagination, nothing else.
		{name: "list_limit_zero", req: list("?limit=0"), status: 400, code: "invalid_field"},
		{name: "list_limit_501", req: list("?limit=501"), status: 400, code: "invalid_field"},
		{name: "list_limit_negative", req: list("?limit=-1"), status: 400, code: "invalid_field"},
		{name: "list_limit_word", req: list("?limit=ten"), status: 400, code: "invalid_field"},
		{name: "list_limit_empty", req: list("?limit="), status: 400, code: "invalid_field"},
		{name: "list_offset_negative", req: list("?offset=-1"), status: 400, code: "invalid_field"},
		{name: "list_offset_fraction", req: list("?offset=1.5"), status: 400, code: "invalid_field"},
		{name: "list_offset_huge", req: list("?offset=99999999999999999999"), status: 400, code: "invalid_field"},
		{name: "list_other_parameter", req: list("?foo=1"), status: 400, code: "invalid_field"},
		{name: "list_parameter_case", req: list("?Limit=5"), status: 400, code: "invalid_field"},
		{name: "list_limit_twice", req: list("?limit=1&limit=2"), status: 400, code: "invalid_field"},
		{name: "list_offset_twice", req: list("?offset=0&offset=0"), status: 400, code: "invalid_field"},
		{name: "list_body", req: request{method: "GET", path: sandboxes, key: keyA, body: `{}`}, status: 400, code: "body_not_allowed"},
		{name: "list_token", req: list(""), token: true, status: 403, code: "forbidden"},
		{name: "list_no_key", req: request{method: "GET", path: sandboxes}, status: 401, code: "unauthorized"},

		// POST /v1/sandboxes/{id}/exec: the body is checked before the
		// sandbox's state (sb-paused would answer 409 to a good one).
		{name: "exec_paused", req: exec("sb-paused", `{"cmd":["true"]}`), status: 409, code: "sandbox_not_running", state: "paused", golden: "sandboxes_exec_not_running"},
		{name: "exec_stopped", req: exec("sb-stopped", `{"cmd":["ls","-l"],"cwd":"/tmp","env":{"A":"b"},"stdin":"x","timeout_s":3600,"encoding":"base64"}`), status: 409, code: "sandbox_not_running", state: "stopped"},
		{name: "exec_no_cmd", req: exec("sb-paused", `{"cwd":"/"}`), status: 400, code: "invalid_field"},
		{name: "exec_null_cmd", req: exec("sb-paused", `{"cmd":null}`), status: 400, code: "invalid_field"},
		{name: "exec_empty_cmd", req: exec("sb-paused", `{"cmd":[]}`), status: 400, code: "invalid_field"},
		{name: "exec_cmd_string", req: exec("sb-paused", `{"cmd":"ls -l"}`), status: 400, code: "invalid_field"},
		{name: "exec_cmd_number", req: exec("sb-paused", `{"cmd":["ls",1]}`), status: 400, code: "invalid_field"},
		{name: "exec_cmd_nul", req: exec("sb-paused", `{"cmd":["ls","a\u0000b"]}`), status: 400, code: "invalid_field"},
		{name: "exec_256_args", req: exec("sb-paused", `{"cmd":[`+many(256, `"a"`)+`]}`), status: 409, code: "sandbox_not_running", state: "paused"},
		{name: "exec_257_args", req: exec("sb-paused", `{"cmd":[`+many(257, `"a"`)+`]}`), status: 400, code: "invalid_field"},
		{name: "exec_cmd_over_64k", req: exec("sb-paused", `{"cmd":["`+strings.Repeat("a", 64<<10)+`","b"]}`), status: 400, code: "invalid_field"},
		{name: "exec_timeout_zero", req: exec("sb-paused", `{"cmd":["true"],"timeout_s":0}`), status: 400, code: "invalid_field"},
		{name: "exec_timeout_high", req: exec("sb-paused", `{"cmd":["true"],"timeout_s":3601}`), status: 400, code: "invalid_field"},
		{name: "exec_timeout_string", req: exec("sb-paused", `{"cmd":["true"],"timeout_s":"60"}`), status: 400, code: "invalid_field"},
		{name: "exec_timeout_fraction", req: exec("sb-paused", `{"cmd":["true"],"timeout_s":1.5}`), status: 400, code: "invalid_field"},
		{name: "exec_encoding", req: exec("sb-paused", `{"cmd":["true"],"encoding":"latin1"}`), status: 400, code: "invalid_field"},
		{name: "exec_encoding_case", req: exec("sb-paused", `{"cmd":["true"],"encoding":"UTF-8"}`), status: 400, code: "invalid_field"},
		{name: "exec_cwd_relative", req: exec("sb-paused", `{"cmd":["true"],"cwd":"tmp"}`), status: 400, code: "invalid_field"},
		{name: "exec_env_65", req: exec("sb-paused", env(65, 1)), status: 400, code: "invalid_field"},
		{name: "exec_env_64", req: exec("sb-paused", env(64, 1)), status: 409, code: "sandbox_not_running", state: "paused"},
		{name: "exec_env_entry_over_4k", req: exec("sb-paused", env(1, 4<<10)), status: 400, code: "invalid_field"},
		{name: "exec_env_key_equals", req: exec("sb-paused", `{"cmd":["true"],"env":{"A=B":"c"}}`), status: 400, code: "invalid_field"},
		{name: "exec_env_not_object", req: exec("sb-paused", `{"cmd":["true"],"env":["A=b"]}`), status: 400, code: "invalid_field"},
		{name: "exec_stdin_over_1m", req: exec("sb-paused", `{"cmd":["cat"],"stdin":"`+strings.Repeat("x", 1<<20+1)+`"}`), status: 400, code: "invalid_field"},
		{name: "exec_unknown_field", req: exec("sb-paused", `{"cmd":["true"],"shell":true}`), status: 400, code: "unknown_field"},
		{name: "exec_trailing", req: exec("sb-paused", `{"cmd":["true"]}{}`), status: 400, code: "invalid_json"},
		{name: "exec_no_body", req: request{method: "POST", path: sandboxes + "/sb-paused/exec", key: keyA}, status: 400, code: "invalid_json"},
		{name: "exec_9m", req: exec("sb-paused", `{"cmd":["cat"],"stdin":"`+strings.Repeat("x", 9<<20)+`"}`), status: 413, code: "body_too_large"},
		{name: "exec_9m_chunked", req: request{method: "POST", path: sandboxes + "/sb-paused/exec", key: keyA, body: `{"cmd":["cat"],"stdin":"` + strings.Repeat("x", 9<<20) + `"}`, header: map[string]string{"Transfer-Encoding": "chunked"}}, status: 413, code: "body_too_large"},
		{name: "exec_text_plain", req: request{method: "POST", path: sandboxes + "/sb-paused/exec", key: keyA, body: `{"cmd":["true"]}`, header: map[string]string{"Content-Type": "text/plain"}}, status: 415, code: "unsupported_media_type"},
		{name: "exec_query", req: request{method: "POST", path: sandboxes + "/sb-paused/exec?timeout_s=5", key: keyA, body: `{"cmd":["true"]}`}, status: 400, code: "query_not_allowed"},
		{name: "exec_unknown_sandbox", req: exec("sb-nope", `{"cmd":["true"]}`), status: 404, code: "sandbox_not_found"},
		{name: "exec_other_account", req: exec("sb-b1", `{"cmd":["true"]}`), status: 404, code: "sandbox_not_found"},
		{name: "exec_token_of_other_sandbox", req: exec("sb-paused", `{"cmd":["true"]}`), token: true, status: 403, code: "forbidden", message: "this access token acts only on its own sandbox"},
		// A token without the exec scope (a default one) may not exec,
		// even in its own sandbox (it reached the guest).
		{name: "exec_token", req: exec("sb-a1", `{"cmd":["true"]}`), token: true, status: 403, code: "forbidden", scope: "exec", message: "this credential lacks the exec scope, which this call needs"},

		// Lifecycle of a configured sandbox: its guest runs elsewhere.
		{name: "pause_configured", req: lifecycle("POST", "/sb-a1/pause"), status: 409, code: "sandbox_not_a_vm", golden: "sandboxes_not_a_vm"},
		{name: "resume_configured", req: lifecycle("POST", "/sb-paused/resume"), status: 409, code: "sandbox_not_a_vm"},
		{name: "stop_configured", req: lifecycle("POST", "/sb-a1/stop"), status: 409, code: "sandbox_not_a_vm"},
		{name: "start_configured", req: lifecycle("POST", "/sb-stopped/start"), status: 409, code: "sandbox_not_a_vm"},
		{name: "delete_configured", req: lifecycle("DELETE", "/sb-a1"), status: 409, code: "sandbox_not_a_vm"},
		// Account keys only on every lifecycle route, as for create and
		// list: a token is refused before the sandbox is looked at (pause,
		// resume, stop and start were sandbox_not_a_vm here, get answered
		// the record), also for a sandbox that does not exist, with the
		// table's one sentence.
		{name: "delete_token", req: lifecycle("DELETE", "/sb-a1"), token: true, status: 403, code: "forbidden"},
		{name: "pause_token", req: lifecycle("POST", "/sb-a1/pause"), token: true, status: 403, code: "forbidden"},
		{name: "resume_token", req: lifecycle("POST", "/sb-a1/resume"), token: true, status: 403, code: "forbidden"},
		{name: "stop_token", req: lifecycle("POST", "/sb-a1/stop"), token: true, status: 403, code: "forbidden"},
		{name: "start_token", req: lifecycle("POST", "/sb-a1/start"), token: true, status: 403, code: "forbidden"},
		{name: "get_token", req: lifecycle("GET", "/sb-a1"), token: true, status: 403, code: "forbidden"},
		{name: "get_token_unknown_sandbox", req: lifecycle("GET", "/sb-nope"), token: true, status: 403, code: "forbidden"},
		{name: "delete_token_other_account", req: lifecycle("DELETE", "/sb-b1"), token: true, status: 403, code: "forbidden"},
		{name: "pause_unknown", req: lifecycle("POST", "/sb-nope/pause"), status: 404, code: "sandbox_not_found"},
		{name: "stop_other_account", req: lifecycle("POST", "/sb-b1/stop"), status: 404, code: "sandbox_not_found"},
		{name: "pause_query", req: lifecycle("POST", "/sb-a1/pause?now=1"), status: 400, code: "query_not_allowed"},
		{name: "stop_body", req: request{method: "POST", path: sandboxes + "/sb-a1/stop", key: keyA, body: `{"force":true}`}, status: 400, code: "body_not_allowed"},
		// VM snapshots: only of a microVM sandbox; tokens may create,
		// list and read them (of their own sandbox), nothing more.
		{name: "snapshot_create_configured", req: request{method: "POST", path: sandboxes + "/sb-a1/snapshots", key: keyA, body: `{}`}, status: 409, code: "sandbox_not_a_vm"},
		{name: "snapshot_list_configured", req: lifecycle("GET", "/sb-a1/snapshots"), status: 409, code: "sandbox_not_a_vm"},
		{name: "snapshot_list_token", req: lifecycle("GET", "/sb-a1/snapshots"), token: true, status: 409, code: "sandbox_not_a_vm"},
		{name: "snapshot_get_token_other_sandbox", req: lifecycle("GET", "/sb-paused/snapshots/v1"), token: true, status: 403, code: "forbidden", message: "this access token acts only on its own sandbox"},
		{name: "snapshot_restore_token", req: lifecycle("POST", "/sb-a1/snapshots/v1/restore"), token: true, status: 403, code: "forbidden"},
		{name: "snapshot_delete_token", req: lifecycle("DELETE", "/sb-a1/snapshots/v1"), token: true, status: 403, code: "forbidden"},
		{name: "snapshot_pin_token", req: lifecycle("POST", "/sb-a1/snapshots/v1/pin"), token: true, status: 403, code: "forbidden"},
		// Retention deletes snapshots: a token may create one without it
		// only (the configured sandbox is refused after that check).
		{name: "snapshot_create_retention_token", req: request{method: "POST", path: sandboxes + "/sb-a1/snapshots", key: keyA, body: `{"retention":{"mode":"delete_oldest","max_count":3}}`}, token: true, status: 403, code: "forbidden"},
		{name: "snapshot_create_token", req: request{method: "POST", path: sandboxes + "/sb-a1/snapshots", key: keyA, body: `{}`}, token: true, status: 409, code: "sandbox_not_a_vm"},
		// The access setting: account keys only, microVMs only.
		{name: "access_token", req: request{method: "PUT", path: sandboxes + "/sb-a1/access", key: keyA, body: `"none"`}, token: true, status: 403, code: "forbidden"},
		{name: "access_configured", req: request{method: "PUT", path: sandboxes + "/sb-a1/access", key: keyA, body: `"none"`}, status: 409, code: "sandbox_not_a_vm"},
		{name: "access_bad", req: request{method: "PUT", path: sandboxes + "/sb-a1/access", key: keyA, body: `"all"`}, status: 400, code: "invalid_field"},
		{name: "access_unknown_scope", req: request{method: "PUT", path: sandboxes + "/sb-a1/access", key: keyA, body: `{"scopes":["root"]}`}, status: 400, code: "invalid_field", field: "scopes"},
		{name: "access_unknown_field", req: request{method: "PUT", path: sandboxes + "/sb-a1/access", key: keyA, body: `{"scopes":["exec"],"none":true}`}, status: 400, code: "unknown_field"},
		{name: "access_other_account", req: request{method: "PUT", path: sandboxes + "/sb-b1/access", key: keyA, body: `"none"`}, status: 404, code: "sandbox_not_found"},
		{name: "create_access_bad", req: create(`{"access":"all"}`), status: 400, code: "invalid_field", field: "access"},
		{name: "create_access_unknown_scope", req: create(`{"access":{"scopes":["checkpoints","root"]}}`), status: 400, code: "invalid_field", field: "access.scopes"},
		{name: "create_access_none", req: create(`{"access":"none"}`), status: 409, code: "sandboxes_disabled"},
		{name: "create_access_scopes", req: create(`{"access":{"scopes":["exec","files"]}}`), status: 409, code: "sandboxes_disabled"},
		{name: "snapshot_fork_access_bad", req: request{method: "POST", path: sandboxes + "/sb-a1/snapshots/v1/fork", key: keyA, body: `{"count":1,"access":{"scopes":[]}}`}, status: 400, code: "invalid_field", field: "access.scopes"},
		{name: "snapshot_fork_token", req: request{method: "POST", path: sandboxes + "/sb-a1/snapshots/v1/fork", key: keyA, body: `{"count":2}`}, token: true, status: 403, code: "forbidden"},
		{name: "snapshot_create_bad_comment", req: request{method: "POST", path: sandboxes + "/sb-a1/snapshots", key: keyA, body: `{"comment":"` + strings.Repeat("c", 257) + `"}`}, status: 400, code: "invalid_field"},
		{name: "snapshot_create_bad_retention", req: request{method: "POST", path: sandboxes + "/sb-a1/snapshots", key: keyA, body: `{"retention":{"mode":"delete_oldest","max_count":0}}`}, status: 400, code: "invalid_field"},
		{name: "snapshot_fork_bad_key", req: request{method: "POST", path: sandboxes + "/sb-a1/snapshots/v1/fork", key: keyA, body: `{"count":2}`, more: http.Header{"Idempotency-Key": {"k1", "k2"}}}, status: 400, code: "invalid_field", field: "Idempotency-Key"},
		{name: "snapshot_fork_bad_count", req: request{method: "POST", path: sandboxes + "/sb-a1/snapshots/v1/fork", key: keyA, body: `{"count":101}`}, status: 400, code: "invalid_field", field: "count"},
		{name: "snapshot_fork_configured", req: request{method: "POST", path: sandboxes + "/sb-a1/snapshots/v1/fork", key: keyA, body: `{"count":2}`}, status: 409, code: "sandbox_not_a_vm"},
		{name: "snapshot_unknown_sandbox", req: lifecycle("GET", "/sb-nope/snapshots"), status: 404, code: "sandbox_not_found"},
		{name: "snapshot_other_account", req: lifecycle("GET", "/sb-b1/snapshots/v1"), status: 404, code: "sandbox_not_found"},
		{name: "get_configured", req: lifecycle("GET", "/sb-paused"), status: 200, state: "paused"},
		{name: "get_query", req: lifecycle("GET", "/sb-a1?x=1"), status: 400, code: "invalid_field"},

		// Methods the routes do not have.
		{name: "method_put_sandboxes", req: lifecycle("PUT", ""), status: 405, code: "method_not_allowed"},
		{name: "method_delete_sandboxes", req: lifecycle("DELETE", ""), status: 405, code: "method_not_allowed"},
		{name: "method_patch_sandbox", req: lifecycle("PATCH", "/sb-a1"), status: 405, code: "method_not_allowed"},
		{name: "method_get_pause", req: lifecycle("GET", "/sb-a1/pause"), status: 405, code: "method_not_allowed"},
		{name: "method_get_exec", req: lifecycle("GET", "/sb-a1/exec"), status: 405, code: "method_not_allowed"},
		{name: "method_options_exec", req: lifecycle("OPTIONS", "/sb-a1/exec"), status: 405, code: "method_not_allowed"},
	}
	return cases
}

// TestSandboxRoutesWithoutVMs checks each refusal of the sandbox routes
// on a hostproxy that runs no microVMs: status, code, the JSend shape,
// data.state where the contract names it, and that nothing reached a
// guest.
func TestSandboxRoutesWithoutVMs(t *testing.T) {
	s := startStack(t, nil)
	token := s.issueToken(keyA, "sb-a1")
	for _, tc := range sandboxCases() {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			if tc.token {
				req.key = token
			}
			before := s.guests["sb-a1"].Requests()
			rep := s.do(req)
			code := checkJSend(t, rep)
			if rep.status != tc.status || code != tc.code {
				t.Fatalf("got %d %q, want %d %q: %.300s", rep.status, code, tc.status, tc.code, rep.body)
			}
			var env struct {
				Data struct{ State, Field, Message, Scope string }
			}
			if err := json.Unmarshal(rep.body, &env); err != nil {
				t.Fatal(err)
			}
			if tc.state != "" && env.Data.State != tc.state {
				t.Errorf("data.state %q, want %q: %s", env.Data.State, tc.state, rep.body)
			}
			if tc.field != "" && env.Data.Field != tc.field {
				t.Errorf("data.field %q, want %q: %s", env.Data.Field, tc.field, rep.body)
			}
			if tc.message != "" && env.Data.Message != tc.message {
				t.Errorf("message %q, want %q", env.Data.Message, tc.message)
			}
			if tc.token && tc.status == 403 && tc.message == "" && env.Data.Message != "this call needs an account API key" {
				t.Errorf("message %q, want the one refusal of tokens on account routes", env.Data.Message)
			}
			if env.Data.Scope != tc.scope {
				t.Errorf("data.scope %q, want %q", env.Data.Scope, tc.scope)
			}
			if tc.status == 405 && rep.header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
			if s.guests["sb-a1"].Requests() != before {
				t.Error("the request reached a guest")
			}
			if tc.golden != "" {
				checkGolden(t, tc.golden, rep)
			}
		})
	}
}

// TestExecBodyCheckedAtTheEdge sends every bad exec body of
// sandboxCases to a running sandbox: each is refused as on a paused one,
// and none reaches its guest.
func TestExecBodyCheckedAtTheEdge(t *testing.T) {
	s := startStack(t, nil)
	for _, tc := range sandboxCases() {
		if !strings.HasPrefix(tc.req.path, sandboxes+"/sb-paused/exec") || tc.status == 409 || tc.token {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.path = strings.Replace(req.path, "/sb-paused/", "/sb-a1/", 1)
			before := s.guests["sb-a1"].Requests()
			rep := s.do(req)
			if code := checkJSend(t, rep); rep.status != tc.status || code != tc.code {
				t.Errorf("got %d %q, want %d %q: %.300s", rep.status, code, tc.status, tc.code, rep.body)
			}
			if s.guests["sb-a1"].Requests() != before {
				t.Error("a refused body reached the guest")
			}
		})
	}
}

// TestListSandboxesPages pages through account A's configured sandboxes:
// the CreateOS list shape, oldest first (ids for equal times), and only
// the account's own.
func TestListSandboxesPages(t *testing.T) {
	s := startStack(t, nil)
	all := []string{"sb-a1", "sb-a2", "sb-dead", "sb-paused", "sb-stopped"}
	cases := []struct {
		name, query   string
		key           string
		ids           []string
		limit, offset int
		total         int
	}{
		{"default", "", keyA, all, 50, 0, 5},
		{"first_two", "?limit=2", keyA, all[:2], 2, 0, 5},
		{"middle", "?limit=2&offset=2", keyA, all[2:4], 2, 2, 5},
		{"offset_first", "?offset=4&limit=2", keyA, all[4:], 2, 4, 5},
		{"past_the_end", "?offset=5", keyA, []string{}, 50, 5, 5},
		{"far_past_the_end", "?offset=1000000", keyA, []string{}, 50, 1000000, 5},
		{"max_limit", "?limit=500", keyA, all, 500, 0, 5},
		{"leading_zeros", "?limit=002&offset=01", keyA, all[1:3], 2, 1, 5},
		{"other_account", "", keyB, []string{"sb-b1"}, 50, 0, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep := s.do(request{method: "GET", path: sandboxes + tc.query, key: tc.key})
			if code := checkJSend(t, rep); rep.status != 200 {
				t.Fatalf("status %d %s: %s", rep.status, code, rep.body)
			}
			// Exactly the documented keys, at both levels.
			var env struct {
				Data map[string]json.RawMessage
			}
			if err := json.Unmarshal(rep.body, &env); err != nil || len(env.Data) != 2 || env.Data["data"] == nil || env.Data["pagination"] == nil {
				t.Fatalf("data is not {data, pagination}: %s", rep.body)
			}
			var page []map[string]any
			var pg map[string]int
			if err := json.Unmarshal(env.Data["data"], &page); err != nil || page == nil {
				t.Fatalf("data.data is not an array: %s", env.Data["data"])
			}
			if err := json.Unmarshal(env.Data["pagination"], &pg); err != nil || len(pg) != 4 {
				t.Fatalf("pagination is not {total, limit, offset, count}: %s", env.Data["pagination"])
			}
			want := map[string]int{"total": tc.total, "limit": tc.limit, "offset": tc.offset, "count": len(tc.ids)}
			for k, v := range want {
				if got, ok := pg[k]; !ok || got != v {
					t.Errorf("pagination.%s = %d (present %v), want %d", k, got, ok, v)
				}
			}
			var ids []string
			for _, sb := range page {
				ids = append(ids, fmt.Sprint(sb["id"]))
			}
			if strings.Join(ids, ",") != strings.Join(tc.ids, ",") {
				t.Errorf("ids %v, want %v", ids, tc.ids)
			}
		})
	}
	checkGolden(t, "sandboxes_list_page", s.do(request{method: "GET", path: sandboxes + "?limit=2&offset=2", key: keyA}))
}

// createStatuses and execStatuses are the statuses, with their codes, that
// a body alone can provoke on a hostproxy without machines (create) and on
// a paused sandbox (exec): what the contract documents for these routes.
var (
	createStatuses = map[int][]string{
		400: {"invalid_json", "unknown_field", "invalid_field"},
		409: {"sandboxes_disabled"},
		413: {"body_too_large"},
	}
	execStatuses = map[int][]string{
		400: {"invalid_json", "unknown_field", "invalid_field"},
		409: {"sandbox_not_running"},
		413: {"body_too_large"},
	}
)

// fuzzHandler is the real handler of a hostproxy over the test stack's
// configuration, with a rate limit no fuzzer reaches. Guests are never
// dialled: create has no machines, exec goes to a paused sandbox.
func fuzzHandler(f *testing.F) http.Handler {
	f.Helper()
	cfg := baseConfig(f.TempDir())
	for i := range cfg.Sandboxes {
		if cfg.Sandboxes[i].Guest == "" {
			cfg.Sandboxes[i].Guest = "unix:///nonexistent/" + cfg.Sandboxes[i].ID + ".sock"
		}
	}
	cfg.RateLimit = hostproxy.RateLimit{PerSecond: 1e9, Burst: 1 << 30}
	srv, err := hostproxy.New(f.Context(), hostproxy.Options{
		Config: cfg,
		Logger: slog.New(slog.DiscardHandler),
		Now:    func() time.Time { return fixedNow },
		Rand:   rand.NewChaCha8([32]byte{'f', 'u', 'z', 'z'}),
	})
	if err != nil {
		f.Fatalf("hostproxy.New: %v", err)
	}
	f.Cleanup(func() { srv.Close() })
	return srv.Handler()
}

// checkBodyAnswer sends body to path through h and checks the answer: JSON
// in the JSend envelope of its status, a status and code of allowed, never
// a 5xx.
func checkBodyAnswer(t *testing.T, h http.Handler, path string, body []byte, allowed map[int][]string) {
	t.Helper()
	r := httptest.NewRequest("POST", path, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Api-Key", keyA)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	resp := w.Result()
	b, _ := io.ReadAll(resp.Body)
	rep := reply{status: resp.StatusCode, header: resp.Header, body: b}
	if rep.status >= 500 {
		t.Fatalf("%d on body %q: %s", rep.status, body, b)
	}
	code := checkJSend(t, rep)
	codes, ok := allowed[rep.status]
	if !ok {
		t.Fatalf("status %d (%s) is not one the contract documents here; body %q", rep.status, b, body)
	}
	for _, c := range codes {
		if c == code {
			return
		}
	}
	t.Fatalf("%d with code %q, want one of %v; body %q", rep.status, code, codes, body)
}

// FuzzCreateSandboxBody sends any body to POST /v1/sandboxes through the
// real handler: the answer is always a JSend envelope with a documented
// status and code, never a 5xx.
func FuzzCreateSandboxBody(f *testing.F) {
	for _, tc := range sandboxCases() {
		if tc.req.path == sandboxes && tc.req.method == "POST" && !tc.token && tc.req.key != "" {
			f.Add([]byte(tc.req.body))
		}
	}
	f.Add([]byte(`{"from":{"sandbox":"sb-a1","snapshot":"v1"}}`))
	f.Add([]byte(`{"name":"a","from":{"sandbox":"sb-a1","snapshot":"auto-1"}}`))
	f.Add([]byte("{\"name\":\"a\xff\"}"))
	f.Add([]byte(`{"name":"\ud800"}`))
	f.Add([]byte(`{"memory_mib":1e3}`))
	f.Add([]byte(`{"memory_mib":-0}`))
	h := fuzzHandler(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		checkBodyAnswer(t, h, sandboxes, body, createStatuses)
	})
}

// FuzzExecBody sends any body to POST /v1/sandboxes/sb-paused/exec through
// the real handler: a bad body is refused for itself (400, 413), a good
// one for the sandbox's state (409), never anything else.
func FuzzExecBody(f *testing.F) {
	for _, tc := range sandboxCases() {
		if strings.HasSuffix(tc.req.path, "/exec") && tc.req.method == "POST" && len(tc.req.body) < 1<<16 {
			f.Add([]byte(tc.req.body))
		}
	}
	f.Add([]byte(`{"cmd":["sh","-c","echo hi"],"env":{"":"x"}}`))
	f.Add([]byte(`{"cmd":["true"],"env":{}}`))
	f.Add([]byte(`{"cmd":["true"],"stdin":null,"cwd":null}`))
	f.Add([]byte(`{"cmd":["true"],"timeout_s":1e2}`))
	f.Add([]byte(`{"cmd":["true"],"env":{"A":"\u0000"}}`))
	h := fuzzHandler(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		checkBodyAnswer(t, h, sandboxes+"/sb-paused/exec", body, execStatuses)
	})
}
