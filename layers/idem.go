package layers

import (
	"time"

	"strata/internal/fault"
)

// Idempotent retries. A create or restore may carry a key; its first
// answer is recorded in the same metadata transaction as the checkpoint
// or the restore it answers, so a client that lost the answer (a timeout,
// a 500 after the commit, a guestd restart) can retry with the same key
// and get that answer instead of a second checkpoint.

// idempotencyTTL is how long an answer is kept for retries.
const idempotencyTTL = 24 * time.Hour

// ErrIdempotencyKeyReused answers a key sent again with another request.
var ErrIdempotencyKeyReused = fault.New(fault.Unprocessable, "idempotency_key_reused",
	"This Idempotency-Key was already used with a different request.")

// Option adjusts one Capture or Restore.
type Option func(*options)

type options struct {
	idemKey string
}

// WithIdempotencyKey makes the operation answer a retry that carries the
// same key and the same request with its first answer. "" means none.
func WithIdempotencyKey(key string) Option {
	return func(o *options) { o.idemKey = key }
}

func applyOptions(opts []Option) options {
	var o options
	for _, fn := range opts {
		fn(&o)
	}
	return o
}

// idem is one request's key and what it asked for.
type idem struct {
	key     string
	request string
}

func createRequest(key, path, name string) idem {
	return idem{key: key, request: "create\x00" + path + "\x00" + name}
}

func restoreRequest(key, id string) idem {
	return idem{key: key, request: "restore\x00" + id}
}

// replay returns the recorded answer to this request, if there is one
// younger than idempotencyTTL; a record of another request under the
// same key is ErrIdempotencyKeyReused.
func (t tx) replay(r idem, now time.Time) (*Checkpoint, error) {
	if r.key == "" {
		return nil, nil
	}
	rec, err := t.idempotency(r.key)
	if err != nil || rec == nil || now.Sub(rec.Created) > idempotencyTTL {
		return nil, err
	}
	if rec.Request != r.request {
		return nil, ErrIdempotencyKeyReused.With("idempotency_key", r.key)
	}
	res := rec.Result
	return &res, nil
}

// record stores the answer to r, inside the transaction that commits it.
// A key recorded meanwhile for another request fails the commit.
func (t tx) record(r idem, res Checkpoint, now time.Time) error {
	if r.key == "" {
		return nil
	}
	if _, err := t.replay(r, now); err != nil {
		return err
	}
	if err := t.pruneIdempotency(now); err != nil {
		return err
	}
	return t.putIdempotency(&idemRecord{Key: r.key, Request: r.request, Result: res, Created: now})
}

// Knows reports whether this store holds an answer under key. A caller
// with several stores (one per filesystem) asks the ones a request does
// not go to: a key known elsewhere was used for another request.
func (s *Store) Knows(key string) (bool, error) {
	var ok bool
	err := s.view(func(t tx) error {
		rec, err := t.idempotency(key)
		ok = rec != nil && time.Since(rec.Created) <= idempotencyTTL
		return err
	})
	return ok, err
}
