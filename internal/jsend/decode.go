package jsend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"strata/internal/fault"
)

// MaxBody is the largest request body the API accepts.
const MaxBody = 16 << 10

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
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || !(mt == "application/json" || strings.HasSuffix(mt, "+json")) {
			return ErrUnsupportedMedia
		}
	}
	if r.ContentLength > MaxBody {
		return ErrBodyTooLarge
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		return ErrInvalidJSON.Wrap(err)
	}
	if len(body) > MaxBody {
		return ErrBodyTooLarge
	}
	return DecodeBytes(body, dst)
}

// DecodeBytes is DecodeObject's parser, apart so that it can be fuzzed.
func DecodeBytes(body []byte, dst any) error {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return ErrInvalidJSON
	}
	if dup := duplicateKey(body); dup != "" {
		return ErrInvalidJSON.With("reason", fmt.Sprintf("field %q appears twice", dup))
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

// duplicateKey returns a key that appears twice in one object of body
// (at any depth), or "". encoding/json would silently keep the last one;
// a request that says two things must not be read as either. Malformed
// input returns "" and is left to the decoder to reject.
func duplicateKey(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool // the next string token of an object is a key
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		top := len(stack) - 1
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				if top >= 0 && stack[top].object {
					stack[top].key = true
				}
				stack = append(stack, frame{keys: map[string]bool{}, object: true, key: true})
			case '[':
				if top >= 0 && stack[top].object {
					stack[top].key = true
				}
				stack = append(stack, frame{})
			default:
				stack = stack[:top]
				if len(stack) == 0 {
					return ""
				}
			}
		case string:
			if top >= 0 && stack[top].object && stack[top].key {
				if stack[top].keys[v] {
					return v
				}
				stack[top].keys[v] = true
				stack[top].key = false
				continue
			}
			if top >= 0 && stack[top].object {
				stack[top].key = true
			}
		default:
			if top >= 0 && stack[top].object {
				stack[top].key = true
			}
		}
	}
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
		name = strings.Trim(name, `"`)
		return fault.Newf(fault.Invalid, "unknown_field", "field %q is not accepted", name).With("field", name).Wrap(err)
	}
	return ErrInvalidJSON.Wrap(err)
}

// InvalidField returns the invalid_field error for field with a reason.
func InvalidField(field, reason string) *fault.Error {
	return fault.New(fault.Invalid, "invalid_field", reason).With("field", field)
}
