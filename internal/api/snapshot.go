package api

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"strata/egress/policy"
	"strata/internal/jsend"
)

// Snapshot is a VM snapshot as the API shows it.
type Snapshot struct {
	ID string `json:"id"`
	// Ref names the snapshot on the whole deployment (SnapshotRefPrefix
	// and 24 lowercase letters and digits, never reused): accepted
	// wherever ID or Name is, and alone in a fork's from.
	Ref       string `json:"ref,omitempty"`
	Name      string `json:"name,omitempty"`
	Sandbox   string `json:"sandbox"`
	Comment   string `json:"comment"`
	Memory    bool   `json:"memory"`
	Auto      bool   `json:"auto"`
	Pinned    bool   `json:"pinned"`
	Status    string `json:"status"`
	SizeBytes int64  `json:"size_bytes"`
	CreatedAt string `json:"created_at"`
	// PauseMs (memory snapshots of a running sandbox) is how long the
	// guest was stopped, measured on the host; Live tells whether its
	// memory was copied while it ran.
	PauseMs float64 `json:"pause_ms,omitempty"`
	Live    bool    `json:"live,omitempty"`
	// MemoryLost says why a restore's automatic snapshot has only its
	// disk: its memory could not be written.
	MemoryLost string `json:"memory_lost,omitempty"`
}

// SnapshotRestore is the answer of a snapshot restore.
type SnapshotRestore struct {
	SnapshotID string `json:"snapshot_id"`
	AutoID     string `json:"auto_id"`
	State      string `json:"state"`
}

// Limits of the snapshot routes.
const (
	MaxSnapshotComment = 256
	MaxSnapshotName    = 64
	MaxRetentionCount  = 100
	MaxForkCount       = 100
)

// SnapshotCreateRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type SnapshotCreateRequest struct {
	Name      *string    `json:"name,omitempty"`
	Comment   *string    `json:"comment,omitempty"`
	Memory    *bool      `json:"memory,omitempty"`
	Retention *Retention `json:"retention,omitempty"`
}

// Retention is how old snapshots may go to make room for a new one.
type Retention struct {
	Mode     string `json:"mode"`
	MaxCount int    `json:"max_count"`
}

// ParseSnapshotCreate decodes and checks a snapshot create body (an empty
// body is {}): name as ValidSnapshotName says; comment at most MaxSnapshotComment bytes of UTF-8 without
// NUL; memory defaults to true; retention, when given, is mode
// "delete_oldest" with max_count 1 to MaxRetentionCount. Each broken rule
// is invalid_field naming the field.
func ParseSnapshotCreate(body []byte) (SnapshotCreateRequest, error) {
	var req SnapshotCreateRequest
	if err := decodeOptional(body, &req); err != nil {
		return SnapshotCreateRequest{}, err
	}
	if req.Comment != nil {
		c := *req.Comment
		if len(c) > MaxSnapshotComment || !utf8.ValidString(c) || containsNUL(c) {
			return SnapshotCreateRequest{}, jsend.InvalidField("comment", fmt.Sprintf("comment must be UTF-8 text of at most %d bytes", MaxSnapshotComment))
		}
	}
	if req.Name != nil && !ValidSnapshotName(*req.Name) {
		return SnapshotCreateRequest{}, jsend.InvalidField("name", fmt.Sprintf("name must be 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit, not of a snapshot id's shape (v1, auto-1) and not starting with sn- (a snapshot ref's prefix)", MaxSnapshotName))
	}
	if req.Memory == nil {
		t := true
		req.Memory = &t
	}
	if r := req.Retention; r != nil {
		if r.Mode != "delete_oldest" {
			return SnapshotCreateRequest{}, jsend.InvalidField("retention.mode", `retention.mode must be "delete_oldest"`)
		}
		if r.MaxCount < 1 || r.MaxCount > MaxRetentionCount {
			return SnapshotCreateRequest{}, jsend.InvalidField("retention.max_count", fmt.Sprintf("retention.max_count must be 1 to %d", MaxRetentionCount))
		}
	}
	return req, nil
}

// SnapshotRestoreRequest is the optional body of a snapshot restore.
type SnapshotRestoreRequest struct {
	DiskOnly bool `json:"disk_only,omitempty"`
}

// ParseSnapshotRestore decodes a restore body; an empty body is {}.
func ParseSnapshotRestore(body []byte) (SnapshotRestoreRequest, error) {
	var req SnapshotRestoreRequest
	if err := decodeOptional(body, &req); err != nil {
		return SnapshotRestoreRequest{}, err
	}
	return req, nil
}

