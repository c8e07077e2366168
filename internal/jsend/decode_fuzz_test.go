package jsend

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

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
// accepts is exactly one valid JSON object that decodes the same way again.
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
