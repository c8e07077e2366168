package hostproxy

import (
	"context"
	"fmt"
	"io"

	bolt "go.etcd.io/bbolt"

	"strata/internal/api"
	"strata/internal/boltjson"
	"strata/sandbox"
)

// Names and refs: two indexes the registry keeps beside the sandboxes'
// records, in the transaction that writes each record (putSandboxTx), so
// that a request resolves what its path or body names in one lookup.
//
//   - Sandbox names (bucketNames: account \x00 name -> sandbox id): a
//     sandbox's name works wherever its id does, among its account's
//     sandboxes that are not destroyed, where it is unique. An id and a
//     name never mean two sandboxes: the API's ids start with "sb-",
//     which no name may (api.ValidateSandboxName), and a name that is
//     the id of a sandbox the configuration lists is refused
//     (insertChecks). A path segment is first an id of the account's,
//     then a name (resolveSandbox). A deleted sandbox's name is free at
//     once, and its id is then unknown.
//   - Snapshot refs (bucketRefs: ref -> refEntry): each VM snapshot gets
//     one when it is first recorded ("sn-" and 24 lowercase letters and
//     digits, about 124 random bits), unique on the deployment and never
//     given again: the entry of a deleted snapshot stays, marked gone.
//     Package sandbox records snapshots and keeps their Ref field as it
//     finds it; the registry alone gives refs.
//
// OpenRegistry checks both against the records (reindexTx): the names
// index is rebuilt, and a snapshot recorded before refs existed gets one.

var (
	bucketNames = []byte("sandbox_names")
	bucketRefs  = []byte("snapshot_refs")
)

// refEntry is where a ref points: a snapshot of a sandbox, or nothing any
// more (Gone), kept so that the ref is never given again.
type refEntry struct {
	Sandbox  string `json:"sandbox"`
	Snapshot string `json:"snapshot"`
	Gone     bool   `json:"gone,omitempty"`
}

// indexed is what the indexes hold of one record: its name's key ("" for
// none) and its snapshots' refs by snapshot id.
type indexed struct {
	name string
	refs map[string]string
}

// nameKey is the names index's key of sb, "" when sb holds no name there:
// no name, no account (a sandbox of the pool or a fork made ahead), or
// destroyed.
func nameKey(sb *Sandbox) string {
	if sb == nil || sb.Name == "" || sb.Account == "" || sb.State == sandbox.Destroyed {
		return ""
	}
	return sb.Account + "\x00" + sb.Name
}

// indexedOf is what the indexes hold of sb (nil: a record not written yet).
func indexedOf(sb *Sandbox) indexed {
	if sb == nil {
		return indexed{}
	}
	ix := indexed{name: nameKey(sb)}
	for _, sn := range sb.Snapshots {
		if sn.Ref != "" {
			if ix.refs == nil {
				ix.refs = map[string]string{}
			}
			ix.refs[sn.ID] = sn.Ref
		}
	}
	return ix
}

// putSandboxTx writes sb, whose record held before what the indexes hold
// of it, and the indexes: its name (errNameTaken when another sandbox of
// the account holds it), and a ref for each snapshot that has none (the
// one it had, if package sandbox rebuilt the snapshot without it), the
// refs of snapshots no longer there marked gone.
func (r *Registry) putSandboxTx(tx *bolt.Tx, before indexed, sb *Sandbox) error {
	names := tx.Bucket(bucketNames)
	if key := nameKey(sb); key != before.name {
		if before.name != "" {
			if v := names.Get([]byte(before.name)); string(v) == sb.ID {
				if err := names.Delete([]byte(before.name)); err != nil {
					return err
				}
			}
		}
		if key != "" {
			if v := names.Get([]byte(key)); v != nil && string(v) != sb.ID {
				return errNameTaken.With("name", sb.Name)
			}
			if err := names.Put([]byte(key), []byte(sb.ID)); err != nil {
				return err
			}
		}
	}
	refs := tx.Bucket(bucketRefs)
	kept := map[string]bool{}
	for i := range sb.Snapshots {
		sn := &sb.Snapshots[i]
		if sn.Ref == "" {
			sn.Ref = before.refs[sn.ID]
		}
		if sn.Ref == "" {
			ref, err := r.freshRef(refs)
			if err != nil {
				return err
			}
			sn.Ref = ref
		}
		kept[sn.Ref] = true
		if before.refs[sn.ID] == sn.Ref {
			continue // indexed already
		}
		if err := boltjson.Put(refs, []byte(sn.Ref), refEntry{Sandbox: sb.ID, Snapshot: sn.ID}); err != nil {
			return err
		}
	}
	for _, ref := range before.refs {
		if !kept[ref] {
			if err := goneTx(refs, ref); err != nil {
				return err
			}
		}
	}
	return boltjson.Put(tx.Bucket(bucketSandboxes), []byte(sb.ID), sb)
}

