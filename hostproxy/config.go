package hostproxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"regexp"
	"strings"
	"time"
)

// Config is hostproxy's configuration, read from a JSON file (LoadConfig)
// and completed by command-line flags. Unknown fields are an error.
//
//	{
//	  "listen": "127.0.0.1:8080",
//	  "data_dir": "/var/lib/strata/hostproxy",
//	  "accounts": [
//	    {"id": "acct-local", "keys": [{"id": "key-local", "env": "CREATEOS_API_KEY"}]}
//	  ],
//	  "sandboxes": [
//	    {"id": "sb-local", "account": "acct-local",
//	     "guest": "unix:///var/lib/strata/guestd.sock", "state": "running"}
//	  ],
//	  "rate_limit": {"per_second": 20, "burst": 40},
//	  "timeouts": {"guest_dial": "1s", "guest_request": "60s"}
//	}
type Config struct {
	// Listen is the TCP address of the API.
	Listen string `json:"listen"`
	// PublicURL is the API's address as processes inside sandboxes reach
	// it, handed to each guest with its access token; "http://"+Listen
	// when empty.
	PublicURL string `json:"public_url,omitempty"`
	// DataDir holds registry.db, the bbolt file of the registry.
	DataDir   string          `json:"data_dir"`
	Accounts  []AccountConfig `json:"accounts"`
	Sandboxes []SandboxConfig `json:"sandboxes"`
	RateLimit RateLimit       `json:"rate_limit"`
	Timeouts  Timeouts        `json:"timeouts"`
	// VMs, when set, lets the API create and run microVM
	// sandboxes on this host.
	VMs *VMsConfig `json:"vms,omitempty"`
}

// AccountConfig is one account and its API keys.
type AccountConfig struct {
	ID   string      `json:"id"`
	Keys []KeyConfig `json:"keys"`
}

// KeyConfig names one account API key without writing it in the file:
// either SHA256, the hex SHA-256 of the key, or Env, the name of an
// environment variable that holds the key when hostproxy starts. Only the
// hash is kept.
type KeyConfig struct {
	ID     string `json:"id"`
	SHA256 string `json:"sha256,omitempty"`
	Env    string `json:"env,omitempty"`
}

// SandboxConfig is one sandbox: its account, the address of its guest
// daemon (unix:///path/to.sock or tcp://host:port) and its state.
type SandboxConfig struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Guest   string `json:"guest"`
	// State is running (the default), paused or stopped.
	State SandboxState `json:"state,omitempty"`
}

// RateLimit is the token bucket of each credential.
type RateLimit struct {
	// PerSecond is the sustained rate; 0 means the default (20).
	PerSecond float64 `json:"per_second,omitempty"`
	// Burst is the bucket size; 0 means the default (40).
	Burst int `json:"burst,omitempty"`
}

