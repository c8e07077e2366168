package layers

import (
	"context"
	"errors"
)

// ExportRequest says what Export writes: a checkpoint (ID) or the live
// state of a managed directory (Path), into To (which must not exist).
type ExportRequest struct {
	Store string
	ID    string
	Path  string
	To    string
}

// Export writes a checkpoint, or a managed directory's live state, from
// the store at r.Store into the plain directory r.To, without a running
// daemon: it opens the store's metadata read-only and reads the layers.
func Export(ctx context.Context, r ExportRequest) error {
	return errors.New("export: not built yet")
}
