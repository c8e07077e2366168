package meta

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"strata/internal/fault"
)

// open returns a fresh database; no root needed.
func open(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := Open(filepath.Join(t.TempDir(), "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func update(t *testing.T, db *bolt.DB, fn func(Tx) error) {
	t.Helper()
	if err := db.Update(func(btx *bolt.Tx) error { return fn(Tx{btx}) }); err != nil {
		t.Fatal(err)
	}
}

// chain stores root 100 with a linear chain of sealed layers 1..n (1 the
// base) and an active layer n+1 on top.
func chain(t *testing.T, db *bolt.DB, n int) {
	t.Helper()
	update(t, db, func(tx Tx) error {
		for i := 1; i <= n+1; i++ {
			l := &Layer{ID: uint64(i), Root: 100, Parent: uint64(i - 1), Sealed: i <= n}
			if err := tx.PutLayer(l); err != nil {
				return err
			}
		}
		return tx.PutRoot(&Root{ID: 100, Path: "/w/p", State: RootReady, Active: uint64(n + 1)})
	})
}

func TestDecomposeUsesTheLargestSpan(t *testing.T) {
	db := open(t)
	chain(t, db, 6)
	update(t, db, func(tx Tx) error {
		// Span 50 covers 5..3, span 51 covers 5..4: the larger one wins.
		if err := tx.PutSpan(&Span{ID: 50, Root: 100, Top: 5, Bottom: 3, Count: 3}); err != nil {
			return err
		}
		if err := tx.PutSpan(&Span{ID: 51, Root: 100, Top: 5, Bottom: 4, Count: 2}); err != nil {
			return err
		}
		segs, err := tx.Decompose(6)
		if err != nil {
			return err
		}
		var dirs []uint64
		for _, s := range segs {
			dirs = append(dirs, s.Dir)
		}
		if want := []uint64{6, 50, 2, 1}; !slices.Equal(dirs, want) {
			t.Fatalf("segments %v, want %v", dirs, want)
		}
		if !segs[3].Base || segs[2].Base {
			t.Fatalf("base flags %+v", segs)
		}
		return nil
	})
}

func TestNextMerge(t *testing.T) {
	seg := func(count int, base bool) Segment { return Segment{Count: count, Base: base} }
	for _, tc := range []struct {
		name string
		segs []Segment
		want int
	}{
		{"equal pair on top", []Segment{seg(1, false), seg(1, false), seg(1, true)}, 0},
		{"strictly growing downwards", []Segment{seg(1, false), seg(2, false), seg(1, true)}, -1},
		{"never the base", []Segment{seg(1, false), seg(1, true)}, -1},
		{"lower pair", []Segment{seg(1, false), seg(4, false), seg(2, false), seg(1, true)}, 1},
		{"empty", nil, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NextMerge(tc.segs); got != tc.want {
				t.Fatalf("NextMerge = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestSquashCandidatesAndSweep(t *testing.T) {
	db := open(t)
	chain(t, db, 4) // 1 base, 2 3 4 sealed, 5 active
	update(t, db, func(tx Tx) error {
		seq, err := tx.NextCheckpointSeq()
		if err != nil {
			return err
		}
		// Only layer 3 is named: 1 (only child 2) and 2 (only child 3)
		// are squashable; 4 is not (its only child 5 is active).
		if err := tx.PutCheckpoint(&Checkpoint{ID: "cp_a", Seq: seq, Root: 100, Layer: 3}); err != nil {
			return err
		}
		pairs, err := tx.SquashCandidates(100)
		if err != nil {
			return err
		}
		if want := []SquashPair{{Upper: 2, Lower: 1}, {Upper: 3, Lower: 2}}; !slices.Equal(pairs, want) {
			t.Fatalf("squash candidates %v, want %v", pairs, want)
		}
		// A branch nothing needs: layer 9 on 3.
		if err := tx.PutLayer(&Layer{ID: 9, Root: 100, Parent: 3, Sealed: true}); err != nil {
			return err
		}
		if err := tx.Sweep(); err != nil {
			return err
		}
		ls, err := tx.Layers()
		if err != nil {
			return err
		}
		var ids []uint64
		for id := range ls {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		if want := []uint64{1, 2, 3, 4, 5}; !slices.Equal(ids, want) {
			t.Fatalf("after sweep %v, want %v", ids, want)
		}
		return nil
	})
}

func TestChainOfAMissingLayerIsInconsistent(t *testing.T) {
	db := open(t)
	update(t, db, func(tx Tx) error {
		if err := tx.PutLayer(&Layer{ID: 2, Root: 100, Parent: 1}); err != nil {
			return err
		}
		if _, err := tx.Chain(2); !errors.Is(err, ErrInconsistent) {
			t.Fatalf("Chain over a missing parent: %v", err)
		}
		return nil
	})
}

func TestIdempotency(t *testing.T) {
	db := open(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	req := Request{Key: "k", Body: "create\x00/w/p\x00"}
	ans := Answer{ID: "cp_x", Path: "/w/p", CreatedAt: now}
	update(t, db, func(tx Tx) error {
		if a, err := tx.Replay(req, now); err != nil || a != nil {
			t.Fatalf("replay of an unknown key: %v, %v", a, err)
		}
		if err := tx.Record(req, ans, now); err != nil {
			return err
		}
		a, err := tx.Replay(req, now.Add(time.Hour))
		if err != nil || a == nil || *a != ans {
			t.Fatalf("replay: %+v, %v; want %+v", a, err, ans)
		}
		_, err = tx.Replay(Request{Key: "k", Body: "restore\x00cp_y"}, now)
		if fault.CodeOf(err) != "idempotency_key_reused" {
			t.Fatalf("another request under the key: %v", err)
		}
		if err := tx.Record(Request{Key: "k", Body: "other"}, ans, now); fault.CodeOf(err) != "idempotency_key_reused" {
			t.Fatalf("recording another request under the key: %v", err)
		}
		if a, err := tx.Replay(req, now.Add(IdempotencyTTL+time.Second)); err != nil || a != nil {
			t.Fatalf("an expired answer is replayed: %v, %v", a, err)
		}
		// Recording prunes expired answers.
		if err := tx.Record(Request{Key: "k2", Body: "b"}, ans, now.Add(IdempotencyTTL+time.Second)); err != nil {
			return err
		}
		if r, err := tx.Idempotency("k"); err != nil || r != nil {
			t.Fatalf("expired answer kept: %+v, %v", r, err)
		}
		return nil
	})
}

func TestStoreIDIsStable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meta.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := StoreID(db)
	if err != nil || len(a) != 16 {
		t.Fatalf("StoreID %q, %v", a, err)
	}
	db.Close()
	db, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if b, _ := StoreID(db); b != a {
		t.Fatalf("store id changed across opens: %q then %q", a, b)
	}
}
