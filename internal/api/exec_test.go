package api

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"strata/internal/fault"
)

// execCodes are the codes ParseExec may fail with, and their kinds.
var execCodes = map[string]fault.Kind{
	"invalid_json": fault.Invalid, "unknown_field": fault.Invalid, "invalid_field": fault.Invalid,
	"body_too_large": fault.TooLarge,
}

// checkExecLimits fails unless req keeps every rule of the contract, with
// its defaults filled in.
func checkExecLimits(t *testing.T, req ExecRequest) {
	t.Helper()
	if len(req.Cmd) < 1 || len(req.Cmd) > 256 {
		t.Fatalf("accepted %d strings in cmd", len(req.Cmd))
	}
	total := 0
	for _, s := range req.Cmd {
		total += len(s)
		if strings.Contains(s, "\x00") {
			t.Fatalf("accepted a NUL in cmd %q", req.Cmd)
		}
	}
	if total > 64<<10 {
		t.Fatalf("accepted %d bytes of cmd", total)
	}
	if !strings.HasPrefix(req.Cwd, "/") || strings.Contains(req.Cwd, "\x00") {
		t.Fatalf("accepted cwd %q", req.Cwd)
	}
	if req.Env != nil && len(req.Env) == 0 || len(req.Env) > 64 {
		t.Fatalf("accepted env of %d entries (nil %v)", len(req.Env), req.Env == nil)
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(v, "\x00") || len(k)+len(v) > 4<<10 {
			t.Fatalf("accepted env entry %q=%q", k, v)
		}
	}
	if len(req.Stdin) > 1<<20 {
		t.Fatalf("accepted %d bytes of stdin", len(req.Stdin))
	}
	if req.TimeoutS < 1 || req.TimeoutS > 3600 {
		t.Fatalf("accepted timeout_s %d", req.TimeoutS)
	}
	if req.Encoding != "utf-8" && req.Encoding != "base64" {
		t.Fatalf("accepted encoding %q", req.Encoding)
	}
}

// FuzzParseExec checks ParseExec on any body: it never panics; it fails
// only with the codes of a malformed request; what it accepts keeps every
// limit of the contract with its defaults filled in, and, marshalled
// again, parses to the same value.
func FuzzParseExec(f *testing.F) {
	for _, seed := range []string{
		`{"cmd":["echo","hi"]}`,
		`{"cmd":["sh","-c","exit 3"],"cwd":"/tmp","env":{"A":"1"},"stdin":"x","timeout_s":5,"encoding":"base64"}`,
		`{"cmd":[]}`, `{"cmd":null}`, `{}`, `{"cmd":"echo"}`, `{"cmd":[1]}`,
		`{"cmd":["a\u0000b"]}`, `{"cmd":["ls"],"cwd":"tmp"}`, `{"cmd":["ls"],"cwd":""}`,
		`{"cmd":["ls"],"env":{"":"x"}}`, `{"cmd":["ls"],"env":{"A=B":"x"}}`, `{"cmd":["ls"],"env":{"A":"\u0000"}}`,
		`{"cmd":["ls"],"env":{}}`, `{"cmd":["ls"],"env":null}`, `{"cmd":["ls"],"stdin":null}`,
		`{"cmd":["ls"],"timeout_s":0}`, `{"cmd":["ls"],"timeout_s":3601}`, `{"cmd":["ls"],"timeout_s":1.5}`,
		`{"cmd":["ls"],"encoding":"UTF-8"}`, `{"cmd":["ls"],"encoding":""}`, `{"cmd":["ls"],"Cmd":["x"]}`,
		`{"cmd":["ls"],"shell":true}`, `{"cmd":["ls"]} {}`, `{"cmd":["ls"],"cmd":["rm"]}`,
		`{"cmd":["\ud800"]}`, "{\"cmd\":[\"\xff\"]}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseExec(body)
		if err != nil {
			fe := fault.As(err)
			if fe == nil {
				t.Fatalf("unclassified error %v", err)
			}
			if kind, ok := execCodes[fe.Code]; !ok || kind != fe.Kind {
				t.Fatalf("code %q kind %v", fe.Code, fe.Kind)
			}
			if fe.Code == "invalid_field" && fe.Fields["field"] == nil {
				t.Fatalf("invalid_field names no field: %v", err)
			}
			return
		}
		if len(body) > MaxExecBody {
			t.Fatalf("accepted a %d-byte body", len(body))
		}
		checkExecLimits(t, req)
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		round, err := ParseExec(again)
		if err != nil {
			t.Fatalf("re-encoded %s refused: %v", again, err)
		}
		if !reflect.DeepEqual(req, round) {
			t.Fatalf("round trip changed %+v into %+v", req, round)
		}
	})
}

