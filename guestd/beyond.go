package guestd

import (
	"context"
	"net/http"
	"slices"

	"strata/internal/api"
	"strata/internal/jsend"
	"strata/layers"
)

// The routes beyond the seed's four (issue 8). Each goes to the store
// that holds what it names: a checkpoint's (owner), or a managed
// directory's (managing).

func (s *Server) changes(r *http.Request) (any, error) {
	if err := jsend.RejectBody(r); err != nil {
		return nil, err
	}
	id, err := checkpointID(r)
	if err != nil {
		return nil, err
	}
	against, err := api.ParseChangesQuery(r.URL.Query())
	if err != nil {
		return nil, err
	}
	st, err := s.engine.owner(id)
	if err != nil {
		return nil, err
	}
	cs, err := st.Changes(r.Context(), id, against)
	if err != nil {
		return nil, err
	}
	out := make([]api.Change, len(cs))
	for i, c := range cs {
		out[i] = api.Change{Path: c.Path, Change: c.Change, Type: c.Type, Size: c.Size}
	}
	return out, nil
}

func (s *Server) readEntry(r *http.Request) (any, error) {
	if err := jsend.RejectQueryAndBody(r); err != nil {
		return nil, err
	}
	id, err := checkpointID(r)
	if err != nil {
		return nil, err
	}
	rel, err := api.ParseEntryPath(r.PathValue("path"))
	if err != nil {
		return nil, err
	}
	st, err := s.engine.owner(id)
	if err != nil {
		return nil, err
	}
	e, err := st.ReadEntry(r.Context(), id, rel)
	if err != nil {
		return nil, err
	}
	return entryToAPI(e), nil
}

// entryToAPI renders a layers.Entry; the field of its type is always
// present, even when empty (an empty file's content, an empty listing).
func entryToAPI(e layers.Entry) api.Entry {
	out := api.Entry{Path: e.Path, Type: e.Type, Mode: api.FormatMode(e.Mode), Size: e.Size, MTime: api.FormatMTime(e.MTime)}
	switch e.Type {
	case layers.TypeFile:
		c := e.Content
		if c == nil {
			c = []byte{}
		}
		out.Content = &c
	case layers.TypeSymlink:
		t := e.Target
		out.Target = &t
	case layers.TypeDir:
		es := make([]api.DirEntry, len(e.Entries))
		for i, d := range e.Entries {
			es[i] = api.DirEntry{Name: d.Name, Type: d.Type}
		}
		out.Entries = &es
	}
	return out
}

func (s *Server) restorePaths(r *http.Request) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	id, err := checkpointID(r)
	if err != nil {
		return nil, err
	}
	var req api.RestorePathsRequest
	if err := jsend.DecodeObject(r, &req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	cp, err := s.observe("restore_paths", func() (layers.Checkpoint, error) {
		st, err := s.engine.owner(id)
		if err != nil {
			return layers.Checkpoint{}, err
		}
		return st.RestorePaths(r.Context(), id, req.Paths)
	})
	if err != nil {
		return nil, err
	}
	return api.RestorePathsResult{CheckpointID: id, Path: cp.Path, Paths: req.Paths, SafetyCheckpointID: cp.SafetyCheckpointID}, nil
}

func (s *Server) clone(r *http.Request) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	id, err := checkpointID(r)
	if err != nil {
		return nil, err
	}
	var req api.PathRequest
	if err := jsend.DecodeObject(r, &req); err != nil {
		return nil, err
	}
	path, err := req.Validate()
	if err != nil {
		return nil, err
	}
	_, err = s.observe("clone", func() (layers.Checkpoint, error) {
		return layers.Checkpoint{}, s.engine.clone(r.Context(), id, path)
	})
	if err != nil {
		return nil, err
	}
	return api.CloneResult{Path: path, FromCheckpointID: id}, nil
}

func (s *Server) release(r *http.Request) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	var req api.PathRequest
	if err := jsend.DecodeObject(r, &req); err != nil {
		return nil, err
	}
	path, err := req.Validate()
	if err != nil {
		return nil, err
	}
	var ids []string
	_, err = s.observe("release", func() (layers.Checkpoint, error) {
		st, err := s.engine.managing(path)
		if err != nil {
			return layers.Checkpoint{}, err
		}
		ids, err = st.Release(r.Context(), path)
		return layers.Checkpoint{}, err
	})
	if err != nil {
		return nil, err
	}
	if ids == nil {
		ids = []string{}
	}
	return api.ReleaseResult{Path: path, DeletedCheckpointIDs: ids}, nil
}

// managing returns the store whose managed root path is, else the main
// store, whose Release then answers with the right code.
func (e *engine) managing(path string) (*layers.Store, error) {
	for _, st := range e.stores() {
		rs, err := st.Roots()
		if err != nil {
			return nil, err
		}
		if slices.Contains(rs, path) {
			return st, nil
		}
	}
	return e.main, nil
}

// clone makes path a clone of checkpoint id, in the checkpoint's store:
// a clone shares the checkpoint's layers, so it must be on that store's
// filesystem. The store checks that on the parent it opens (422
// path_mount otherwise), with the other path rules (path_exists, …).
func (e *engine) clone(ctx context.Context, id, path string) error {
	st, err := e.owner(id)
	if err != nil {
		return err
	}
	return st.Clone(ctx, id, path)
}
