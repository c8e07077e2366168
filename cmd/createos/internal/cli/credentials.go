package cli

import (
	"bufio"
	"os"
	"strings"
)

// withCredentialsFile returns a getenv that falls back to the env file
// guestd writes inside a sandbox (root-readable; $CREATEOS_CREDENTIALS or
// /run/strata/credentials.env) for the variables the environment lacks.
// A file that is missing or unreadable changes nothing.
func withCredentialsFile(getenv func(string) string) func(string) string {
	path := getenv(EnvCredentials)
	if path == "" {
		path = DefaultCredentials
	}
	var file map[string]string
	return func(name string) string {
		if v := getenv(name); v != "" {
			return v
		}
		if file == nil {
			file = readEnvFile(path)
		}
		return file[name]
	}
}

// readEnvFile parses NAME='value' lines (as guestd writes them).
func readEnvFile(path string) map[string]string {
	out := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if len(value) >= 2 && value[0] == '\'' && value[len(value)-1] == '\'' {
			value = value[1 : len(value)-1]
		}
		out[name] = value
	}
	return out
}
