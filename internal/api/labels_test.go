package api

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"strata/internal/fault"
)

// The rules of API.md's "Names, keys, env and labels", written apart from
// the code.
var (
	envNameRule  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	labelKeyRule = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$`)
)

// labelValueRule: at most 256 bytes of printable UTF-8.
func labelValueRule(v string) bool {
	if len(v) > 256 || !utf8.ValidString(v) {
		return false
	}
	return !strings.ContainsFunc(v, func(r rune) bool { return !unicode.IsPrint(r) })
}

// invalidField fails unless err is invalid_field naming field.
func invalidField(t *testing.T, err error, field string) {
	t.Helper()
	fe := fault.As(err)
	if fe == nil || fe.Code != "invalid_field" || fe.Fields["field"] != field {
		t.Fatalf("got %v, want invalid_field naming %s", err, field)
	}
}

// TestValidateSandboxEnv names each rule of a sandbox's env.
func TestValidateSandboxEnv(t *testing.T) {
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m["E"+strings.Repeat("x", i)] = ""
		}
		return m
	}
	tests := []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"none", nil, true},
		{"empty", map[string]string{}, true},
		{"plain", map[string]string{"CI": "1", "_": "", "a_B9": "x y=z"}, true},
		{"64 entries", many(64), true},
		{"65 entries", many(65), false},
		{"empty name", map[string]string{"": "x"}, false},
		{"digit first", map[string]string{"9A": "x"}, false},
		{"dash", map[string]string{"A-B": "x"}, false},
		{"equals", map[string]string{"A=B": "x"}, false},
		{"not ASCII", map[string]string{"Ä": "x"}, false},
		{"NUL in the value", map[string]string{"A": "x\x00y"}, false},
		{"entry of 4 KiB", map[string]string{"A": strings.Repeat("v", 4095)}, true},
		{"entry over 4 KiB", map[string]string{"AB": strings.Repeat("v", 4095)}, false},
		{"value of 4 KiB", map[string]string{"A": strings.Repeat("v", 4096)}, false},
		{"newline in a value", map[string]string{"A": "x\ny"}, true},
		{"value not UTF-8", map[string]string{"A": "\xff"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateSandboxEnv("env", tc.env)
			if tc.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			invalidField(t, err, "env")
		})
	}
}

// FuzzValidateSandboxEnv holds ValidateSandboxEnv to the rule on one
// entry of any name and value.
func FuzzValidateSandboxEnv(f *testing.F) {
	for _, s := range [][2]string{{"A", "1"}, {"_", ""}, {"1A", "x"}, {"A", "\x00"}, {"A-B", "x"}, {"é", "x"}, {"A", strings.Repeat("v", 4095)}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		err := ValidateSandboxEnv("env", map[string]string{k: v})
		want := envNameRule.MatchString(k) && !strings.Contains(v, "\x00") && utf8.ValidString(v) && len(v) <= 4096 && len(k)+len(v) <= 4096
		if (err == nil) != want {
			t.Fatalf("ValidateSandboxEnv(%q=%q) = %v", k, v, err)
		}
		if err != nil {
			invalidField(t, err, "env")
			return
		}
		// What is accepted is what exec accepts: it may go to every exec.
		if checkEnv(map[string]string{k: v}) != nil {
			t.Fatalf("%q=%q accepted here, refused by exec", k, v)
		}
	})
}

// TestMergeEnv: the call's env over the sandbox's, at most 64 entries.
func TestMergeEnv(t *testing.T) {
	many := func(prefix string, n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[prefix+strings.Repeat("x", i)] = prefix
		}
		return m
	}
	tests := []struct {
		name       string
		base, call map[string]string
		want       map[string]string
		ok         bool
	}{
		{"neither", nil, nil, nil, true},
		{"the call's alone", nil, map[string]string{"A": "1"}, map[string]string{"A": "1"}, true},
		{"the sandbox's alone", map[string]string{"A": "1"}, nil, map[string]string{"A": "1"}, true},
		{"the call's wins", map[string]string{"A": "base", "B": "base"}, map[string]string{"A": "call"}, map[string]string{"A": "call", "B": "base"}, true},
		{"64 in all", many("B", 32), many("C", 32), nil, true},
		{"65 in all", many("B", 33), many("C", 32), nil, false},
		{"64 each, all the same names", many("B", 64), many("B", 64), many("B", 64), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MergeEnv(tc.base, tc.call)
			if !tc.ok {
				invalidField(t, err, "env")
				if fault.As(err).Fields["sandbox_env"] != len(tc.base) {
					t.Fatalf("sandbox_env %v, want %d", fault.As(err).Fields["sandbox_env"], len(tc.base))
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tc.want != nil && !equalMaps(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// FuzzMergeEnv checks the merge's invariants on any two envs of names
// from a small alphabet (so that they overlap): every name of either is
// in the merge, each with the call's value when the call has it, nothing
// else is, and a merge of more than 64 is refused; neither input changes.
// Each input holds at most 64, as their own checks leave them.
func FuzzMergeEnv(f *testing.F) {
	f.Add("ABC", "CDE", 3)
	f.Add("", "A", 0)
	f.Add("ABCDEFGH", "", 9)
	f.Fuzz(func(t *testing.T, baseNames, callNames string, width int) {
		width = 1 + (width&0xff)%8
		build := func(names, value string) map[string]string {
			m := map[string]string{}
			for i := 0; i+width <= len(names); i += width {
				m["N"+names[i:i+width]] = value
			}
			return m
		}
		base, call := build(baseNames, "base"), build(callNames, "call")
		nb, nc := len(base), len(call)
		if nb > MaxSandboxEnv || nc > MaxExecEnv {
			return // each was checked before (ValidateSandboxEnv, ParseExec)
		}
		got, err := MergeEnv(base, call)
		if len(base) != nb || len(call) != nc {
			t.Fatal("an input changed")
		}
		union := map[string]bool{}
		for k := range base {
			union[k] = true
		}
		for k := range call {
			union[k] = true
		}
		if len(union) > MaxExecEnv {
			if err == nil {
				t.Fatalf("merged %d entries", len(union))
			}
			invalidField(t, err, "env")
			return
		}
		if err != nil {
			t.Fatalf("refused %d entries: %v", len(union), err)
		}
		if len(got) != len(union) {
			t.Fatalf("merge of %d names has %d", len(union), len(got))
		}
		for k := range union {
			want := "base"
			if _, ok := call[k]; ok {
				want = "call"
			}
			if got[k] != want {
				t.Fatalf("%s = %q, want %q", k, got[k], want)
			}
		}
	})
}

// TestValidateLabels names each rule of labels.
func TestValidateLabels(t *testing.T) {
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m["l"+strings.Repeat("x", i)] = "v"
		}
		return m
	}
	tests := []struct {
		name   string
		labels map[string]string
		ok     bool
	}{
		{"none", nil, true},
		{"plain", map[string]string{"owner": "docs", "a": "", "0": "x"}, true},
		{"dots, slashes, dashes, underscores", map[string]string{"team.example.com/tier-a_b": "x"}, true},
		{"a value of spaces and symbols", map[string]string{"k": "a b = c / ü € 😀"}, true},
		{"32 labels", many(32), true},
		{"33 labels", many(33), false},
		{"empty key", map[string]string{"": "x"}, false},
		{"upper key", map[string]string{"Owner": "x"}, false},
		{"key starting with a dot", map[string]string{".a": "x"}, false},
		{"key ending with a slash", map[string]string{"a/": "x"}, false},
		{"key of 63", map[string]string{strings.Repeat("k", 63): "x"}, true},
		{"key of 64", map[string]string{strings.Repeat("k", 64): "x"}, false},
		{"value of 256", map[string]string{"k": strings.Repeat("v", 256)}, true},
		{"value of 257", map[string]string{"k": strings.Repeat("v", 257)}, false},
		{"value with a tab", map[string]string{"k": "a\tb"}, false},
		{"value with a newline", map[string]string{"k": "a\nb"}, false},
		{"value with a no-break space", map[string]string{"k": "a\u00a0b"}, false},
		{"value not UTF-8", map[string]string{"k": "\xff"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateLabels("labels", tc.labels)
			if tc.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			invalidField(t, err, "labels")
		})
	}
}

// FuzzValidateLabels holds the label rules to the regular expression and
// the value rule, on one label of any key and value.
func FuzzValidateLabels(f *testing.F) {
	for _, s := range [][2]string{{"owner", "docs"}, {"a/b", ""}, {"A", "x"}, {"a.", "x"}, {"a", "\n"}, {"a", "\xff"}, {"a", "😀"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		err := ValidateLabels("labels", map[string]string{k: v})
		if want := labelKeyRule.MatchString(k) && labelValueRule(v); (err == nil) != want {
			t.Fatalf("ValidateLabels(%q=%q) = %v", k, v, err)
		}
		if err != nil {
			invalidField(t, err, "labels")
		}
	})
}

// TestParseLabelsBody: PUT …/labels' body.
func TestParseLabelsBody(t *testing.T) {
	tests := []struct {
		name, body string
		code       string
		want       map[string]string
	}{
		{"labels", `{"owner":"docs","tier":"a"}`, "", map[string]string{"owner": "docs", "tier": "a"}},
		{"none", `{}`, "", map[string]string{}},
		{"a number", `{"owner":1}`, "invalid_field", nil},
		{"null", `null`, "invalid_json", nil},
		{"an array", `[]`, "invalid_json", nil},
		{"a key twice", `{"a":"1","a":"2"}`, "invalid_json", nil},
		{"a bad key", `{"A":"1"}`, "invalid_field", nil},
		{"trailing data", `{} {}`, "invalid_json", nil},
		{"over 64 KiB", `{}` + strings.Repeat(" ", 64<<10), "body_too_large", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseLabelsBody([]byte(tc.body))
			if tc.code == "" {
				if err != nil || !equalMaps(got, tc.want) {
					t.Fatalf("got %v, %v; want %v", got, err, tc.want)
				}
				return
			}
			if fe := fault.As(err); fe == nil || fe.Code != tc.code {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
		})
	}
}

// TestParseLabelSelector: label=key=value, repeatable, all must match.
func TestParseLabelSelector(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		ok     bool
		labels map[string]string // matched against, when ok
		match  bool
	}{
		{"none", nil, true, map[string]string{"a": "1"}, true},
		{"one", []string{"owner=docs"}, true, map[string]string{"owner": "docs", "x": "y"}, true},
		{"one, another value", []string{"owner=docs"}, true, map[string]string{"owner": "ops"}, false},
		{"one, missing", []string{"owner=docs"}, true, nil, false},
		{"two, both", []string{"owner=docs", "tier=a"}, true, map[string]string{"owner": "docs", "tier": "a"}, true},
		{"two, one", []string{"owner=docs", "tier=a"}, true, map[string]string{"owner": "docs"}, false},
		{"empty value", []string{"owner="}, true, map[string]string{"owner": ""}, true},
		{"empty value is not missing", []string{"owner="}, true, nil, false},
		{"a value with =", []string{"q=a=b"}, true, map[string]string{"q": "a=b"}, true},
		{"one key, two values", []string{"a=1", "a=2"}, true, map[string]string{"a": "1"}, false},
		{"no =", []string{"owner"}, false, nil, false},
		{"empty", []string{""}, false, nil, false},
		{"bad key", []string{"Owner=docs"}, false, nil, false},
		{"bad value", []string{"owner=a\nb"}, false, nil, false},
		{"33 terms", strings.Split(strings.Repeat("a=1,", 33)[:4*33-1], ","), false, nil, false},
		{"32 terms", strings.Split(strings.Repeat("a=1,", 32)[:4*32-1], ","), true, map[string]string{"a": "1"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sel, err := ParseLabelSelector(tc.values)
			if !tc.ok {
				invalidField(t, err, "label")
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if got := sel.Matches(tc.labels); got != tc.match {
				t.Fatalf("Matches(%v) = %v", tc.labels, got)
			}
		})
	}
}

// FuzzParseLabelSelector: any parameter is parsed or refused with
// invalid_field naming label; an accepted one is a valid key and value
// split at the first '=', and matches exactly the labels that have it.
func FuzzParseLabelSelector(f *testing.F) {
	for _, s := range []string{"owner=docs", "a=", "a==", "=x", "A=b", "a=\n", "owner", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		sel, err := ParseLabelSelector([]string{v})
		if err != nil {
			invalidField(t, err, "label")
			return
		}
		k, val, ok := strings.Cut(v, "=")
		if !ok || len(sel) != 1 || sel[0] != (LabelMatch{k, val}) || !labelKeyRule.MatchString(k) || !labelValueRule(val) {
			t.Fatalf("accepted %q as %v", v, sel)
		}
		if !sel.Matches(map[string]string{k: val, "other": "x"}) || sel.Matches(map[string]string{k: val + "x"}) || sel.Matches(nil) {
			t.Fatalf("%v matches wrongly", sel)
		}
	})
}

// TestSnapshotRefs: "sn-" and 24 lowercase letters and digits; a name
// may not start with "sn-".
func TestSnapshotRefs(t *testing.T) {
	for s, want := range map[string]bool{
		"sn-0123456789abcdefghijklmn": true, "sn-aaaaaaaaaaaaaaaaaaaaaaaa": true,
		"sn-0123456789abcdefghijklm": false, "sn-0123456789abcdefghijklmno": false, "sn-0123456789ABCDEFGHIJKLMN": false,
		"sn-0123456789abcdefghijkl-n": false, "SN-0123456789abcdefghijklmn": false, "": false, "sn-": false, "v1": false,
	} {
		if got := ValidSnapshotRef(s); got != want {
			t.Errorf("ValidSnapshotRef(%q) = %v", s, got)
		}
		if ValidSnapshotName(s) && strings.HasPrefix(s, "sn-") {
			t.Errorf("%q is a valid snapshot name", s)
		}
	}
}

// FuzzSnapshotReference: a string is at most one of a snapshot's id, ref
// and name, so that the three are told apart wherever any is accepted.
func FuzzSnapshotReference(f *testing.F) {
	for _, s := range []string{"v1", "auto-2", "sn-0123456789abcdefghijklmn", "sn-x", "after-build", "V1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := 0
		for _, ok := range []bool{ValidSnapshotID(s), ValidSnapshotRef(s), ValidSnapshotName(s)} {
			if ok {
				n++
			}
		}
		if n > 1 {
			t.Fatalf("%q is %d of id, ref and name", s, n)
		}
	})
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// FuzzParseLabelsBody: any body is labels that keep every rule, and
// marshal to a body that parses to the same labels, or a refusal with
// the codes of a malformed request.
func FuzzParseLabelsBody(f *testing.F) {
	for _, s := range []string{`{}`, `{"owner":"docs"}`, `{"A":"1"}`, `{"a":1}`, `{"a":"1","a":"2"}`, `null`, `[]`, `{"a":"\u0007"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		labels, err := ParseLabelsBody(body)
		if err != nil {
			fe := fault.As(err)
			if fe == nil || fe.Code != "invalid_json" && fe.Code != "invalid_field" && fe.Code != "body_too_large" {
				t.Fatalf("error %v", err)
			}
			if fe.Code == "invalid_field" && fe.Fields["field"] != "labels" {
				t.Fatalf("invalid_field names %v", fe.Fields["field"])
			}
			return
		}
		if labels == nil || ValidateLabels("labels", labels) != nil {
			t.Fatalf("accepted %v", labels)
		}
		again, _ := json.Marshal(labels)
		round, err := ParseLabelsBody(again)
		if err != nil || !equalMaps(round, labels) {
			t.Fatalf("round trip of %s: %v, %v", again, round, err)
		}
	})
}

