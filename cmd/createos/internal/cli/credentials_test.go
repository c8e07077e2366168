package cli

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCredentialsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credentials.env")
	os.WriteFile(path, []byte("CREATEOS_API_URL='http://10.0.0.1:8080'\nCREATEOS_SANDBOX_ID='sb-1'\nCREATEOS_API_KEY='sbt_abc'\n"), 0o600)
	env := map[string]string{EnvCredentials: path, EnvSandboxID: "sb-from-env"}
	get := withCredentialsFile(func(k string) string { return env[k] })
	tests := []struct{ name, want string }{
		{EnvAPIURL, "http://10.0.0.1:8080"},
		{EnvAPIKey, "sbt_abc"},
		{EnvSandboxID, "sb-from-env"}, // the environment wins
		{"OTHER", ""},
	}
	for _, tc := range tests {
		if got := get(tc.name); got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, got, tc.want)
		}
	}
	none := withCredentialsFile(func(k string) string {
		if k == EnvCredentials {
			return filepath.Join(t.TempDir(), "missing")
		}
		return ""
	})
	if v := none(EnvAPIKey); v != "" {
		t.Errorf("missing file gave %q", v)
	}
}
