package layers

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"strata/holders"
	"strata/internal/failpoint"
	"strata/internal/fault"
	"strata/layers/meta"
	"strata/layers/overlay"
	"strata/pathpolicy"
)

// Config configures a Store.
type Config struct {
	// Dir is the store directory. It must be on the same mount as every
	// directory the store will manage: enrollment is a rename.
	Dir string
	// Policy decides which directories may be enrolled. Its
	// ExtraProtected gains Dir.
	Policy *pathpolicy.Policy
	// Scanner finds processes that hold a directory busy.
	Scanner *holders.Scanner
	// Logger receives one line per step of each operation.
	Logger *slog.Logger
	// LegacyMount forces mount(2) instead of the new mount API.
	LegacyMount bool
	// NoRedirectDir mounts with redirect_dir=off, as on a kernel that
	// refuses redirect_dir=on (tests of that fallback): renaming a
	// directory that an earlier checkpoint holds then fails with EXDEV.
	NoRedirectDir bool
	// MinFree is the free space a capture needs on the store's filesystem
	// (507 insufficient_storage below it). 0 means 1% of the filesystem's
	// size, at least 1 MiB and at most 64 MiB: a small filesystem can
	// still be checkpointed. A restore or delete, which may free space,
	// needs only a hard floor (a few hundred KiB and a few inodes).
	MinFree uint64
	// Others, when set, returns the managed roots and the store
	// directories of the other stores the caller runs (one per
	// filesystem): enrollment checks nesting against all roots, and every
	// store directory is protected.
	Others func() (roots, stores []string)
	// NoCompaction turns background compaction off (tests that need a
	// fixed layout). Captures still compact in line past syncCompactDepth.
	NoCompaction bool
	// AutoCheckpoints is how many automatic checkpoints (a restore's
	// safety checkpoints of unsaved changes) are kept per directory, the
	// newest; 0 turns them off. guestd's default is DefaultAutoCheckpoints.
	AutoCheckpoints int
	// StepHook, when set, is called after every step of every operation
	// (metrics).
	StepHook func(op, step string, d time.Duration, err error)
}

// Checkpoint is the public view of a checkpoint.
type Checkpoint struct {
	ID        string
	Path      string
	Name      string
	CreatedAt time.Time
	ParentID  string
	// Auto marks a checkpoint the store made itself (a restore's safety
	// checkpoint of unsaved changes).
	Auto bool
	// SizeBytes is the space held by the checkpoint's own layer: what
	// deleting it alone could free.
	SizeBytes int64
	// SafetyCheckpointID is, in a restore's answer, the automatic
	// checkpoint that keeps the unsaved changes it discarded ("" if there
	// were none).
	SafetyCheckpointID string
}

// Store is one filesystem's layer store: layer directories, the metadata
// database, and the managed roots whose layers live there.
type Store struct {
	// teardowns are the old stacks let go in the background (see
	// teardown); Settle and Close wait for them.
	teardowns inflight
	cfg       Config
	dir       string
	layers    string
	tmp       string
	trash     string
	intents   string // captures' intents (intent.go)
	db        *bolt.DB
	lock      *os.File // flock held for the store's lifetime
	source    string   // the source tag of this store's mounts (see ours)
	mounter   overlay.Mounter
	clone     bool // the filesystem clones files (FICLONE): merges clone, not link
	log       *slog.Logger
	boot      string

	// compaction in the background
	compactMu  sync.Mutex
	collectMu  sync.Mutex      // collect runs one at a time
	pending    map[uint64]bool // roots to compact (true: squash too)
	wake       chan struct{}
	stop       context.CancelFunc
	workerDone chan struct{}

	// enrollMu makes an enrollment's checks and its intent one step for
	// the other enrollments: two nested directories enrolled together
	// would each pass the nesting check before the other is recorded.
	enrollMu sync.Mutex

	mu     sync.Mutex
	nextID uint64
	busy   map[string]bool  // paths with an operation under way
	pins   map[uint64]int   // layer dirs an operation is using
	sizes  map[uint64]int64 // bytes held by sealed layer and span dirs (sizes.go)
	// unrecorded are the sizes measured but not yet in their records
	unrecorded map[uint64]bool
}

// Errors of the store's operations.
var (
	ErrCheckpointNotFound = fault.New(fault.NotFound, "checkpoint_not_found", "no checkpoint has this id")
	ErrInProgress         = fault.New(fault.Conflict, "operation_in_progress", "another operation on this directory is under way")
	ErrNoSpace            = fault.New(fault.InsufficientStorage, "insufficient_storage", "not enough free space to proceed safely")
)

