package guestimage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// lockCache takes the cache's exclusive build lock, waiting (and saying
// so) while another build holds it. The returned function releases it.
func lockCache(ctx context.Context, cache string, logf func(string, ...any)) (func(), error) {
	if err := mkdirPublic(cache); err != nil {
		return nil, err
	}
	path := filepath.Join(cache, ".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, err
	}
	release := func() { f.Close() } // closing the last fd drops the flock
	said := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return release, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		if !said {
			logf("waiting for another build to finish (lock %s)", path)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pruneImages keeps keep image directories, current and the most recently
// built or used others (by mtime), and removes the rest; directories
// whose name starts with '.' (builds in progress) are left alone.
func pruneImages(root string, keep int, current string) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	type dir struct {
		name  string
		mtime time.Time
	}
	var dirs []dir
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		dirs = append(dirs, dir{e.Name(), info.ModTime()})
	}
	slices.SortFunc(dirs, func(a, b dir) int { return b.mtime.Compare(a.mtime) })
	var errs []error
	kept := 1 // current
	for _, d := range dirs {
		if d.name == current {
			continue
		}
		if kept < keep {
			kept++
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, d.name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
