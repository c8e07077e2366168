package meta

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"strata/internal/boltjson"
	"strata/internal/fault"
	"strata/layers/overlay"
)

// The buckets of the database (see the package doc).
var (
	bucketMeta         = []byte("meta")
	bucketRoots        = []byte("roots")
	bucketLayers       = []byte("layers")
	bucketCheckpoints  = []byte("checkpoints")
	bucketCheckpointID = []byte("checkpoint_ids")
	bucketZombies      = []byte("zombies")
	bucketSpans        = []byte("spans")
	bucketLayerRefs    = []byte("layer_checkpoints")
	bucketIdempotency  = []byte("idempotency")
	// bucketRootRefs indexes checkpoints by root: key root, kind (0 made
	// by a client, 1 automatic), seq. It counts a directory's checkpoints
	// and finds its oldest of each kind without reading the records.
	bucketRootRefs = []byte("root_checkpoints")
	allBuckets     = [][]byte{bucketMeta, bucketRoots, bucketLayers, bucketCheckpoints, bucketCheckpointID, bucketZombies, bucketSpans, bucketLayerRefs, bucketIdempotency, bucketRootRefs}
	keySchema      = []byte("schema")
	keyStoreID     = []byte("store_id")
)

const schemaVersion = 1

// Root states.
const (
	// RootEnrolling: the intent of a first capture is recorded; the
	// directory may or may not have been exchanged yet (see EnrollIntent).
	RootEnrolling = "enrolling"
	// RootReady: the directory is a managed mount root.
	RootReady = "ready"
	// RootCloning: a clone's intent is recorded; its mountpoint (Move)
	// may or may not be at Path yet.
	RootCloning = "cloning"
	// RootReleasing: a release's intent is recorded; its staged content
	// (Move) may or may not have taken the mountpoint's place at Path.
	RootReleasing = "releasing"
)

// Root is a managed mount root.
type Root struct {
	ID   uint64 `json:"id"`
	Path string `json:"path"`
	// Dev and Ino identify the root: the empty mountpoint directory that
	// enrollment left at Path. Path is only where it is expected; an
	// operation checks that Path still leads to this inode.
	Dev    uint64 `json:"dev,omitempty"`
	Ino    uint64 `json:"ino,omitempty"`
	State  string `json:"state"`
	Active uint64 `json:"active"` // the read-write layer
	// Head is the checkpoint the live directory continues from: the newest
	// capture, or the last restored. It may name a deleted checkpoint.
	Head string `json:"head,omitempty"`
	// Mounted is the stack the live mount must have.
	Mounted overlay.Stack `json:"mounted"`
	// Enroll is set while State is RootEnrolling.
	Enroll *EnrollIntent `json:"enroll,omitempty"`
	// Move is set while State is RootCloning or RootReleasing.
	Move *MoveIntent `json:"move,omitempty"`
	// Paths is set while a restore of single paths is under way.
	Paths *PathsIntent `json:"paths,omitempty"`
}

// PathsIntent is what recovery needs to clear an interrupted restore of
// single paths: the hidden names it builds under and the parent
// directories it makes, relative to the root.
type PathsIntent struct {
	Staged []string `json:"staged"`
	Made   []string `json:"made,omitempty"`
}

// MoveIntent is what recovery needs to finish or undo a clone or a
// release: a directory built in the store that is to take Path's place
// by one rename. The inode found at Path tells whether it did.
type MoveIntent struct {
	// Stage is where the directory waits, relative to the store dir.
	Stage    string `json:"stage"`
	StageIno uint64 `json:"stage_ino"`
}

// EnrollIntent is what recovery needs to finish or undo a first capture.
// The directory's contents move into the store by one rename exchange; the
// inode found at Path afterwards tells whether it happened.
type EnrollIntent struct {
	OrigIno       uint64    `json:"orig_ino"`       // the user's directory
	MountpointIno uint64    `json:"mountpoint_ino"` // the empty directory swapped in
	Base          uint64    `json:"base"`
	Checkpoint    string    `json:"checkpoint"`
	Name          string    `json:"name"`
	Created       time.Time `json:"created"`
	// Idempotency is the create request's key, recorded at the commit.
	Idempotency *Idempotency `json:"idempotency,omitempty"`
}

