// Package meta is the layer store's metadata: the records (managed roots,
// layers, checkpoints, spans, lazily detached stacks, idempotency answers)
// in a bbolt database, and the pure queries over them that the engine
// decides with: the chain of a layer, the segments that serve it
// (Decompose, NextMerge: the compaction rule), the squashable pairs, and
// the mark-and-sweep of unneeded layer records (Sweep).
//
// Everything here is a transaction on the database and nothing else: no
// mounts, no layer directories, no root needed to test. Callers hold a
// Tx (a bolt transaction with typed accessors); a read-write transaction
// is the commit point of every operation of package layers.
//
// Records are JSON (internal/boltjson) under big-endian uint64 keys;
// checkpoints are keyed by a sequence number so that a cursor lists them
// oldest first, with indexes by public id and by layer. The schema has a
// version; Open refuses a database of another one.
package meta
