// Package api holds the wire types of the checkpoint API and the
// validation of their fields, shared by guestd (which serves them),
// hostproxy (which validates them at the edge and forwards them) and
// createos (which sends them). It does no I/O.
package api

import (
	"fmt"
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
	// Retention (extension) lets the capture delete the directory's
	// oldest checkpoints; see RetentionCount.
	Retention *Retention `json:"retention,omitempty"`
}

// Checkpoint is a checkpoint as the API shows it.
type Checkpoint struct {
	ID        string `json:"id"`
	Path      string `json:"path"`
	Name      string `json:"name"`
	CreatedAt string `json:"created_at"`
	ParentID  string `json:"parent_id,omitempty"`
	// Auto (extension) marks a checkpoint the store made itself: a
	// restore's safety checkpoint of unsaved changes. Always present.
	Auto bool `json:"auto"`
	// SizeBytes (extension) is the space held by the checkpoint's own
	// layer: what deleting it alone could free.
	SizeBytes int64 `json:"size_bytes"`
}

// Directory is a managed directory (extension: GET …/directories): its
// path and the checkpoint its live content continues from, which the next
// capture will name as parent_id.
type Directory struct {
	Path         string `json:"path"`
	CheckpointID string `json:"checkpoint_id"`
	// State is "ready", "moved" (the path no longer leads to the managed
	// directory: a parent was renamed; now_at says where its live mount
	// is when known) or "unavailable" (problem says why).
	State   string `json:"state"`
	NowAt   string `json:"now_at,omitempty"`
	Problem string `json:"problem,omitempty"`
	// SizeBytes (extension) is the space held by the directory's layers:
	// its checkpoints' and its unsaved changes'.
	SizeBytes int64 `json:"size_bytes"`
}

// Credentials is what the host gives a guest for the processes inside it
// (PUT /v1/credentials on guestd): the API address, the sandbox id, and the
// sandbox access token, empty when there is none.
//
// TokenSHA256, with Token empty, is for a host that no longer has the
// token in plain text (it keeps only hashes, and a guest booting again
// gets only that): the SHA-256 of the token, in lowercase hex. The guest
// keeps the token it already has if that token has this hash, and
// otherwise has none. It is never sent with a Token.
type Credentials struct {
	APIURL      string `json:"api_url"`
	SandboxID   string `json:"sandbox_id"`
	Token       string `json:"token"`
	TokenSHA256 string `json:"token_sha256,omitempty"`
	// ChannelKey is the key a microVM guest's processes use while the
	// sandbox has no access token: it works only through the sandbox's
	// own channel (hostproxy's channelkey.go).
	ChannelKey string `json:"channel_key,omitempty"`
}

// ValidTokenSHA256 reports whether s has the shape of
// Credentials.TokenSHA256: 64 lowercase hexadecimal digits.
func ValidTokenSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !digit(c) && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// RestoreResult is the data of a successful restore.
type RestoreResult struct {
	CheckpointID string `json:"checkpoint_id"`
	Path         string `json:"path"`
	// SafetyCheckpointID (extension) is the automatic checkpoint that
	// keeps the unsaved changes the restore discarded; absent when there
	// were none.
	SafetyCheckpointID string `json:"safety_checkpoint_id,omitempty"`
}

// FormatTime renders t as created_at.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }

// Validate checks the fields of a create request and returns the path
// and name. The path's own rules (absolute, clean, allowed) are the
// guest's policy; here it must only be a non-empty string without the
// characters that names refuse (see HiddenRune). Retention, when given,
// must be mode "delete_oldest" with max_count 1 to MaxCheckpoints.
func (r CreateRequest) Validate() (path, name string, err error) {
	if r.Path == nil {
		return "", "", jsend.InvalidField("path", "path is required")
	}
	if *r.Path == "" {
		return "", "", jsend.InvalidField("path", "path must not be empty")
	}
	if err := checkRunes("path", *r.Path); err != nil {
		return "", "", err
	}
	if r.Name != nil {
		name = *r.Name
		if err := ValidateName(name); err != nil {
			return "", "", err
		}
	}
	if err := r.validateRetention(); err != nil {
		return "", "", err
	}
	return *r.Path, name, nil
}

// ValidateName checks a display name: at most 128 bytes of valid UTF-8,
// with no control, format or line and paragraph separator characters
// (HiddenRune).
func ValidateName(name string) error {
	if len(name) > MaxNameBytes {
		return jsend.InvalidField("name", "name must be at most 128 bytes").With("limit", MaxNameBytes)
	}
	return checkRunes("name", name)
}

// HiddenRune reports whether r is a character that names and paths must
// not contain: a control character (Cc: NUL, newline, escape, DEL, C1), a
// format character (Cf: zero-width spaces and joiners U+200B–U+200D, the
// direction marks and overrides U+200E–U+200F, U+202A–U+202E and
// U+2066–U+2069, the byte order mark U+FEFF, the soft hyphen…), or a line
// or paragraph separator (Zl U+2028, Zp U+2029). Each is invisible, or
// changes how the text around it is shown, so a name holding one can pass
// for another in a list, a log or a terminal.
func HiddenRune(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// checkRunes fails with invalid_field for field unless s is valid UTF-8
// without a HiddenRune; the error names the first such character.
func checkRunes(field, s string) error {
	if !utf8.ValidString(s) {
		return jsend.InvalidField(field, field+" must be valid UTF-8")
	}
	for _, r := range s {
		if HiddenRune(r) {
			return jsend.InvalidField(field, fmt.Sprintf("%s contains %U; control, format (zero-width, bidi) and line separator characters are not allowed", field, r)).
				With("character", fmt.Sprintf("%U", r))
		}
	}
	return nil
}

// HeaderIdempotencyKey names the optional request header of create and
// restore (extension) that makes a retry return the first answer instead
// of acting again. hostproxy checks it and forwards it unchanged; guestd
// keeps the answers.
const HeaderIdempotencyKey = "Idempotency-Key"

// MaxIdempotencyKey is the longest Idempotency-Key accepted, in bytes.
const MaxIdempotencyKey = 255

// IdempotencyKey returns the Idempotency-Key of a request from the values
// of its header (http.Header.Values): "" when there is none; the key when
// it is sent once with 1 to 255 printable ASCII characters (0x20–0x7E);
// otherwise invalid_field naming the header, for a key that is empty,
// too long, holds any other byte, or is sent twice (a retry must not be
// matched on one of two keys).
func IdempotencyKey(values []string) (string, error) {
	const field = HeaderIdempotencyKey
	switch {
	case len(values) == 0:
		return "", nil
	case len(values) > 1:
		return "", jsend.InvalidField(field, "send the Idempotency-Key header once")
	}
	key := values[0]
	switch {
	case key == "":
		return "", jsend.InvalidField(field, "Idempotency-Key must not be empty")
	case len(key) > MaxIdempotencyKey:
		return "", jsend.InvalidField(field, "Idempotency-Key must be at most 255 characters").With("limit", MaxIdempotencyKey)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return "", jsend.InvalidField(field, "Idempotency-Key must be printable ASCII characters only")
		}
	}
	return key, nil
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

// GuestAPIURL is the public API's address inside a strata microVM: guestd
// listens there on the guest's loopback and carries each call to the host
// through the host↔guest channel (CREATEOS_API_URL in the guest).
const GuestAPIURL = "http://127.0.0.1:7777"