// deleteSandboxTx deletes the record of sb (as it was read) and what the
// indexes hold of it: its name is free, its refs are gone.
func deleteSandboxTx(tx *bolt.Tx, sb *Sandbox) error {
	ix := indexedOf(sb)
	names := tx.Bucket(bucketNames)
	if ix.name != "" {
		if v := names.Get([]byte(ix.name)); string(v) == sb.ID {
			if err := names.Delete([]byte(ix.name)); err != nil {
				return err
			}
		}
	}
	for _, ref := range ix.refs {
		if err := goneTx(tx.Bucket(bucketRefs), ref); err != nil {
			return err
		}
	}
	return tx.Bucket(bucketSandboxes).Delete([]byte(sb.ID))
}

// goneTx marks ref's entry gone, keeping where it pointed.
func goneTx(refs *bolt.Bucket, ref string) error {
	e, err := boltjson.Get[refEntry](refs, []byte(ref))
	if err != nil {
		return err
	}
	if e == nil {
		e = &refEntry{}
	}
	if e.Gone {
		return nil
	}
	e.Gone = true
	return boltjson.Put(refs, []byte(ref), e)
}

// freshRef is a ref no entry of refs has ever held.
func (r *Registry) freshRef(refs *bolt.Bucket) (string, error) {
	for range 8 {
		ref, err := newSnapshotRef(r.random())
		if err != nil {
			return "", err
		}
		if refs.Get([]byte(ref)) == nil {
			return ref, nil
		}
	}
	return "", fmt.Errorf("registry: no unused snapshot ref in 8 draws: is the random source broken?")
}

// refAlphabet is what a ref's 24 characters are drawn from.
const refAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// newSnapshotRef draws a ref from rnd: each character uniform over
// refAlphabet (bytes of 252 and above are drawn again, 252 being 7 × 36).
func newSnapshotRef(rnd io.Reader) (string, error) {
	out := make([]byte, 0, len(api.SnapshotRefPrefix)+api.SnapshotRefLen)
	out = append(out, api.SnapshotRefPrefix...)
	var buf [32]byte
	for len(out) < cap(out) {
		if _, err := io.ReadFull(rnd, buf[:]); err != nil {
			return "", fmt.Errorf("registry: snapshot ref: %w", err)
		}
		for _, b := range buf {
			if b < 252 && len(out) < cap(out) {
				out = append(out, refAlphabet[b%36])
			}
		}
	}
	return string(out), nil
}