// Idempotency is the first answer to a request that carried an
// Idempotency-Key: a retry with the same key and request gets Result
// again; the same key with another request is refused.
type Idempotency struct {
	Key     string    `json:"key"`
	Request string    `json:"request"`
	Result  Answer    `json:"result"`
	Created time.Time `json:"created"`
}

// Layer is a layer: base (Parent 0), sealed, or active.
type Layer struct {
	ID      uint64    `json:"id"`
	Root    uint64    `json:"root"`
	Parent  uint64    `json:"parent,omitempty"`
	Sealed  bool      `json:"sealed"`
	Created time.Time `json:"created"`
	// Bytes is a sealed layer's size once measured (0: not yet); a
	// sealed layer never changes, so it is measured once.
	Bytes int64 `json:"bytes,omitempty"`
}

// Checkpoint is a checkpoint: a name for a sealed layer of a root.
type Checkpoint struct {
	ID      string    `json:"id"`
	Seq     uint64    `json:"seq"`
	Root    uint64    `json:"root"`
	Layer   uint64    `json:"layer"`
	Name    string    `json:"name,omitempty"`
	Created time.Time `json:"created"`
	Parent  string    `json:"parent,omitempty"`
	// Auto marks a checkpoint the store made itself: a restore's safety
	// checkpoint of the unsaved changes it discarded.
	Auto bool `json:"auto,omitempty"`
}

// Span is a compacted layer: one directory holding the merge of a
// run of consecutive sealed layers of one chain, from Bottom (oldest) up
// to Top (newest). A mount may use it instead of the Count layers it
// covers. Spans are caches: never needed for correctness, only for
// short stacks; they are keyed by Top so that a chain walk finds them.
type Span struct {
	ID     uint64 `json:"id"`
	Root   uint64 `json:"root"`
	Top    uint64 `json:"top"`
	Bottom uint64 `json:"bottom"`
	Count  int    `json:"count"`
}

// Zombie is an old mount that was detached lazily because something
// still used it: its layers stay on disk until its superblock is gone.
type Zombie struct {
	ID     uint64   `json:"id"`
	Boot   string   `json:"boot"`
	Dev    uint64   `json:"dev"`
	Layers []uint64 `json:"layers"`
}

func u64key(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func putJSON(b *bolt.Bucket, key []byte, v any) error { return boltjson.Put(b, key, v) }

// Tx wraps a bolt transaction with typed accessors.
type Tx struct{ *bolt.Tx }

// Root returns root id, or nil.
func (t Tx) Root(id uint64) (*Root, error) {
	return boltjson.Get[Root](t.Bucket(bucketRoots), u64key(id))
}

func (t Tx) PutRoot(r *Root) error { return putJSON(t.Bucket(bucketRoots), u64key(r.ID), r) }

func (t Tx) DeleteRoot(id uint64) error { return t.Bucket(bucketRoots).Delete(u64key(id)) }

// Roots returns every managed root.
func (t Tx) Roots() ([]*Root, error) { return all[Root](t.Bucket(bucketRoots)) }

// all decodes every record of a bucket, in key order.
func all[T any](b *bolt.Bucket) ([]*T, error) {
	var out []*T
	err := boltjson.ForEach(b, func(_ []byte, v *T) error {
		out = append(out, v)
		return nil
	})
	return out, err
}

func (t Tx) RootByPath(path string) (*Root, error) {
	rs, err := t.Roots()
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		if r.Path == path {
			return r, nil
		}
	}
	return nil, nil
}

// Layer returns layer id; a missing one is ErrInconsistent.
func (t Tx) Layer(id uint64) (*Layer, error) {
	l, err := boltjson.Get[Layer](t.Bucket(bucketLayers), u64key(id))
	if err == nil && l == nil {
		err = fmt.Errorf("layer %d: %w", id, ErrInconsistent)
	}
	return l, err
}

func (t Tx) PutLayer(l *Layer) error { return putJSON(t.Bucket(bucketLayers), u64key(l.ID), l) }

func (t Tx) DeleteLayer(id uint64) error { return t.Bucket(bucketLayers).Delete(u64key(id)) }

