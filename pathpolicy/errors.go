package pathpolicy

import (
	"strata/internal/fault"
)

// Stable codes of the errors this package returns. Every path-rule violation
// is fault.Unprocessable (422); a malformed path is fault.Invalid (400).
const (
	CodePathNotAbsolute  = "path_not_absolute"
	CodePathNotClean     = "path_not_clean"
	CodePathNotFound     = "path_not_found"
	CodePathNotDirectory = "path_not_directory"
	CodePathProtected    = "path_protected"
	CodePathSymlink      = "path_symlink"
	CodePathMount        = "path_mount"
	CodePathNested       = "path_nested"
	CodePathHardlink     = "path_hardlink"
	CodePathSpecialFile  = "path_special_file"
	// CodePathExists refuses a path that must not exist yet (a clone's).
	CodePathExists = "path_exists"

	CodeInvalidField = "invalid_field"
)

// ViolationCodes lists every code a path-rule violation can carry.
var ViolationCodes = []string{
	CodePathNotAbsolute, CodePathNotClean, CodePathNotFound, CodePathNotDirectory,
	CodePathProtected, CodePathSymlink, CodePathMount, CodePathNested,
	CodePathHardlink, CodePathSpecialFile, CodePathExists,
}

// MaxPathLen is the longest path accepted, in bytes (Linux PATH_MAX).
const MaxPathLen = 4096

// violation builds the 422 error for a broken path rule. offending is the
// absolute path of the component, file or mount that broke the rule, or ""
// when the rule concerns the path string itself.
func violation(code, path, offending, message string) *fault.Error {
	fields := map[string]any{"path": path}
	if offending != "" {
		fields["offending"] = offending
	}
	return &fault.Error{Kind: fault.Unprocessable, Code: code, Message: message, Fields: fields}
}

// Violation is the 422 error for a broken path rule found outside this
// package (a check on an open handle that closes a race with the path
// checks here).
func Violation(code, path, offending, message string) error {
	return violation(code, path, offending, message)
}

// invalidPath is the 400 error for a path that is not a path at all. The
// value is not echoed back: it may be 4 KiB of garbage or hold a NUL byte.
func invalidPath(message string) *fault.Error {
	return &fault.Error{
		Kind: fault.Invalid, Code: CodeInvalidField, Message: message,
		Fields: map[string]any{"field": "path"},
	}
}