// TestParseExec names each rule of the exec body, accepted at its limit
// and refused just past it.
func TestParseExec(t *testing.T) {
	args := func(n, size int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = strings.Repeat("a", size)
		}
		b, _ := json.Marshal(s)
		return string(b)
	}
	env := func(n, keyLen, valueLen int) string {
		m := map[string]string{}
		for i := range n {
			k := fmt.Sprintf("K%0*d", keyLen-1, i)
			m[k] = strings.Repeat("v", valueLen)
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	tests := []struct {
		name, body string
		code       string // "" when accepted
		field      string
		want       *ExecRequest // when accepted and not nil: the value expected
	}{
		{name: "defaults", body: `{"cmd":["echo","hi"]}`,
			want: &ExecRequest{Cmd: []string{"echo", "hi"}, Cwd: "/", TimeoutS: 60, Encoding: "utf-8"}},
		{name: "every field", body: `{"cmd":["sh","-c","cat"],"cwd":"/tmp","env":{"A":"1","B":""},"stdin":"in","timeout_s":5,"encoding":"base64"}`,
			want: &ExecRequest{Cmd: []string{"sh", "-c", "cat"}, Cwd: "/tmp", Env: map[string]string{"A": "1", "B": ""}, Stdin: "in", TimeoutS: 5, Encoding: "base64"}},
		{name: "nulls are left out", body: `{"cmd":["ls"],"cwd":null,"env":null,"stdin":null,"timeout_s":null,"encoding":null}`,
			want: &ExecRequest{Cmd: []string{"ls"}, Cwd: "/", TimeoutS: 60, Encoding: "utf-8"}},
		{name: "empty env is nil", body: `{"cmd":["ls"],"env":{}}`,
			want: &ExecRequest{Cmd: []string{"ls"}, Cwd: "/", TimeoutS: 60, Encoding: "utf-8"}},
		{name: "empty program is the guest's to refuse", body: `{"cmd":[""]}`},
		{name: "NUL in stdin", body: `{"cmd":["cat"],"stdin":"a\u0000b"}`},

		{name: "cmd missing", body: `{}`, code: "invalid_field", field: "cmd"},
		{name: "cmd null", body: `{"cmd":null}`, code: "invalid_field", field: "cmd"},
		{name: "cmd empty", body: `{"cmd":[]}`, code: "invalid_field", field: "cmd"},
		{name: "cmd a string", body: `{"cmd":"echo hi"}`, code: "invalid_field", field: "cmd"},
		{name: "cmd of numbers", body: `{"cmd":[1]}`, code: "invalid_field", field: "cmd"},
		{name: "256 strings", body: `{"cmd":` + args(256, 1) + `}`},
		{name: "257 strings", body: `{"cmd":` + args(257, 1) + `}`, code: "invalid_field", field: "cmd"},
		{name: "64 KiB of cmd", body: `{"cmd":` + args(64, 1024) + `}`},
		{name: "64 KiB and a byte of cmd", body: `{"cmd":["a",` + args(64, 1024)[1:] + `}`, code: "invalid_field", field: "cmd"},
		{name: "NUL in cmd", body: `{"cmd":["echo","a\u0000b"]}`, code: "invalid_field", field: "cmd"},

		{name: "cwd relative", body: `{"cmd":["ls"],"cwd":"tmp"}`, code: "invalid_field", field: "cwd"},
		{name: "cwd empty", body: `{"cmd":["ls"],"cwd":""}`, code: "invalid_field", field: "cwd"},
		{name: "NUL in cwd", body: `{"cmd":["ls"],"cwd":"/tmp\u0000"}`, code: "invalid_field", field: "cwd"},
		{name: "cwd a number", body: `{"cmd":["ls"],"cwd":1}`, code: "invalid_field", field: "cwd"},

		{name: "64 env entries", body: `{"cmd":["ls"],"env":` + env(64, 4, 1) + `}`},
		{name: "65 env entries", body: `{"cmd":["ls"],"env":` + env(65, 4, 1) + `}`, code: "invalid_field", field: "env"},
		{name: "4 KiB env entry", body: `{"cmd":["ls"],"env":` + env(1, 96, 4000) + `}`},
		{name: "4 KiB and a byte env entry", body: `{"cmd":["ls"],"env":` + env(1, 97, 4000) + `}`, code: "invalid_field", field: "env"},
		{name: "empty env key", body: `{"cmd":["ls"],"env":{"":"x"}}`, code: "invalid_field", field: "env"},
		{name: "= in env key", body: `{"cmd":["ls"],"env":{"A=B":"x"}}`, code: "invalid_field", field: "env"},
		{name: "NUL in env key", body: `{"cmd":["ls"],"env":{"A\u0000":"x"}}`, code: "invalid_field", field: "env"},
		{name: "NUL in env value", body: `{"cmd":["ls"],"env":{"A":"x\u0000"}}`, code: "invalid_field", field: "env"},
		{name: "= in env value", body: `{"cmd":["ls"],"env":{"A":"b=c"}}`},
		{name: "env value a number", body: `{"cmd":["ls"],"env":{"A":1}}`, code: "invalid_field", field: "env"},
		{name: "env an array", body: `{"cmd":["ls"],"env":["A=1"]}`, code: "invalid_field", field: "env"},

		{name: "1 MiB of stdin", body: `{"cmd":["cat"],"stdin":"` + strings.Repeat("s", 1<<20) + `"}`},
		{name: "1 MiB and a byte of stdin", body: `{"cmd":["cat"],"stdin":"` + strings.Repeat("s", 1<<20+1) + `"}`, code: "invalid_field", field: "stdin"},
		{name: "1 MiB of stdin, every byte escaped", body: `{"cmd":["cat"],"stdin":"` + strings.Repeat(`\u003c`, 1<<20) + `"}`},

		{name: "timeout 1", body: `{"cmd":["ls"],"timeout_s":1}`},
		{name: "timeout 3600", body: `{"cmd":["ls"],"timeout_s":3600}`},
		{name: "timeout 0", body: `{"cmd":["ls"],"timeout_s":0}`, code: "invalid_field", field: "timeout_s"},
		{name: "timeout negative", body: `{"cmd":["ls"],"timeout_s":-5}`, code: "invalid_field", field: "timeout_s"},
		{name: "timeout 3601", body: `{"cmd":["ls"],"timeout_s":3601}`, code: "invalid_field", field: "timeout_s"},
		{name: "timeout fractional", body: `{"cmd":["ls"],"timeout_s":1.5}`, code: "invalid_field", field: "timeout_s"},
		{name: "timeout a string", body: `{"cmd":["ls"],"timeout_s":"60"}`, code: "invalid_field", field: "timeout_s"},
		{name: "timeout huge", body: `{"cmd":["ls"],"timeout_s":1e30}`, code: "invalid_field", field: "timeout_s"},

		{name: "encoding base64", body: `{"cmd":["ls"],"encoding":"base64"}`},
		{name: "encoding uppercase", body: `{"cmd":["ls"],"encoding":"UTF-8"}`, code: "invalid_field", field: "encoding"},
		{name: "encoding utf8", body: `{"cmd":["ls"],"encoding":"utf8"}`, code: "invalid_field", field: "encoding"},
		{name: "encoding empty", body: `{"cmd":["ls"],"encoding":""}`, code: "invalid_field", field: "encoding"},

		{name: "unknown field", body: `{"cmd":["ls"],"shell":true}`, code: "unknown_field", field: "shell"},
		{name: "field in another case", body: `{"CMD":["ls"]}`, code: "unknown_field", field: "CMD"},
		{name: "trailing data", body: `{"cmd":["ls"]} {}`, code: "invalid_json"},
		{name: "field twice", body: `{"cmd":["ls"],"cmd":["rm","-rf","/"]}`, code: "invalid_json"},
		{name: "not an object", body: `["ls"]`, code: "invalid_json"},
		{name: "empty body", body: ``, code: "invalid_json"},
		{name: "invalid UTF-8", body: "{\"cmd\":[\"\xff\"]}", code: "invalid_json"},
		{name: "lone surrogate", body: `{"cmd":["\ud800"]}`, code: "invalid_json"},
		{name: "over 8 MiB", body: `{"cmd":["ls"]}` + strings.Repeat(" ", MaxExecBody), code: "body_too_large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := ParseExec([]byte(tc.body))
			if tc.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				checkExecLimits(t, req)
				if tc.want != nil && !reflect.DeepEqual(req, *tc.want) {
					t.Fatalf("got %+v, want %+v", req, *tc.want)
				}
				return
			}
			fe := fault.As(err)
			if fe == nil || fe.Code != tc.code {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
			if tc.field != "" && fe.Fields["field"] != tc.field {
				t.Fatalf("field %v, want %s (%v)", fe.Fields["field"], tc.field, err)
			}
		})
	}
}

// TestExecFailed: exec_failed is a 422 with the reason as its message.
func TestExecFailed(t *testing.T) {
	err := ExecFailed(`program "nope" not found in PATH`)
	if err.Kind != fault.Unprocessable || err.Code != "exec_failed" || err.Message != `program "nope" not found in PATH` {
		t.Fatalf("ExecFailed = %+v", err)
	}
}
