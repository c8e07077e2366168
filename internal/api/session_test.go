package api

import (
	"strings"
	"testing"

	"strata/internal/fault"
)

func TestParseSession(t *testing.T) {
	for _, tc := range []struct {
		body, field string
		want        SessionRequest
	}{
		{body: `{"cmd":["sh"]}`, want: SessionRequest{Cmd: []string{"sh"}, Cwd: "/"}},
		{body: `{"cmd":["sh"],"tty":true}`, want: SessionRequest{Cmd: []string{"sh"}, Cwd: "/", TTY: true, Rows: 24, Cols: 80}},
		{body: `{"cmd":["sh"],"tty":true,"rows":50,"cols":200,"detachable":true,"timeout_s":10,"cwd":"/w","env":{"A":"b"}}`,
			want: SessionRequest{Cmd: []string{"sh"}, Cwd: "/w", Env: map[string]string{"A": "b"}, TTY: true, Rows: 50, Cols: 200, Detachable: true, TimeoutS: 10}},
		{body: `{}`, field: "cmd"},
		{body: `{"cmd":[]}`, field: "cmd"},
		{body: `{"cmd":["a\u0000"]}`, field: "cmd"},
		{body: `{"cmd":["sh"],"cwd":"rel"}`, field: "cwd"},
		{body: `{"cmd":["sh"],"rows":10}`, field: "rows"},
		{body: `{"cmd":["sh"],"tty":true,"rows":0}`, field: "rows"},
		{body: `{"cmd":["sh"],"tty":true,"cols":1001}`, field: "cols"},
		{body: `{"cmd":["sh"],"timeout_s":0}`, field: "timeout_s"},
		{body: `{"cmd":["sh"],"timeout_s":3601}`, field: "timeout_s"},
		{body: `{"cmd":["sh"],"stdin":"x"}`, field: "stdin"},
		{body: `{"cmd":["sh"],"env":{"A=B":"c"}}`, field: "env"},
	} {
		got, err := ParseSession([]byte(tc.body))
		if tc.field == "" {
			if err != nil || strings.Join(got.Cmd, " ") != strings.Join(tc.want.Cmd, " ") || got.Cwd != tc.want.Cwd || got.TTY != tc.want.TTY ||
				got.Rows != tc.want.Rows || got.Cols != tc.want.Cols || got.Detachable != tc.want.Detachable || got.TimeoutS != tc.want.TimeoutS || len(got.Env) != len(tc.want.Env) {
				t.Errorf("%s: %+v, %v; want %+v", tc.body, got, err, tc.want)
			}
			continue
		}
		if fe := fault.As(err); fe == nil || fe.Fields["field"] != tc.field {
			t.Errorf("%s: %v; want invalid_field %s", tc.body, err, tc.field)
		}
	}
}

// FuzzParseSession: whatever the body, ParseSession either refuses it
// with a classified error or returns a request within every limit.
func FuzzParseSession(f *testing.F) {
	for _, s := range []string{`{"cmd":["sh"]}`, `{"cmd":["sh"],"tty":true,"rows":5,"cols":7}`, `{"cmd":["x"],"timeout_s":5,"detachable":true}`, `{`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseSession(body)
		if err != nil {
			if fault.As(err) == nil {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		checkExecLimits(t, ExecRequest{Cmd: req.Cmd, Cwd: req.Cwd, Env: req.Env, TimeoutS: max(req.TimeoutS, 1), Encoding: EncodingUTF8})
		if req.TTY && (req.Rows < 1 || req.Rows > MaxTermSize || req.Cols < 1 || req.Cols > MaxTermSize) || !req.TTY && (req.Rows != 0 || req.Cols != 0) {
			t.Fatalf("accepted a terminal of %d × %d (tty %v)", req.Rows, req.Cols, req.TTY)
		}
	})
}

func TestValidSessionID(t *testing.T) {
	for id, want := range map[string]bool{"se-0123456789abcdef": true, "se-0123456789ABCDEF": false, "se-0123": false, "sb-0123456789abcdef": false, "": false, "se-0123456789abcdeg": false} {
		if ValidSessionID(id) != want {
			t.Errorf("ValidSessionID(%q) = %v", id, !want)
		}
	}
}

// FuzzValidGeneration checks the generation's shape on any string: 16
// lowercase hex digits, what guestd draws (8 random bytes, hex).
func FuzzValidGeneration(f *testing.F) {
	for _, s := range []string{"0123456789abcdef", "0123456789ABCDEF", "", "0123", "0123456789abcdef0", "ffffffffffffffff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, g string) {
		want := len(g) == 16 && strings.Trim(g, "0123456789abcdef") == ""
		if ValidGeneration(g) != want {
			t.Fatalf("ValidGeneration(%q) = %v", g, !want)
		}
	})
}
