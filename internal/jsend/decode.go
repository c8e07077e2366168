package jsend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	"strata/internal/fault"
)

// MaxBody is the largest request body the API accepts.
const MaxBody = 16 << 10

// MaxValues bounds the JSON values (objects, arrays, scalars) of a body
// that DecodeBytes decodes. A body of MaxBody bytes cannot hold more
// (each value takes a byte at least), so it matters to the larger bodies
// of exec and sessions only, whose valid requests hold a few hundred:
// decoded, every value is a structure (an 8 MiB list of empty strings
// was 2.8 million strings, 150 MiB of heap), so a body is counted,
// without allocating, before anything is decoded from it.
const MaxValues = MaxBody

// Errors of request decoding, shared by every server so that codes match.
var (
	ErrInvalidJSON      = fault.New(fault.Invalid, "invalid_json", "the request body must be exactly one JSON object")
	ErrBodyTooLarge     = fault.New(fault.TooLarge, "body_too_large", "the request body is larger than 16 KiB").With("limit", MaxBody)
	ErrUnsupportedMedia = fault.New(fault.UnsupportedMedia, "unsupported_media_type", "the request body must be sent as application/json")
	ErrQueryNotAllowed  = fault.New(fault.Invalid, "query_not_allowed", "this operation takes no query parameters")
	ErrBodyNotAllowed   = fault.New(fault.Invalid, "body_not_allowed", "this operation takes no request body")
)

// RejectQuery fails when the request has any query string, even an empty
// "?" followed by nothing.
func RejectQuery(r *http.Request) error {
	if r.URL.RawQuery != "" || r.URL.ForceQuery {
		return ErrQueryNotAllowed
	}
	return nil
}

// RejectBody fails when the request carries a body of any length.
func RejectBody(r *http.Request) error {
	if r.ContentLength > 0 {
		return ErrBodyNotAllowed
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	var one [1]byte
	n, _ := io.ReadFull(r.Body, one[:])
	if n > 0 {
		return ErrBodyNotAllowed
	}
	return nil
}

// RejectQueryAndBody is RejectQuery then RejectBody: the checks of every
// operation that takes neither.
func RejectQueryAndBody(r *http.Request) error {
	if err := RejectQuery(r); err != nil {
		return err
	}
	return RejectBody(r)
}

// DecodeObject reads r's body as exactly one JSON object into dst (a
// pointer to a struct), rejecting non-JSON content types, bodies over
// MaxBody, unknown fields, fields of the wrong type and trailing data.
func DecodeObject(r *http.Request, dst any) error {
	body, err := ReadBody(r, MaxBody, ErrBodyTooLarge)
	if err != nil {
		return err
	}
	return DecodeBytes(body, dst)
}

// ReadBody reads r's body for a JSON operation: a content type that is
// not JSON is ErrUnsupportedMedia, a body over limit bytes is tooLarge.
func ReadBody(r *http.Request, limit int64, tooLarge error) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || !(mt == "application/json" || strings.HasSuffix(mt, "+json")) {
			return nil, ErrUnsupportedMedia
		}
	}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	if r.Body == nil {
		return nil, nil
	}
	if n := r.ContentLength; n > 0 {
		// Read into a buffer of its length: io.ReadAll grows one by
		// doubling, and holds up to twice a large body while it reads.
		body := make([]byte, n)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, ErrInvalidJSON.Wrap(err)
		}
		return body, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, ErrInvalidJSON.Wrap(err)
	}
	if int64(len(body)) > limit {
		return nil, tooLarge
	}
	return body, nil
}

// DecodeBytes is DecodeObject's parser, apart so that it can be fuzzed.
// A body of more than MaxValues values is invalid_json before it is
// decoded.
//
// encoding/json alone is looser than the API: it matches field names
// without regard to case, keeps the last of two equal keys and replaces
// invalid UTF-8 with U+FFFD. So the body is checked first, as text (valid
// UTF-8, no lone surrogate escapes) and as a tree of keys against dst's
// type (each key named once per object, struct fields matched exactly),
// and decoded only then.
func DecodeBytes(body []byte, dst any) error {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return ErrInvalidJSON
	}
	if !wellFormedText(body) {
		return ErrInvalidJSON.With("reason", "the body is not valid UTF-8 (or escapes half a surrogate pair)")
	}
	if countValues(body, MaxValues) > MaxValues {
		return ErrInvalidJSON.With("reason", fmt.Sprintf("the body holds more than %d JSON values", MaxValues))
	}
	if err := checkKeys(body, reflect.TypeOf(dst)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return classifyDecodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ErrInvalidJSON.With("reason", "trailing data after the JSON object")
	}
	return nil
}

