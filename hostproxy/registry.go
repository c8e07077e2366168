package hostproxy

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"strata/internal/api"
	"strata/internal/boltjson"
	"strata/sandbox"
)

// SandboxState is the life-cycle state of a sandbox. Only a running
// sandbox serves checkpoint operations.
type SandboxState = sandbox.State

// The states a configured sandbox may be given.
const (
	StateRunning = sandbox.Running
	StatePaused  = sandbox.Paused
	StateStopped = sandbox.Stopped
)

// configurable tells whether a configured sandbox may be in state s.
func configurable(s SandboxState) bool {
	return s == StateRunning || s == StatePaused || s == StateStopped
}

// Account owns API keys and sandboxes.
type Account struct {
	ID string `json:"id"`
}

// APIKey is an account API key as stored: its hash, never the key.
type APIKey struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Hash    string `json:"hash"`
}

// Sandbox is one sandbox of an account: a microVM of this host (its
// Machine is set), or a configured guest address (a guestd running in
// someone else's VM, or on this machine for make run's local sandbox).
type Sandbox = sandbox.Record

// CredentialKind tells the three kinds of credential apart: an account
// API key, a sandbox access token, a sandbox's channel key
// (channelkey.go). The authorization table (authz.go) names them.
type CredentialKind string

// The kinds of credential.
const (
	KindAccountKey  CredentialKind = "account_key"
	KindAccessToken CredentialKind = "access_token"
	KindChannelKey  CredentialKind = "channel_key"
)

// Principal is who a request acts as, once its key is known.
type Principal struct {
	Kind CredentialKind
	// ID names the credential in logs and metrics: the key id,
	// "token:<sandbox>" for an access token, "channel:<sandbox>" for a
	// channel key. Never the secret.
	ID      string
	Account string
	// Sandbox is the one sandbox a token or a channel key may act on;
	// empty for an account key.
	Sandbox string
	// Scopes are what a token or a channel key may do on Sandbox (the
	// token's own; the sandbox's access setting for a channel key, read
	// from its record at this request). An account key needs none.
	Scopes api.Scopes
}

// TokenInfo is what may be shown of a sandbox access token.
type TokenInfo struct {
	Enabled   bool       `json:"enabled"`
	Hint      string     `json:"hint,omitempty"`
	CreatedAt time.Time  `json:"created_at,omitzero"`
	Scopes    api.Scopes `json:"scopes,omitempty"`
}

type credential struct {
	Kind    CredentialKind `json:"kind"`
	Hash    string         `json:"hash"`
	KeyID   string         `json:"key_id,omitempty"`
	Account string         `json:"account,omitempty"`
	Sandbox string         `json:"sandbox,omitempty"`
}

type tokenRecord struct {
	Hash      string    `json:"hash"`
	Hint      string    `json:"hint"`
	CreatedAt time.Time `json:"created_at"`
	// Scopes are the token's; none (a token issued before scopes
	// existed) is api.DefaultScopes.
	Scopes api.Scopes `json:"scopes,omitempty"`
}

// scopes are the token's scopes.
func (t *tokenRecord) scopes() api.Scopes {
	if len(t.Scopes) == 0 {
		return api.DefaultScopes
	}
	return t.Scopes
}

// info is what may be shown of the token.
func (t *tokenRecord) info() TokenInfo {
	return TokenInfo{Enabled: true, Hint: t.Hint, CreatedAt: t.CreatedAt, Scopes: t.scopes()}
}

var (
	bucketAccounts    = []byte("accounts")
	bucketSandboxes   = []byte("sandboxes")
	bucketCredentials = []byte("credentials") // hash -> credential
	bucketTokens      = []byte("tokens")      // sandbox id -> tokenRecord
)

// RegistryFile is the name of the registry's bbolt file in the data directory.
const RegistryFile = "registry.db"

// Registry holds accounts, key hashes, sandboxes and access-token hashes
// in one bbolt file. Every change is one bbolt transaction, so a crash
// leaves either the old or the new state.
type Registry struct {
	db *bolt.DB
	// channelSecret keys the sandboxes' channel keys (channelkey.go).
	channelSecret []byte
	// rand draws snapshot refs (names.go); nil is crypto/rand.
	rand io.Reader
}

// random is the registry's source of randomness.
func (r *Registry) random() io.Reader {
	if r.rand == nil {
		return rand.Reader
	}
	return r.rand
}

// OpenRegistry opens (or creates) the registry under dir. It fails at once
// when another process holds the file.
func OpenRegistry(ctx context.Context, dir string) (*Registry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if dir == "" {
		return nil, errors.New("registry: no data directory; set data_dir or pass --data")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	path := filepath.Join(dir, RegistryFile)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("registry: %s is locked by another process (is another hostproxy running with this data directory?)", path)
		}
		return nil, fmt.Errorf("registry: open %s: %w", path, err)
	}
	reg := &Registry{db: db}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketAccounts, bucketSandboxes, bucketCredentials, bucketTokens, bucketNames, bucketRefs} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if reg.channelSecret, err = loadChannelSecret(tx); err != nil {
			return err
		}
		return reg.reindexTx(tx)
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("registry: init %s: %w", path, err)
	}
	return reg, nil
}

