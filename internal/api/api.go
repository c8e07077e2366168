// Package api holds the wire types of the checkpoint API and the
// validation of their fields, shared by guestd (which serves them),
// hostproxy (which validates them at the edge and forwards them) and
// createos (which sends them). It does no I/O.
package api

import (
	"time"
	"unicode"
	"unicode/utf8"

	"strata/internal/jsend"
)

// MaxNameBytes is the longest display name a checkpoint may have.
const MaxNameBytes = 128

// TimeFormat is how created_at is written: RFC 3339, UTC, with a Z and
// milliseconds, so that checkpoints taken within one second still order.
const TimeFormat = "2006-01-02T15:04:05.000Z"

// CreateRequest is the body of POST …/checkpoints.
type CreateRequest struct {
	Path *string `json:"path"`
	Name *string `json:"name"`
}

// Checkpoint is a checkpoint as the API shows it.
type Checkpoint struct {
	ID        string `json:"id"`
	Path      string `json:"path"`
	Name      string `json:"name"`
	CreatedAt string `json:"created_at"`
	ParentID  string `json:"parent_id,omitempty"`
}

// Directory is a managed directory (extension: GET …/directories): its
// path and the checkpoint its live content continues from, which the next
// capture will name as parent_id.
type Directory struct {
	Path         string `json:"path"`
	CheckpointID string `json:"checkpoint_id"`
}

// Credentials is what the host gives a guest for the processes inside it
// (PUT /v1/credentials on guestd): the API address, the sandbox id, and the
// sandbox access token, empty when there is none.
type Credentials struct {
	APIURL    string `json:"api_url"`
	SandboxID string `json:"sandbox_id"`
	Token     string `json:"token"`
}

// RestoreResult is the data of a successful restore.
type RestoreResult struct {
	CheckpointID string `json:"checkpoint_id"`
	Path         string `json:"path"`
}

// FormatTime renders t as created_at.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }

// Validate checks the fields of a create request and returns the path
// and name. The path's own rules (absolute, clean, allowed) are the
// guest's policy; here it must only be a non-empty string.
func (r CreateRequest) Validate() (path, name string, err error) {
	if r.Path == nil {
		return "", "", jsend.InvalidField("path", "path is required")
	}
	if *r.Path == "" {
		return "", "", jsend.InvalidField("path", "path must not be empty")
	}
	if r.Name != nil {
		name = *r.Name
		if err := ValidateName(name); err != nil {
			return "", "", err
		}
	}
	return *r.Path, name, nil
}

// ValidateName checks a display name: at most 128 bytes of UTF-8 with no
// control characters.
func ValidateName(name string) error {
	if len(name) > MaxNameBytes {
		return jsend.InvalidField("name", "name must be at most 128 bytes").With("limit", MaxNameBytes)
	}
	if !utf8.ValidString(name) {
		return jsend.InvalidField("name", "name must be valid UTF-8")
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return jsend.InvalidField("name", "name must not contain control characters")
		}
	}
	return nil
}

// ValidCheckpointID reports whether id has the shape of a checkpoint id:
// "cp_" and 22 characters of unpadded base64url.
func ValidCheckpointID(id string) bool {
	if len(id) != 25 || id[:3] != "cp_" {
		return false
	}
	for i := 3; i < len(id); i++ {
		c := id[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