// Open opens (creating if needed) the store at cfg.Dir, sweeps half-done
// work and remounts every managed root from the metadata. When Open
// returns, every managed directory shows its live content.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("store directory %q must be an absolute path", cfg.Dir)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Policy == nil {
		cfg.Policy = &pathpolicy.Policy{}
	}
	if cfg.Scanner == nil {
		cfg.Scanner = holders.NewScanner("/proc")
	}
	s := &Store{
		cfg:        cfg,
		dir:        filepath.Clean(cfg.Dir),
		log:        cfg.Logger.With("store", cfg.Dir),
		boot:       bootID(),
		busy:       map[string]bool{},
		pins:       map[uint64]int{},
		sizes:      map[uint64]int64{},
		unrecorded: map[uint64]bool{},
		pending:    map[uint64]bool{},
		wake:       make(chan struct{}, 1),
	}
	s.layers = filepath.Join(s.dir, "layers")
	s.tmp = filepath.Join(s.dir, "tmp")
	s.trash = filepath.Join(s.dir, "trash")
	s.intents = filepath.Join(s.dir, "captures")
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, classifyNoSpace(fmt.Errorf("create store: %w", err))
	}
	// One owner per store: nothing in it is touched before the lock is
	// held, so a second guestd started on it changes nothing.
	lock, err := lockStore(s.dir)
	if err != nil {
		return nil, err
	}
	s.lock = lock
	ok := false
	defer func() {
		if !ok {
			lock.Close()
		}
	}()
	for _, d := range []string{s.layers, s.tmp, s.trash, s.intents} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, classifyNoSpace(fmt.Errorf("create store: %w", err))
		}
	}
	// Half-done staging from a previous run is never needed; a probe
	// mount a crash left there goes first.
	detachUnder(s.tmp)
	if err := clearDir(s.tmp); err != nil {
		return nil, err
	}
	// Merges clone files where the filesystem can (exact link counts).
	s.clone = canClone(s.tmp)
	want := overlay.DefaultOptions
	want.RedirectDir = !cfg.NoRedirectDir
	m, refused, err := overlay.Probe(ctx, filepath.Join(s.tmp, "probe"), cfg.LegacyMount, want)
	if err != nil && isNoSpace(err) {
		// A full filesystem must not keep the directories it holds from
		// being mounted: pick the mounter without writing anything.
		s.log.Warn("store filesystem is full; choosing the mounter without a probe", "err", err)
		m, refused = overlay.ProbeNoWrite(s.layers, cfg.LegacyMount, want)
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("overlayfs is not usable on %s (need overlay support, xattrs and d_type on the store's filesystem, and root): %w", s.dir, err)
	}
	if refused != nil {
		s.log.Warn("overlayfs refused redirect_dir=on: mounting with redirect_dir=off, so renaming a directory that an earlier checkpoint holds fails with EXDEV (mv copies it instead)", "err", refused)
	}
	s.mounter = m
	db, err := meta.Open(filepath.Join(s.dir, "meta.db"))
	if err != nil {
		return nil, err
	}
	s.db = db
	id, err := meta.StoreID(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.source = sourceTag(id)
	if err := s.recover(ctx); err != nil {
		db.Close()
		return nil, err
	}
	ok = true
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop, s.workerDone = stop, make(chan struct{})
	go s.worker(wctx)
	s.log.Info("store open", "mounter", m.Name(), "redirect_dir", m.Options().RedirectDir, "clone", s.clone)
	return s, nil
}

// Close stops background compaction and closes the metadata database.
// Mounts stay: they belong to the live directories, not to this process.
func (s *Store) Close() error {
	s.stop()
	<-s.workerDone
	s.teardowns.wait()
	err := s.db.Close()
	s.lock.Close()
	return err
}

// Mounter returns the mount implementation in use.
func (s *Store) Mounter() string { return s.mounter.Name() }

// Dir returns the store directory.
func (s *Store) Dir() string { return s.dir }

