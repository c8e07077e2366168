package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// bootID is the host's boot id: a snapshot marked with it is not yet on
// disk, which after a reboot (another id) means it may be torn.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return string(bytes.TrimSpace(b))
}

// syncLater writes a ready snapshot's files to disk in the background
// and then clears its mark.
func (m *Manager) syncLater(id string, s Snapshot) {
	if s.Unsynced == "" {
		return
	}
	m.syncs.Add(1)
	started := m.goAfter(func() {
		defer m.syncs.Done()
		if err := m.syncSnapshot(id, s); err != nil {
			m.log.Error("snapshot not written to disk", "sandbox", id, "snapshot", s.ID, "err", err)
		}
	})
	if !started {
		m.syncs.Done() // the next Recover writes it back
	}
}

// durable writes a ready snapshot's files to disk now unless they are
// already (its mark is clear): a fork or a restore never loads a state
// that a power cut could still tear. A sync in the background at the
// same time does the same harmlessly.
func (m *Manager) durable(id string, s Snapshot) error {
	if s.Unsynced == "" {
		return nil
	}
	if err := m.syncSnapshot(id, s); err != nil {
		return fmt.Errorf("snapshot %s of %s not written to disk: %w", s.ID, id, err)
	}
	return nil
}

// syncSnapshot writes a snapshot's files (its frozen top and its state)
// and the store's directory to disk, then clears the snapshot's mark.
func (m *Manager) syncSnapshot(id string, s Snapshot) error {
	var files []string
	if len(s.Disk) > 0 {
		files = append(files, m.layerPath(s.Disk[0]))
	}
	if s.State != "" {
		files = append(files, m.statePath(s.State))
	}
	t0 := time.Now()
	for _, f := range files {
		if err := syncFile(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := syncDir(m.storeDir()); err != nil {
		return err
	}
	_, err := m.cfg.Records.Update(context.Background(), id, func(rec *Record) error {
		if sn, ok := rec.Snapshot(s.ID); ok {
			sn.Unsynced = ""
		}
		return nil
	})
	m.log.Debug("snapshot on disk", "sandbox", id, "snapshot", s.ID, "took", time.Since(t0).Round(time.Millisecond))
	return err
}

// Synced waits until the snapshots taken so far are on disk (their files
// written back, their records unmarked).
func (m *Manager) Synced() { m.syncs.Wait() }
