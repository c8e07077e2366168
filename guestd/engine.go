package guestd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"

	"strata/holders"
	"strata/layers"
	"strata/pathpolicy"
)

// engine routes operations to the layer store of each filesystem:
// enrollment moves a directory's contents into a store with a rename, so
// the store must be on the directory's own mount. The main store (--store)
// serves the mount it lives on; a directory on another allowed mount (say
// a tmpfs /tmp) gets a store in ".strata" at that mount's root, created on
// first use and listed in the main store's stores.json so that startup
// finds it.
type engine struct {
	cfg       Config
	policy    *pathpolicy.Policy
	log       *slog.Logger
	main      *layers.Store
	mainMount string

	stepHook func(op, step string, d time.Duration, err error)

	mu     sync.Mutex
	extra  map[string]*layers.Store // by store dir
	create sync.Mutex               // serializes store creation
}

const extraStoreName = ".strata"

func openEngine(ctx context.Context, cfg Config, stepHook func(string, string, time.Duration, error)) (*engine, error) {
	e := &engine{cfg: cfg, policy: cfg.Policy, log: cfg.Logger, extra: map[string]*layers.Store{}, stepHook: stepHook}
	if err := os.MkdirAll(cfg.Store, 0o700); err != nil {
		return nil, err
	}
	mp, err := mountOf(cfg.Store)
	if err != nil {
		return nil, err
	}
	e.mainMount = mp
	// Stores of other filesystems first: the main store's recovery checks
	// nesting against their roots.
	dirs, err := e.readStores()
	if err != nil {
		return nil, err
	}
	var kept []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "meta.db")); err != nil {
			// A store on a filesystem that did not survive (a tmpfs after a
			// reboot) took its managed directories with it.
			e.log.Warn("store gone, forgetting it", "store", d, "err", err)
			continue
		}
		st, err := layers.Open(ctx, e.storeConfig(d, stepHook))
		if err != nil {
			e.closeAll()
			return nil, fmt.Errorf("open store %s: %w", d, err)
		}
		e.extra[d] = st
		kept = append(kept, d)
	}
	if len(kept) != len(dirs) {
		if err := e.writeStores(kept); err != nil {
			e.closeAll()
			return nil, err
		}
	}
	st, err := layers.Open(ctx, e.storeConfig(cfg.Store, stepHook))
	if err != nil {
		e.closeAll()
		return nil, err
	}
	e.main = st
	return e, nil
}

func (e *engine) storeConfig(dir string, stepHook func(string, string, time.Duration, error)) layers.Config {
	return layers.Config{
		Dir:             dir,
		Policy:          e.policy,
		Scanner:         holders.NewScanner("/proc"),
		Logger:          e.log,
		LegacyMount:     e.cfg.LegacyMount,
		NoCompaction:    e.cfg.NoCompaction,
		MinFree:         e.cfg.MinFree,
		StepHook:        stepHook,
		AutoCheckpoints: e.cfg.AutoCheckpoints,
		Others:          func() ([]string, []string) { return e.others(dir) },
	}
}

// others returns the roots and store dirs of every store but dir's.
func (e *engine) others(dir string) (roots, stores []string) {
	for _, st := range e.stores() {
		if st.Dir() == dir {
			continue
		}
		stores = append(stores, st.Dir())
		rs, err := st.Roots()
		if err != nil {
			e.log.Error("read roots", "store", st.Dir(), "err", err)
		}
		roots = append(roots, rs...)
	}
	if dir != e.cfg.Store && e.main == nil {
		stores = append(stores, e.cfg.Store)
	}
	return roots, stores
}

// stores returns every open store, the main one first.
func (e *engine) stores() []*layers.Store {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*layers.Store
	if e.main != nil {
		out = append(out, e.main)
	}
	dirs := make([]string, 0, len(e.extra))
	for d := range e.extra {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		out = append(out, e.extra[d])
	}
	return out
}

func (e *engine) closeAll() {
	for _, st := range e.stores() {
		st.Close()
	}
}

// storeFor returns the store that serves path: the store whose root it
// already is, else the store of the mount its parent directory is on when
// that mount may hold managed roots, else the main store (whose checks
// then refuse the path with the right code).
func (e *engine) storeFor(ctx context.Context, path string) (*layers.Store, error) {
	for _, st := range e.stores() {
		rs, err := st.Roots()
		if err != nil {
			return nil, err
		}
		if slices.Contains(rs, path) {
			return st, nil
		}
	}
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || path == "/" {
		return e.main, nil
	}
	// A store is made for a filesystem only for a path that passes the
	// path rules: a refused path must leave nothing behind.
	if err := e.policy.CheckEnrollPath(path, nil); err != nil {
		return e.main, nil
	}
	mp, err := mountOf(filepath.Dir(path))
	if err != nil || mp == e.mainMount || !slices.Contains(e.allowedMounts(), mp) {
		return e.main, nil
	}
	dir := filepath.Join(mp, extraStoreName)
	e.mu.Lock()
	st := e.extra[dir]
	e.mu.Unlock()
	if st != nil {
		return st, nil
	}
	return e.newStore(ctx, dir)
}

func (e *engine) allowedMounts() []string {
	if e.policy.AllowedMounts != nil {
		return e.policy.AllowedMounts
	}
	return pathpolicy.DefaultAllowedMounts
}

