package sandbox

import (
	"maps"
	"slices"
	"testing"
)

// TestLeases: a set lease has one holder and its amount; a taken one
// counts its holders, and goes with the last release (a release called
// twice counts once); end ends a lease whoever holds it; kinds are apart.
func TestLeases(t *testing.T) {
	var l leases
	l.set(leaseMemory, "sb-1", 256)
	l.set(leaseMemory, "sb-1", 512) // replaced
	l.set(leaseMemory, "sb-2", 128)
	if got := l.amounts(leaseMemory); !maps.Equal(got, map[string]int64{"sb-1": 512, "sb-2": 128}) {
		t.Fatalf("memory leases %v", got)
	}
	if l.has(leaseDisk, "sb-1") {
		t.Fatal("a memory lease counted as a disk lease")
	}
	a := l.take(leaseFile, "f1")
	b := l.take(leaseFile, "f1")
	a()
	a() // once
	if !l.has(leaseFile, "f1") {
		t.Fatal("a file lease ended while a holder is left")
	}
	b()
	if l.has(leaseFile, "f1") || len(l.keys(leaseFile)) != 0 {
		t.Fatalf("a file lease outlived its holders: %v", l.keys(leaseFile))
	}
	l.take(leaseInUse, "sb-1/v1")
	l.take(leaseInUse, "sb-1/v2")
	if got := l.keys(leaseInUse); !slices.Equal(got, []string{"sb-1/v1", "sb-1/v2"}) {
		t.Fatalf("in-use leases %v", got)
	}
	l.end(leaseMemory, "sb-1")
	if got := l.amounts(leaseMemory); !maps.Equal(got, map[string]int64{"sb-2": 128}) {
		t.Fatalf("after end: %v", got)
	}
}