// wellFormedText reports whether body is valid UTF-8 and every \u escape
// in it names a character: a high surrogate escape must be followed by a
// low one, and a low one must follow a high one. encoding/json would turn
// both a bad byte and a lone surrogate into U+FFFD without a word. A
// malformed escape is left to the decoder, which rejects it.
func wellFormedText(body []byte) bool {
	if !utf8.Valid(body) {
		return false
	}
	inString := false
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 < len(body) && body[i+1] != 'u' {
				i++ // a one-character escape, such as \" or \\
				continue
			}
			r, ok := hex4(body, i+2)
			if !ok {
				return true // malformed: the decoder says so
			}
			i += 5 // the last hex digit
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return false // a low surrogate with no high one before it
			case r >= 0xD800 && r <= 0xDBFF:
				lo, ok := hex4(body, i+3)
				if i+2 >= len(body) || body[i+1] != '\\' || body[i+2] != 'u' || !ok || lo < 0xDC00 || lo > 0xDFFF {
					return false
				}
				i += 6
			}
		}
	}
	return true
}

// hex4 reads the four hex digits at b[at:].
func hex4(b []byte, at int) (rune, bool) {
	if at < 0 || at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// checkKeys walks the first JSON value of body and fails on the first key
// that appears twice in one object, at any depth (invalid_json: a request
// that says two things must not be read as either), or that does not name
// a field of the struct it is decoded into exactly, case included
// (unknown_field: encoding/json would take "PATH" or "Path" for "path").
// It judges only a value that is well formed to its end: malformed input
// returns nil and is left to the decoder, so that it is invalid_json
// whatever its keys.
func checkKeys(body []byte, root reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool         // the next string token of an object is a key
		typ    reflect.Type // what this object or array decodes into; nil: anything
		member reflect.Type // what the value after the last key decodes into
	}
	var stack []frame
	var first error
	// valueType is what the value that starts now decodes into.
	valueType := func() reflect.Type {
		if len(stack) == 0 {
			return decodeTarget(root)
		}
		top := &stack[len(stack)-1]
		if top.object {
			return top.member
		}
		if t := top.typ; t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			return decodeTarget(t.Elem())
		}
		return nil
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		top := len(stack) - 1
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				t := valueType()
				if top >= 0 && stack[top].object {
					stack[top].key = true
				}
				stack = append(stack, frame{keys: map[string]bool{}, object: v == '{', key: v == '{', typ: t})
			default:
				stack = stack[:top]
				if len(stack) == 0 {
					return first
				}
			}
			continue
		case string:
			if top >= 0 && stack[top].object && stack[top].key {
				f := &stack[top]
				f.key = false
				if first != nil {
					continue
				}
				if f.keys[v] {
					first = ErrInvalidJSON.With("reason", fmt.Sprintf("field %q appears twice", v))
					continue
				}
				f.keys[v] = true
				f.member = nil
				if t := f.typ; t != nil {
					switch t.Kind() {
					case reflect.Struct:
						ft, ok := structFields(t)[v]
						if !ok {
							first = unknownField(v)
						}
						f.member = decodeTarget(ft)
					case reflect.Map:
						f.member = decodeTarget(t.Elem())
					}
				}
				continue
			}
		}
		if top >= 0 && stack[top].object {
			stack[top].key = true
		}
		if top < 0 {
			return nil // a scalar at the top: not an object, the decoder says so
		}
	}
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// decodeTarget is what encoding/json decodes a value into for a field of
// type t: t without its pointers, or nil when anything goes (an interface,
// or a type that decodes itself, such as json.RawMessage).
func decodeTarget(t reflect.Type) reflect.Type {
	for t != nil {
		if t.Kind() == reflect.Interface || t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType) {
			return nil
		}
		if t.Kind() != reflect.Pointer {
			return t
		}
		t = t.Elem()
	}
	return nil
}

var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// structFields maps the JSON names of t's fields, as encoding/json names
// them (the tag's name, else the Go name; fields of embedded structs
// promoted), to their types.
func structFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for _, f := range reflect.VisibleFields(t) {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				continue // its fields are listed as promoted ones
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if _, taken := m[name]; !taken { // the shallower field wins
			m[name] = f.Type
		}
	}
	fieldCache.Store(t, m)
	return m
}

func unknownField(name string) *fault.Error {
	return fault.Newf(fault.Invalid, "unknown_field", "field %q is not accepted", name).With("field", name)
}

func classifyDecodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		field := typeErr.Field
		if field == "" {
			return ErrInvalidJSON.Wrap(err)
		}
		return fault.Newf(fault.Invalid, "invalid_field", "field %q has the wrong type", field).With("field", field).Wrap(err)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return unknownField(strings.Trim(name, `"`)).Wrap(err)
	}
	return ErrInvalidJSON.Wrap(err)
}

// InvalidField returns the invalid_field error for field with a reason.
func InvalidField(field, reason string) *fault.Error {
	return fault.New(fault.Invalid, "invalid_field", reason).With("field", field)
}
