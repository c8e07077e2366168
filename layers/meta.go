package layers

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The metadata database. Every record is JSON under a big-endian uint64
// key; checkpoints are keyed by a sequence number so that a cursor walks
// them oldest first, with an index from their public id.
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
	allBuckets         = [][]byte{bucketMeta, bucketRoots, bucketLayers, bucketCheckpoints, bucketCheckpointID, bucketZombies, bucketSpans, bucketLayerRefs, bucketIdempotency}
	keySchema          = []byte("schema")
	keyStoreID         = []byte("store_id")
)

const schemaVersion = 1

// Root states.
const (
	// rootEnrolling: the intent of a first capture is recorded; the
	// directory may or may not have been exchanged yet (see enrollIntent).
	rootEnrolling = "enrolling"
	// rootReady: the directory is a managed mount root.
	rootReady = "ready"
)

// rootRecord is a managed mount root.
type rootRecord struct {
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
	Mounted Stack `json:"mounted"`
	// Enroll is set while State is rootEnrolling.
	Enroll *enrollIntent `json:"enroll,omitempty"`
}

// enrollIntent is what recovery needs to finish or undo a first capture.
// The directory's contents move into the store by one rename exchange; the
// inode found at Path afterwards tells whether it happened.
type enrollIntent struct {
	OrigIno       uint64    `json:"orig_ino"`       // the user's directory
	MountpointIno uint64    `json:"mountpoint_ino"` // the empty directory swapped in
	Base          uint64    `json:"base"`
	Checkpoint    string    `json:"checkpoint"`
	Name          string    `json:"name"`
	Created       time.Time `json:"created"`
	// Idempotency is the create request's key, recorded at the commit.
	Idempotency *idemRecord `json:"idempotency,omitempty"`
}

// idemRecord is the first answer to a request that carried an
// Idempotency-Key: a retry with the same key and request gets Result
// again; the same key with another request is refused.
type idemRecord struct {
	Key     string     `json:"key"`
	Request string     `json:"request"`
	Result  Checkpoint `json:"result"`
	Created time.Time  `json:"created"`
}

// layerRecord is a layer: base (Parent 0), sealed, or active.
type layerRecord struct {
	ID      uint64    `json:"id"`
	Root    uint64    `json:"root"`
	Parent  uint64    `json:"parent,omitempty"`
	Sealed  bool      `json:"sealed"`
	Created time.Time `json:"created"`
}

// checkpointRecord is a checkpoint: a name for a sealed layer of a root.
type checkpointRecord struct {
	ID      string    `json:"id"`
	Seq     uint64    `json:"seq"`
	Root    uint64    `json:"root"`
	Layer   uint64    `json:"layer"`
	Name    string    `json:"name,omitempty"`
	Created time.Time `json:"created"`
	Parent  string    `json:"parent,omitempty"`
}

// spanRecord is a compacted layer: one directory holding the merge of a
// run of consecutive sealed layers of one chain, from Bottom (oldest) up
// to Top (newest). A mount may use it instead of the Count layers it
// covers. Spans are caches: never needed for correctness, only for
// short stacks; they are keyed by Top so that a chain walk finds them.
type spanRecord struct {
	ID     uint64 `json:"id"`
	Root   uint64 `json:"root"`
	Top    uint64 `json:"top"`
	Bottom uint64 `json:"bottom"`
	Count  int    `json:"count"`
}

// zombieRecord is an old mount that was detached lazily because something
// still used it: its layers stay on disk until its superblock is gone.
type zombieRecord struct {
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

func putJSON(b *bolt.Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, data)
}

func getJSON(b *bolt.Bucket, key []byte, v any) (bool, error) {
	data := b.Get(key)
	if data == nil {
		return false, nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return true, fmt.Errorf("decode record %x: %w", key, err)
	}
	return true, nil
}

// tx wraps a bolt transaction with typed accessors.
type tx struct{ *bolt.Tx }

