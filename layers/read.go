package layers

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"path"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/api"
)

// ReadEntry returns the entry at rel (relative to the root, "" or "." for
// the root itself) as it is in checkpoint id, read from its layers
// without mounting them: a file with its content (at most
// MaxEntryContent bytes; larger ones are 413 file_too_large with their
// size), a symlink with its target, a directory with its names and their
// types. A special file is never read: it is not found, and directory
// listings leave it out (layers hold none but whiteouts, which hide
// names).
func (s *Store) ReadEntry(ctx context.Context, id, rel string) (Entry, error) {
	if rel == "." {
		rel = ""
	}
	if rel != "" {
		if err := api.ValidateRelPath("path", rel); err != nil {
			return Entry{}, err
		}
	}
	lt, _, _, err := s.checkpointTree(id)
	if err != nil {
		return Entry{}, err
	}
	defer lt.Close()
	return readEntry(ctx, lt, rel)
}

// readEntry is ReadEntry on a tree.
func readEntry(ctx context.Context, t tree, rel string) (Entry, error) {
	shown := rel
	if shown == "" {
		shown = "."
	}
	notFound := func(err error) (Entry, error) {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			return Entry{}, ErrEntryNotFound.With("path", shown)
		}
		return Entry{}, err
	}
	st, err := t.Lstat(rel)
	if err != nil {
		return notFound(err)
	}
	typ := entryType(&st)
	if typ == "" {
		return notFound(fs.ErrNotExist)
	}
	e := Entry{Path: shown, Type: typ, Mode: st.Mode & 07777, Size: st.Size, MTime: time.Unix(st.Mtim.Unix()).UTC()}
	switch typ {
	case TypeFile:
		if st.Size > MaxEntryContent {
			return Entry{}, ErrFileTooLarge.With("path", shown).With("size", st.Size)
		}
		f, err := t.Open(rel)
		if err != nil {
			return notFound(err)
		}
		defer f.Close()
		// At most one byte more than the limit: a file that grew since its
		// stat (a live tree) is refused, not cut short.
		b, err := io.ReadAll(io.LimitReader(f, MaxEntryContent+1))
		if err != nil {
			return Entry{}, err
		}
		if len(b) > MaxEntryContent {
			return Entry{}, ErrFileTooLarge.With("path", shown).With("size", int64(len(b)))
		}
		e.Content, e.Size = b, int64(len(b))
	case TypeSymlink:
		if e.Target, err = t.Readlink(rel); err != nil {
			return notFound(err)
		}
	case TypeDir:
		names, err := t.ReadDir(rel)
		if err != nil {
			return notFound(err)
		}
		e.Entries = make([]DirEntry, 0, len(names))
		for _, name := range names {
			if err := ctx.Err(); err != nil {
				return Entry{}, err
			}
			cst, err := t.Lstat(path.Join(rel, name))
			if errors.Is(err, fs.ErrNotExist) {
				continue // gone meanwhile (a live tree)
			}
			if err != nil {
				return Entry{}, err
			}
			if ct := entryType(&cst); ct != "" {
				e.Entries = append(e.Entries, DirEntry{Name: name, Type: ct})
			}
		}
	}
	return e, nil
}
