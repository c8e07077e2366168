package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
)

// The uids and gids live processes hold. A sandbox's uid (and a
// template's group) is free for a new sandbox only once no process holds
// it: a record gone is not enough, since a QEMU may outlive its record
// (a restore's old machine writing auto-N's memory for up to
// SnapshotTimeout after its sandbox was deleted; a template QEMU; a QEMU
// a crash left until Recover kills it), and a new sandbox with the same
// uid could ptrace it or read its memory through /proc/PID/mem.

// processIDs are the uids and gids (real, effective, saved, filesystem, and
// supplementary groups) of every process under proc ("/proc").
type processIDs struct {
	uids, gids map[uint32]bool
}

// liveProcessIDs reads processIDs from proc. A process that ends while it is
// read is skipped: what it held is free.
func liveProcessIDs(proc string) processIDs {
	h := processIDs{uids: map[uint32]bool{}, gids: map[uint32]bool{}}
	entries, _ := os.ReadDir(proc)
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(proc, e.Name(), "status"))
		if err != nil {
			continue
		}
		parseStatusIDs(b, h)
	}
	return h
}

// parseStatusIDs adds the ids of one /proc/PID/status to h: its Uid and
// Gid lines (four ids each) and its Groups line. Anything else, and any
// field that is not a number, is ignored.
func parseStatusIDs(status []byte, h processIDs) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		key, rest, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok {
			continue
		}
		var into map[uint32]bool
		switch string(key) {
		case "Uid":
			into = h.uids
		case "Gid", "Groups":
			into = h.gids
		default:
			continue
		}
		for _, f := range bytes.Fields(rest) {
			if n, err := strconv.ParseUint(string(f), 10, 32); err == nil {
				into[uint32(n)] = true
			}
		}
	}
}

// freeUID is the lowest uid of the deployment's range that no record
// names and no live process holds (procids.go).
func (m *Manager) freeUID(ctx context.Context) (uint32, error) {
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return 0, err
	}
	used := liveProcessIDs("/proc").uids
	for _, r := range records {
		if r.Machine != nil {
			used[r.Machine.Uid] = true
		}
	}
	m.mu.Lock()
	for uid := range m.templateUIDs {
		used[uid] = true
	}
	m.mu.Unlock()
	first, end := m.ids.UIDs()
	for uid := first; uid < end; uid++ {
		if !used[uid] {
			return uid, nil
		}
	}
	return 0, ErrHostCapacity.With("uids", m.ids.String())
}
