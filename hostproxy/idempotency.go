package hostproxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"strata/egress/policy"
	"strata/internal/boltjson"
	"strata/internal/fault"
)

// createTTL is how long a sandbox create's Idempotency-Key is kept: the
// 24 hours of the checkpoint operations' keys.
const createTTL = 24 * time.Hour

var errCreateKeyReused = fault.New(fault.Unprocessable, "idempotency_key_reused",
	"this Idempotency-Key was already used with a different request")

// bucketCreates holds the claims: account \x00 key -> createClaim for a
// create, account \x00 key \x00 n for the n-th fork of a many-forks fork
// (forkClaimKey).
var bucketCreates = []byte("creates")

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

// createClaimReq is a create's Idempotency-Key on its way to Insert (or
// a fork's of a many-forks fork: key is then forkClaimKey's).
type createClaimReq struct {
	account, key, request string
	now                   time.Time
	prior                 string // set by Insert when the key was claimed
}

func withCreateClaim(ctx context.Context, c *createClaimReq) context.Context {
	return context.WithValue(ctx, createClaimKey{}, c)
}

// errClaimed is Insert's answer to a create (or a fork of a many-forks
// fork) whose key an earlier one claimed with the same request: that
// sandbox is the answer.
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
	// One key names one request: a create's key is not a many-forks
	// fork's, nor the other way round.
	key, _, ofFork := strings.Cut(c.key, "\x00")
	other := []byte(c.account + "\x00" + key)
	if !ofFork {
		other = append(other, 0)
	}
	if claimed(b, other, !ofFork) {
		return errCreateKeyReused.With("idempotency_key", key)
	}
	k := []byte(c.account + "\x00" + c.key)
	old, err := boltjson.Get[createClaim](b, k)
	if err != nil {
		return err
	}
	if old != nil {
		if old.Request != c.request {
			return errCreateKeyReused.With("idempotency_key", key)
		}
		c.prior = old.Sandbox
		return errClaimed
	}
	return boltjson.Put(b, k, createClaim{Request: c.request, Sandbox: id, At: c.now.UTC()})
}

// claimed tells whether b holds the claim k (expired ones are dropped
// before it is asked), or with prefix one whose key starts with k.
func claimed(b *bolt.Bucket, k []byte, prefix bool) bool {
	if !prefix {
		return b.Get(k) != nil
	}
	first, _ := b.Cursor().Seek(k)
	return first != nil && bytes.HasPrefix(first, k)
}

// A many-forks fork (POST …/snapshots/{snapshot}/fork) with an
// Idempotency-Key claims it fork by fork: the n-th fork's insert (or
// take, of a fork made ahead) claims forkClaimKey(key, n) in the
// transaction that records it, as a create does. A retry with the same
// key and request finds the forks the first made (errClaimed: the answer
// names them as they are now) and makes only those the first did not
// (each fork is made or refused on its own: a refused one did nothing, as
// a failed create did). checkForkKey refuses the same key with another
// request before any fork is asked for, so that a retry with a larger
// count does not make forks beyond the first request's.

// forkClaimKey is the claim of the n-th fork (1, 2, …) of a many-forks
// fork sent with key (a key has no NUL: api.IdempotencyKey).
func forkClaimKey(key string, n int) string {
	return key + "\x00" + strconv.Itoa(n)
}

// forkRequest is a many-forks fork as understood, for requestHash: the
// snapshot as resolved, the access setting as recorded.
type forkRequest struct {
	Sandbox    string  `json:"sandbox"`
	Snapshot   string  `json:"snapshot"`
	Count      int     `json:"count"`
	NamePrefix *string `json:"name_prefix"`
	Access     string  `json:"access"`
	// Env and Labels are left out when empty: a request without them
	// hashes as it did before they existed.
	Env    map[string]string `json:"env,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Network likewise.
	Network *policy.Spec `json:"network,omitempty"`
}

// checkForkKey fails with idempotency_key_reused when account's key
// claims, within createTTL of now, a create or a fork of another request
// than request.
func (r *Registry) checkForkKey(ctx context.Context, account, key, request string, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketCreates)
		if b == nil {
			return nil
		}
		live := func(v []byte) (*createClaim, bool) {
			var c createClaim
			if json.Unmarshal(v, &c) != nil || now.Sub(c.At) > createTTL {
				return nil, false
			}
			return &c, true
		}
		if v := b.Get([]byte(account + "\x00" + key)); v != nil {
			if _, ok := live(v); ok {
				return errCreateKeyReused.With("idempotency_key", key)
			}
		}
		prefix := []byte(account + "\x00" + key + "\x00")
		cur := b.Cursor()
		for k, v := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = cur.Next() {
			if c, ok := live(v); ok && c.Request != request {
				return errCreateKeyReused.With("idempotency_key", key)
			}
		}
		return nil
	})
}
