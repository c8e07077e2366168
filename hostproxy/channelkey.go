package hostproxy

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Channel keys: what lets the processes inside a microVM sandbox call the
// API with no set-up. Every microVM guest is handed one in its credentials
// (CREATEOS_API_KEY, when the sandbox has no access token), and hostproxy
// takes it only from a call that comes through that sandbox's own channel,
// where it acts as that sandbox's access token would. Outside the channel,
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
// through sandbox via's channel ("" for a call from the network): an
// access token's of via, when key is via's channel key and via belongs to
// an account; otherwise unauthorized.
func (r *Registry) authenticateChannel(ctx context.Context, via, key string) (Principal, error) {
	if via == "" || !hmac.Equal([]byte(key), []byte(r.ChannelKey(via))) {
		return Principal{}, errUnauthorized
	}
	sb, err := r.Sandbox(ctx, via)
	if errors.Is(err, errSandboxNotFound) || err == nil && (sb.Account == "" || sb.Machine == nil) {
		return Principal{}, errUnauthorized
	}
	if err != nil {
		return Principal{}, err
	}
	return Principal{Kind: KindAccessToken, ID: "channel:" + sb.ID, Account: sb.Account, Sandbox: sb.ID}, nil
}

// isChannelKey tells whether key has a channel key's prefix.
func isChannelKey(key string) bool { return strings.HasPrefix(key, ChannelKeyPrefix) }