// TestWithSandboxEnv: the sandbox's env goes under the call's, the rest of
// the body stays as it was sent, and a sandbox without env changes
// nothing.
func TestWithSandboxEnv(t *testing.T) {
	body := []byte(`{"cmd":["sh","-c","echo <$A>"],"env":{"A":"call"},"stdin":"<&>","timeout_s":5}`)
	same, err := WithSandboxEnv(body, nil, map[string]string{"A": "call"})
	if err != nil || string(same) != string(body) {
		t.Fatalf("without a sandbox env: %s, %v", same, err)
	}
	got, err := WithSandboxEnv(body, map[string]string{"A": "base", "B": "<b>"}, map[string]string{"A": "call"})
	if err != nil {
		t.Fatal(err)
	}
	req, err := ParseExec(got)
	if err != nil {
		t.Fatalf("%s: %v", got, err)
	}
	if !equalMaps(req.Env, map[string]string{"A": "call", "B": "<b>"}) || req.Stdin != "<&>" || req.TimeoutS != 5 || req.Cmd[2] != "echo <$A>" {
		t.Fatalf("merged into %+v", req)
	}
	if strings.Contains(string(got), `\u003c`) {
		t.Fatalf("HTML escapes in %s", got)
	}
	many := map[string]string{}
	for i := range 64 {
		many["B"+strings.Repeat("x", i)] = "b"
	}
	if _, err := WithSandboxEnv(body, many, map[string]string{"A": "call"}); err == nil {
		t.Fatal("65 entries merged")
	} else {
		invalidField(t, err, "env")
	}
}

