package hostproxy

import (
	"context"
	"sort"

	bolt "go.etcd.io/bbolt"

	"strata/internal/boltjson"
	"strata/internal/fault"
	"strata/sandbox"
)

var (
	errNameTaken = fault.New(fault.Conflict, "name_taken", "another sandbox of this account has this name")
	errNameIsID  = fault.New(fault.Conflict, "name_taken", "a sandbox has this name as its id: a name must not mean two sandboxes")
)

// The registry keeps the microVM sandboxes' records for package sandbox.
var _ sandbox.Records = (*Registry)(nil)

// Insert adds a new sandbox record; its name must be unique among the
// account's sandboxes that are not destroyed (name_taken).
func (r *Registry) Insert(ctx context.Context, sb Sandbox) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSandboxes)
		if v := b.Get([]byte(sb.ID)); v != nil {
			return fault.New(fault.Conflict, "sandbox_exists", "a sandbox with this id exists")
		}
		if err := insertChecks(ctx, tx, b, sb); err != nil {
			return err
		}
		return r.putSandboxTx(tx, indexed{}, &sb)
	})
}

// Update applies fn to the sandbox's record in one transaction; an error
// from fn changes nothing.
func (r *Registry) Update(ctx context.Context, id string, fn func(*Sandbox) error) (Sandbox, error) {
	return r.update(ctx, id, fn, false)
}

// Take applies fn to a pooled sandbox's record, which gives it to an
// account, checking in the same transaction what Insert checks: the name
// unique among the account's sandboxes, and the create's claim of its
// Idempotency-Key. The record gets the access setting, env and labels the
// create or fork gives (withTaken), which fn, package sandbox's, does not
// copy.
func (r *Registry) Take(ctx context.Context, id string, fn func(*Sandbox) error) (Sandbox, error) {
	return r.update(ctx, id, fn, true)
}

// update is Update, and Take when inserted is set.
func (r *Registry) update(ctx context.Context, id string, fn func(*Sandbox) error, inserted bool) (Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return Sandbox{}, err
	}
	var out Sandbox
	err := r.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSandboxes)
		sb, err := boltjson.Get[Sandbox](b, []byte(id))
		if err != nil {
			return err
		}
		if sb == nil {
			return errSandboxNotFound
		}
		before := indexedOf(sb)
		if err := fn(sb); err != nil {
			return err
		}
		if t, ok := ctx.Value(takeKey{}).(taken); ok && inserted {
			sb.Access, sb.Env, sb.Labels, sb.Network = t.access, t.env, t.labels, t.network
		}
		if inserted {
			if err := insertChecks(ctx, tx, b, *sb); err != nil {
				return err
			}
		}
		if err := r.putSandboxTx(tx, before, sb); err != nil {
			return err
		}
		out = *sb
		return nil
	})
	return out, err
}

// insertChecks are the checks of a record that comes to an account: the
// create's claim (when ctx carries one) and its name: unique among the
// account's other sandboxes that are not destroyed (the names index,
// which putSandboxTx checks again as it writes), and not the id of
// another sandbox (a configured one's: the API's ids start with "sb-",
// which no name may), so that a name and an id never mean two sandboxes.
func insertChecks(ctx context.Context, tx *bolt.Tx, b *bolt.Bucket, sb Sandbox) error {
	if c, ok := ctx.Value(createClaimKey{}).(*createClaimReq); ok {
		if err := claimTx(tx, c, sb.ID); err != nil {
			return err
		}
	}
	key := nameKey(&sb)
	if key == "" {
		return nil
	}
	if sb.Name != sb.ID && b.Get([]byte(sb.Name)) != nil {
		return errNameIsID.With("name", sb.Name)
	}
	if v := tx.Bucket(bucketNames).Get([]byte(key)); v != nil && string(v) != sb.ID {
		return errNameTaken.With("name", sb.Name)
	}
	return nil
}

// Get returns the sandbox id, or sandbox_not_found.
func (r *Registry) Get(ctx context.Context, id string) (Sandbox, error) {
	return r.Sandbox(ctx, id)
}

// List returns every sandbox, oldest first.
func (r *Registry) List(ctx context.Context) ([]Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var all []Sandbox
	err := r.db.View(func(tx *bolt.Tx) error {
		return boltjson.ForEach(tx.Bucket(bucketSandboxes), func(_ []byte, sb *Sandbox) error {
			all = append(all, *sb)
			return nil
		})
	})
	sortRecords(all)
	return all, err
}

// sortRecords orders records oldest first, then by id.
func sortRecords(all []Sandbox) {
	sort.SliceStable(all, func(i, j int) bool {
		if !all[i].CreatedAt.Equal(all[j].CreatedAt) {
			return all[i].CreatedAt.Before(all[j].CreatedAt)
		}
		return all[i].ID < all[j].ID
	})
}

// Delete removes the sandbox's record and its access token.
func (r *Registry) Delete(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.db.Update(func(tx *bolt.Tx) error {
		if err := revokeTx(tx, id); err != nil {
			return err
		}
		sb, err := boltjson.Get[Sandbox](tx.Bucket(bucketSandboxes), []byte(id))
		if err != nil || sb == nil {
			return err
		}
		return deleteSandboxTx(tx, sb)
	})
}
