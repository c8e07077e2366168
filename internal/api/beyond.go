package api

import (
	"fmt"
	"net/url"
	"path"
	"strings"
	"time"

	"strata/internal/fault"
	"strata/internal/jsend"
)

// Wire types and checks of the directory-checkpoint routes beyond the
// seed's four (issue 8): retention on create, changes, files from the
// past, restore of single paths, clones and release.

// MaxCheckpoints is how many checkpoints one directory may hold, and the
// largest retention.max_count of a create.
const MaxCheckpoints = 10000

// RetentionDeleteOldest is the only retention mode.
const RetentionDeleteOldest = "delete_oldest"

// validateRetention checks the optional retention of a create: mode
// "delete_oldest" and max_count 1 to MaxCheckpoints; null is no retention.
func (r CreateRequest) validateRetention() error {
	ret := r.Retention
	if ret == nil {
		return nil
	}
	if ret.Mode != RetentionDeleteOldest {
		return jsend.InvalidField("retention.mode", `retention.mode must be "delete_oldest"`)
	}
	if ret.MaxCount < 1 || ret.MaxCount > MaxCheckpoints {
		return jsend.InvalidField("retention.max_count", fmt.Sprintf("retention.max_count must be 1 to %d", MaxCheckpoints)).With("limit", MaxCheckpoints)
	}
	return nil
}

// RetentionCount is the max_count of a validated create's retention, 0
// when it has none.
func (r CreateRequest) RetentionCount() int {
	if r.Retention == nil {
		return 0
	}
	return r.Retention.MaxCount
}

// Change is one entry of GET …/checkpoints/{checkpoint}/changes.
type Change struct {
	Path   string `json:"path"`
	Change string `json:"change"`
	Type   string `json:"type"`
	Size   int64  `json:"size"`
}

// AgainstLive is the value of ?against= that compares a checkpoint with
// the live directory.
const AgainstLive = "live"

// ParseChangesQuery reads the query of the changes route: nothing (the
// checkpoint against its parent, ""), or against=live, or against=cp_…
// (another checkpoint). A parameter other than against is
// query_not_allowed; against sent twice, empty or of another shape is
// invalid_field naming "against".
func ParseChangesQuery(q url.Values) (string, error) {
	for k := range q {
		if k != "against" {
			return "", jsend.ErrQueryNotAllowed.With("parameter", k)
		}
	}
	vs, ok := q["against"]
	if !ok {
		return "", nil
	}
	if len(vs) != 1 {
		return "", jsend.InvalidField("against", "send against once")
	}
	v := vs[0]
	if v == AgainstLive || ValidCheckpointID(v) {
		return v, nil
	}
	return "", jsend.InvalidField("against", `against must be "live" or a checkpoint id (cp_…)`)
}

// ModeFormat documents how Entry.Mode is written: the permission bits and
// the setuid, setgid and sticky bits as four octal digits, like chmod
// takes them ("0644", "4755"); never the file type.
const ModeFormat = "%04o"

// FormatMode renders permission bits as Entry.Mode.
func FormatMode(m uint32) string { return fmt.Sprintf(ModeFormat, m&0o7777) }

// MTimeFormat is how Entry.MTime is written: RFC 3339, UTC, with a Z and
// nanoseconds (a file's mtime is finer than a checkpoint's created_at).
const MTimeFormat = "2006-01-02T15:04:05.000000000Z"

// FormatMTime renders t as Entry.MTime.
func FormatMTime(t time.Time) string { return t.UTC().Format(MTimeFormat) }

// Entry is the data of GET …/checkpoints/{checkpoint}/files/{path…}: one
// entry as it is in the checkpoint. Exactly one of Content (files),
// Target (symlinks) and Entries (directories) is present.
type Entry struct {
	Path  string `json:"path"`
	Type  string `json:"type"`
	Mode  string `json:"mode"`
	Size  int64  `json:"size"`
	MTime string `json:"mtime"`
	// Content is a file's bytes, base64 (standard alphabet, padded).
	Content *[]byte     `json:"content,omitempty"`
	Target  *string     `json:"target,omitempty"`
	Entries *[]DirEntry `json:"entries,omitempty"`
}

// DirEntry is one name in a directory's listing.
type DirEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// MaxRelPath is the longest path, in bytes, that a route beyond the four
// takes relative to a managed directory (PATH_MAX).
const MaxRelPath = 4096

