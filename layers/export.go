package layers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"

	"strata/layers/meta"
	"strata/layers/overlay"
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
//
// It takes the store's lock shared for its whole run, so a guestd that
// holds the store makes it fail at once (stop guestd, or use the API),
// and a guestd started meanwhile fails to open the store until it ends.
// The directory is built under a temporary name next to r.To (so r.To's
// parent must exist), synced, and renamed into place: r.To either does
// not exist or holds the whole export. Files are clones of the layers'
// where r.To is on the store's filesystem and it clones.
//
// A live state is read from the root's recorded stack (its upper layer
// and the layers below); the live mount, which stays mounted without a
// daemon, may still be written meanwhile: each file is as it was read.
func Export(ctx context.Context, r ExportRequest) error {
	if r.Store == "" || r.To == "" || (r.ID == "") == (r.Path == "") {
		return errors.New("export: need a store, a destination, and one of a checkpoint id or a directory path")
	}
	to, err := filepath.Abs(r.To)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(to); err == nil {
		return fmt.Errorf("export: %s already exists", to)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	store := filepath.Clean(r.Store)
	lock, err := os.Open(filepath.Join(store, "lock"))
	if err != nil {
		return fmt.Errorf("export: %s is not a strata store: %w", store, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("export: store %s is in use by a running guestd: stop it first, or read the checkpoint through its API", store)
		}
		return fmt.Errorf("export: lock store %s: %w", store, err)
	}
	db, err := bolt.Open(filepath.Join(store, "meta.db"), 0o600, &bolt.Options{ReadOnly: true, Timeout: 500 * time.Millisecond})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return fmt.Errorf("export: the metadata of store %s is held by a running guestd: stop it first, or read the checkpoint through its API", store)
		}
		return fmt.Errorf("export: open the metadata of %s: %w", store, err)
	}
	defer db.Close()
	var ids []uint64
	var staged *meta.PathsIntent
	err = db.View(func(btx *bolt.Tx) error {
		t := meta.Tx{Tx: btx}
		if r.ID != "" {
			cp, err := mustCheckpoint(t, r.ID)
			if err != nil {
				return err
			}
			ids, err = segDirs(t, cp.Layer)
			return err
		}
		root, err := t.RootByPath(filepath.Clean(r.Path))
		if err != nil {
			return err
		}
		if root == nil {
			return fmt.Errorf("export: %s is not a managed directory of store %s", r.Path, store)
		}
		if root.State != meta.RootReady {
			return fmt.Errorf("export: %s has an unfinished operation (%s); start guestd once to finish or undo it, then export again", r.Path, root.State)
		}
		ids = root.Mounted.Dirs()
		staged = root.Paths
		return nil
	})
	if err != nil {
		return err
	}
	dirs := make([]string, len(ids))
	for i, id := range ids {
		dirs[i] = filepath.Join(store, "layers", filepath.FromSlash(overlay.RelFS(id)))
	}
	src, err := newLayerTree(dirs, nil)
	if err != nil {
		return err
	}
	defer src.Close()
	return materializeInto(ctx, src, to, staged)
}

// materializeInto writes the whole of src as the new directory to: built
// under a temporary sibling name, synced, renamed into place (never over
// anything).
func materializeInto(ctx context.Context, src tree, to string, staged *meta.PathsIntent) error {
	parent, name := filepath.Dir(to), filepath.Base(to)
	pfd, err := openDirAt(unix.AT_FDCWD, parent)
	if err != nil {
		return fmt.Errorf("export: the parent of %s: %w", to, err)
	}
	defer unix.Close(pfd)
	var b [6]byte
	rand.Read(b[:])
	tmp := "." + name + ".strata-export-" + hex.EncodeToString(b[:])
	fail := func(err error) error {
		os.RemoveAll(filepath.Join(parent, tmp))
		return err
	}
	if err := materialize(ctx, src, "", pfd, tmp); err != nil {
		return fail(err)
	}
	if staged != nil {
		// What an interrupted restore of paths left (its hidden names, the
		// parents it made if empty) is not the directory's: the copy
		// drops it as recovery would.
		out, err := openDirTree(pfd, tmp)
		if err != nil {
			return fail(err)
		}
		err = removeStaged(out, staged)
		out.Close()
		if err != nil {
			return fail(err)
		}
	}
	if err := unix.Syncfs(pfd); err != nil {
		return fail(&os.PathError{Op: "syncfs", Path: parent, Err: err})
	}
	if err := unix.Renameat2(pfd, tmp, pfd, name, unix.RENAME_NOREPLACE); err != nil {
		return fail(&os.LinkError{Op: "rename", Old: tmp, New: to, Err: err})
	}
	return unix.Fsync(pfd)
}
