package jsend

import (
	"encoding/json"
	"fmt"

	"strata/internal/fault"
)

// KindForStatus is the inverse of Status: the kind whose status is status.
// It reports false for a status that no kind maps to (and for 500, which is
// Internal and never carries a client-facing code).
func KindForStatus(status int) (fault.Kind, bool) {
	for k := fault.Invalid; k <= fault.InsufficientStorage; k++ {
		if Status(k) == status {
			return k, true
		}
	}
	return fault.Internal, false
}

// ParseFail turns the JSend fail envelope that another strata server sent
// with status (4xx) back into the *fault.Error it was written from, so that
// a relaying server writes it through Error like any other. The code,
// message and every other field of data are kept as they were sent.
func ParseFail(status int, body []byte) (*fault.Error, error) {
	kind, ok := KindForStatus(status)
	if !ok || status < 400 || status >= 500 {
		return nil, fmt.Errorf("jsend: status %d is not a client error of the API", status)
	}
	var env struct {
		Status string                     `json:"status"`
		Data   map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, fmt.Errorf("jsend: fail body: %w", err)
	}
	if env.Status != "fail" {
		return nil, fmt.Errorf("jsend: status %d with envelope status %q", status, env.Status)
	}
	var code, message string
	if err := json.Unmarshal(env.Data["code"], &code); err != nil || code == "" {
		return nil, fmt.Errorf("jsend: fail body without a code")
	}
	if err := json.Unmarshal(env.Data["message"], &message); err != nil {
		return nil, fmt.Errorf("jsend: fail body without a message")
	}
	fe := fault.New(kind, code, message)
	for k, v := range env.Data {
		if k == "code" || k == "message" {
			continue
		}
		if fe.Fields == nil {
			fe.Fields = make(map[string]any, len(env.Data))
		}
		fe.Fields[k] = v
	}
	return fe, nil
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