// FuzzWithSandboxEnv: for any exec body ParseExec accepts, and a sandbox
// env of one entry, the merged body parses to the same request with the
// merged env (or the merge is refused as too many entries).
func FuzzWithSandboxEnv(f *testing.F) {
	f.Add([]byte(`{"cmd":["true"]}`), "A", "1")
	f.Add([]byte(`{"cmd":["sh","-c","x"],"env":{"A":"2"},"stdin":"\u003c","cwd":"/tmp"}`), "A", "1")
	f.Add([]byte(`{"cmd":["true"],"env":null}`), "B", "")
	f.Fuzz(func(t *testing.T, body []byte, k, v string) {
		call, err := ParseExec(body)
		if err != nil {
			return
		}
		base := map[string]string{k: v}
		if ValidateSandboxEnv("env", base) != nil {
			return
		}
		got, err := WithSandboxEnv(body, base, call.Env)
		if err != nil {
			invalidField(t, err, "env")
			return
		}
		if len(got) > MaxExecBody {
			t.Fatalf("merged body of %d bytes", len(got))
		}
		merged, err := ParseExec(got)
		if err != nil {
			t.Fatalf("merged body %s refused: %v", got, err)
		}
		want, _ := MergeEnv(base, call.Env)
		if !equalMaps(merged.Env, want) {
			t.Fatalf("env %v, want %v", merged.Env, want)
		}
		merged.Env, call.Env = nil, nil
		if !reflect.DeepEqual(merged, call) {
			t.Fatalf("merge changed %+v into %+v", call, merged)
		}
	})
}