// Layers returns every layer by id.
func (t Tx) Layers() (map[uint64]*Layer, error) {
	out := map[uint64]*Layer{}
	err := boltjson.ForEach(t.Bucket(bucketLayers), func(_ []byte, l *Layer) error {
		out[l.ID] = l
		return nil
	})
	return out, err
}

// Chain returns layer id and its ancestors, topmost first.
func (t Tx) Chain(id uint64) ([]uint64, error) {
	var out []uint64
	for id != 0 {
		l, err := t.Layer(id)
		if err != nil {
			return nil, err
		}
		out = append(out, id)
		id = l.Parent
		if len(out) > MaxChain {
			return nil, fmt.Errorf("layer chain longer than %d: %w", MaxChain, ErrInconsistent)
		}
	}
	return out, nil
}

func (t Tx) Checkpoint(id string) (*Checkpoint, error) {
	seq := t.Bucket(bucketCheckpointID).Get([]byte(id))
	if seq == nil {
		return nil, nil
	}
	c, err := boltjson.Get[Checkpoint](t.Bucket(bucketCheckpoints), seq)
	if err == nil && c == nil {
		err = fmt.Errorf("checkpoint %s: index without record: %w", id, ErrInconsistent)
	}
	return c, err
}

// PutCheckpoint stores a new checkpoint (use moveCheckpoint to change the
// layer of a stored one) with its three indexes: by public id, by layer,
// and by root.
func (t Tx) PutCheckpoint(c *Checkpoint) error {
	if err := putJSON(t.Bucket(bucketCheckpoints), u64key(c.Seq), c); err != nil {
		return err
	}
	if err := t.Bucket(bucketLayerRefs).Put(spanKey(c.Layer, c.Seq), nil); err != nil {
		return err
	}
	if err := t.Bucket(bucketRootRefs).Put(rootRefKey(c.Root, c.Auto, c.Seq), nil); err != nil {
		return err
	}
	return t.Bucket(bucketCheckpointID).Put([]byte(c.ID), u64key(c.Seq))
}

func (t Tx) DeleteCheckpoint(c *Checkpoint) error {
	if err := t.Bucket(bucketCheckpoints).Delete(u64key(c.Seq)); err != nil {
		return err
	}
	if err := t.Bucket(bucketLayerRefs).Delete(spanKey(c.Layer, c.Seq)); err != nil {
		return err
	}
	if err := t.Bucket(bucketRootRefs).Delete(rootRefKey(c.Root, c.Auto, c.Seq)); err != nil {
		return err
	}
	return t.Bucket(bucketCheckpointID).Delete([]byte(c.ID))
}

// rootRefKey is a checkpoint's key in the by-root index.
func rootRefKey(root uint64, auto bool, seq uint64) []byte {
	k := append(u64key(root), 0)
	if auto {
		k[8] = 1
	}
	return append(k, u64key(seq)...)
}

// CountOf returns how many checkpoints of root there are of one kind
// (auto: made by the store; else made by clients).
func (t Tx) CountOf(root uint64, auto bool) int {
	prefix := rootRefKey(root, auto, 0)[:9]
	n := 0
	c := t.Bucket(bucketRootRefs).Cursor()
	for k, _ := c.Seek(prefix); k != nil && string(k[:9]) == string(prefix); k, _ = c.Next() {
		n++
	}
	return n
}

// OldestOf returns up to n checkpoints of root of one kind, oldest first.
func (t Tx) OldestOf(root uint64, auto bool, n int) ([]*Checkpoint, error) {
	prefix := rootRefKey(root, auto, 0)[:9]
	var out []*Checkpoint
	c := t.Bucket(bucketRootRefs).Cursor()
	for k, _ := c.Seek(prefix); k != nil && string(k[:9]) == string(prefix) && len(out) < n; k, _ = c.Next() {
		cp, err := boltjson.Get[Checkpoint](t.Bucket(bucketCheckpoints), k[9:])
		if err == nil && cp == nil {
			err = fmt.Errorf("checkpoint seq %d: index without record: %w", binary.BigEndian.Uint64(k[9:]), ErrInconsistent)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, cp)
	}
	return out, nil
}

