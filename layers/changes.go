package layers

import (
	"context"
	"errors"
)

// Changes returns what checkpoint id changed, sorted by path: against its
// parent ("" as against), against the live directory (AgainstLive), or
// against another checkpoint of the same directory (its id).
func (s *Store) Changes(ctx context.Context, id, against string) ([]Change, error) {
	return nil, errors.New("changes: not built yet")
}

// ReadEntry returns the entry at rel (relative to the root, "" or "." for
// the root itself) as it is in checkpoint id, read from its layers.
func (s *Store) ReadEntry(ctx context.Context, id, rel string) (Entry, error) {
	return Entry{}, errors.New("read entry: not built yet")
}
