package jsend

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"strata/internal/fault"
)

// fuzzBody has the shape of the create-checkpoint body, plus a nested
// object and a number so that type errors at depth are reached too.
type fuzzBody struct {
	Path  *string          `json:"path"`
	Name  *string          `json:"name"`
	Inner *struct{ N int } `json:"inner"`
}

// FuzzDecodeObject checks DecodeObject's contract on any input: it never
// panics; it fails only with the documented codes of its kind; and what it
// accepts is exactly one valid JSON object of valid UTF-8, whose keys name
// fuzzBody's fields exactly (case included), in which no character was
// replaced by U+FFFD, and which decodes the same way again.
func FuzzDecodeObject(f *testing.F) {
	for _, seed := range []string{
		`{"path":"/workspace/project","name":"before-update"}`,
		`{"path":"/a"} {"path":"/b"}`,
		`{"path":"/a"}   `,
		`{"path":1}`,
		`{"path":"/a","other":true}`,
		`{"inner":{"N":"x"}}`,
		`[{"path":"/a"}]`,
		`{"path":"/a","path":"/b"}`,
		"\ufeff{}",
		`{"path":"\u0000"}`,
		strings.Repeat("[", 20000),
		`{"inner":` + strings.Repeat(`{"N":`, 3000) + `1` + strings.Repeat("}", 3000) + `}`,
		``, `null`, `{}`, `{`, `}`,
		`{"PATH":"/a"}`, `{"path":"/etc","Path":"/x"}`, `{"inner":{"n":1}}`, `{"p\u0061th":"/a"}`,
		"{\"path\":\"/a\xff\"}", `{"path":"\ud800"}`, `{"path":"\udc00\ud800"}`, `{"path":"\ud83d\ude00"}`,
		`{"path":"\\ud800"}`, `{"path":"\ufffd"}`,
	} {
		f.Add([]byte(seed), "application/json")
	}
	f.Add([]byte(`{}`), "text/plain")
	f.Add([]byte(`{}`), "application/merge-patch+json; charset=utf-8")
	f.Add(bytes.Repeat([]byte(" "), MaxBody+1), "")

	allowed := map[string]fault.Kind{
		"invalid_json": fault.Invalid, "unknown_field": fault.Invalid, "invalid_field": fault.Invalid,
		"body_too_large": fault.TooLarge, "unsupported_media_type": fault.UnsupportedMedia,
	}
	f.Fuzz(func(t *testing.T, body []byte, contentType string) {
		r := httptest.NewRequest("POST", "/v1/checkpoints", bytes.NewReader(body))
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		} else {
			r.Header.Del("Content-Type")
		}
		var got fuzzBody
		err := DecodeObject(r, &got)
		if err != nil {
			fe := fault.As(err)
			if fe == nil {
				t.Fatalf("unclassified error %v", err)
			}
			if kind, ok := allowed[fe.Code]; !ok || kind != fe.Kind {
				t.Fatalf("unexpected code %q kind %v", fe.Code, fe.Kind)
			}
			if len(body) > MaxBody && fe.Code != "body_too_large" && fe.Code != "unsupported_media_type" {
				t.Fatalf("%d-byte body failed with %q, want body_too_large", len(body), fe.Code)
			}
			return
		}
		if len(body) > MaxBody {
			t.Fatalf("accepted a %d-byte body", len(body))
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if trimmed := bytes.TrimLeft(body, " \t\r\n"); trimmed[0] != '{' {
			t.Fatalf("accepted a non-object %q", body)
		}
		if !utf8.Valid(body) {
			t.Fatalf("accepted invalid UTF-8 %q", body)
		}
		checkExactKeys(t, body)
		checkNothingReplaced(t, body)
		again, _ := json.Marshal(got)
		var round fuzzBody
		if err := DecodeBytes(again, &round); err != nil {
			t.Fatalf("re-encoded body %s rejected: %v", again, err)
		}
		if !reflect.DeepEqual(got, round) {
			t.Fatalf("round trip changed %+v into %+v", got, round)
		}
	})
}