// Timeouts bound the work of one request. Zero values take the defaults.
type Timeouts struct {
	// ReadHeader bounds reading a request's headers (default 5s).
	ReadHeader Duration `json:"read_header,omitempty"`
	// Read bounds reading a whole request, body included (default 15s).
	Read Duration `json:"read,omitempty"`
	// Write bounds a response, from the end of the headers (default: the
	// guest request timeout plus 10s).
	Write Duration `json:"write,omitempty"`
	// Idle bounds a keep-alive connection between requests (default 60s).
	Idle Duration `json:"idle,omitempty"`
	// GuestDial bounds connecting to a guest daemon (default 1s).
	GuestDial Duration `json:"guest_dial,omitempty"`
	// GuestRequest bounds a whole call to a guest daemon (default 60s).
	GuestRequest Duration `json:"guest_request,omitempty"`
	// Shutdown bounds the wait for requests in flight at shutdown (default 30s).
	Shutdown Duration `json:"shutdown,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("1.5s").
type Duration time.Duration

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"1s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("duration %q is negative", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d Duration) or(def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}

// Defaults of Config.
const (
	DefaultListen       = "127.0.0.1:8080"
	DefaultRatePerSec   = 20
	DefaultRateBurst    = 40
	defaultReadHeader   = 5 * time.Second
	defaultRead         = 15 * time.Second
	defaultIdle         = 60 * time.Second
	defaultGuestDial    = time.Second
	defaultGuestRequest = 60 * time.Second
	defaultShutdown     = 30 * time.Second
	// MinKeyLength is the shortest account API key accepted from the
	// environment; keys are compared by SHA-256, so they must be hard to guess.
	MinKeyLength = 16
)

// LoadConfig reads a JSON configuration file.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return ParseConfig(b)
}

// ParseConfig decodes a JSON configuration, rejecting unknown fields.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if dec.More() {
		return Config{}, errors.New("config: trailing data after the JSON object")
	}
	return c, nil
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// seed is a validated configuration: key hashes instead of key sources.
type seed struct {
	accounts  []Account
	keys      []APIKey
	sandboxes []Sandbox
}

// resolve validates c and reads its keys through getenv. It fails with a
// message naming the field to fix; a configuration without any key fails.
func (c Config) resolve(getenv func(string) string) (seed, error) {
	var s seed
	accounts := map[string]bool{}
	keyIDs := map[string]bool{}
	hashes := map[string]string{}
	for i, a := range c.Accounts {
		if !idPattern.MatchString(a.ID) {
			return s, fmt.Errorf("config: accounts[%d].id %q: want 1-64 letters, digits, '.', '_' or '-'", i, a.ID)
		}
		if accounts[a.ID] {
			return s, fmt.Errorf("config: account %q is listed twice", a.ID)
		}
		accounts[a.ID] = true
		s.accounts = append(s.accounts, Account{ID: a.ID})
		for j, k := range a.Keys {
			where := fmt.Sprintf("accounts[%d].keys[%d]", i, j)
			if !idPattern.MatchString(k.ID) {
				return s, fmt.Errorf("config: %s.id %q: want 1-64 letters, digits, '.', '_' or '-'", where, k.ID)
			}
			if keyIDs[k.ID] {
				return s, fmt.Errorf("config: key id %q is used twice", k.ID)
			}
			keyIDs[k.ID] = true
			var hash string
			switch {
			case k.SHA256 != "" && k.Env != "":
				return s, fmt.Errorf("config: %s: set sha256 or env, not both", where)
			case k.SHA256 != "":
				h := strings.ToLower(k.SHA256)
				if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
					return s, fmt.Errorf("config: %s.sha256: want 64 hex digits", where)
				}
				hash = h
			case k.Env != "":
				v := getenv(k.Env)
				if v == "" {
					return s, fmt.Errorf("config: %s: environment variable %s is empty or unset", where, k.Env)
				}
				if len(v) < MinKeyLength {
					return s, fmt.Errorf("config: %s: the key in %s is shorter than %d characters; generate one with 'hostproxy --print-new-key'", where, k.Env, MinKeyLength)
				}
				hash = hashSecret(v)
			default:
				return s, fmt.Errorf("config: %s: set sha256 (hex SHA-256 of the key) or env (a variable holding the key)", where)
			}
			if other, dup := hashes[hash]; dup {
				return s, fmt.Errorf("config: keys %q and %q are the same key", other, k.ID)
			}
			hashes[hash] = k.ID
			s.keys = append(s.keys, APIKey{ID: k.ID, Account: a.ID, Hash: hash})
		}
	}
	if len(s.keys) == 0 {
		return s, errors.New("config: no account API key is configured; add one under accounts[].keys (or pass --key-env) before starting")
	}
	sandboxes := map[string]bool{}
	guests := map[string]string{} // guest address -> sandbox
	for i, sb := range c.Sandboxes {
		where := fmt.Sprintf("sandboxes[%d]", i)
		if !idPattern.MatchString(sb.ID) {
			return s, fmt.Errorf("config: %s.id %q: want 1-64 letters, digits, '.', '_' or '-'", where, sb.ID)
		}
		if sandboxes[sb.ID] {
			return s, fmt.Errorf("config: sandbox %q is listed twice", sb.ID)
		}
		sandboxes[sb.ID] = true
		if !accounts[sb.Account] {
			return s, fmt.Errorf("config: %s.account %q is not an account of accounts[]", where, sb.Account)
		}
		scheme, addr, err := ParseGuestAddress(sb.Guest)
		if err != nil {
			return s, fmt.Errorf("config: %s.guest: %w", where, err)
		}
		// A guest serves the checkpoints and credentials of one sandbox:
		// two sandboxes sharing one would see each other's checkpoints,
		// across accounts too.
		switch scheme {
		case "unix":
			addr = path.Clean(addr)
		case "tcp":
			addr = strings.ToLower(addr)
		}
		g := scheme + "://" + addr
		if other, dup := guests[g]; dup {
			return s, fmt.Errorf("config: sandboxes %q and %q have the same guest address %s; each sandbox needs its own guestd", other, sb.ID, sb.Guest)
		}
		guests[g] = sb.ID
		state := sb.State
		if state == "" {
			state = StateRunning
		}
		if !configurable(state) {
			return s, fmt.Errorf("config: %s.state %q: want running, paused or stopped", where, sb.State)
		}
		s.sandboxes = append(s.sandboxes, Sandbox{ID: sb.ID, Account: sb.Account, Guest: sb.Guest, State: state})
	}
	if c.RateLimit.PerSecond < 0 || c.RateLimit.Burst < 0 {
		return s, errors.New("config: rate_limit values must not be negative")
	}
	return s, nil
}

// hashSecret is the stored form of a key or token: hex SHA-256. Keys and
// tokens are long random strings, so a fast hash does not help a guesser.
func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}
