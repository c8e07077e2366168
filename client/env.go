package client

import (
	"bufio"
	"errors"
	"net/http"
	"os"
	"strings"
)

// Variables of the environment, and the credentials file guestd writes
// inside a sandbox (root-readable) with the same names.
const (
	EnvAPIURL    = "CREATEOS_API_URL"
	EnvAPIKey    = "CREATEOS_API_KEY"
	EnvSandboxID = "CREATEOS_SANDBOX_ID"
	// EnvCredentials names another credentials file (tests, tools).
	EnvCredentials     = "CREATEOS_CREDENTIALS"
	DefaultCredentials = "/run/strata/credentials.env"
)

// New is a client of the API at baseURL (http:// or https://) with key.
func New(baseURL, key string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Key: key, HTTP: &http.Client{}}
}

// FromEnv is New with the address and key of the environment, each taken
// from the credentials file ($CREATEOS_CREDENTIALS, else
// DefaultCredentials) when the environment lacks it: inside a sandbox, a
// program needs no set-up.
func FromEnv() (*Client, error) {
	file := os.Getenv(EnvCredentials)
	if file == "" {
		file = DefaultCredentials
	}
	var creds map[string]string
	get := func(name string) string {
		if v := os.Getenv(name); v != "" {
			return v
		}
		if creds == nil {
			creds = ReadCredentials(file)
		}
		return creds[name]
	}
	url, key := get(EnvAPIURL), get(EnvAPIKey)
	switch {
	case url == "":
		return nil, errors.New("no API address: set " + EnvAPIURL + " (" + file + " has none either)")
	case key == "":
		return nil, errors.New("no API key: set " + EnvAPIKey + " (" + file + " has none either)")
	}
	return New(url, key), nil
}

// ReadCredentials parses NAME='value' lines, as guestd writes them; a
// missing or unreadable file is no values.
func ReadCredentials(path string) map[string]string {
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
