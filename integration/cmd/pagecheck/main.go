// Command pagecheck is the guest program of the live-snapshot suite
// (integration/vm_live_test.go): copied into a sandbox and started there,
// it holds MiB mebibytes of memory in which every page carries a pattern
// derived from its index and its generation, rewrites random pages
// (1024 whole pages, 4 MiB, a tenth of a second) so that a live save
// always has dirty pages to copy again, and every two seconds checks
// every page against the generations it keeps in a table. A page that a
// save missed, or that a load put back from another moment than its
// neighbours, fails the check.
//
//	pagecheck MiB STATUS
//
// It writes "sweeps=N pages=P errors=E writes=W" to STATUS (a file in
// guest memory, /dev/shm) after each check, with the first bad page when
// there is one. It is a test's tool: it is built by the test and never
// shipped.
package main

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"
)

const (
	pageSize = 4096
	words    = pageSize / 8
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: pagecheck MiB STATUS")
		os.Exit(2)
	}
	mib, err := strconv.Atoi(os.Args[1])
	if err != nil || mib < 1 {
		fmt.Fprintln(os.Stderr, "MiB: a positive number")
		os.Exit(2)
	}
	status := os.Args[2]
	pages := mib << 20 / pageSize
	mem := make([]byte, pages*pageSize)
	gens := make([]uint32, pages)
	for p := range pages {
		fill(mem, p, 0)
	}
	var sweeps, errors, writes int64
	first := ""
	lastCheck := time.Now()
	for {
		// 4 MiB of pages rewritten every tenth of a second.
		for range 1024 {
			p := rand.IntN(pages)
			gens[p]++
			fill(mem, p, gens[p])
			writes++
		}
		time.Sleep(100 * time.Millisecond)
		if time.Since(lastCheck) < 2*time.Second {
			continue
		}
		for p := range pages {
			if !check(mem, p, gens[p]) {
				errors++
				if first == "" {
					first = fmt.Sprintf(" first=page:%d,gen:%d,found:%#x", p, gens[p], binary.LittleEndian.Uint64(mem[p*pageSize:]))
				}
			}
		}
		sweeps++
		lastCheck = time.Now()
		line := fmt.Sprintf("sweeps=%d pages=%d errors=%d writes=%d%s\n", sweeps, pages, errors, writes, first)
		// Rename, so that a reader never sees a half-written line.
		if err := os.WriteFile(status+".new", []byte(line), 0o644); err == nil {
			os.Rename(status+".new", status)
		}
	}
}

// word is the pattern of word w of page p at generation g.
func word(p int, g uint32, w int) uint64 {
	return (uint64(p)<<32 | uint64(g)) ^ uint64(w)*0x9E3779B97F4A7C15
}

func fill(mem []byte, p int, g uint32) {
	b := mem[p*pageSize : (p+1)*pageSize]
	for w := range words {
		binary.LittleEndian.PutUint64(b[w*8:], word(p, g, w))
	}
}

func check(mem []byte, p int, g uint32) bool {
	b := mem[p*pageSize : (p+1)*pageSize]
	for w := range words {
		if binary.LittleEndian.Uint64(b[w*8:]) != word(p, g, w) {
			return false
		}
	}
	return true
}
