// Package fault defines the few classes of error that strata's domain
// packages return, each carrying a stable code for the public API.
//
// Domain packages (layers, pathpolicy, holders, guestd's engine) build
// *Error values and never import net/http; package jsend is the one place
// that turns a Kind into an HTTP status and a JSend envelope. An error that is not a
// *Error is an internal error: its text is logged, never shown to a client.
package fault

import (
	"errors"
	"fmt"
)

// Kind is the class of an error. Each kind maps to exactly one HTTP status
// (see jsend.Status).
type Kind uint8

const (
	// Internal is a server-side failure; clients see a bare 500.
	Internal Kind = iota
	// Invalid is a malformed request (400).
	Invalid
	// Unauthorized is a missing or unknown credential (401).
	Unauthorized
	// Forbidden is a valid credential used outside its scope (403).
	Forbidden
	// NotFound is an unknown sandbox, checkpoint or route (404).
	NotFound
	// MethodNotAllowed is a wrong method on a known route (405).
	MethodNotAllowed
	// Conflict is a state that forbids the operation right now (409).
	Conflict
	// TooLarge is a request body over the limit (413).
	TooLarge
	// UnsupportedMedia is a body that is not JSON (415).
	UnsupportedMedia
	// Unprocessable is a well-formed request that breaks a rule (422).
	Unprocessable
	// TooManyRequests is a rate limit (429).
	TooManyRequests
	// Unavailable is a dependency that cannot be reached (503).
	Unavailable
	// InsufficientStorage is not enough free space to proceed safely (507).
	InsufficientStorage
	// BadGateway is an answer from a dependency that breaks its contract
	// (502): a guest's answer that is not guestd's.
	BadGateway
)

var kindNames = [...]string{
	Internal: "internal", Invalid: "invalid", Unauthorized: "unauthorized",
	Forbidden: "forbidden", NotFound: "not_found", MethodNotAllowed: "method_not_allowed",
	Conflict: "conflict", TooLarge: "too_large", UnsupportedMedia: "unsupported_media",
	Unprocessable: "unprocessable", TooManyRequests: "too_many_requests",
	Unavailable: "unavailable", InsufficientStorage: "insufficient_storage",
	BadGateway: "bad_gateway",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Error is a classified error with a stable code and a message fit for a
// client. Fields name what failed ("path", "holders", "limit"); Err is the
// underlying cause, kept for logs and errors.Is, never sent to a client.
type Error struct {
	Kind    Kind
	Code    string
	Message string
	Fields  map[string]any
	Err     error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return e.Code + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// New returns an error of the given kind and code.
func New(kind Kind, code, message string) *Error {
	return &Error{Kind: kind, Code: code, Message: message}
}

// Newf is New with a formatted message.
func Newf(kind Kind, code, format string, args ...any) *Error {
	return &Error{Kind: kind, Code: code, Message: fmt.Sprintf(format, args...)}
}

// With returns a copy of e with the field key set to value.
func (e *Error) With(key string, value any) *Error {
	c := *e
	c.Fields = make(map[string]any, len(e.Fields)+1)
	for k, v := range e.Fields {
		c.Fields[k] = v
	}
	c.Fields[key] = value
	return &c
}

// Wrap returns a copy of e whose cause is err.
func (e *Error) Wrap(err error) *Error {
	c := *e
	c.Err = err
	return &c
}

// As returns the *Error in err's chain, or nil when err is unclassified.
func As(err error) *Error {
	var fe *Error
	if errors.As(err, &fe) {
		return fe
	}
	return nil
}

// KindOf returns the kind of err: Internal when err carries no *Error.
func KindOf(err error) Kind {
	if fe := As(err); fe != nil {
		return fe.Kind
	}
	return Internal
}

// CodeOf returns the stable code of err, or "" when it has none.
func CodeOf(err error) string {
	if fe := As(err); fe != nil {
		return fe.Code
	}
	return ""
}
