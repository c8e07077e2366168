package api

import (
	"fmt"
	"strconv"
	"time"

	"strata/internal/fault"
	"strata/internal/jsend"
)

// Files of a sandbox (/v1/sandboxes/{id}/files/{path…}): the {path…} part
// is an absolute path inside the guest without its leading slash, checked
// by ParseEntryPath ("" is the root directory). Bodies stream both ways:
// neither daemon holds a whole file.

// Media types of the files routes.
const (
	MediaOctetStream = "application/octet-stream"
	MediaTar         = "application/x-tar"
)

// Headers of the files routes: a file's permission bits (octal, as
// "0644") and its modification time (RFC 3339 with nanoseconds).
const (
	HeaderFileMode  = "X-File-Mode"
	HeaderFileMtime = "X-File-Mtime"
)

// Codes of the files routes.
const (
	CodeFileNotFound = "file_not_found"
	CodeNotAFile     = "not_a_file"
)

var (
	ErrFileNotFound = fault.New(fault.NotFound, CodeFileNotFound, "no file or directory has this path in the sandbox")
	ErrNotAFile     = fault.New(fault.Conflict, CodeNotAFile, "the path is a directory (or not a regular file) where a file is needed")
	// ErrDirectoryNotEmpty is a delete of a directory that has entries,
	// without recursive=true.
	ErrDirectoryNotEmpty = fault.New(fault.Conflict, "directory_not_empty", "the directory is not empty; delete with recursive=true to remove the whole tree")
	// ErrGuestDiskFull is a write the guest's disk has no room for.
	ErrGuestDiskFull = fault.New(fault.InsufficientStorage, "insufficient_storage", "not enough free space in the sandbox to write this")
)

// FileEntry is one entry of a directory listing: type is "file", "dir",
// "symlink" or "other"; mode its permission bits in octal.
type FileEntry struct {
	Name      string    `json:"name"`
	Type      string    `json:"type"`
	SizeBytes int64     `json:"size_bytes"`
	Mode      string    `json:"mode"`
	Mtime     time.Time `json:"mtime"`
	Target    string    `json:"target,omitempty"` // a symlink's
}

// FileListing is the answer of GET …/files/{dir}.
type FileListing struct {
	Path    string      `json:"path"`
	Entries []FileEntry `json:"entries"`
}

// FileWritten is the answer of PUT …/files/{path}.
type FileWritten struct {
	Path      string `json:"path"`
	SizeBytes int64  `json:"size_bytes"`
}

// ParseFileMode reads X-File-Mode: octal permission bits, 0 to 07777;
// "" is def.
func ParseFileMode(s string, def uint32) (uint32, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n > 0o7777 || len(s) > 6 {
		return 0, jsend.InvalidField(HeaderFileMode, HeaderFileMode+" must be octal permission bits, 0 to 7777")
	}
	return uint32(n), nil
}

// ParseFileMtime reads X-File-Mtime: RFC 3339 (nanoseconds allowed);
// "" is the zero time (the time of the write).
func ParseFileMtime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Year() < 1 || t.Year() > 9999 {
		return time.Time{}, jsend.InvalidField(HeaderFileMtime, HeaderFileMtime+" must be an RFC 3339 time, such as 2026-12-03T10:00:00Z")
	}
	return t, nil
}

// FormatFileMode is X-File-Mode's form of perm.
func FormatFileMode(perm uint32) string { return fmt.Sprintf("%04o", perm&0o7777) }
