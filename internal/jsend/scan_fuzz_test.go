package jsend

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"strata/internal/fault"
)

// valuesOf counts the values of v as countValues counts them.
func valuesOf(v any) int {
	switch v := v.(type) {
	case []any:
		n := 1
		for _, e := range v {
			n += valuesOf(e)
		}
		return n
	case map[string]any:
		n := 1
		for _, e := range v {
			n += valuesOf(e)
		}
		return n
	default:
		return 1
	}
}

// topLevel is the number of elements or members of the array or object
// b, by encoding/json's tokens (duplicate keys counted).
func topLevel(b []byte) int {
	obj := b[bytes.IndexAny(b, "[{")] == '{'
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	n, depth := 0, 0
	key := true // in an object, a key and a value take turns
	for {
		tok, err := dec.Token()
		if err != nil {
			return n
		}
		d, isDelim := tok.(json.Delim)
		if depth == 1 && !(isDelim && (d == '}' || d == ']')) {
			if !obj || key {
				n++
			}
			key = !key
		}
		if isDelim {
			switch d {
			case '{', '[':
				depth++
			default:
				depth--
			}
		}
	}
}

// FuzzScan checks the scanner that bounds untrusted JSON before it is
// decoded, on any input: it never panics; countValues never passes its
// limit by more than one, and on valid JSON counts what encoding/json
// decodes (objects, arrays, scalars; no keys); EachElement and EachMember
// walk a valid array or object element by element as encoding/json does,
// each element valid JSON of its own.
func FuzzScan(f *testing.F) {
	for _, seed := range []string{
		`[]`, `{}`, `[1,"a",{"b":[2,3]},null,true]`, `{"a":1,"a":2,"b":{"c":"}"}}`, `"x"`, `12`,
		` [ "\"" , "\\" , [ ] ] `, `[{]`, `[1,,2]`, `{"a" 1}`, `{"a":}`, `["\u00e9"]`,
		strings.Repeat("[", 20000), `[` + strings.Repeat(`{},`, 100) + `{}]`, `{"k":"v"} trailing`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, max := range []int{0, 3, 1 << 20} {
			if n := countValues(b, max); n > max+1 {
				t.Fatalf("countValues(%d) = %d", max, n)
			}
		}
		var elems, members int
		elemErr := EachElement(b, func(e []byte) error {
			elems++
			if json.Valid(b) && !json.Valid(e) {
				t.Fatalf("element %q of a valid array is not JSON", e)
			}
			return nil
		})
		memberErr := EachMember(b, func(k, v []byte) error {
			members++
			if json.Valid(b) {
				var s string
				if json.Unmarshal(k, &s) != nil || !json.Valid(v) {
					t.Fatalf("member %q: %q of a valid object is not JSON", k, v)
				}
			}
			return nil
		})
		if !json.Valid(b) {
			return
		}
		var v any
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			return // nesting json.Valid allows and Decode does not
		}
		if n := countValues(b, 1<<30); !hasDuplicateKeys(b) && n != valuesOf(v) {
			t.Fatalf("countValues = %d, encoding/json decodes %d values", n, valuesOf(v))
		}
		switch v.(type) {
		case []any:
			if elemErr != nil || elems != topLevel(b) {
				t.Fatalf("EachElement: %d elements, %v; encoding/json has %d", elems, elemErr, topLevel(b))
			}
		case map[string]any:
			if memberErr != nil || members != topLevel(b) {
				t.Fatalf("EachMember: %d members, %v; encoding/json has %d", members, memberErr, topLevel(b))
			}
		}
	})
}

// hasDuplicateKeys tells whether some object of b names a key twice
// (encoding/json keeps one value of the two, so counts differ).
func hasDuplicateKeys(b []byte) bool {
	return checkKeys(b, nil) != nil
}

// FuzzParseFail checks the bounds of a relayed fail on any body: it never
// panics; what it keeps is a code and field names of the documented
// shape, at most MaxFailFields fields, no more text than the body held,
// and it is written again (Error) as a fail that parses back the same.
func FuzzParseFail(f *testing.F) {
	for _, seed := range []string{
		`{"status":"fail","data":{"code":"directory_busy","message":"busy","path":"/w","holders":[{"pid":1}]}}`,
		`{"status":"fail","data":{"code":"x","message":"m"}}`,
		`{"status":"fail","data":{"code":"x","message":"m","a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9}}`,
		`{"status":"fail","data":{"code":"x","message":"m","a":1,"a":2}}`,
		`{"status":"fail","data":{"code":"X","message":"m"}}`,
		`{"status":"fail","data":{"message":"m"}}`,
		`{"status":"error","data":{"code":"x","message":"m"}}`,
		`{"status":"fail","data":{"code":"x","message":"m"},"extra":1}`,
		`{"status":"fail","data":{"code":"x","message":"<b>"}}`,
		`{"status":"fail","data":{` + strings.Repeat(`"k":0,`, 1000) + `"code":"x","message":"m"}}`,
	} {
		f.Add(409, []byte(seed))
	}
	f.Add(401, []byte(`{"status":"fail","data":{"code":"unauthorized","message":"m"}}`))
	f.Add(200, []byte(`{"status":"fail","data":{"code":"x","message":"m"}}`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		fe, err := ParseFail(status, body)
		if err != nil {
			return
		}
		if len(body) > MaxFailBody {
			t.Fatalf("took a fail of %d bytes", len(body))
		}
		if k, _ := KindForStatus(status); fe.Kind != k || status < 400 || status >= 500 {
			t.Fatalf("status %d taken as %v", status, fe.Kind)
		}
		if !isName([]byte(fe.Code)) || len(fe.Fields) > MaxFailFields {
			t.Fatalf("code %q with %d fields", fe.Code, len(fe.Fields))
		}
		held := len(fe.Code) + len(fe.Message)
		for k, v := range fe.Fields {
			if !isName([]byte(k)) || k == "code" || k == "message" {
				t.Fatalf("field %q", k)
			}
			held += len(k) + len(v.(json.RawMessage))
		}
		if held > len(body) {
			t.Fatalf("%d bytes kept of a %d-byte body", held, len(body))
		}
		w := httptest.NewRecorder()
		Error(w, nil, "", fe)
		out, _ := io.ReadAll(w.Body)
		if w.Code != status {
			t.Fatalf("written with %d, parsed from %d", w.Code, status)
		}
		again, err := ParseFail(w.Code, out)
		if len(out) <= MaxFailBody && (err != nil || again.Code != fe.Code || again.Message != fe.Message || len(again.Fields) != len(fe.Fields)) {
			t.Fatalf("written again as %s: %v", out, err)
		}
		if fault.KindOf(again) != fe.Kind && err == nil {
			t.Fatalf("kind %v, then %v", fe.Kind, again.Kind)
		}
	})
}