// ValidateRelPath checks a path relative to a managed directory's root:
// not empty, at most MaxRelPath bytes, valid UTF-8 without a HiddenRune,
// not absolute, clean (no "//", no trailing "/", no "." element) and
// without a ".." element. The root itself (".") is not such a path. The
// error is invalid_field naming field.
func ValidateRelPath(field, p string) error {
	if fe := relPathError(field, p); fe != nil {
		return fe
	}
	return nil
}

// relPathError is ValidateRelPath's check, nil when p is good.
func relPathError(field, p string) *fault.Error {
	switch {
	case p == "":
		return jsend.InvalidField(field, field+" must not be empty")
	case len(p) > MaxRelPath:
		return jsend.InvalidField(field, fmt.Sprintf("%s must be at most %d bytes", field, MaxRelPath)).With("limit", MaxRelPath)
	}
	if err := checkRunes(field, p); err != nil {
		return fault.As(err)
	}
	switch {
	case strings.HasPrefix(p, "/"):
		return jsend.InvalidField(field, field+" must be relative to the directory's root (no leading /)")
	case p == "." || path.Clean(p) != p:
		return jsend.InvalidField(field, field+` must be clean: no "//", ".", or trailing "/"`)
	case p == ".." || strings.HasPrefix(p, "../"):
		return jsend.InvalidField(field, field+` must not contain ".."`)
	}
	return nil
}

// ParseEntryPath checks the {path…} of the files route, as it arrives
// unescaped: "" is the root itself; anything else follows
// ValidateRelPath, with field "path".
func ParseEntryPath(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	if err := ValidateRelPath("path", p); err != nil {
		return "", err
	}
	return p, nil
}

// MaxRestorePaths is how many paths one restore-paths request may name.
const MaxRestorePaths = 100

// RestorePathsRequest is the body of POST …/checkpoints/{checkpoint}/restore-paths.
type RestorePathsRequest struct {
	Paths []string `json:"paths"`
}

// Validate checks the paths: 1 to MaxRestorePaths of them, each a
// ValidateRelPath path, none named twice and none inside another (the
// outer one already restores it). A broken rule is invalid_field naming
// "paths", with the index of the path at fault when there is one.
func (r RestorePathsRequest) Validate() error {
	if len(r.Paths) == 0 {
		return jsend.InvalidField("paths", "paths must name 1 to 100 paths relative to the directory's root")
	}
	if len(r.Paths) > MaxRestorePaths {
		return jsend.InvalidField("paths", fmt.Sprintf("paths must name at most %d paths", MaxRestorePaths)).With("limit", MaxRestorePaths)
	}
	for i, p := range r.Paths {
		if fe := relPathError("paths", p); fe != nil {
			return fe.With("index", i)
		}
	}
	for i, p := range r.Paths {
		for j, q := range r.Paths {
			if i == j {
				continue
			}
			if p == q && j < i {
				return jsend.InvalidField("paths", fmt.Sprintf("paths names %q twice", p)).With("index", i)
			}
			if strings.HasPrefix(p, q+"/") {
				return jsend.InvalidField("paths", fmt.Sprintf("%q is inside %q, which is restored with everything in it", p, q)).With("index", i)
			}
		}
	}
	return nil
}

// RestorePathsResult is the data of a successful restore-paths.
type RestorePathsResult struct {
	CheckpointID string   `json:"checkpoint_id"`
	Path         string   `json:"path"`
	Paths        []string `json:"paths"`
	// SafetyCheckpointID is the automatic checkpoint that keeps the
	// unsaved changes the restore replaced, when there were any.
	SafetyCheckpointID string `json:"safety_checkpoint_id,omitempty"`
}

// PathRequest is the body of clone and release: one absolute path.
type PathRequest struct {
	Path *string `json:"path"`
}

// Validate returns the path: required, not empty, without a HiddenRune.
// The path rules (absolute, clean, allowed) are the guest's policy, as
// for create (pathpolicy.CheckSyntax at the edge).
func (r PathRequest) Validate() (string, error) {
	if r.Path == nil {
		return "", jsend.InvalidField("path", "path is required")
	}
	if *r.Path == "" {
		return "", jsend.InvalidField("path", "path must not be empty")
	}
	if err := checkRunes("path", *r.Path); err != nil {
		return "", err
	}
	return *r.Path, nil
}

// CloneResult is the data of a successful clone.
type CloneResult struct {
	Path             string `json:"path"`
	FromCheckpointID string `json:"from_checkpoint_id"`
}

// ReleaseResult is the data of a successful release.
type ReleaseResult struct {
	Path                 string   `json:"path"`
	DeletedCheckpointIDs []string `json:"deleted_checkpoint_ids"`
}
