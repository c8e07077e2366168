package layers

import (
	"context"
	"errors"
)

// Clone makes path (which must not exist; its parent must) a new managed
// directory whose content is checkpoint id's, sharing its layers. Its
// lineage starts at id: its first checkpoint's parent is id.
func (s *Store) Clone(ctx context.Context, id, path string) error {
	return errors.New("clone: not built yet")
}
