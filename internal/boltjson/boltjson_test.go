package boltjson

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

type record struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

var bucket = []byte("records")

// openDB returns a bbolt file in t.TempDir() whose bucket "records" holds
// raw: each value is stored as is, so a test can plant corrupt records.
func openDB(t *testing.T, raw map[string]string) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "test.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bucket)
		if err != nil {
			return err
		}
		for k, v := range raw {
			if err := b.Put([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func view(t *testing.T, db *bolt.DB, fn func(b *bolt.Bucket) error) error {
	t.Helper()
	return db.View(func(tx *bolt.Tx) error { return fn(tx.Bucket(bucket)) })
}

func TestPutGet(t *testing.T) {
	tests := []struct {
		name    string
		raw     map[string]string
		key     string
		want    *record
		wantErr string // substring of the error; "" for none
	}{
		{name: "present", raw: map[string]string{"a": `{"name":"x","n":1}`}, key: "a", want: &record{Name: "x", N: 1}},
		{name: "absent", raw: map[string]string{"a": `{"name":"x"}`}, key: "b", want: nil},
		{name: "unknown fields are ignored", raw: map[string]string{"a": `{"name":"x","old":true}`}, key: "a", want: &record{Name: "x"}},
		{name: "corrupt record names its key", raw: map[string]string{"a": `{"name":`}, key: "a", wantErr: `boltjson: decode record "a"`},
		{name: "binary key is shown in hex", raw: map[string]string{"\x00\x00\x00\x07": `[`}, key: "\x00\x00\x00\x07", wantErr: "decode record 00000007"},
		{name: "empty value is corrupt", raw: map[string]string{"a": ``}, key: "a", wantErr: `decode record "a"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			db := openDB(t, tc.raw)
			var got *record
			err := view(t, db, func(b *bolt.Bucket) (err error) {
				got, err = Get[record](b, []byte(tc.key))
				return err
			})
			if tc.wantErr != "" {
				var syntax *json.SyntaxError
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, &syntax) {
					t.Fatalf("Get = %v, %v; want an error containing %q that wraps *json.SyntaxError", got, err, tc.wantErr)
				}
				if got != nil {
					t.Errorf("Get returned %+v with its error, want nil", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("Get = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestPut(t *testing.T) {
	tests := []struct {
		name    string
		v       any
		want    string // the stored bytes
		wantErr string
	}{
		{name: "struct", v: record{Name: "x", N: 2}, want: `{"name":"x","n":2}`},
		{name: "pointer", v: &record{Name: "y"}, want: `{"name":"y","n":0}`},
		{name: "unencodable value stores nothing", v: map[string]any{"f": func() {}}, wantErr: `boltjson: encode record "k"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			db := openDB(t, nil)
			err := db.Update(func(tx *bolt.Tx) error { return Put(tx.Bucket(bucket), []byte("k"), tc.v) })
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Put = %v, want an error containing %q", err, tc.wantErr)
			}
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			view(t, db, func(b *bolt.Bucket) error {
				if got := b.Get([]byte("k")); string(got) != tc.want || (tc.want == "" && got != nil) {
					t.Errorf("stored %q, want %q", got, tc.want)
				}
				return nil
			})
		})
	}
}

// TestPutReadOnly checks that bbolt's own errors come back unwrapped.
func TestPutReadOnly(t *testing.T) {
	db := openDB(t, nil)
	err := view(t, db, func(b *bolt.Bucket) error { return Put(b, []byte("k"), record{}) })
	if !errors.Is(err, berrors.ErrTxNotWritable) {
		t.Fatalf("Put in a read-only transaction = %v, want ErrTxNotWritable", err)
	}
}

var errStop = errors.New("stop")

func TestForEach(t *testing.T) {
	raw := map[string]string{
		"a1": `{"name":"a1"}`,
		"a2": `{"name":"a2"}`,
		"b1": `{"name":"b1"}`,
		"c1": `{"name":"c1"}`,
	}
	corrupt := map[string]string{"a1": `{"name":"a1"}`, "a2": `nope`, "a3": `{"name":"a3"}`}
	tests := []struct {
		name    string
		raw     map[string]string
		prefix  *string // nil: ForEach; else ForEachPrefix
		stopAt  string  // fn returns errStop at this key
		want    []string
		wantErr string // "stop" for errStop, else a substring
	}{
		{name: "all in key order", raw: raw, want: []string{"a1", "a2", "b1", "c1"}},
		{name: "empty bucket", raw: nil, want: nil},
		{name: "fn's error stops the walk", raw: raw, stopAt: "a2", want: []string{"a1", "a2"}, wantErr: "stop"},
		{name: "corrupt record stops the walk", raw: corrupt, want: []string{"a1"}, wantErr: `decode record "a2"`},
		{name: "prefix", raw: raw, prefix: ptr("a"), want: []string{"a1", "a2"}},
		{name: "prefix between keys", raw: raw, prefix: ptr("b"), want: []string{"b1"}},
		{name: "prefix matching nothing", raw: raw, prefix: ptr("bz"), want: nil},
		{name: "prefix past the last key", raw: raw, prefix: ptr("z"), want: nil},
		{name: "empty prefix is every record", raw: raw, prefix: ptr(""), want: []string{"a1", "a2", "b1", "c1"}},
		{name: "prefix: fn's error stops the walk", raw: raw, prefix: ptr("a"), stopAt: "a1", want: []string{"a1"}, wantErr: "stop"},
		{name: "prefix: corrupt record stops the walk", raw: corrupt, prefix: ptr("a"), want: []string{"a1"}, wantErr: `decode record "a2"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			db := openDB(t, tc.raw)
			var got []string
			var kept []*record
			fn := func(k []byte, v *record) error {
				if v.Name != string(k) {
					t.Errorf("key %q has record %+v", k, v)
				}
				got = append(got, string(k))
				kept = append(kept, v)
				if string(k) == tc.stopAt {
					return errStop
				}
				return nil
			}
			err := view(t, db, func(b *bolt.Bucket) error {
				if tc.prefix == nil {
					return ForEach(b, fn)
				}
				return ForEachPrefix(b, []byte(*tc.prefix), fn)
			})
			switch {
			case tc.wantErr == "stop":
				if err != errStop {
					t.Errorf("error = %v, want fn's own error unwrapped", err)
				}
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error = %v, want one containing %q", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("visited %q, want %q", got, tc.want)
			}
			// Values are fresh: those kept past the walk still say who they are.
			for i, v := range kept {
				if v.Name != got[i] {
					t.Errorf("kept value %d = %+v, want name %q", i, v, got[i])
				}
			}
		})
	}
}

// TestForEachSkipsNestedBuckets pins that a nested bucket (a nil value to
// bbolt) is not handed to fn as a record, nor reported as a corrupt one.
func TestForEachSkipsNestedBuckets(t *testing.T) {
	db := openDB(t, map[string]string{"a": `{"name":"a"}`, "c": `{"name":"c"}`})
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.Bucket(bucket).CreateBucket([]byte("b"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []*string{nil, ptr("")} {
		var got []string
		err := view(t, db, func(b *bolt.Bucket) error {
			fn := func(k []byte, _ *record) error { got = append(got, string(k)); return nil }
			if prefix == nil {
				return ForEach(b, fn)
			}
			return ForEachPrefix(b, []byte(*prefix), fn)
		})
		if err != nil || !slices.Equal(got, []string{"a", "c"}) {
			t.Errorf("prefix %v: visited %q, %v; want [a c], nil", prefix, got, err)
		}
	}
	view(t, db, func(b *bolt.Bucket) error {
		if v, err := Get[record](b, []byte("b")); v != nil || err != nil {
			t.Errorf("Get of a nested bucket = %+v, %v; want nil, nil", v, err)
		}
		return nil
	})
}

func ptr(s string) *string { return &s }

// FuzzShowKey checks that the key an error shows can be read back to the
// key's exact bytes: as a Go string when quoted, as hex otherwise.
func FuzzShowKey(f *testing.F) {
	for _, k := range []string{"", "sb-a1", "\x00\x00\x00\x00\x00\x00\x00\x07", "a\nb", "\xff", "é", "\u202e"} {
		f.Add([]byte(k))
	}
	f.Fuzz(func(t *testing.T, k []byte) {
		s := showKey(k)
		var back []byte
		if strings.HasPrefix(s, `"`) {
			u, err := strconv.Unquote(s)
			if err != nil {
				t.Fatalf("showKey(%q) = %s: %v", k, s, err)
			}
			back = []byte(u)
		} else {
			var err error
			if back, err = hex.DecodeString(s); err != nil {
				t.Fatalf("showKey(%q) = %s: %v", k, s, err)
			}
		}
		if string(back) != string(k) {
			t.Fatalf("showKey(%q) = %s reads back as %q", k, s, back)
		}
	})
}
