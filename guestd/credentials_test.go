package guestd

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"strata/internal/fault"
)

// putCredentials runs the PUT /v1/credentials handler of a guestd whose
// credentials file is path. It needs no store: the handler touches only
// that file.
func putCredentials(path, body string) error {
	s := &Server{credentialsPath: path}
	r := httptest.NewRequest("PUT", "/v1/credentials", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	_, err := s.credentials(r)
	return err
}

// TestCredentialsFile pins what lands in the credentials file and where:
// the configured path (its directory created: make run's is under STATE),
// root-readable only, NAME='value' lines that createos parses, and a
// revoke (no token) that rewrites the file without the key.
func TestCredentialsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "credentials.env")
	steps := []struct {
		name, body, want string
	}{
		{"issue", `{"api_url":"http://127.0.0.1:8080","sandbox_id":"sb-local","token":"st_abc"}`,
			"CREATEOS_API_URL='http://127.0.0.1:8080'\nCREATEOS_SANDBOX_ID='sb-local'\nCREATEOS_API_KEY='st_abc'\n"},
		{"revoke", `{"api_url":"http://127.0.0.1:8080","sandbox_id":"sb-local","token":""}`,
			"CREATEOS_API_URL='http://127.0.0.1:8080'\nCREATEOS_SANDBOX_ID='sb-local'\n"},
		// A microVM's host sends a channel key: the key while there is
		// no token, the token once there is one.
		{"boot, no token", `{"api_url":"http://127.0.0.1:7777","sandbox_id":"sb-1","token":"","channel_key":"sbc_k"}`,
			"CREATEOS_API_URL='http://127.0.0.1:7777'\nCREATEOS_SANDBOX_ID='sb-1'\nCREATEOS_API_KEY='sbc_k'\n"},
		{"issue beside the channel key", `{"api_url":"http://127.0.0.1:7777","sandbox_id":"sb-1","token":"sbt_t","channel_key":"sbc_k"}`,
			"CREATEOS_API_URL='http://127.0.0.1:7777'\nCREATEOS_SANDBOX_ID='sb-1'\nCREATEOS_API_KEY='sbt_t'\n"},
		{"boot, the kept token's hash", `{"api_url":"http://127.0.0.1:7777","sandbox_id":"sb-1","token":"","token_sha256":"` + sha("sbt_t") + `","channel_key":"sbc_k"}`,
			"CREATEOS_API_URL='http://127.0.0.1:7777'\nCREATEOS_SANDBOX_ID='sb-1'\nCREATEOS_API_KEY='sbt_t'\n"},
		{"boot, another token's hash", `{"api_url":"http://127.0.0.1:7777","sandbox_id":"sb-1","token":"","token_sha256":"` + sha("sbt_other") + `","channel_key":"sbc_k"}`,
			"CREATEOS_API_URL='http://127.0.0.1:7777'\nCREATEOS_SANDBOX_ID='sb-1'\nCREATEOS_API_KEY='sbc_k'\n"},
	}
	for _, st := range steps {
		if err := putCredentials(path, st.body); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if string(got) != st.want {
			t.Errorf("%s: file\n%s\nwant\n%s", st.name, got, st.want)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v (%v), want 0600", st.name, fi.Mode(), err)
		}
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want the file alone (no temporary left): %v", len(entries), entries)
	}
}

// TestCredentialsRefused pins that a request the file could not hold
// safely is an invalid-field error and writes nothing.
func TestCredentialsRefused(t *testing.T) {
	cases := map[string]struct {
		body, field string
	}{
		"not http":      {`{"api_url":"ftp://x","sandbox_id":"sb","token":"t"}`, "api_url"},
		"quote":         {`{"api_url":"http://x","sandbox_id":"sb","token":"t'; rm -rf /"}`, "token"},
		"newline":       {`{"api_url":"http://x","sandbox_id":"sb\nX=1","token":"t"}`, "sandbox_id"},
		"no sandbox id": {`{"api_url":"http://x","sandbox_id":"","token":"t"}`, "sandbox_id"},
		"channel key":   {`{"api_url":"http://x","sandbox_id":"sb","channel_key":"k'\n"}`, "channel_key"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "credentials.env")
			err := putCredentials(path, tc.body)
			fe := fault.As(err)
			if fe == nil || fe.Kind != fault.Invalid || fe.Code != "invalid_field" || fe.Fields["field"] != tc.field {
				t.Errorf("error %v, want invalid_field on %s", err, tc.field)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("file written for a refused request: %v", err)
			}
		})
	}
}

