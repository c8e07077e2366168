package guestd

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"strata/internal/api"
	"strata/internal/jsend"
)

// DefaultCredentials is where guestd writes what processes in the sandbox
// need to call the API themselves, and where createos looks for it. Outside
// a real guest (make run, tests) guestd --credentials puts the file in the
// daemon's own state instead of the machine's /run.
const DefaultCredentials = "/run/strata/credentials.env"

// envAPIKey is the variable of the credentials file that holds the token.
const envAPIKey = "CREATEOS_API_KEY"

// credentials handles PUT /v1/credentials: the host sends the API address,
// the sandbox id and the sandbox access token (empty once revoked), and
// guestd writes them, root-readable only, as a shell-sourceable env file:
// CREATEOS_API_URL, CREATEOS_SANDBOX_ID and CREATEOS_API_KEY. createos
// reads the file when those variables are not set. A microVM's host sends
// a channel_key too, a key that works only through the sandbox's own
// channel: CREATEOS_API_KEY is that key while the sandbox has no token, so
// that processes inside call the API with no set-up.
//
// A host that has only the token's hash (after a boot) sends token_sha256
// in place of the token: guestd keeps the token it has (keptToken) only
// if its SHA-256 is that, and otherwise writes none, so that a token
// rotated or revoked while the sandbox was down does not linger.
func (s *Server) credentials(r *http.Request) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	var req api.Credentials
	if err := jsend.DecodeObject(r, &req); err != nil {
		return nil, err
	}
	if req.TokenSHA256 != "" {
		switch {
		case req.Token != "":
			return nil, jsend.InvalidField("token_sha256", "token_sha256 is sent in place of a token, never with one")
		case !api.ValidTokenSHA256(req.TokenSHA256):
			return nil, jsend.InvalidField("token_sha256", "token_sha256 must be 64 lowercase hexadecimal digits")
		}
		req.Token = keptToken(req.TokenSHA256, s.credentialsPath, s.credentialsCopy)
	}
	if !strings.HasPrefix(req.APIURL, "http://") && !strings.HasPrefix(req.APIURL, "https://") {
		return nil, jsend.InvalidField("api_url", "api_url must be an http:// or https:// URL")
	}
	for field, v := range map[string]string{"api_url": req.APIURL, "sandbox_id": req.SandboxID, "token": req.Token, "channel_key": req.ChannelKey} {
		if strings.ContainsFunc(v, func(r rune) bool { return unicode.IsControl(r) || r == '\'' }) || len(v) > 2048 {
			return nil, jsend.InvalidField(field, field+" must be at most 2048 bytes, without quotes or control characters")
		}
	}
	if req.SandboxID == "" {
		return nil, jsend.InvalidField("sandbox_id", "sandbox_id is required")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CREATEOS_API_URL='%s'\nCREATEOS_SANDBOX_ID='%s'\n", req.APIURL, req.SandboxID)
	switch {
	case req.Token != "":
		fmt.Fprintf(&b, "%s='%s'\n", envAPIKey, req.Token)
	case req.ChannelKey != "":
		fmt.Fprintf(&b, "%s='%s'\n", envAPIKey, req.ChannelKey)
	}
	if s.credentialsCopy != "" {
		if err := writeFileIfChanged(s.credentialsCopy, []byte(b.String())); err != nil {
			return nil, err
		}
	}
	if err := writeFileIfChanged(s.credentialsPath, []byte(b.String())); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

// writeFileIfChanged is writeFileAtomic unless path already holds data,
// as a regular file of mode 0600: a guest restored from a snapshot of its
// own sandbox has its credentials already, and a write of its durable
// copy (a fresh disk layer on the host, synced) would cost its restore a
// few hundred milliseconds under TCG.
func writeFileIfChanged(path string, data []byte) error {
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == 0o600 && fi.Size() == int64(len(data)) {
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
			return nil
		}
	}
	return writeFileAtomic(path, data)
}

// keptToken is the token guestd already has, from its credentials file or
// else its durable copy, if its SHA-256 in lowercase hex (as the host's
// registry stores it) is sha; otherwise "".
func keptToken(sha string, paths ...string) string {
	for _, p := range paths {
		if p == "" {
			continue
		}
		token := credentialsEnv(p, nil)[envAPIKey]
		if token == "" {
			continue
		}
		sum := sha256.Sum256([]byte(token))
		if subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(sha)) == 1 {
			return token
		}
	}
	return ""
}

// restoreCredentials puts back the credentials file from its durable
// copy when it is missing: /run is empty after a boot, and the host has
// only the token's hash to give again.
func restoreCredentials(path, copyPath string) error {
	if copyPath == "" {
		return nil
	}
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	b, err := os.ReadFile(copyPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return writeFileAtomic(path, b)
}

// writeFileAtomic replaces path with data, mode 0600, durably: a temporary
// file in the same directory, synced, renamed over path, and the directory
// synced so that the rename survives a crash too.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	err = tmp.Chmod(0o600)
	if err == nil {
		_, err = tmp.Write(data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
