package api

import "strata/internal/fault"

// GuestFailCodes are the codes of the client errors (4xx) that guestd
// answers, each with its kind (so its status): the documented set
// (docs/api.md, "Error codes", the rows from the guest), and the codes of
// the request checks guestd shares with the edge (jsend, httpx, the path
// rules). hostproxy relays a guest's fail only when its code is here and
// its status is this kind's; anything else is the guest's fault and is
// answered as one fixed error. A guest is not trusted (root inside a
// sandbox can answer for guestd), so the codes of the edge's own checks
// are never here: unauthorized, forbidden, sandbox_not_found,
// rate_limited, or any 401, 403 or 429 would let a guest speak for the
// API about credentials and other sandboxes.
var GuestFailCodes = map[string]fault.Kind{
	// Request checks, as the edge makes them.
	"invalid_json":           fault.Invalid,
	"unknown_field":          fault.Invalid,
	"invalid_field":          fault.Invalid,
	"query_not_allowed":      fault.Invalid,
	"body_not_allowed":       fault.Invalid,
	"not_found":              fault.NotFound,
	"method_not_allowed":     fault.MethodNotAllowed,
	"body_too_large":         fault.TooLarge,
	"unsupported_media_type": fault.UnsupportedMedia,

	// Checkpoints and managed directories (layers, holders).
	"checkpoint_not_found":       fault.NotFound,
	"directory_not_managed":      fault.NotFound,
	"entry_not_found":            fault.NotFound,
	"directory_busy":             fault.Conflict,
	"operation_in_progress":      fault.Conflict,
	"directory_moved":            fault.Conflict,
	"checkpoint_limit":           fault.Conflict,
	"directory_unavailable":      fault.Conflict,
	"file_too_large":             fault.TooLarge,
	"checkpoint_other_directory": fault.Unprocessable,
	"idempotency_key_reused":     fault.Unprocessable,

	// Path rules (pathpolicy).
	"path_not_absolute":  fault.Unprocessable,
	"path_not_clean":     fault.Unprocessable,
	"path_protected":     fault.Unprocessable,
	"path_not_found":     fault.Unprocessable,
	"path_not_directory": fault.Unprocessable,
	"path_symlink":       fault.Unprocessable,
	"path_mount":         fault.Unprocessable,
	"path_nested":        fault.Unprocessable,
	"path_hardlink":      fault.Unprocessable,
	"path_special_file":  fault.Unprocessable,
	"path_exists":        fault.Unprocessable,

	// Exec, sessions and files.
	CodeExecFailed:        fault.Unprocessable,
	CodeSessionNotFound:   fault.NotFound,
	CodeSessionLimit:      fault.Conflict,
	CodeSessionRestored:   fault.Conflict,
	CodeFileNotFound:      fault.NotFound,
	CodeNotAFile:          fault.Conflict,
	"directory_not_empty": fault.Conflict,
}