// ForkRequest is the body of POST …/snapshots/{snapshot}/fork.
type ForkRequest struct {
	Count      int     `json:"count"`
	NamePrefix *string `json:"name_prefix,omitempty"`
	// Access is every fork's access setting (ParseAccess): a fork takes
	// its own, never its source's; left out, DefaultAccess.
	Access json.RawMessage `json:"access,omitempty"`
	// Env and Labels are every fork's (ValidateSandboxEnv,
	// ValidateLabels), never the source's.
	Env    map[string]string `json:"env,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Network is every fork's network setting (policy.Parse); left out,
	// the source's: a fork of a restricted sandbox is restricted too.
	Network *policy.Spec `json:"network,omitempty"`
}

// ParseFork decodes and checks a fork body of at most MaxCreateBody
// bytes: count 1 to MaxForkCount (required); name_prefix, optional, is a
// sandbox name that stays one with "-<n>" added (the forks are named
// <prefix>-1, <prefix>-2, …); access, optional, follows ParseAccess; env
// and labels, optional, ValidateSandboxEnv and ValidateLabels (an empty
// one is left out).
func ParseFork(body []byte) (ForkRequest, error) {
	var req ForkRequest
	if len(body) > MaxCreateBody {
		return req, ErrCreateBodyTooLarge
	}
	if err := jsend.DecodeBytes(body, &req); err != nil {
		return ForkRequest{}, err
	}
	if req.Count < 1 || req.Count > MaxForkCount {
		return ForkRequest{}, jsend.InvalidField("count", fmt.Sprintf("count must be 1 to %d", MaxForkCount))
	}
	if req.NamePrefix != nil {
		if err := ValidateSandboxName(ForkName(*req.NamePrefix, MaxForkCount)); err != nil {
			return ForkRequest{}, jsend.InvalidField("name_prefix", "name_prefix must be a sandbox name that stays one with -<n> added")
		}
	}
	if _, err := ParseAccess("access", req.Access); err != nil {
		return ForkRequest{}, err
	}
	if err := ValidateSandboxEnv("env", req.Env); err != nil {
		return ForkRequest{}, err
	}
	if err := ValidateLabels("labels", req.Labels); err != nil {
		return ForkRequest{}, err
	}
	if len(req.Env) == 0 {
		req.Env = nil
	}
	if len(req.Labels) == 0 {
		req.Labels = nil
	}
	if req.Network != nil {
		p, err := policy.Parse(*req.Network)
		if err != nil {
			return ForkRequest{}, err
		}
		spec := p.Spec()
		req.Network = &spec
	}
	return req, nil
}

// ForkName is the name of the nth fork of a many-fork request.
func ForkName(prefix string, n int) string { return fmt.Sprintf("%s-%d", prefix, n) }

// decodeOptional decodes a body that may be left out (as {}), at most
// jsend.MaxBody, with jsend.DecodeBytes's rules.
func decodeOptional(body []byte, dst any) error {
	if len(body) > jsend.MaxBody {
		return jsend.ErrBodyTooLarge
	}
	if len(body) == 0 {
		body = []byte("{}")
	}
	return jsend.DecodeBytes(body, dst)
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// ValidSnapshotName reports whether s may name a snapshot: 1 to
// MaxSnapshotName ASCII letters, digits, '.', '_' or '-', the first a
// letter or digit, not of a snapshot id's shape ("v" or "auto-" and
// digits, leading zeros too) and not starting with a ref's prefix
// ("sn-"), so that a name is accepted wherever an id or a ref is and
// never means another snapshot than the id or the ref would.
func ValidSnapshotName(s string) bool {
	if len(s) == 0 || len(s) > MaxSnapshotName || idShaped(s, "v") || idShaped(s, "auto-") || strings.HasPrefix(s, SnapshotRefPrefix) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case digit(c), c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// SnapshotRefPrefix starts every snapshot ref; SnapshotRefLen is the
// number of lowercase letters and digits after it.
const (
	SnapshotRefPrefix = "sn-"
	SnapshotRefLen    = 24
)

// ValidSnapshotRef reports whether s has the shape of a snapshot ref:
// SnapshotRefPrefix and SnapshotRefLen lowercase letters and digits.
func ValidSnapshotRef(s string) bool {
	rest, ok := strings.CutPrefix(s, SnapshotRefPrefix)
	if !ok || len(rest) != SnapshotRefLen {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if !lower(rest[i]) && !digit(rest[i]) {
			return false
		}
	}
	return true
}

// idShaped tells whether s is prefix followed by one or more digits.
func idShaped(s, prefix string) bool {
	n, ok := strings.CutPrefix(s, prefix)
	if !ok || n == "" {
		return false
	}
	for i := 0; i < len(n); i++ {
		if !digit(n[i]) {
			return false
		}
	}
	return true
}
