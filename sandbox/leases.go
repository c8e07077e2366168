package sandbox

import (
	"maps"
	"slices"
	"sync"
)

// Leases: what work under way holds of the host, in one table.
//
// Each piece of in-flight work that holds something the host has (memory
// a boot was admitted with, the growth its disk was admitted with, a
// store file made and not yet named, a snapshot a restore is loading, a
// compaction's work file, the memory of a restore's old machine writing
// auto-N) takes a lease of that kind, keyed by what it holds, and gives
// it back when the work ends. Admission sums leases, collection keeps
// the files leased, a delete refuses a snapshot leased: nothing else
// keeps such state beside the records.
//
// A lease lives as long as the process: after a crash nothing is held,
// and what recovery needs of the work is in the records (the work is
// recorded before it begins: DESIGN's crash model), so Recover finds it
// there and takes its leases again or ends it:
//
//	kind         held by                         after a crash
//	memory       a boot, a template QEMU         Recover boots the sandbox again (bootAs), which takes it again
//	disk         a boot (create, fork, start)    the same
//	laterSave    a restore's old machine         the QEMU no record names is killed; auto-N is kept disk-only (keepDisk)
//	file         a store file made, not yet      the file no record names is collected
//	             named in a record
//	work         a compaction's work file        the same
//	inUse        a snapshot a restore loads      the restore is finished or undone from its record
//
// uids and groups are not leased: a uid is free only once no record
// names it and no live process holds it (uids.go), which survives a
// crash by itself.
type leases struct {
	mu   sync.Mutex
	held [leaseKinds]map[string]lease
}

// leaseKind is what a lease holds.
type leaseKind int

const (
	leaseMemory    leaseKind = iota // MiB of guest memory, by sandbox (or template key)
	leaseDisk                       // bytes a disk may still grow by, by sandbox
	leaseLaterSave                  // MiB of a restore's old machine, by key
	leaseFile                       // a store file, by name
	leaseWork                       // a compaction's work file, by path
	leaseInUse                      // a snapshot, "sandbox/snapshot"
	leaseKinds
)

// lease is one key's hold: how many hold it, and the amount (the last
// set's: memory and disk have one holder per key).
type lease struct {
	count  int
	amount int64
}

// set makes key's lease of kind amount (one holder; a set replaces it).
func (l *leases) set(kind leaseKind, key string, amount int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[kind] == nil {
		l.held[kind] = map[string]lease{}
	}
	l.held[kind][key] = lease{count: 1, amount: amount}
}

// take adds a holder to key's lease of kind until release.
func (l *leases) take(kind leaseKind, key string) (release func()) {
	l.mu.Lock()
	if l.held[kind] == nil {
		l.held[kind] = map[string]lease{}
	}
	h := l.held[kind][key]
	h.count++
	l.held[kind][key] = h
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if h := l.held[kind][key]; h.count <= 1 {
				delete(l.held[kind], key)
			} else {
				h.count--
				l.held[kind][key] = h
			}
		})
	}
}

// end ends key's lease of kind, whoever holds it.
func (l *leases) end(kind leaseKind, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held[kind], key)
}

// has tells whether key holds a lease of kind.
func (l *leases) has(kind leaseKind, key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.held[kind][key]
	return ok
}

// amounts are the leases of kind now: key → amount.
func (l *leases) amounts(kind leaseKind) map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int64, len(l.held[kind]))
	for k, h := range l.held[kind] {
		out[k] = h.amount
	}
	return out
}

// keys are the keys holding a lease of kind, sorted.
func (l *leases) keys(kind leaseKind) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.held[kind]))
}
