package layers

import (
	"strconv"
	"strings"
	"time"

	"strata/layers/meta"
)

// Idempotent retries. A create or restore may carry a key; its first
// answer is recorded in the same metadata transaction as the checkpoint
// or the restore it answers, so a client that lost the answer (a timeout,
// a 500 after the commit, a guestd restart) can retry with the same key
// and get that answer instead of a second checkpoint (meta.Replay and
// meta.Record).

// ErrIdempotencyKeyReused answers a key sent again with another request.
var ErrIdempotencyKeyReused = meta.ErrIdempotencyKeyReused

// Option adjusts one Capture or Restore.
type Option func(*options)

type options struct {
	idemKey   string
	retention int
	auto      bool   // a capture the store makes itself (an automatic checkpoint)
	except    string // with auto: a checkpoint the retention of automatic ones keeps
}

// WithRetention makes a Capture delete the directory's oldest checkpoints
// (automatic ones aside) so that it keeps at most max (1–MaxCheckpoints),
// the new one included. 0 means no retention.
func WithRetention(max int) Option {
	return func(o *options) { o.retention = max }
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

func createRequest(key, path, name string, retention int) meta.Request {
	body := "create\x00" + path + "\x00" + name
	if retention > 0 {
		body += "\x00retain " + strconv.Itoa(retention)
	}
	return meta.Request{Key: key, Body: body}
}

func restoreRequest(key, id string) meta.Request {
	return meta.Request{Key: key, Body: "restore\x00" + id}
}

// answer is a checkpoint as the idempotency record keeps it.
func answer(c Checkpoint) meta.Answer {
	return meta.Answer{ID: c.ID, Path: c.Path, Name: c.Name, CreatedAt: c.CreatedAt, ParentID: c.ParentID, Safety: c.SafetyCheckpointID}
}

// fromAnswer is a kept answer as the store returns it.
func fromAnswer(a *meta.Answer) *Checkpoint {
	if a == nil {
		return nil
	}
	return &Checkpoint{ID: a.ID, Path: a.Path, Name: a.Name, CreatedAt: a.CreatedAt, ParentID: a.ParentID, SafetyCheckpointID: a.Safety}
}

// replay returns the kept answer to req, or nil (see meta.Replay).
func (s *Store) replay(req meta.Request) (*Checkpoint, error) {
	var prior *Checkpoint
	err := s.view(func(t meta.Tx) error {
		a, err := t.Replay(req, time.Now())
		prior = fromAnswer(a)
		return err
	})
	if prior != nil && strings.HasPrefix(req.Body, "create\x00") {
		prior.SizeBytes = s.sizeOf(prior.ID)
	}
	return prior, err
}

// Knows reports whether this store holds an answer under key. A caller
// with several stores (one per filesystem) asks the ones a request does
// not go to: a key known elsewhere was used for another request.
func (s *Store) Knows(key string) (bool, error) {
	var ok bool
	err := s.view(func(t meta.Tx) error {
		rec, err := t.Idempotency(key)
		ok = rec != nil && time.Since(rec.Created) <= meta.IdempotencyTTL
		return err
	})
	return ok, err
}
