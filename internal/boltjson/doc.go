// Package boltjson stores records as JSON values in bbolt buckets: Put
// encodes one, Get decodes the one at a key, ForEach and ForEachPrefix
// decode every one in key order. It is the one place strata's bbolt files
// (hostproxy's registry, the layer store's meta.db) turn records into bytes
// and back.
//
// It does not open files, create buckets or manage transactions: every
// function takes a *bolt.Bucket of a transaction the caller holds, so
// several records change in one transaction or not at all. A nil bucket is
// the caller's bug and panics, as in bbolt. Deleting a record is the
// bucket's own Delete.
//
// A value that does not decode is an error that names the key and wraps
// the json error; the caller decides whether that is corruption to report
// or a record to skip. Keys and values passed to callbacks are valid only
// for the life of the transaction, as everywhere in bbolt: copy a key to
// keep it. Decoded values are fresh and may be kept.
package boltjson
