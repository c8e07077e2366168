package hostproxy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Channel keys: what lets the processes inside a microVM sandbox call the
// API with no set-up. Every microVM guest is handed one in its credentials
// (CREATEOS_API_KEY, when the sandbox has no access token), unless its
// access setting is none, and hostproxy takes it only from a call that
// comes through that sandbox's own channel, where it acts on that sandbox
// with the scopes of its access setting, read from the sandbox's record at
// each call (so that a change of access takes effect at once, for the key
// the guest already holds: the key itself carries no scopes). Outside the channel,
// or through another sandbox's, it is refused like any wrong key: a key
// read out of a guest (or out of a fork's memory, which holds its
// snapshot's) opens nothing anywhere else.
//
// Why a key at all, when the channel already names the sandbox: guestd's
// forwarder is a loopback TCP port that every uid in the guest reaches,
// and the credentials file is root's (0600). The key keeps the API to the
// processes the guest's root lets read it, as an access token does.
//
// A channel key is HMAC-SHA256 of the sandbox id under a secret of the
// registry's (made once, kept in its bbolt file): nothing per sandbox is
// stored, it survives hostproxy's restarts, and it never changes for a
// sandbox, so a guest restored from its own snapshot keeps a working one.

// ChannelKeyPrefix starts every channel key.
const ChannelKeyPrefix = "sbc_"

var (
	bucketMeta          = []byte("meta")
	metaChannelSecret   = []byte("channel_secret")
	channelKeyLabel     = "strata channel key\x00"
	channelSecretLength = 32
)

// loadChannelSecret returns the registry's channel secret, made in tx on
// first use.
func loadChannelSecret(tx *bolt.Tx) ([]byte, error) {
	b, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return nil, err
	}
	if v := b.Get(metaChannelSecret); len(v) == channelSecretLength {
		return append([]byte(nil), v...), nil
	}
	secret := make([]byte, channelSecretLength)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("random: %w", err)
	}
	if err := b.Put(metaChannelSecret, secret); err != nil {
		return nil, err
	}
	return secret, nil
}

// ChannelKey is sandbox id's channel key.
func (r *Registry) ChannelKey(id string) string {
	m := hmac.New(sha256.New, r.channelSecret)
	m.Write([]byte(channelKeyLabel + id))
	return ChannelKeyPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// authenticateChannel returns the principal of a channel key that came
// through sandbox via's channel (nil for a call from the network): via's
// channel key, with the scopes of via's access setting as its record has
// it now, when key is via's channel key and via is a microVM of an
// account; otherwise unauthorized.
func (r *Registry) authenticateChannel(via *Sandbox, key string) (Principal, error) {
	if via == nil || !hmac.Equal([]byte(key), []byte(r.ChannelKey(via.ID))) || via.Account == "" || via.Machine == nil {
		return Principal{}, errUnauthorized
	}
	access := accessOf(*via)
	if access.None {
		return Principal{}, errNoAccess
	}
	return Principal{Kind: KindChannelKey, ID: "channel:" + via.ID, Account: via.Account, Sandbox: via.ID, Scopes: access.Scopes}, nil
}

// isChannelKey tells whether key has a channel key's prefix.
func isChannelKey(key string) bool { return strings.HasPrefix(key, ChannelKeyPrefix) }
