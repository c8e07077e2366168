package hostproxy

import (
	"encoding/base64"
	"fmt"
	"io"
)

// TokenPrefix starts every sandbox access token; KeyPrefix every account
// API key that hostproxy generates. They let people and secret scanners
// tell the two apart.
const (
	TokenPrefix = "sbt_"
	KeyPrefix   = "sk_"
)

// NewSecret returns prefix followed by 32 random bytes from rnd in
// unpadded base64url (43 characters).
func NewSecret(rnd io.Reader, prefix string) (string, error) {
	var b [32]byte
	if _, err := io.ReadFull(rnd, b[:]); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// tokenHint is the part of a token that may be shown again: its last four
// characters.
func tokenHint(token string) string {
	if len(token) <= 4 {
		return ""
	}
	return token[len(token)-4:]
}
