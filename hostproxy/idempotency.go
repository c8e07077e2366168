package hostproxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"

	"strata/internal/boltjson"
	"strata/internal/fault"
)

// createTTL is how long a sandbox create's Idempotency-Key is kept: the
// 24 hours of the checkpoint operations' keys.
const createTTL = 24 * time.Hour

var errCreateKeyReused = fault.New(fault.Unprocessable, "idempotency_key_reused",
	"this Idempotency-Key was already used with a different request")

var bucketCreates = []byte("creates") // account \x00 key -> createClaim

// createClaim is a create's Idempotency-Key as kept: what was asked (the
// SHA-256 of the request with its defaults filled in) and the sandbox it
// made.
type createClaim struct {
	Request string    `json:"request"`
	Sandbox string    `json:"sandbox"`
	At      time.Time `json:"at"`
}

// requestHash is the SHA-256 of v's JSON: the request as understood, so
// that {} and {"memory_mib":512} are the same request.
func requestHash(v any) string {
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// createClaimKey is the context key of a create's claim: the registry's
// Insert records the claim in the transaction that inserts the sandbox,
// so that a retry finds either both or neither.
type createClaimKey struct{}

// createClaimReq is a create's Idempotency-Key on its way to Insert.
type createClaimReq struct {
	account, key, request string
	now                   time.Time
	prior                 string // set by Insert when the key was claimed
}

func withCreateClaim(ctx context.Context, c *createClaimReq) context.Context {
	return context.WithValue(ctx, createClaimKey{}, c)
}

// errClaimed is Insert's answer to a create whose key an earlier create
// claimed with the same request: that sandbox is the answer.
var errClaimed = errors.New("the Idempotency-Key was claimed by an earlier create")

// claimTx claims c's key for sandbox id in tx, unless it is claimed
// within createTTL: then c.prior is the sandbox that claim made (and
// errClaimed is returned), or idempotency_key_reused when the claim was
// for another request. Expired claims are dropped on the way.
func claimTx(tx *bolt.Tx, c *createClaimReq, id string) error {
	b, err := tx.CreateBucketIfNotExists(bucketCreates)
	if err != nil {
		return err
	}
	var expired [][]byte
	if err := boltjson.ForEach(b, func(k []byte, old *createClaim) error {
		if c.now.Sub(old.At) > createTTL {
			expired = append(expired, append([]byte(nil), k...))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, e := range expired {
		if err := b.Delete(e); err != nil {
			return err
		}
	}
	k := []byte(c.account + "\x00" + c.key)
	old, err := boltjson.Get[createClaim](b, k)
	if err != nil {
		return err
	}
	if old != nil {
		if old.Request != c.request {
			return errCreateKeyReused.With("idempotency_key", c.key)
		}
		c.prior = old.Sandbox
		return errClaimed
	}
	return boltjson.Put(b, k, createClaim{Request: c.request, Sandbox: id, At: c.now.UTC()})
}