// CheckpointsOf returns root's checkpoints, oldest first.
func (t Tx) CheckpointsOf(root uint64) ([]*Checkpoint, error) {
	var out []*Checkpoint
	for _, auto := range []bool{false, true} {
		cs, err := t.OldestOf(root, auto, MaxChain)
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
	}
	slices.SortFunc(out, func(a, b *Checkpoint) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

// MoveCheckpoint points a stored checkpoint at another layer.
func (t Tx) MoveCheckpoint(c *Checkpoint, layer uint64) error {
	if err := t.DeleteCheckpoint(c); err != nil {
		return err
	}
	c.Layer = layer
	return t.PutCheckpoint(c)
}

// Referenced reports whether any checkpoint names layer.
func (t Tx) Referenced(layer uint64) bool {
	prefix := u64key(layer)
	k, _ := t.Bucket(bucketLayerRefs).Cursor().Seek(prefix)
	return k != nil && string(k[:8]) == string(prefix)
}

// Checkpoints returns every checkpoint, oldest first.
func (t Tx) Checkpoints() ([]*Checkpoint, error) { return all[Checkpoint](t.Bucket(bucketCheckpoints)) }

// NextCheckpointSeq allocates the sequence number of a new checkpoint.
func (t Tx) NextCheckpointSeq() (uint64, error) { return t.Bucket(bucketCheckpoints).NextSequence() }

// Idempotency returns the answer kept under key, or nil.
func (t Tx) Idempotency(key string) (*Idempotency, error) {
	return boltjson.Get[Idempotency](t.Bucket(bucketIdempotency), []byte(key))
}

func (t Tx) PutIdempotency(r *Idempotency) error {
	return putJSON(t.Bucket(bucketIdempotency), []byte(r.Key), r)
}

// PruneIdempotency forgets answers older than idempotencyTTL.
func (t Tx) PruneIdempotency(now time.Time) error {
	b := t.Bucket(bucketIdempotency)
	var old [][]byte
	err := b.ForEach(func(k, v []byte) error {
		r, err := boltjson.Get[Idempotency](b, k)
		if err != nil || now.Sub(r.Created) > IdempotencyTTL {
			old = append(old, append([]byte(nil), k...))
		}
		return nil
	})
	for _, k := range old {
		if err == nil {
			err = b.Delete(k)
		}
	}
	return err
}

func (t Tx) Zombies() ([]*Zombie, error) { return all[Zombie](t.Bucket(bucketZombies)) }

func (t Tx) PutZombie(z *Zombie) error {
	return putJSON(t.Bucket(bucketZombies), u64key(z.ID), z)
}

func (t Tx) DeleteZombie(id uint64) error { return t.Bucket(bucketZombies).Delete(u64key(id)) }

func spanKey(top, id uint64) []byte { return append(u64key(top), u64key(id)...) }

func (t Tx) PutSpan(sp *Span) error {
	return putJSON(t.Bucket(bucketSpans), spanKey(sp.Top, sp.ID), sp)
}

func (t Tx) DeleteSpan(sp *Span) error {
	return t.Bucket(bucketSpans).Delete(spanKey(sp.Top, sp.ID))
}

// SpansOf returns the spans whose Top is top.
func (t Tx) SpansOf(top uint64) ([]*Span, error) {
	var out []*Span
	err := boltjson.ForEachPrefix(t.Bucket(bucketSpans), u64key(top), func(_ []byte, sp *Span) error {
		out = append(out, sp)
		return nil
	})
	return out, err
}

func (t Tx) Spans() ([]*Span, error) { return all[Span](t.Bucket(bucketSpans)) }

// ErrInconsistent is a record that names one that does not exist.
var ErrInconsistent = errors.New("metadata is inconsistent")

// StoreID returns the store's random id, kept in the metadata (made on
// first use): it tags the store's mounts.
func StoreID(db *bolt.DB) (string, error) {
	var id []byte
	err := db.Update(func(btx *bolt.Tx) error {
		m := btx.Bucket(bucketMeta)
		if v := m.Get(keyStoreID); v != nil {
			id = append([]byte(nil), v...)
			return nil
		}
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		id = []byte(hex.EncodeToString(b[:]))
		return m.Put(keyStoreID, id)
	})
	return string(id), err
}

// ReadStoreID is StoreID for a store opened read-only; "" when it has none.
func ReadStoreID(db *bolt.DB) string {
	var id string
	db.View(func(btx *bolt.Tx) error {
		if v := btx.Bucket(bucketMeta).Get(keyStoreID); v != nil {
			id = string(v)
		}
		return nil
	})
	return id
}

// MaxChain bounds chain walks; overlayfs itself accepts 500 lower layers.
const MaxChain = 100000

// Open opens (creating) the metadata database at path, with every bucket,
// and checks its schema version. bbolt's own lock waits 2 s at most.
func Open(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open metadata %s: %w", path, err)
	}
	err = db.Update(func(btx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := btx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		if err := indexByRoot(btx); err != nil {
			return err
		}
		m := btx.Bucket(bucketMeta)
		if v := m.Get(keySchema); v != nil {
			if got := binary.BigEndian.Uint64(v); got != schemaVersion {
				return fmt.Errorf("metadata schema %d, this guestd knows %d", got, schemaVersion)
			}
			return nil
		}
		return m.Put(keySchema, u64key(schemaVersion))
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// indexByRoot fills the by-root index of a store that predates it: every
// checkpoint, when the index is empty and checkpoints exist.
func indexByRoot(btx *bolt.Tx) error {
	idx := btx.Bucket(bucketRootRefs)
	if k, _ := idx.Cursor().First(); k != nil {
		return nil
	}
	return boltjson.ForEach(btx.Bucket(bucketCheckpoints), func(_ []byte, c *Checkpoint) error {
		return idx.Put(rootRefKey(c.Root, c.Auto, c.Seq), nil)
	})
}

// Segment is one lower layer of a mount stack.
type Segment struct {
	Dir    uint64 // the layer or span directory
	Top    uint64 // newest layer covered
	Bottom uint64 // oldest layer covered
	Count  int    // layers covered
	Base   bool   // the root's base layer
}

// Decompose returns the segments that serve the chain of top, topmost
// first, using the largest span available at each step.
func (t Tx) Decompose(top uint64) ([]Segment, error) {
	var out []Segment
	for cur := top; cur != 0; {
		spans, err := t.SpansOf(cur)
		if err != nil {
			return nil, err
		}
		var best *Span
		for _, sp := range spans {
			if best == nil || sp.Count > best.Count {
				best = sp
			}
		}
		seg := Segment{Dir: cur, Top: cur, Bottom: cur, Count: 1}
		if best != nil {
			seg = Segment{Dir: best.ID, Top: cur, Bottom: best.Bottom, Count: best.Count}
		}
		l, err := t.Layer(seg.Bottom)
		if err != nil {
			return nil, err
		}
		seg.Base = l.Parent == 0 && seg.Count == 1
		out = append(out, seg)
		cur = l.Parent
		if len(out) > MaxChain {
			return nil, fmt.Errorf("chain of layer %d does not end: %w", top, ErrInconsistent)
		}
	}
	return out, nil
}

// NextMerge returns the index i of the first pair (segs[i], segs[i+1])
// the binary-counter rule merges, or -1.
func NextMerge(segs []Segment) int {
	for i := 0; i+1 < len(segs); i++ {
		if segs[i+1].Base || segs[i].Base {
			return -1
		}
		if segs[i].Count >= segs[i+1].Count {
			return i
		}
	}
	return -1
}

// SquashPair is a layer to merge into its only child.
type SquashPair struct{ Upper, Lower uint64 } // child, parent

// SquashCandidates lists the squashable pairs of rootID, lowest first.
func (t Tx) SquashCandidates(rootID uint64) ([]SquashPair, error) {
	all, err := t.Layers()
	if err != nil {
		return nil, err
	}
	referenced := map[uint64]bool{}
	cps, err := t.Checkpoints()
	if err != nil {
		return nil, err
	}
	for _, c := range cps {
		referenced[c.Layer] = true
	}
	roots, err := t.Roots()
	if err != nil {
		return nil, err
	}
	for _, r := range roots {
		referenced[r.Active] = true
		if r.Enroll != nil {
			return nil, nil // never while an enrollment is pending
		}
	}
	children := map[uint64][]uint64{}
	for _, l := range all {
		if l.Parent != 0 {
			children[l.Parent] = append(children[l.Parent], l.ID)
		}
	}
	var out []SquashPair
	for _, l := range all {
		if l.Root != rootID || !l.Sealed || referenced[l.ID] || len(children[l.ID]) != 1 {
			continue
		}
		child := all[children[l.ID][0]]
		if child == nil || !child.Sealed {
			continue // an active upper cannot be rewritten
		}
		out = append(out, SquashPair{Upper: child.ID, Lower: l.ID})
	}
	slices.SortFunc(out, func(a, b SquashPair) int { return cmp.Compare(a.Lower, b.Lower) })
	return out, nil
}

// SpanCovers reports whether layer id lies strictly inside span sp: below
// sp.Top on the walk down to sp.Bottom, and above sp.Bottom.
func (t Tx) SpanCovers(sp *Span, id uint64) (bool, error) {
	cur := sp.Top
	for n := 1; n < sp.Count && cur != sp.Bottom; n++ {
		l, err := t.Layer(cur)
		if err != nil {
			return false, err
		}
		if l.Parent == id {
			return true, nil
		}
		cur = l.Parent
	}
	return false, nil
}

// Sweep deletes the records of layers that no checkpoint and no live
// directory needs: mark every chain from a checkpoint's layer and from
// each root's active layer, sweep the rest (and spans whose top went).
// Their dirs are the store's to delete.
func (t Tx) Sweep() error {
	all, err := t.Layers()
	if err != nil {
		return err
	}
	needed := make(map[uint64]bool, len(all))
	mark := func(id uint64) {
		for id != 0 && !needed[id] {
			needed[id] = true
			l := all[id]
			if l == nil {
				return
			}
			id = l.Parent
		}
	}
	cps, err := t.Checkpoints()
	if err != nil {
		return err
	}
	for _, c := range cps {
		mark(c.Layer)
	}
	roots, err := t.Roots()
	if err != nil {
		return err
	}
	for _, r := range roots {
		mark(r.Active)
		if r.Enroll != nil {
			mark(r.Enroll.Base)
		}
	}
	for id := range all {
		if !needed[id] {
			if err := t.DeleteLayer(id); err != nil {
				return err
			}
		}
	}
	spans, err := t.Spans()
	if err != nil {
		return err
	}
	for _, sp := range spans {
		// Every layer under a needed one is needed, so a span is needed
		// exactly when its top is.
		if !needed[sp.Top] {
			if err := t.DeleteSpan(sp); err != nil {
				return err
			}
		}
	}
	return nil
}

// IdempotencyTTL is how long an answer is kept for retries.
const IdempotencyTTL = 24 * time.Hour

// ErrIdempotencyKeyReused answers a key sent again with another request.
var ErrIdempotencyKeyReused = fault.New(fault.Unprocessable, "idempotency_key_reused",
	"This Idempotency-Key was already used with a different request.")

// Request is one request's Idempotency-Key and what it asked for.
type Request struct {
	Key  string
	Body string
}

// Answer is the first answer to a request, as the store returned it.
type Answer struct {
	ID        string
	Path      string
	Name      string
	CreatedAt time.Time
	ParentID  string
	// Safety is a restore's safety checkpoint.
	Safety string `json:",omitempty"`
}

// Replay returns the recorded answer to r, if there is one younger than
// IdempotencyTTL; a record of another request under the same key is
// ErrIdempotencyKeyReused.
func (t Tx) Replay(r Request, now time.Time) (*Answer, error) {
	if r.Key == "" {
		return nil, nil
	}
	rec, err := t.Idempotency(r.Key)
	if err != nil || rec == nil || now.Sub(rec.Created) > IdempotencyTTL {
		return nil, err
	}
	if rec.Request != r.Body {
		return nil, ErrIdempotencyKeyReused.With("idempotency_key", r.Key)
	}
	res := rec.Result
	return &res, nil
}

// Record stores the answer to r, inside the transaction that commits it.
// A key recorded meanwhile for another request fails the commit.
func (t Tx) Record(r Request, res Answer, now time.Time) error {
	if r.Key == "" {
		return nil
	}
	if _, err := t.Replay(r, now); err != nil {
		return err
	}
	if err := t.PruneIdempotency(now); err != nil {
		return err
	}
	return t.PutIdempotency(&Idempotency{Key: r.Key, Request: r.Body, Result: res, Created: now})
}
