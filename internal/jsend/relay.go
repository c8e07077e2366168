package jsend

import (
	"bytes"
	"encoding/json"
	"fmt"

	"strata/internal/fault"
)

// KindForStatus is the inverse of Status: the kind whose status is status.
// It reports false for a status that no kind maps to (and for 500, which is
// Internal and never carries a client-facing code).
func KindForStatus(status int) (fault.Kind, bool) {
	for k := fault.Invalid; k <= fault.BadGateway; k++ {
		if Status(k) == status {
			return k, true
		}
	}
	return fault.Internal, false
}

// Bounds of a fail that ParseFail takes from another server (a guest,
// which is not trusted): the body, and the fields beside code and
// message. What ParseFail returns is a copy of at most MaxFailBody bytes
// of text, whatever the body held: encoding/json would make a map entry
// of every field first (a 16 MiB body of tiny fields took 560 MiB).
// MaxFailBody holds guestd's largest fails: directory_busy with its
// holders, exec_failed naming a long program.
const (
	MaxFailBody   = 64 << 10
	MaxFailFields = 8
	// maxFailName bounds a code and a field's name.
	maxFailName = 64
)

// ParseFail turns the JSend fail envelope that another strata server sent
// with status (4xx) back into the *fault.Error it was written from, so that
// a relaying server writes it through Error like any other. The code,
// message and other fields of data are kept as they were sent, within
// bounds: a body of at most MaxFailBody bytes that is one object of
// "status":"fail" and "data", whose data holds a code (a name: lowercase
// letters, digits and '_', at most 64 bytes), a message (a string) and at
// most MaxFailFields more fields (each named as a code is), each named
// once. Anything else is an error. Whether the code is one the caller
// relays is the caller's to say.
func ParseFail(status int, body []byte) (*fault.Error, error) {
	kind, ok := KindForStatus(status)
	if !ok || status < 400 || status >= 500 {
		return nil, fmt.Errorf("jsend: status %d is not a client error of the API", status)
	}
	if len(body) > MaxFailBody {
		return nil, fmt.Errorf("jsend: fail body of %d bytes, at most %d", len(body), MaxFailBody)
	}
	if !json.Valid(body) {
		return nil, fmt.Errorf("jsend: fail body is not JSON")
	}
	var envStatus, data []byte
	err := EachMember(body, func(k, v []byte) error {
		switch {
		case string(k) == `"status"` && envStatus == nil:
			envStatus = v
		case string(k) == `"data"` && data == nil:
			data = v
		default:
			return fmt.Errorf("jsend: fail envelope with member %.80s", k)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if string(envStatus) != `"fail"` {
		return nil, fmt.Errorf("jsend: status %d with envelope status %.80s", status, envStatus)
	}
	fe := &fault.Error{Kind: kind}
	var code, message []byte
	err = EachMember(data, func(k, v []byte) error {
		name := k[1 : len(k)-1]
		if !isName(name) {
			return fmt.Errorf("jsend: fail field named %.80s", k)
		}
		switch {
		case string(name) == "code" && code == nil:
			code = v
		case string(name) == "message" && message == nil:
			message = v
		case string(name) == "code" || string(name) == "message" || fe.Fields[string(name)] != nil:
			return fmt.Errorf("jsend: fail field %s named twice", name)
		case len(fe.Fields) == MaxFailFields:
			return fmt.Errorf("jsend: fail with more than %d fields", MaxFailFields)
		default:
			if fe.Fields == nil {
				fe.Fields = make(map[string]any, MaxFailFields)
			}
			fe.Fields[string(name)] = json.RawMessage(bytes.Clone(v))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(code, &fe.Code); err != nil || !isName([]byte(fe.Code)) {
		return nil, fmt.Errorf("jsend: fail body without a code")
	}
	if err := json.Unmarshal(message, &fe.Message); err != nil {
		return nil, fmt.Errorf("jsend: fail body without a message")
	}
	return fe, nil
}

// isName tells whether b is a code or field name: 1 to maxFailName
// lowercase ASCII letters, digits and '_'.
func isName(b []byte) bool {
	if len(b) == 0 || len(b) > maxFailName {
		return false
	}
	for _, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// ParseSuccess returns the data of a JSend success envelope, unchanged:
// a slice of body, not a copy, so that whoever holds body's bytes (a
// budget of answers held) holds data's.
func ParseSuccess(body []byte) (json.RawMessage, error) {
	var env struct {
		Status string  `json:"status"`
		Data   inPlace `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, fmt.Errorf("jsend: success body: %w", err)
	}
	if env.Status != "success" || len(env.Data) == 0 {
		return nil, fmt.Errorf("jsend: 200 with envelope status %q", env.Status)
	}
	return json.RawMessage(env.Data), nil
}

// inPlace is JSON kept as the slice of the input that json.Unmarshal
// hands it, where json.RawMessage copies it.
type inPlace []byte

func (p *inPlace) UnmarshalJSON(b []byte) error {
	*p = b
	return nil
}