// reindexTx makes the indexes agree with the records: the names index
// rebuilt from them (a name two records claim, which no write allows,
// goes to the older), a ref given to each snapshot without one (recorded
// before refs existed), every snapshot's ref pointing at it, and every
// other entry gone.
func (r *Registry) reindexTx(tx *bolt.Tx) error {
	if err := tx.DeleteBucket(bucketNames); err != nil && tx.Bucket(bucketNames) != nil {
		return err
	}
	names, err := tx.CreateBucket(bucketNames)
	if err != nil {
		return err
	}
	refs, err := tx.CreateBucketIfNotExists(bucketRefs)
	if err != nil {
		return err
	}
	all := tx.Bucket(bucketSandboxes)
	var records []Sandbox
	if err := boltjson.ForEach(all, func(_ []byte, sb *Sandbox) error {
		records = append(records, *sb)
		return nil
	}); err != nil {
		return err
	}
	sortRecords(records)
	live := map[string]refEntry{}
	for _, sb := range records {
		if key := nameKey(&sb); key != "" && names.Get([]byte(key)) == nil {
			if err := names.Put([]byte(key), []byte(sb.ID)); err != nil {
				return err
			}
		}
		changed := false
		for i := range sb.Snapshots {
			sn := &sb.Snapshots[i]
			if sn.Ref == "" {
				if sn.Ref, err = r.freshRef(refs); err != nil {
					return err
				}
				// Taken at once, so that the next draw cannot give it too.
				if err := boltjson.Put(refs, []byte(sn.Ref), refEntry{Sandbox: sb.ID, Snapshot: sn.ID}); err != nil {
					return err
				}
				changed = true
			}
			live[sn.Ref] = refEntry{Sandbox: sb.ID, Snapshot: sn.ID}
		}
		if changed {
			if err := boltjson.Put(all, []byte(sb.ID), sb); err != nil {
				return err
			}
		}
	}
	type fix struct {
		ref string
		e   refEntry
	}
	var fixes []fix
	if err := boltjson.ForEach(refs, func(k []byte, e *refEntry) error {
		ref := string(k)
		want, ok := live[ref]
		delete(live, ref)
		switch {
		case ok && *e != want:
			fixes = append(fixes, fix{ref, want})
		case !ok && !e.Gone:
			gone := *e
			gone.Gone = true
			fixes = append(fixes, fix{ref, gone})
		}
		return nil
	}); err != nil {
		return err
	}
	for ref, e := range live {
		fixes = append(fixes, fix{ref, e})
	}
	for _, f := range fixes {
		if err := boltjson.Put(refs, []byte(f.ref), f.e); err != nil {
			return err
		}
	}
	return nil
}

// resolveSandbox finds the sandbox of account that seg names: the
// account's sandbox whose id is seg, else the account's sandbox (not
// destroyed) named seg. found is false when neither is: seg names
// nothing of the account's (another account's sandbox is as unknown as
// one that does not exist).
func (r *Registry) resolveSandbox(ctx context.Context, account, seg string) (sb Sandbox, found bool, err error) {
	if err := ctx.Err(); err != nil {
		return Sandbox{}, false, err
	}
	if seg == "" || account == "" || len(seg) > 255 {
		return Sandbox{}, false, nil
	}
	err = r.db.View(func(tx *bolt.Tx) error {
		all := tx.Bucket(bucketSandboxes)
		if api.ValidSandboxID(seg) {
			rec, err := boltjson.Get[Sandbox](all, []byte(seg))
			if err != nil {
				return err
			}
			if rec != nil && rec.Account == account {
				sb, found = *rec, true
				return nil
			}
		}
		id := tx.Bucket(bucketNames).Get([]byte(account + "\x00" + seg))
		if id == nil {
			return nil
		}
		rec, err := boltjson.Get[Sandbox](all, id)
		if err != nil {
			return err
		}
		if rec != nil && rec.Account == account && rec.Name == seg {
			sb, found = *rec, true
		}
		return nil
	})
	return sb, found, err
}

// snapshotByRef is where ref points: the sandbox and the snapshot's id,
// or found false when no snapshot has it (any more).
func (r *Registry) snapshotByRef(ctx context.Context, ref string) (e refEntry, found bool, err error) {
	if err := ctx.Err(); err != nil {
		return refEntry{}, false, err
	}
	if !api.ValidSnapshotRef(ref) {
		return refEntry{}, false, nil
	}
	err = r.db.View(func(tx *bolt.Tx) error {
		got, err := boltjson.Get[refEntry](tx.Bucket(bucketRefs), []byte(ref))
		if got != nil && !got.Gone {
			e, found = *got, true
		}
		return err
	})
	return e, found, err
}