// TestCredentialsKeepByHash pins what guestd does with token_sha256, the
// hash of the sandbox's token that the host sends after a boot (it keeps
// only hashes): the token guestd has, from its file or else its durable
// copy, is kept only if it has that hash; any other token is dropped, so
// that a token rotated or revoked while the sandbox was down does not
// stay in the guest. Both files end the same.
func TestCredentialsKeepByHash(t *testing.T) {
	const (
		head    = "CREATEOS_API_URL='http://127.0.0.1:7777'\nCREATEOS_SANDBOX_ID='sb-1'\n"
		withOld = head + "CREATEOS_API_KEY='sbt_old'\n"
		withNew = head + "CREATEOS_API_KEY='sbt_new'\n"
	)
	put := func(hash string) string {
		return `{"api_url":"http://127.0.0.1:7777","sandbox_id":"sb-1","token":"","token_sha256":"` + hash + `"}`
	}
	cases := []struct {
		name       string
		file, copy string // "" for no file
		body       string
		want       string
	}{
		{"file has the token", withOld, withOld, put(sha("sbt_old")), withOld},
		{"after a boot only the copy has it", "", withOld, put(sha("sbt_old")), withOld},
		{"the file has it, the copy has another", withOld, withNew, put(sha("sbt_old")), withOld},
		{"the copy has it, the file has another", withNew, withOld, put(sha("sbt_old")), withOld},
		{"rotated while down", "", withOld, put(sha("sbt_new")), head},
		{"rotated, file present", withOld, withOld, put(sha("sbt_new")), head},
		{"no token to keep", head, head, put(sha("sbt_old")), head},
		{"nothing yet", "", "", put(sha("sbt_old")), head},
		{"neither token nor hash", withOld, withOld, `{"api_url":"http://127.0.0.1:7777","sandbox_id":"sb-1","token":""}`, head},
		{"a token replaces", withOld, withOld, `{"api_url":"http://127.0.0.1:7777","sandbox_id":"sb-1","token":"sbt_new"}`, withNew},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := &Server{credentialsPath: filepath.Join(dir, "run", "credentials.env"), credentialsCopy: filepath.Join(dir, "strata-credentials.env")}
			for path, content := range map[string]string{s.credentialsPath: tc.file, s.credentialsCopy: tc.copy} {
				if content != "" {
					if err := writeFileAtomic(path, []byte(content)); err != nil {
						t.Fatal(err)
					}
				}
			}
			r := httptest.NewRequest("PUT", "/v1/credentials", strings.NewReader(tc.body))
			r.Header.Set("Content-Type", "application/json")
			if _, err := s.credentials(r); err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{s.credentialsPath, s.credentialsCopy} {
				if got, err := os.ReadFile(path); err != nil || string(got) != tc.want {
					t.Errorf("%s:\n%s(%v)\nwant\n%s", filepath.Base(path), got, err, tc.want)
				}
			}
		})
	}
}

// TestCredentialsHashRefused pins the shape of token_sha256: 64
// lowercase hex digits, and never beside a token.
func TestCredentialsHashRefused(t *testing.T) {
	good := sha("sbt_old")
	cases := map[string]string{
		"with a token": `{"api_url":"http://x","sandbox_id":"sb","token":"sbt_old","token_sha256":"` + good + `"}`,
		"upper case":   `{"api_url":"http://x","sandbox_id":"sb","token":"","token_sha256":"` + strings.ToUpper(good) + `"}`,
		"short":        `{"api_url":"http://x","sandbox_id":"sb","token":"","token_sha256":"` + good[:63] + `"}`,
		"not hex":      `{"api_url":"http://x","sandbox_id":"sb","token":"","token_sha256":"` + good[:63] + `g"}`,
		"quote":        `{"api_url":"http://x","sandbox_id":"sb","token":"","token_sha256":"` + good[:63] + `'"}`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "credentials.env")
			err := putCredentials(path, body)
			fe := fault.As(err)
			if fe == nil || fe.Code != "invalid_field" || fe.Fields["field"] != "token_sha256" {
				t.Errorf("error %v, want invalid_field on token_sha256", err)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("file written for a refused request: %v", err)
			}
		})
	}
}

// sha is the SHA-256 of s in lowercase hex, as hostproxy's registry keeps
// a token's.
func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestWriteFileIfChanged: a file that already holds the data (regular,
// 0600) is left as it is, the same inode; any other content, mode or
// kind of file is replaced.
func TestWriteFileIfChanged(t *testing.T) {
	data := []byte("CREATEOS_SANDBOX_ID='sb-1'\n")
	for _, tc := range []struct {
		name    string
		prepare func(path string) error
		kept    bool
	}{
		{"same", func(p string) error { return os.WriteFile(p, data, 0o600) }, true},
		{"other content", func(p string) error { return os.WriteFile(p, []byte("CREATEOS_SANDBOX_ID='sb-2'\n"), 0o600) }, false},
		{"other mode", func(p string) error {
			if err := os.WriteFile(p, data, 0o600); err != nil {
				return err
			}
			return os.Chmod(p, 0o644)
		}, false},
		{"a link to the same", func(p string) error {
			target := p + ".target"
			if err := os.WriteFile(target, data, 0o600); err != nil {
				return err
			}
			return os.Symlink(target, p)
		}, false},
		{"missing", func(string) error { return nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "credentials.env")
			if err := tc.prepare(path); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Lstat(path)
			if err := writeFileIfChanged(path, data); err != nil {
				t.Fatal(err)
			}
			after, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path)
			if string(got) != string(data) || !after.Mode().IsRegular() || after.Mode().Perm() != 0o600 {
				t.Fatalf("after: %q, mode %v", got, after.Mode())
			}
			if kept := before != nil && os.SameFile(before, after); kept != tc.kept {
				t.Fatalf("file kept: %v, want %v", kept, tc.kept)
			}
		})
	}
}
