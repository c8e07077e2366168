package boltjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"
)

// Put stores v, encoded as JSON, at key.
func Put(b *bolt.Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("boltjson: encode record %s: %w", showKey(key), err)
	}
	return b.Put(key, data)
}

// Get decodes the record at key. It returns nil and no error when there is
// none.
func Get[T any](b *bolt.Bucket, key []byte) (*T, error) {
	data := b.Get(key)
	if data == nil {
		return nil, nil
	}
	return decode[T](key, data)
}

// ForEach calls fn with every record of b in key order, and stops at the
// first error fn or decoding returns. b must not change during the walk
// (bbolt's rule for Bucket.ForEach).
func ForEach[T any](b *bolt.Bucket, fn func(k []byte, v *T) error) error {
	return b.ForEach(func(k, data []byte) error {
		if data == nil {
			return nil // a nested bucket, not a record
		}
		v, err := decode[T](k, data)
		if err != nil {
			return err
		}
		return fn(k, v)
	})
}

// ForEachPrefix is ForEach over the records whose key starts with prefix.
func ForEachPrefix[T any](b *bolt.Bucket, prefix []byte, fn func(k []byte, v *T) error) error {
	c := b.Cursor()
	for k, data := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, data = c.Next() {
		if data == nil {
			continue // a nested bucket, not a record
		}
		v, err := decode[T](k, data)
		if err != nil {
			return err
		}
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}

func decode[T any](key, data []byte) (*T, error) {
	v := new(T)
	if err := json.Unmarshal(data, v); err != nil {
		return nil, fmt.Errorf("boltjson: decode record %s: %w", showKey(key), err)
	}
	return v, nil
}

// showKey prints a key for an error: quoted when it is printable text (an
// id, a hash), hexadecimal otherwise (big-endian integers).
func showKey(k []byte) string {
	if utf8.Valid(k) && !bytes.ContainsFunc(k, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return strconv.Quote(string(k))
	}
	return fmt.Sprintf("%x", k)
}