// TestDuplicateKeys: a body that names a field twice, at any depth, is
// invalid_json rather than read as its last value.
func TestDuplicateKeys(t *testing.T) {
	tests := []struct {
		body string
		dup  bool
	}{
		{`{"path":"/a","path":"/b"}`, true},
		{`{"path":"/a","name":"x","name":"y"}`, true},
		{`{"inner":{"N":1,"N":2}}`, true},
		{`{"path":"/a","inner":{"path":1}}`, false},
		{`{"path":"path","name":"path"}`, false},
		{`{"inner":{"N":1},"path":"/a"}`, false},
		{`{"a":[{"x":1},{"x":2}],"b":1}`, false},
		{`{"a":[1,"a"],"a":2}`, true},
	}
	for _, tc := range tests {
		err := DecodeBytes([]byte(tc.body), &map[string]any{})
		if got := err != nil && fault.CodeOf(err) == "invalid_json"; got != tc.dup {
			t.Errorf("%s: error %v, duplicate %v", tc.body, err, tc.dup)
		}
	}
}

// checkExactKeys fails unless every key of the accepted body names a field
// of fuzzBody as its tag spells it: encoding/json alone would also take
// "PATH" for "path".
func checkExactKeys(t *testing.T, body []byte) {
	t.Helper()
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		t.Fatalf("accepted body is not an object: %v", err)
	}
	for k := range top {
		if k != "path" && k != "name" && k != "inner" {
			t.Fatalf("accepted key %q in %q", k, body)
		}
	}
	if raw, ok := top["inner"]; ok && string(raw) != "null" {
		var inner map[string]json.RawMessage
		if err := json.Unmarshal(raw, &inner); err != nil {
			t.Fatalf("accepted inner %s: %v", raw, err)
		}
		for k := range inner {
			if k != "N" {
				t.Fatalf("accepted inner key %q in %q", k, body)
			}
		}
	}
}

// checkNothingReplaced fails when decoding the accepted body yields more
// U+FFFD than the body spells, literally or as a \ufffd escape: the
// decoder put one in for a bad byte or a lone surrogate.
func checkNothingReplaced(t *testing.T, body []byte) {
	t.Helper()
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("accepted body: %v", err)
	}
	var decoded int
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			decoded += strings.Count(v, "\uFFFD")
		case []any:
			for _, e := range v {
				walk(e)
			}
		case map[string]any:
			for k, e := range v {
				decoded += strings.Count(k, "\uFFFD")
				walk(e)
			}
		}
	}
	walk(v)
	lower := []byte(strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, string(body)))
	spelled := bytes.Count(body, []byte("\uFFFD")) + bytes.Count(lower, []byte(`\ufffd`))
	if decoded > spelled {
		t.Fatalf("decoding %q replaced %d characters with U+FFFD", body, decoded-spelled)
	}
}

