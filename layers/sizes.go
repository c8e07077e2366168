package layers

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"strata/layers/meta"
)

// Sizes. A checkpoint's size_bytes is the space its own layer holds: the
// blocks allocated to the layer's directories and regular files
// (st_blocks), which is what deleting that checkpoint alone could
// free once nothing else needs the layer. A file the layer shares with a
// span (a hard link on a filesystem that cannot clone) or blocks it
// shares by reflink are counted in each. A directory's size_bytes is the
// sum over the layer and span dirs it made (its unsaved changes
// included); layers a clone shares count for the directory that made
// them.
//
// Sealed layers and spans never change, so their sizes are computed once
// and cached for the store's lifetime: the tree check of the enrollment,
// capture or restore that seals a layer measures it as it walks
// (measured), anything else is walked once (treeBytes). A sealed layer's
// size also goes into its record (meta.Layer.Bytes) at the next list, so
// that a restart does not walk every layer again. An active layer is
// walked each time.

// dirBytes returns the space held by layer or span dir id; cache says the
// dir never changes. A sealed layer's size measured now is added to
// measured, for the caller to record (recordBytes).
func (s *Store) dirBytes(id uint64, cache bool, measured map[uint64]int64) int64 {
	if cache {
		s.mu.Lock()
		n, ok := s.sizes[id]
		unrecorded := s.unrecorded[id]
		if unrecorded && measured != nil {
			delete(s.unrecorded, id)
		}
		s.mu.Unlock()
		if ok {
			if unrecorded && measured != nil {
				measured[id] = n
			}
			return n
		}
		var recorded int64
		s.view(func(t meta.Tx) error {
			if l, err := t.Layer(id); err == nil && l.Sealed {
				recorded = l.Bytes
			}
			return nil
		})
		if recorded > 0 {
			s.mu.Lock()
			s.sizes[id] = recorded
			s.mu.Unlock()
			return recorded
		}
	}
	n, err := treeBytes(s.fsDir(id))
	if err != nil {
		// A dir collected meanwhile holds nothing; anything else is
		// logged and counted as far as the walk got.
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("size of a layer", "layer", id, "err", err)
		}
		return n
	}
	if cache {
		s.mu.Lock()
		s.sizes[id] = n
		if measured != nil {
			measured[id] = n
		} else {
			s.unrecorded[id] = true
		}
		s.mu.Unlock()
	}
	return n
}

// recordBytes keeps the sizes measured in the records of the sealed
// layers they are of, in one transaction (spans are not recorded).
func (s *Store) recordBytes(measured map[uint64]int64) {
	if len(measured) == 0 {
		return
	}
	err := s.update(func(t meta.Tx) error {
		for id, n := range measured {
			l, err := t.Layer(id)
			if err != nil || !l.Sealed || l.Bytes == n {
				continue // a span, or a layer gone meanwhile
			}
			l.Bytes = n
			if err := t.PutLayer(l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Warn("record layer sizes", "err", err)
	}
}

// measured keeps n as the size of sealed layer id, which an operation's
// tree check measured as it walked the layer (pathpolicy.CheckTreeBytes):
// no walk of its own; the next list records it.
func (s *Store) measured(id uint64, n int64) {
	s.mu.Lock()
	s.sizes[id] = n
	s.unrecorded[id] = true
	s.mu.Unlock()
}

// treeBytes sums the allocated bytes of dir and of the directories and
// regular files under it, as pathpolicy.CheckTreeBytes counts them
// (symlinks and whiteouts hold none to speak of).
func treeBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p != dir {
				return nil // gone meanwhile
			}
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	return n, err
}

// fillSizes sets SizeBytes of cps from their layers (layer maps each
// checkpoint id to its layer).
func (s *Store) fillSizes(cps []Checkpoint, layer map[string]uint64) {
	measured := map[uint64]int64{}
	for i := range cps {
		if l, ok := layer[cps[i].ID]; ok {
			cps[i].SizeBytes = s.dirBytes(l, true, measured)
		}
	}
	s.recordBytes(measured)
}

// rootBytes is the space held by the dirs root made: its layers (the
// active one walked afresh) and spans.
func (s *Store) rootBytes(rootID uint64) (int64, error) {
	type dir struct {
		id     uint64
		sealed bool
	}
	var dirs []dir
	err := s.view(func(t meta.Tx) error {
		ls, err := t.Layers()
		if err != nil {
			return err
		}
		for _, l := range ls {
			if l.Root == rootID {
				dirs = append(dirs, dir{l.ID, l.Sealed})
			}
		}
		sps, err := t.Spans()
		for _, sp := range sps {
			if sp.Root == rootID {
				dirs = append(dirs, dir{sp.ID, true})
			}
		}
		return err
	})
	var n int64
	measured := map[uint64]int64{}
	for _, d := range dirs {
		n += s.dirBytes(d.id, d.sealed, measured)
	}
	s.recordBytes(measured)
	return n, err
}

// sizeOf returns the size of checkpoint id's layer (0 when it is gone).
func (s *Store) sizeOf(id string) int64 {
	var layer uint64
	s.view(func(t meta.Tx) error {
		if c, err := t.Checkpoint(id); err == nil && c != nil {
			layer = c.Layer
		}
		return nil
	})
	if layer == 0 {
		return 0
	}
	// Kept in memory only: a create's answer must not pay for a second
	// metadata commit; the next list records it.
	return s.dirBytes(layer, true, nil)
}
