package guestd

import (
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

// credentials handles PUT /v1/credentials: the host sends the API address,
// the sandbox id and the sandbox access token (empty once revoked), and
// guestd writes them, root-readable only, as a shell-sourceable env file:
// CREATEOS_API_URL, CREATEOS_SANDBOX_ID and CREATEOS_API_KEY. createos
// reads the file when those variables are not set.
func (s *Server) credentials(r *http.Request) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	var req api.Credentials
	if err := jsend.DecodeObject(r, &req); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(req.APIURL, "http://") && !strings.HasPrefix(req.APIURL, "https://") {
		return nil, jsend.InvalidField("api_url", "api_url must be an http:// or https:// URL")
	}
	for field, v := range map[string]string{"api_url": req.APIURL, "sandbox_id": req.SandboxID, "token": req.Token} {
		if strings.ContainsFunc(v, func(r rune) bool { return unicode.IsControl(r) || r == '\'' }) || len(v) > 2048 {
			return nil, jsend.InvalidField(field, field+" must be at most 2048 bytes, without quotes or control characters")
		}
	}
	if req.SandboxID == "" {
		return nil, jsend.InvalidField("sandbox_id", "sandbox_id is required")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CREATEOS_API_URL='%s'\nCREATEOS_SANDBOX_ID='%s'\n", req.APIURL, req.SandboxID)
	if req.Token != "" {
		fmt.Fprintf(&b, "CREATEOS_API_KEY='%s'\n", req.Token)
	}
	if s.credentialsCopy != "" {
		if err := writeFileAtomic(s.credentialsCopy, []byte(b.String())); err != nil {
			return nil, err
		}
	}
	if err := writeFileAtomic(s.credentialsPath, []byte(b.String())); err != nil {
		return nil, err
	}
	return struct{}{}, nil
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