// TestExactFieldNames pins defect 7 of issue 6: encoding/json matched
// field names without regard to case, so {"PATH":…} was read as a path and
// {"path":"/etc","Path":"/x"} slipped past the rule against a field named
// twice. A key must spell a field exactly; any other is unknown_field.
func TestExactFieldNames(t *testing.T) {
	tests := []struct {
		name, body  string
		code, field string // "" code: accepted
	}{
		{"upper case", `{"PATH":"/a"}`, "unknown_field", "PATH"},
		{"title case", `{"Path":"/a"}`, "unknown_field", "Path"},
		{"two cases of one field", `{"path":"/etc","Path":"/x"}`, "unknown_field", "Path"},
		{"two cases, other order", `{"Path":"/x","path":"/etc"}`, "unknown_field", "Path"},
		{"nested struct field", `{"inner":{"n":1}}`, "unknown_field", "n"},
		{"nested exact", `{"inner":{"N":1}}`, "", ""},
		{"escape spelling the exact name", `{"p\u0061th":"/a"}`, "", ""},
		{"escape spelling another case", `{"P\u0061th":"/a"}`, "unknown_field", "Path"},
		{"exact names", `{"path":"/a","name":"n"}`, "", ""},
		{"same name twice", `{"path":"/a","path":"/a"}`, "invalid_json", ""},
		{"unknown then malformed", `{"PATH":"/a",`, "invalid_json", ""},
		{"unknown then trailing data", `{"PATH":"/a"} x`, "unknown_field", "PATH"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got fuzzBody
			err := DecodeBytes([]byte(tc.body), &got)
			if tc.code == "" {
				if err != nil {
					t.Fatalf("%s: %v", tc.body, err)
				}
				return
			}
			fe := fault.As(err)
			if fe == nil || fe.Code != tc.code {
				t.Fatalf("%s: error %v, want %s", tc.body, err, tc.code)
			}
			if tc.field != "" && fe.Fields["field"] != tc.field {
				t.Errorf("%s: field %v, want %q", tc.body, fe.Fields["field"], tc.field)
			}
		})
	}
	// A map takes any key, of any case, each once.
	var m map[string]any
	if err := DecodeBytes([]byte(`{"Any":1,"any":2,"ANY":{"x":1,"X":2}}`), &m); err != nil || len(m) != 3 {
		t.Errorf("map: %v %v", m, err)
	}
}

// TestInvalidUTF8 pins defect 7 of issue 6: invalid UTF-8, and escapes of
// half a surrogate pair, were silently replaced with U+FFFD; now the body
// is invalid_json.
func TestInvalidUTF8(t *testing.T) {
	tests := []struct {
		name, body string
		want       string // the decoded path; "" when refused
	}{
		{"bad byte in a value", "{\"path\":\"/a\xff\"}", ""},
		{"bad byte in a key", "{\"path\xfe\":\"/a\"}", ""},
		{"truncated sequence", "{\"path\":\"/\xe2\x82\"}", ""},
		{"overlong encoding", "{\"path\":\"/\xc0\xaf\"}", ""},
		{"encoded surrogate", "{\"path\":\"/\xed\xa0\x80\"}", ""},
		{"bad byte outside strings", "{\"path\":\"/a\"}\xff", ""},
		{"lone high surrogate", `{"path":"\ud800"}`, ""},
		{"lone low surrogate", `{"path":"\udc00"}`, ""},
		{"high then text", `{"path":"\ud800x"}`, ""},
		{"high then a non-surrogate escape", `{"path":"\ud800\u0041"}`, ""},
		{"pair reversed", `{"path":"\udc00\ud800"}`, ""},
		{"lone surrogate after an escaped quote", `{"path":"\"\ud800"}`, ""},
		{"lone surrogate in a key", `{"\ud800":1}`, ""},
		{"surrogate pair", `{"path":"\ud83d\ude00"}`, "\U0001F600"},
		{"upper case pair", `{"path":"\uD83D\uDE00"}`, "\U0001F600"},
		{"escaped backslash then text", `{"path":"\\ud800"}`, `\ud800`},
		{"replacement character spelled", `{"path":"\ufffd\uFFFD"}`, "\uFFFD\uFFFD"},
		{"multibyte text", `{"path":"/é€😀"}`, "/é€😀"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got fuzzBody
			err := DecodeBytes([]byte(tc.body), &got)
			if tc.want == "" {
				if fault.CodeOf(err) != "invalid_json" {
					t.Fatalf("%q: error %v, want invalid_json", tc.body, err)
				}
				return
			}
			if err != nil || got.Path == nil || *got.Path != tc.want {
				t.Fatalf("%q: got %v, %v; want path %q", tc.body, got.Path, err, tc.want)
			}
		})
	}
}
