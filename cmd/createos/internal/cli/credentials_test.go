package cli

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCredentialsFile: what the environment lacks comes from the file that
// $CREATEOS_CREDENTIALS names, and the environment knows which values did.
func TestCredentialsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credentials.env")
	if err := os.WriteFile(path, []byte("CREATEOS_API_URL='http://10.0.0.1:8080'\nCREATEOS_SANDBOX_ID='sb-1'\nCREATEOS_API_KEY='sbt_abc'\n# CREATEOS_OTHER='x'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{EnvCredentials: path, EnvSandboxID: "sb-from-env"}
	env := newEnvironment(func(k string) string { return vars[k] })
	if env.File != path {
		t.Fatalf("file %q, want %q", env.File, path)
	}
	tests := []struct {
		name, want string
		inFile     bool
	}{
		{EnvAPIURL, "http://10.0.0.1:8080", true},
		{EnvAPIKey, "sbt_abc", true},
		{EnvSandboxID, "sb-from-env", false}, // the environment wins
		{"CREATEOS_OTHER", "", false},
		{"OTHER", "", false},
	}
	for _, tc := range tests {
		if got := env.get(tc.name); got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, got, tc.want)
		}
		if env.inFile(tc.name) != tc.inFile {
			t.Errorf("%s: inFile %v, want %v", tc.name, env.inFile(tc.name), tc.inFile)
		}
	}
	missing := filepath.Join(t.TempDir(), "missing")
	none := newEnvironment(func(k string) string {
		if k == EnvCredentials {
			return missing
		}
		return ""
	})
	if v := none.get(EnvAPIKey); v != "" || none.inFile(EnvAPIKey) {
		t.Errorf("missing file gave %q", v)
	}
	if d := newEnvironment(func(string) string { return "" }); d.File != DefaultCredentials {
		t.Errorf("default file %q, want %q", d.File, DefaultCredentials)
	}
}