func (t tx) root(id uint64) (*rootRecord, error) {
	var r rootRecord
	ok, err := getJSON(t.Bucket(bucketRoots), u64key(id), &r)
	if err != nil || !ok {
		return nil, err
	}
	return &r, nil
}

func (t tx) putRoot(r *rootRecord) error { return putJSON(t.Bucket(bucketRoots), u64key(r.ID), r) }

func (t tx) deleteRoot(id uint64) error { return t.Bucket(bucketRoots).Delete(u64key(id)) }

func (t tx) roots() ([]*rootRecord, error) {
	var out []*rootRecord
	err := t.Bucket(bucketRoots).ForEach(func(k, v []byte) error {
		var r rootRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		out = append(out, &r)
		return nil
	})
	return out, err
}

func (t tx) rootByPath(path string) (*rootRecord, error) {
	rs, err := t.roots()
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

func (t tx) layer(id uint64) (*layerRecord, error) {
	var l layerRecord
	ok, err := getJSON(t.Bucket(bucketLayers), u64key(id), &l)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("layer %d: %w", id, errMissingRecord)
	}
	return &l, nil
}

func (t tx) putLayer(l *layerRecord) error { return putJSON(t.Bucket(bucketLayers), u64key(l.ID), l) }

func (t tx) deleteLayer(id uint64) error { return t.Bucket(bucketLayers).Delete(u64key(id)) }

func (t tx) layers() (map[uint64]*layerRecord, error) {
	out := map[uint64]*layerRecord{}
	err := t.Bucket(bucketLayers).ForEach(func(k, v []byte) error {
		var l layerRecord
		if err := json.Unmarshal(v, &l); err != nil {
			return err
		}
		out[l.ID] = &l
		return nil
	})
	return out, err
}

// chain returns layer id and its ancestors, topmost first.
func (t tx) chain(id uint64) ([]uint64, error) {
	var out []uint64
	for id != 0 {
		l, err := t.layer(id)
		if err != nil {
			return nil, err
		}
		out = append(out, id)
		id = l.Parent
		if len(out) > maxChain {
			return nil, fmt.Errorf("layer chain longer than %d: %w", maxChain, errMissingRecord)
		}
	}
	return out, nil
}

func (t tx) checkpoint(id string) (*checkpointRecord, error) {
	seq := t.Bucket(bucketCheckpointID).Get([]byte(id))
	if seq == nil {
		return nil, nil
	}
	var c checkpointRecord
	ok, err := getJSON(t.Bucket(bucketCheckpoints), seq, &c)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: index without record: %w", id, errMissingRecord)
	}
	return &c, nil
}

// putCheckpoint stores a new checkpoint (use moveCheckpoint to change the
// layer of a stored one) with its two indexes: by public id, and by layer.
func (t tx) putCheckpoint(c *checkpointRecord) error {
	if err := putJSON(t.Bucket(bucketCheckpoints), u64key(c.Seq), c); err != nil {
		return err
	}
	if err := t.Bucket(bucketLayerRefs).Put(spanKey(c.Layer, c.Seq), nil); err != nil {
		return err
	}
	return t.Bucket(bucketCheckpointID).Put([]byte(c.ID), u64key(c.Seq))
}

func (t tx) deleteCheckpoint(c *checkpointRecord) error {
	if err := t.Bucket(bucketCheckpoints).Delete(u64key(c.Seq)); err != nil {
		return err
	}
	if err := t.Bucket(bucketLayerRefs).Delete(spanKey(c.Layer, c.Seq)); err != nil {
		return err
	}
	return t.Bucket(bucketCheckpointID).Delete([]byte(c.ID))
}

// moveCheckpoint points a stored checkpoint at another layer.
func (t tx) moveCheckpoint(c *checkpointRecord, layer uint64) error {
	if err := t.deleteCheckpoint(c); err != nil {
		return err
	}
	c.Layer = layer
	return t.putCheckpoint(c)
}

// referenced reports whether any checkpoint names layer.
func (t tx) referenced(layer uint64) bool {
	prefix := u64key(layer)
	k, _ := t.Bucket(bucketLayerRefs).Cursor().Seek(prefix)
	return k != nil && string(k[:8]) == string(prefix)
}