// List returns every checkpoint of every managed root, oldest first.
func (s *Store) List(ctx context.Context) ([]Checkpoint, error) {
	var out []Checkpoint
	layer := map[string]uint64{}
	err := s.view(func(t meta.Tx) error {
		cs, err := t.Checkpoints()
		if err != nil {
			return err
		}
		rs, err := t.Roots()
		if err != nil {
			return err
		}
		paths := make(map[uint64]string, len(rs))
		for _, r := range rs {
			paths[r.ID] = r.Path
		}
		out = make([]Checkpoint, 0, len(cs))
		for _, c := range cs {
			p, ok := paths[c.Root]
			if !ok {
				return fmt.Errorf("checkpoint %s: root %d: %w", c.ID, c.Root, meta.ErrInconsistent)
			}
			out = append(out, Checkpoint{ID: c.ID, Path: p, Name: c.Name, CreatedAt: c.Created, ParentID: c.Parent, Auto: c.Auto})
			layer[c.ID] = c.Layer
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.fillSizes(out, layer)
	return out, nil
}

// update runs fn in a read-write transaction of the metadata.
func (s *Store) update(fn func(t meta.Tx) error) error {
	return s.db.Update(func(btx *bolt.Tx) error { return fn(meta.Tx{Tx: btx}) })
}

// view runs fn in a read-only transaction of the metadata.
func (s *Store) view(fn func(t meta.Tx) error) error {
	return s.db.View(func(btx *bolt.Tx) error { return fn(meta.Tx{Tx: btx}) })
}

// policy returns the path policy with every store directory protected.
func (s *Store) policy() *pathpolicy.Policy {
	p := *s.cfg.Policy
	p.ExtraProtected = append(slices.Clone(p.ExtraProtected), s.dir)
	if s.cfg.Others != nil {
		_, stores := s.cfg.Others()
		p.ExtraProtected = append(p.ExtraProtected, stores...)
	}
	return &p
}

// allRoots returns the managed roots of this store and of the others.
func (s *Store) allRoots() ([]string, error) {
	roots, err := s.Roots()
	if err != nil {
		return nil, err
	}
	if s.cfg.Others != nil {
		others, _ := s.cfg.Others()
		roots = append(roots, others...)
	}
	return roots, nil
}

// Directory is a managed root and the checkpoint its live content
// continues from (the newest capture or the last restore).
type Directory struct {
	Path         string
	CheckpointID string
	// State is DirReady, DirMoved (the path no longer leads to the root;
	// NowAt says where its live mount is, when the mount table shows it)
	// or DirUnavailable (Problem says why).
	State   string
	NowAt   string
	Problem string
	// SizeBytes is the space held by the directory's layers: its
	// checkpoints' and its unsaved changes'.
	SizeBytes int64
}

// pendingProblem says why a root in state (not ready) is unavailable: an
// enrollment, clone or release under way, or one a crash interrupted that
// the next operation on the path or the next start finishes or undoes.
func pendingProblem(state string) string {
	what := map[string]string{meta.RootEnrolling: "an enrollment", meta.RootCloning: "a clone", meta.RootReleasing: "a release"}[state]
	if what == "" {
		what = "an operation (" + state + ")"
	}
	return what + " is under way or was interrupted; the next operation on the path, or the next start, finishes or undoes it"
}

// Directory states.
const (
	DirReady       = "ready"
	DirMoved       = "moved"
	DirUnavailable = "unavailable"
)

// rootRecords reads every root record.
func (s *Store) rootRecords() ([]*meta.Root, error) {
	var rs []*meta.Root
	err := s.view(func(t meta.Tx) (err error) {
		rs, err = t.Roots()
		return err
	})
	return rs, err
}

// Directories returns the managed roots, with where each stands.
func (s *Store) Directories() ([]Directory, error) {
	rs, err := s.rootRecords()
	if err != nil {
		return nil, err
	}
	out := make([]Directory, 0, len(rs))
	for _, r := range rs {
		d := Directory{Path: r.Path, CheckpointID: r.Head, State: DirReady}
		if d.SizeBytes, err = s.rootBytes(r.ID); err != nil {
			return nil, err
		}
		if r.State != meta.RootReady {
			d.State, d.Problem = DirUnavailable, pendingProblem(r.State)
			out = append(out, d)
			continue
		}
		h, err := s.openRoot(r)
		switch {
		case fault.CodeOf(err) == ErrDirectoryMoved.Code:
			d.State = DirMoved
			if fe := fault.As(err); fe != nil {
				d.NowAt, _ = fe.Fields["now_at"].(string)
			}
		case err != nil:
			// The cause names store paths: it goes to the log only.
			s.log.Error("inspect managed root", "path", r.Path, "err", err)
			d.State, d.Problem = DirUnavailable, "the directory could not be inspected; guestd's log says why"
		case h.top() == nil || !r.Mounted.Matches(h.top().VFSOptions):
			d.State, d.Problem = DirUnavailable, "its live mount is not the recorded one (guestd's log says why); the next operation on it retries"
		}
		h.Close()
		out = append(out, d)
	}
	return out, nil
}

// Roots returns the paths of the managed roots.
func (s *Store) Roots() ([]string, error) {
	var out []string
	err := s.view(func(t meta.Tx) error {
		rs, err := t.Roots()
		for _, r := range rs {
			out = append(out, r.Path)
		}
		return err
	})
	return out, err
}

// HasCheckpoint reports whether id is a checkpoint of this store.
func (s *Store) HasCheckpoint(id string) (bool, error) {
	var ok bool
	err := s.view(func(t meta.Tx) error {
		c, err := t.Checkpoint(id)
		ok = c != nil
		return err
	})
	return ok, err
}

// begin claims path for one operation; a second concurrent operation on
// the same directory fails at once rather than queueing.
func (s *Store) begin(path string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy[path] {
		return nil, ErrInProgress.With("path", path)
	}
	s.busy[path] = true
	return func() {
		s.mu.Lock()
		delete(s.busy, path)
		s.mu.Unlock()
	}, nil
}

// newLayerID allocates a layer id and pins it until unpin.
func (s *Store) newLayerID() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	s.pins[s.nextID]++
	return s.nextID
}

// pin keeps the layer dirs of ids on disk while an operation uses them.
func (s *Store) pin(ids ...uint64) func() {
	s.mu.Lock()
	for _, id := range ids {
		s.pins[id]++
	}
	s.mu.Unlock()
	return func() { s.unpin(ids...) }
}

func (s *Store) unpin(ids ...uint64) {
	s.mu.Lock()
	for _, id := range ids {
		if s.pins[id]--; s.pins[id] <= 0 {
			delete(s.pins, id)
		}
	}
	s.mu.Unlock()
}

// Hard floor of free space and inodes for operations that may free space
// (restore): enough for a layer dir and a metadata commit.
const (
	floorBytes  = 256 << 10
	floorInodes = 8
)

// checkSpace refuses an operation when the store's filesystem is short of
// blocks or inodes: below the reserve (captures), or below the hard floor
// when floorOnly (restores, which discard the live upper and so may free
// space).
func (s *Store) checkSpace(path string, floorOnly bool) error {
	sp, err := statSpace(s.dir)
	if err != nil {
		return err
	}
	needBytes, needInodes := s.reserve(sp)
	if floorOnly {
		needBytes, needInodes = floorBytes, floorInodes
	}
	if sp.freeBytes < needBytes {
		return ErrNoSpace.With("path", path).With("free_bytes", sp.freeBytes).With("required_bytes", needBytes)
	}
	if sp.totalInodes > 0 && sp.freeInodes < needInodes {
		return ErrNoSpace.With("path", path).With("free_inodes", sp.freeInodes).With("required_inodes", needInodes)
	}
	return nil
}

// reserve is the free space and inodes a capture leaves untouched: the
// configured MinFree, or 1% of the filesystem (1 MiB to 64 MiB); inodes
// 1% of the filesystem's (16 to 4096).
func (s *Store) reserve(sp space) (bytes, inodes uint64) {
	bytes = s.cfg.MinFree
	if bytes == 0 {
		bytes = min(max(sp.totalBytes/100, 1<<20), 64<<20)
	}
	inodes = min(max(sp.totalInodes/100, 16), 4096)
	return bytes, inodes
}

// newCheckpointID returns "cp_" and 16 random bytes in unpadded base64url.
func newCheckpointID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return "cp_" + base64.RawURLEncoding.EncodeToString(b[:])
}

// makeLayerDir creates layers/<id>/{fs,work} via tmp/, fs taking the
// attributes of the directory open at attrSrc unless it is -1.
func (s *Store) makeLayerDir(id uint64, work bool, attrSrc int) error {
	stage := filepath.Join(s.tmp, overlay.LayerName(id))
	if err := os.MkdirAll(filepath.Join(stage, "fs"), 0o755); err != nil {
		return err
	}
	if work {
		if err := os.Mkdir(filepath.Join(stage, "work"), 0o700); err != nil {
			return err
		}
	}
	if attrSrc >= 0 {
		if err := copyDirAttrsFD(attrSrc, filepath.Join(stage, "fs")); err != nil {
			os.RemoveAll(stage)
			return err
		}
	}
	if err := os.Rename(stage, filepath.Join(s.layers, overlay.LayerName(id))); err != nil {
		os.RemoveAll(stage)
		return err
	}
	return nil
}

// fsDir is layer id's content directory.
func (s *Store) fsDir(id uint64) string { return filepath.Join(s.layers, overlay.RelFS(id)) }

// removeLayerDir moves a layer dir to trash and deletes it.
func (s *Store) removeLayerDir(id uint64) error {
	src := filepath.Join(s.layers, overlay.LayerName(id))
	dst := filepath.Join(s.trash, overlay.LayerName(id)+"."+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Rename(src, dst); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	failpoint.Hit(fpCollectTrashed)
	return os.RemoveAll(dst)
}

// clearDir removes everything inside dir.
func clearDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