// newStore creates the store at dir, recording it before it exists so
// that a crash in between leaves at worst an empty entry that startup
// drops.
func (e *engine) newStore(ctx context.Context, dir string) (*layers.Store, error) {
	e.create.Lock()
	defer e.create.Unlock()
	e.mu.Lock()
	st := e.extra[dir]
	e.mu.Unlock()
	if st != nil {
		return st, nil
	}
	dirs, err := e.readStores()
	if err != nil {
		return nil, err
	}
	if !slices.Contains(dirs, dir) {
		if err := e.writeStores(append(dirs, dir)); err != nil {
			return nil, err
		}
	}
	st, err = layers.Open(ctx, e.storeConfig(dir, e.stepHook))
	if err != nil {
		return nil, fmt.Errorf("create store %s: %w", dir, err)
	}
	e.log.Info("store created for another filesystem", "store", dir)
	e.mu.Lock()
	e.extra[dir] = st
	e.mu.Unlock()
	return st, nil
}

func (e *engine) storesFile() string { return filepath.Join(e.cfg.Store, "stores.json") }

func (e *engine) readStores() ([]string, error) {
	b, err := os.ReadFile(e.storesFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var dirs []string
	if err := json.Unmarshal(b, &dirs); err != nil {
		return nil, fmt.Errorf("%s: %w", e.storesFile(), err)
	}
	return dirs, nil
}

// writeStores replaces stores.json atomically and durably.
func (e *engine) writeStores(dirs []string) error {
	b, err := json.Marshal(dirs)
	if err != nil {
		return err
	}
	return writeFileAtomic(e.storesFile(), b)
}

// mountOf returns the mount point of the mount that holds path.
func mountOf(path string) (string, error) {
	ms, err := mountinfo.GetMounts(nil)
	if err != nil {
		return "", err
	}
	best := ""
	for _, m := range ms {
		mp := m.Mountpoint
		if (path == mp || mp == "/" || strings.HasPrefix(path, mp+"/")) && len(mp) > len(best) {
			best = mp
		}
	}
	if best == "" {
		return "", fmt.Errorf("no mount holds %s", path)
	}
	return best, nil
}

// capture captures path; retention, when not 0, lets the capture delete
// the directory's oldest checkpoints (layers.WithRetention).
func (e *engine) capture(ctx context.Context, path, name, key string, retention int) (layers.Checkpoint, error) {
	st, err := e.storeFor(ctx, path)
	if err != nil {
		return layers.Checkpoint{}, err
	}
	if err := e.keyUsedElsewhere(st, key); err != nil {
		return layers.Checkpoint{}, err
	}
	opts := []layers.Option{layers.WithIdempotencyKey(key)}
	if retention > 0 {
		opts = append(opts, layers.WithRetention(retention))
	}
	return st.Capture(ctx, path, name, opts...)
}

// keyUsedElsewhere refuses an Idempotency-Key that another store (another
// filesystem) holds an answer for: the same request always goes to the
// same store, so the key was used for another request.
func (e *engine) keyUsedElsewhere(st *layers.Store, key string) error {
	if key == "" {
		return nil
	}
	for _, other := range e.stores() {
		if other == st {
			continue
		}
		ok, err := other.Knows(key)
		if err != nil {
			return err
		}
		if ok {
			return layers.ErrIdempotencyKeyReused.With("idempotency_key", key)
		}
	}
	return nil
}

// list merges every store's checkpoints, oldest first.
func (e *engine) list(ctx context.Context) ([]layers.Checkpoint, error) {
	var all []layers.Checkpoint
	for _, st := range e.stores() {
		cps, err := st.List(ctx)
		if err != nil {
			return nil, err
		}
		all = append(all, cps...)
	}
	slices.SortStableFunc(all, func(a, b layers.Checkpoint) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return all, nil
}

// directories lists the managed roots of every store, by path.
func (e *engine) directories() ([]layers.Directory, error) {
	var all []layers.Directory
	for _, st := range e.stores() {
		ds, err := st.Directories()
		if err != nil {
			return nil, err
		}
		all = append(all, ds...)
	}
	slices.SortFunc(all, func(a, b layers.Directory) int { return strings.Compare(a.Path, b.Path) })
	return all, nil
}

// owner returns the store that holds checkpoint id.
func (e *engine) owner(id string) (*layers.Store, error) {
	for _, st := range e.stores() {
		ok, err := st.HasCheckpoint(id)
		if err != nil {
			return nil, err
		}
		if ok {
			return st, nil
		}
	}
	return nil, layers.ErrCheckpointNotFound.With("checkpoint_id", id)
}

func (e *engine) restore(ctx context.Context, id, key string) (layers.Checkpoint, error) {
	st, err := e.owner(id)
	if err != nil {
		return layers.Checkpoint{}, err
	}
	if err := e.keyUsedElsewhere(st, key); err != nil {
		return layers.Checkpoint{}, err
	}
	return st.Restore(ctx, id, layers.WithIdempotencyKey(key))
}

func (e *engine) delete(ctx context.Context, id string) error {
	st, err := e.owner(id)
	if err != nil {
		return err
	}
	return st.Delete(ctx, id)
}