// checkpoints returns every checkpoint, oldest first.
func (t tx) checkpoints() ([]*checkpointRecord, error) {
	var out []*checkpointRecord
	err := t.Bucket(bucketCheckpoints).ForEach(func(k, v []byte) error {
		var c checkpointRecord
		if err := json.Unmarshal(v, &c); err != nil {
			return err
		}
		out = append(out, &c)
		return nil
	})
	return out, err
}

func (t tx) idempotency(key string) (*idemRecord, error) {
	var r idemRecord
	ok, err := getJSON(t.Bucket(bucketIdempotency), []byte(key), &r)
	if err != nil || !ok {
		return nil, err
	}
	return &r, nil
}

func (t tx) putIdempotency(r *idemRecord) error {
	return putJSON(t.Bucket(bucketIdempotency), []byte(r.Key), r)
}

// pruneIdempotency forgets answers older than idempotencyTTL.
func (t tx) pruneIdempotency(now time.Time) error {
	b := t.Bucket(bucketIdempotency)
	var old [][]byte
	err := b.ForEach(func(k, v []byte) error {
		var r idemRecord
		if json.Unmarshal(v, &r) != nil || now.Sub(r.Created) > idempotencyTTL {
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

func (t tx) zombies() ([]*zombieRecord, error) {
	var out []*zombieRecord
	err := t.Bucket(bucketZombies).ForEach(func(k, v []byte) error {
		var z zombieRecord
		if err := json.Unmarshal(v, &z); err != nil {
			return err
		}
		out = append(out, &z)
		return nil
	})
	return out, err
}

func (t tx) putZombie(z *zombieRecord) error {
	return putJSON(t.Bucket(bucketZombies), u64key(z.ID), z)
}

func (t tx) deleteZombie(id uint64) error { return t.Bucket(bucketZombies).Delete(u64key(id)) }

func spanKey(top, id uint64) []byte { return append(u64key(top), u64key(id)...) }

func (t tx) putSpan(sp *spanRecord) error {
	return putJSON(t.Bucket(bucketSpans), spanKey(sp.Top, sp.ID), sp)
}

func (t tx) deleteSpan(sp *spanRecord) error {
	return t.Bucket(bucketSpans).Delete(spanKey(sp.Top, sp.ID))
}

// spansOf returns the spans whose Top is top.
func (t tx) spansOf(top uint64) ([]*spanRecord, error) {
	var out []*spanRecord
	c := t.Bucket(bucketSpans).Cursor()
	prefix := u64key(top)
	for k, v := c.Seek(prefix); k != nil && string(k[:8]) == string(prefix); k, v = c.Next() {
		var sp spanRecord
		if err := json.Unmarshal(v, &sp); err != nil {
			return nil, err
		}
		out = append(out, &sp)
	}
	return out, nil
}

func (t tx) spans() ([]*spanRecord, error) {
	var out []*spanRecord
	err := t.Bucket(bucketSpans).ForEach(func(k, v []byte) error {
		var sp spanRecord
		if err := json.Unmarshal(v, &sp); err != nil {
			return err
		}
		out = append(out, &sp)
		return nil
	})
	return out, err
}

var errMissingRecord = errors.New("metadata is inconsistent")

// storeSource returns the source tag of the store's mounts, made from a
// random store id that the metadata keeps (created on first use).
func storeSource(db *bolt.DB) (string, error) {
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
	return sourcePrefix + string(id), err
}

// readStoreSource is storeSource for a store opened read-only; "" when it
// has no id yet.
func readStoreSource(db *bolt.DB) string {
	var src string
	db.View(func(btx *bolt.Tx) error {
		if v := btx.Bucket(bucketMeta).Get(keyStoreID); v != nil {
			src = sourcePrefix + string(v)
		}
		return nil
	})
	return src
}

// maxChain bounds chain walks; overlayfs itself accepts 500 lower layers.
const maxChain = 100000

func openDB(path string) (*bolt.DB, error) {
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
