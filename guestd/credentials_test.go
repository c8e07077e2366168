package guestd

import (
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
