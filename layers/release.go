package layers

import (
	"context"
	"errors"

	"strata/layers/meta"
)

// Release turns the managed directory at path back into a plain
// directory holding its live content, and deletes its checkpoints; it
// returns their ids.
func (s *Store) Release(ctx context.Context, path string) ([]string, error) {
	return nil, errors.New("release: not built yet")
}

func (s *Store) resolveRelease(ctx context.Context, r *meta.Root) error { return nil }

func (s *Store) clearReleaseStaging() {}
