package layers

import (
	"context"
	"errors"
)

// RestorePaths makes each of paths (relative to the root) of the live
// directory of checkpoint id what it is in the checkpoint: recursively,
// and removed when the checkpoint lacks it. The rest of the directory is
// untouched.
func (s *Store) RestorePaths(ctx context.Context, id string, paths []string) (Checkpoint, error) {
	return Checkpoint{}, errors.New("restore paths: not built yet")
}