// Close closes the bbolt file.
func (r *Registry) Close() error { return r.db.Close() }

// seed makes the registry's accounts, account keys and sandboxes exactly
// those of s, in one transaction. Access tokens survive for sandboxes that
// remain with the same account; the others are revoked.
func (r *Registry) seed(ctx context.Context, s seed) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.db.Update(func(tx *bolt.Tx) error {
		// Configured sandboxes are replaced by the configuration's;
		// microVM sandboxes (made through the API) are kept.
		old := map[string]Sandbox{}
		var configured [][]byte
		if err := boltjson.ForEach(tx.Bucket(bucketSandboxes), func(k []byte, sb *Sandbox) error {
			old[sb.ID] = *sb
			if sb.Machine == nil {
				configured = append(configured, append([]byte(nil), k...))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range configured {
			sb := old[string(k)]
			if err := deleteSandboxTx(tx, &sb); err != nil {
				return err
			}
		}
		if err := tx.DeleteBucket(bucketAccounts); err != nil {
			return err
		}
		if _, err := tx.CreateBucket(bucketAccounts); err != nil {
			return err
		}
		creds := tx.Bucket(bucketCredentials)
		var stale [][]byte
		if err := boltjson.ForEach(creds, func(k []byte, c *credential) error {
			if c.Kind == KindAccountKey {
				stale = append(stale, append([]byte(nil), k...))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range stale {
			if err := creds.Delete(k); err != nil {
				return err
			}
		}
		for _, a := range s.accounts {
			if err := boltjson.Put(tx.Bucket(bucketAccounts), []byte(a.ID), a); err != nil {
				return err
			}
		}
		for _, k := range s.keys {
			if err := boltjson.Put(creds, []byte(k.Hash), credential{Kind: KindAccountKey, Hash: k.Hash, KeyID: k.ID, Account: k.Account}); err != nil {
				return err
			}
		}
		keep := map[string]bool{}
		for id, sb := range old {
			if sb.Machine != nil {
				keep[id] = true
			}
		}
		for _, sb := range s.sandboxes {
			if o, ok := old[sb.ID]; ok && o.Machine != nil {
				return fmt.Errorf("sandbox %q is configured, but a microVM sandbox of that id exists", sb.ID)
			}
			if err := r.putSandboxTx(tx, indexed{}, &sb); err != nil {
				return err
			}
			if o, ok := old[sb.ID]; ok && o.Account == sb.Account {
				keep[sb.ID] = true
			}
		}
		tokens := tx.Bucket(bucketTokens)
		var drop []string
		if err := boltjson.ForEach(tokens, func(k []byte, _ *tokenRecord) error {
			if !keep[string(k)] {
				drop = append(drop, string(k))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, id := range drop {
			if err := revokeTx(tx, id); err != nil {
				return err
			}
		}
		return nil
	})
}

// Authenticate returns the principal of key, or an unauthorized error.
// The lookup is by SHA-256, and the stored hash is then compared in
// constant time, so response time says nothing about stored keys.
func (r *Registry) Authenticate(ctx context.Context, key string) (Principal, error) {
	if err := ctx.Err(); err != nil {
		return Principal{}, err
	}
	if key == "" {
		return Principal{}, errUnauthorized
	}
	hash := hashSecret(key)
	var p Principal
	err := r.db.View(func(tx *bolt.Tx) error {
		c, err := boltjson.Get[credential](tx.Bucket(bucketCredentials), []byte(hash))
		if err != nil {
			return err
		}
		if c == nil || subtle.ConstantTimeCompare([]byte(c.Hash), []byte(hash)) != 1 {
			return errUnauthorized
		}
		switch c.Kind {
		case KindAccountKey:
			p = Principal{Kind: KindAccountKey, ID: c.KeyID, Account: c.Account}
			return nil
		case KindAccessToken:
			t, err := boltjson.Get[tokenRecord](tx.Bucket(bucketTokens), []byte(c.Sandbox))
			if err != nil {
				return err
			}
			if t == nil || subtle.ConstantTimeCompare([]byte(t.Hash), []byte(hash)) != 1 {
				return errUnauthorized
			}
			sb, err := boltjson.Get[Sandbox](tx.Bucket(bucketSandboxes), []byte(c.Sandbox))
			if err != nil {
				return err
			}
			if sb == nil {
				return errUnauthorized
			}
			p = Principal{Kind: KindAccessToken, ID: "token:" + sb.ID, Account: sb.Account, Sandbox: sb.ID, Scopes: t.scopes()}
			return nil
		default:
			return fmt.Errorf("registry: credential of unknown kind %q", c.Kind)
		}
	})
	return p, err
}

// Sandbox returns the sandbox id, or sandbox_not_found.
func (r *Registry) Sandbox(ctx context.Context, id string) (Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return Sandbox{}, err
	}
	var sb Sandbox
	err := r.db.View(func(tx *bolt.Tx) error {
		found, err := boltjson.Get[Sandbox](tx.Bucket(bucketSandboxes), []byte(id))
		if err != nil {
			return err
		}
		if found == nil {
			return errSandboxNotFound
		}
		sb = *found
		return nil
	})
	return sb, err
}

// SetSandboxState records a sandbox's new state (a pause, a resume, a stop).
func (r *Registry) SetSandboxState(ctx context.Context, id string, state SandboxState) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !state.Valid() {
		return fmt.Errorf("registry: invalid sandbox state %q", state)
	}
	return r.db.Update(func(tx *bolt.Tx) error {
		sb, err := boltjson.Get[Sandbox](tx.Bucket(bucketSandboxes), []byte(id))
		if err != nil {
			return err
		}
		if sb == nil {
			return errSandboxNotFound
		}
		before := indexedOf(sb)
		sb.State = state
		return r.putSandboxTx(tx, before, sb)
	})
}

// IssueToken stores token, with scopes, as the sandbox's access token, or
// fails with token_exists when one is enabled.
func (r *Registry) IssueToken(ctx context.Context, sandboxID, token string, scopes api.Scopes, now time.Time) (TokenInfo, error) {
	return r.putToken(ctx, sandboxID, token, scopes, now, false)
}

// RotateToken replaces the sandbox's access token with token at once,
// with the old one's scopes: the old one fails from the next request on.
// It fails with token_not_found when none is enabled.
func (r *Registry) RotateToken(ctx context.Context, sandboxID, token string, now time.Time) (TokenInfo, error) {
	return r.putToken(ctx, sandboxID, token, nil, now, true)
}

func (r *Registry) putToken(ctx context.Context, sandboxID, token string, scopes api.Scopes, now time.Time, rotate bool) (TokenInfo, error) {
	if err := ctx.Err(); err != nil {
		return TokenInfo{}, err
	}
	rec := tokenRecord{Hash: hashSecret(token), Hint: tokenHint(token), CreatedAt: now.UTC().Truncate(time.Second), Scopes: scopes}
	err := r.db.Update(func(tx *bolt.Tx) error {
		sb, err := boltjson.Get[Sandbox](tx.Bucket(bucketSandboxes), []byte(sandboxID))
		if err != nil {
			return err
		}
		if sb == nil {
			return errSandboxNotFound
		}
		old, err := boltjson.Get[tokenRecord](tx.Bucket(bucketTokens), []byte(sandboxID))
		if err != nil {
			return err
		}
		exists := old != nil
		switch {
		case exists && !rotate:
			return errTokenExists
		case !exists && rotate:
			return errTokenNotFound
		}
		if exists {
			rec.Scopes = old.scopes()
			if err := tx.Bucket(bucketCredentials).Delete([]byte(old.Hash)); err != nil {
				return err
			}
		}
		if err := boltjson.Put(tx.Bucket(bucketTokens), []byte(sandboxID), rec); err != nil {
			return err
		}
		return boltjson.Put(tx.Bucket(bucketCredentials), []byte(rec.Hash), credential{Kind: KindAccessToken, Hash: rec.Hash, Sandbox: sandboxID})
	})
	if err != nil {
		return TokenInfo{}, err
	}
	return rec.info(), nil
}

// Token tells whether the sandbox has an access token, never the token.
func (r *Registry) Token(ctx context.Context, sandboxID string) (TokenInfo, error) {
	if err := ctx.Err(); err != nil {
		return TokenInfo{}, err
	}
	var info TokenInfo
	err := r.db.View(func(tx *bolt.Tx) error {
		t, err := boltjson.Get[tokenRecord](tx.Bucket(bucketTokens), []byte(sandboxID))
		if t != nil {
			info = t.info()
		}
		return err
	})
	return info, err
}

// tokenHash is the SHA-256 (hashSecret) of the sandbox's access token,
// "" when it has none: what a guest that may still hold the token is told
// (api.Credentials.TokenSHA256).
func (r *Registry) tokenHash(ctx context.Context, sandboxID string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	var hash string
	err := r.db.View(func(tx *bolt.Tx) error {
		t, err := boltjson.Get[tokenRecord](tx.Bucket(bucketTokens), []byte(sandboxID))
		if t != nil {
			hash = t.Hash
		}
		return err
	})
	return hash, err
}

// RevokeToken removes the sandbox's access token; revoking none is not an error.
func (r *Registry) RevokeToken(ctx context.Context, sandboxID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.db.Update(func(tx *bolt.Tx) error { return revokeTx(tx, sandboxID) })
}

func revokeTx(tx *bolt.Tx, sandboxID string) error {
	t, err := boltjson.Get[tokenRecord](tx.Bucket(bucketTokens), []byte(sandboxID))
	if err != nil || t == nil {
		return err
	}
	if err := tx.Bucket(bucketCredentials).Delete([]byte(t.Hash)); err != nil {
		return err
	}
	return tx.Bucket(bucketTokens).Delete([]byte(sandboxID))
}
