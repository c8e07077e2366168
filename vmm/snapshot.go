package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/failpoint"
)

// FailpointSwitchover is hit in a save once the disk has switched, with
// the guest stopped and its state not yet (all) written.
const FailpointSwitchover = "vm.save.switchover"

// SaveOptions says how Save writes a machine's state.
type SaveOptions struct {
	// Live keeps the guest running while its memory is copied (pre-copy)
	// and stops it only for the last dirty pages and the device state;
	// the guest runs again when Save returns. Without Live the guest is
	// stopped first, and stays stopped unless Resume.
	//
	// Live was not safe under TCG with QEMU 7.2 (a live-copied state
	// crashed its guest once loaded, one restore in ten); QEMU 10, which
	// hostproxy requires, loaded 10 of 10 correctly (VMM.md), and the
	// integration suite checks every page of a known pattern across
	// live saves and loads.
	Live bool
	// Downtime is the pause a live save aims for (QEMU's downtime-limit;
	// DefaultDowntime when zero). Converge bounds the copy while the
	// guest runs (DefaultConverge when zero): a guest that dirties its
	// memory faster than it is copied is then stopped for what is left,
	// as a save without Live would be, and SaveStats.Converged says so.
	Downtime time.Duration
	Converge time.Duration
	// Resume runs a guest that the save stopped again once its state is
	// written (a snapshot of a running sandbox, not a pause).
	Resume bool
	// Overlay, when set, becomes the disk's new top at the instant the
	// guest stops for good (the switch-over): the disk as it was then is
	// the old top, frozen from there on, and the state written matches
	// it exactly. The file must be an empty qcow2 (its backing name is
	// not used).
	Overlay *Layer
}

// SaveStats is what a Save took.
type SaveStats struct {
	// Pause is how long the guest was stopped, when the save let it run
	// again (Live, or Resume), as the host saw it.
	Pause time.Duration
	// Total is the whole save.
	Total time.Duration
	// Switched tells whether Overlay became the disk's top: once it has,
	// it stays so even if the save then fails.
	Switched bool
	// Transferred is what QEMU wrote; Passes is how many times it went
	// over the guest's dirty memory (a live save goes over it again
	// while the guest writes).
	Transferred int64
	Passes      int
	// Format is how the state was written; DirectIO tells whether its
	// pages bypassed the page cache (the filesystem took O_DIRECT).
	Format   StateFormat
	DirectIO bool
	// Converged tells whether a live save ended within its downtime
	// (false: Converge passed and the rest was copied stopped).
	Converged bool
}

// The defaults of a live save: a pause a person at a terminal does not
// notice, and a bound on the copy after which finishing stopped is
// cheaper than copying again.
const (
	DefaultDowntime = 100 * time.Millisecond
	DefaultConverge = 5 * time.Second
)

// maxDowntimeMs is QEMU's largest downtime-limit (2000 s): a live save
// that did not converge ends at its next pass.
const maxDowntimeMs = 2_000_000

// The migration states QEMU reports.
const (
	migCompleted     = "completed"
	migFailed        = "failed"
	migCancelled     = "cancelled"
	migPreSwitchover = "pre-switchover"
)

// Save writes the machine's memory and device state to state (a QEMU
// migration stream), as Load reads it back.
func (m *qemuMachine) Save(ctx context.Context, state *os.File, opts SaveOptions) (SaveStats, error) {
	t0 := time.Now()
	var st SaveStats
	q, err := m.monitor(ctx)
	if err != nil {
		return st, err
	}
	caps := []map[string]any{
		{"capability": "pause-before-switchover", "state": opts.Live},
		// A shared RAM file is the RAM's copy: only devices are saved.
		{"capability": "x-ignore-shared", "state": m.cfg.RAM != nil && m.cfg.RAM.Shared},
		// Never auto-converge: under TCG a save with it on gave a state
		// that crashed its guest once loaded (a page the throttled copy
		// missed). A guest that never lets the copy converge ends the
		// save at the caller's deadline instead.
		{"capability": "auto-converge", "state": false},
	}
	// A whole state is written mapped-ram (state.go); a template's
	// devices alone (its RAM is a shared file) as a classic stream.
	mapped := m.cfg.RAM == nil || !m.cfg.RAM.Shared
	var files []*os.File
	var direct bool
	if mapped {
		if err := state.Truncate(0); err != nil {
			return st, fmt.Errorf("state: %w", err)
		}
		if _, err := state.WriteAt(stateHeader(), 0); err != nil {
			return st, noSpace(fmt.Errorf("state: writing its header: %w", err))
		}
		if files, direct, err = stateFiles(state, true, false); err != nil {
			return st, err
		}
		defer closeAll(files)
		err = mappedRAM(ctx, q, caps, direct)
	} else {
		err = classic(ctx, q, caps)
	}
	if err != nil {
		return st, err
	}
	st.Format, st.DirectIO = FormatStream, false
	if mapped {
		st.Format, st.DirectIO = FormatMappedRAM, direct
	}
	// QEMU's default bandwidth cap (128 MiB/s) is meant for networks; a
	// local file takes whatever the host can write. The downtime limit
	// is the pause a live save aims for.
	downtime, converge := opts.Downtime, opts.Converge
	if downtime <= 0 {
		downtime = DefaultDowntime
	}
	if converge <= 0 {
		converge = DefaultConverge
	}
	if _, err := q.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(64) << 30, "downtime-limit": downtime.Milliseconds()}); err != nil {
		return st, err
	}
	// A guest this save stops runs again if the save fails.
	wasRunning, err := m.Running(ctx)
	if err != nil {
		return st, err
	}
	var added string
	if opts.Overlay != nil {
		if added, err = m.addLayer(ctx, q, *opts.Overlay); err != nil {
			return st, err
		}
	}
	var stopped time.Time
	var oldTop string
	if opts.Live && opts.Overlay != nil {
		if oldTop, err = m.top(ctx); err != nil {
			m.dropLayer(q, added)
			return st, err
		}
	}
	// Whatever happens, the guest runs again if it ran before.
	undo := func(err error) (SaveStats, error) {
		q.cleanup("migrate_cancel", nil)
		if wasRunning {
			q.cleanup("cont", nil)
		}
		if !st.Switched {
			m.dropLayer(q, added)
		}
		st.Total = time.Since(t0)
		return st, noSpace(err)
	}
	if !opts.Live {
		stopped = time.Now()
		if _, err := q.Execute(ctx, "stop", nil); err != nil {
			return undo(err)
		}
		if opts.Overlay != nil {
			switched, err := m.switchTop(ctx, q, *opts.Overlay)
			st.Switched = switched
			if err != nil {
				return undo(err)
			}
			failpoint.Hit(FailpointSwitchover)
		}
	}
	if mapped {
		set, err := addFDSet(ctx, q, stateOpaque, files)
		if err != nil {
			return undo(err)
		}
		// QEMU has its own descriptors of the file once the migration
		// has opened its channels; the set goes with the save.
		defer q.cleanup("remove-fd", map[string]any{"fdset-id": set})
		if _, err := q.Execute(ctx, "migrate", map[string]any{"uri": stateURI(set)}); err != nil {
			return undo(err)
		}
	} else {
		if _, err := q.ExecuteWithFile(ctx, "getfd", map[string]any{"fdname": "snapshot"}, state); err != nil {
			return undo(err)
		}
		if _, err := q.Execute(ctx, "migrate", map[string]any{"uri": "fd:snapshot"}); err != nil {
			q.cleanup("closefd", map[string]any{"fdname": "snapshot"})
			return undo(err)
		}
	}
	fail := undo
	started, lifted := time.Now(), false
	for {
		if opts.Live && stopped.IsZero() && !lifted && time.Since(started) > converge {
			// The copy does not converge: the next pass ends it,
			// whatever is left (QEMU stops the guest for it).
			lifted = true
			if _, err := q.Execute(ctx, "migrate-set-parameters", map[string]any{"downtime-limit": int64(maxDowntimeMs)}); err != nil {
				return fail(err)
			}
			m.log.Info("live save did not converge; finishing it stopped", "machine", m.cfg.Name, "after", time.Since(started).Round(time.Millisecond))
		}
		status, err := migrationStatus(ctx, q)
		if err != nil {
			return fail(err)
		}
		switch status {
		case migPreSwitchover:
			if !stopped.IsZero() {
				break // seen again before QEMU moved on
			}
			// The guest has just stopped, for good: the disk's top
			// changes now, before the device state is written.
			// Only the switch itself is inside the pause: the old
			// top's name was read before, and its writable
			// descriptors leave QEMU once the guest runs again (QEMU
			// reopened it read-only at the switch; the descriptors
			// only wait in their set).
			stopped = time.Now()
			if opts.Overlay != nil {
				if _, err := q.Execute(ctx, "blockdev-snapshot", map[string]any{"node": oldTop, "overlay": opts.Overlay.Node}); err != nil {
					return fail(err)
				}
				st.Switched = true
				failpoint.Hit(FailpointSwitchover)
			}
			if _, err := q.Execute(ctx, "migrate-continue", map[string]any{"state": migPreSwitchover}); err != nil {
				return fail(err)
			}
		case migCompleted:
			st.Transferred, st.Passes = migrationTotals(ctx, q)
			st.Converged = opts.Live && !lifted
			if opts.Live || opts.Resume && wasRunning {
				// After a completed migration the source is stopped
				// with its images inactive; cont takes them back.
				if _, err := q.Execute(ctx, "cont", nil); err != nil {
					return fail(err)
				}
				st.Pause = time.Since(stopped)
			}
			if opts.Live && st.Switched {
				if err := m.dropWritable(ctx, q, *opts.Overlay); err != nil {
					return fail(err)
				}
			}
			st.Total = time.Since(t0)
			return st, nil
		case migFailed, migCancelled:
			return fail(noSpace(fmt.Errorf("qemu of %s: saving its state %s%s", m.cfg.Name, status, migrationError(ctx, q))))
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-m.done:
			return fail(fmt.Errorf("qemu of %s exited while saving its state", m.cfg.Name))
		case <-time.After(time.Millisecond):
		}
	}
}

// CancelSave cancels a migration under way, if any. The guest is left as
// it is: a save that had stopped it leaves it stopped.
func (m *qemuMachine) CancelSave(ctx context.Context) error {
	_, err := m.execute(ctx, "migrate_cancel")
	return err
}

// SwitchDisk makes top, an empty qcow2, the disk's new top layer at once:
// from then on the old top is read-only (a disk-only snapshot). The guest
// keeps running; QEMU drains its requests for the switch.
func (m *qemuMachine) SwitchDisk(ctx context.Context, top Layer) error {
	q, err := m.monitor(ctx)
	if err != nil {
		return err
	}
	added, err := m.addLayer(ctx, q, top)
	if err != nil {
		return err
	}
	if switched, err := m.switchTop(ctx, q, top); err != nil {
		if !switched {
			m.dropLayer(q, added)
		}
		return err
	}
	return nil
}

// Load reads a state written by Save into a machine started with
// Incoming. The machine is left paused: Resume runs it.
func (m *qemuMachine) Load(ctx context.Context, state *os.File) error {
	q, err := m.monitor(ctx)
	if err != nil {
		return err
	}
	// A machine started from a template's RAM (private) has its memory
	// already: the stream carries its devices only. One that makes a
	// template (shared) loads a whole state into the file.
	caps := []map[string]any{{"capability": "x-ignore-shared", "state": m.cfg.RAM != nil && !m.cfg.RAM.Shared}}
	format, err := StateFormatOf(state)
	if err != nil {
		return err
	}
	if format == FormatMappedRAM {
		// A machine that makes a template (its RAM shared) reads the
		// state through the page cache: the machines that map the state
		// next (forks, a resume) then find its pages there, and so do
		// the saves that read their RAM.
		files, direct, err := stateFiles(state, false, m.cfg.RAM != nil && m.cfg.RAM.Shared)
		if err != nil {
			return err
		}
		defer closeAll(files)
		if err := mappedRAM(ctx, q, caps, direct); err != nil {
			return err
		}
		set, err := addFDSet(ctx, q, stateOpaque, files)
		if err != nil {
			return err
		}
		defer q.cleanup("remove-fd", map[string]any{"fdset-id": set})
		if _, err := q.Execute(ctx, "migrate-incoming", map[string]any{"uri": stateURI(set)}); err != nil {
			return err
		}
	} else {
		if err := classic(ctx, q, caps); err != nil {
			return err
		}
		if _, err := q.ExecuteWithFile(ctx, "getfd", map[string]any{"fdname": "incoming"}, state); err != nil {
			return err
		}
		if _, err := q.Execute(ctx, "migrate-incoming", map[string]any{"uri": "fd:incoming"}); err != nil {
			return err
		}
	}
	for {
		status, err := migrationStatus(ctx, q)
		if err != nil {
			return err
		}
		switch status {
		case migCompleted:
			return nil
		case migFailed, migCancelled:
			return noSpace(fmt.Errorf("qemu of %s: loading its state %s%s", m.cfg.Name, status, migrationError(ctx, q)))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.done:
			return fmt.Errorf("qemu of %s exited while loading its state%s", m.cfg.Name, logTail(m.cfg.QEMULog()))
		case <-time.After(time.Millisecond):
		}
	}
}

// top is the node name of the disk's current top layer.
func (m *qemuMachine) top(ctx context.Context) (string, error) {
	ret, err := m.execute(ctx, "query-block")
	if err != nil {
		return "", err
	}
	var devs []struct {
		Qdev     string `json:"qdev"`
		Inserted *struct {
			Node string `json:"node-name"`
		} `json:"inserted"`
	}
	if err := json.Unmarshal(ret, &devs); err != nil {
		return "", fmt.Errorf("query-block: %w", err)
	}
	for _, d := range devs {
		if strings.Contains(d.Qdev, "blk0") && d.Inserted != nil {
			return d.Inserted.Node, nil
		}
	}
	return "", fmt.Errorf("query-block: no disk blk0 in %.300s", ret)
}

// Quit asks QEMU to exit and waits until it has.
func (m *qemuMachine) Quit(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if _, err := m.execute(ctx, "quit"); err != nil && !errors.Is(err, ErrQMPClosed) {
		select {
		case <-m.done:
			return nil
		default:
		}
		return err
	}
	select {
	case <-m.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// addLayer hands QEMU the layer's file (read-write and read-only, in one
// descriptor set) and adds it as a block node with no backing yet.
// It returns the fd set's id.
func (m *qemuMachine) addLayer(ctx context.Context, q *QMP, l Layer) (string, error) {
	if !ValidNode(l.Node) {
		return "", fmt.Errorf("layer node name %q is not valid", l.Node)
	}
	files, err := openDisk([]Layer{l})
	if err != nil {
		return "", err
	}
	defer closeAll(files)
	set, err := addFDSet(ctx, q, l.Node, files) // the node name: StreamDisk's key
	if err != nil {
		return "", err
	}
	_, err = q.Execute(ctx, "blockdev-add", map[string]any{
		"driver": "qcow2", "node-name": l.Node,
		"file":    fileNode(set, false),
		"backing": nil,
	})
	if err != nil {
		q.cleanup("remove-fd", map[string]any{"fdset-id": set})
		return "", err
	}
	return l.Node + "\x00" + fmt.Sprint(set), nil
}

// dropLayer undoes an addLayer whose layer never became the top.
func (m *qemuMachine) dropLayer(q *QMP, added string) {
	if added == "" {
		return
	}
	node, set, _ := strings.Cut(added, "\x00")
	q.cleanup("blockdev-del", map[string]any{"node-name": node})
	var id int
	fmt.Sscan(set, &id)
	q.cleanup("remove-fd", map[string]any{"fdset-id": id})
}

// switchTop puts the node over the disk's current top, which is frozen
// from then on: QEMU reopens it read-only by itself, and its read-write
// descriptor goes (dropWritable). switched tells whether node is the top
// now, even when an error follows.
func (m *qemuMachine) switchTop(ctx context.Context, q *QMP, layer Layer) (switched bool, err error) {
	top, err := m.top(ctx)
	if err != nil {
		return false, err
	}
	if _, err = q.Execute(ctx, "blockdev-snapshot", map[string]any{"node": top, "overlay": layer.Node}); err != nil {
		return false, err
	}
	return true, m.dropWritable(ctx, q, layer)
}

// dropWritable removes from QEMU every read-write descriptor of a disk
// layer but the top's: a frozen layer is read by restores and forks of
// other sandboxes, and an escaped QEMU must not hold a way to write it.
// The descriptor sets Start and addLayer gave QEMU hold a layer's file
// read-write and read-only; once a layer is a backing layer, QEMU has
// reopened it through the read-only one, and the read-write one only
// waits in its set. Which file a descriptor is, and how it was opened,
// is read from the host's side (/proc/PID/fd, fdinfo).
//
// Then every descriptor QEMU holds is checked (frozenWritable): the block
// layer's own descriptor of a frozen layer goes only through QEMU's
// reopen, whose failure QEMU ignores, so a writable one left fails the
// operation.
func (m *qemuMachine) dropWritable(ctx context.Context, q *QMP, top Layer) error {
	topInfo, err := os.Stat(top.Path)
	if err != nil {
		return err
	}
	ret, err := q.Execute(ctx, "query-fdsets", nil)
	if err != nil {
		return err
	}
	sets, err := parseFdsets(ret)
	if err != nil {
		return err
	}
	// The frozen layers: every file QEMU was given but the top, and the
	// layers it started with (by device and inode, not by name).
	frozen := map[fileID]string{}
	for _, l := range m.cfg.Disk {
		if fi, err := os.Stat(l.Path); err == nil && !os.SameFile(fi, topInfo) {
			frozen[idOf(fi)] = l.Path
		}
	}
	for _, set := range sets {
		if set.Opaque == stateOpaque {
			continue // a state being written, not a layer
		}
		for _, fd := range set.FDs {
			fi, err := os.Stat(fmt.Sprintf("/proc/%d/fd/%d", m.proc.Pid, fd))
			if err == nil && os.SameFile(fi, topInfo) {
				continue
			}
			if err == nil {
				if _, ok := frozen[idOf(fi)]; !ok {
					frozen[idOf(fi)] = fmt.Sprintf("fdset %d", set.ID)
				}
			}
			if !writable(m.proc.Pid, fd) {
				continue
			}
			if _, err := q.Execute(ctx, "remove-fd", map[string]any{"fdset-id": set.ID, "fd": fd}); err != nil {
				return fmt.Errorf("qemu of %s: dropping the writable descriptor %d of a frozen layer: %w", m.cfg.Name, fd, err)
			}
		}
	}
	fds, err := openFiles(m.proc.Pid)
	if err != nil {
		return fmt.Errorf("qemu of %s: checking its descriptors of frozen layers: %w", m.cfg.Name, err)
	}
	if left := frozenWritable(fds, frozen); len(left) > 0 {
		err := fmt.Errorf("qemu of %s (pid %d) still holds descriptor %d of frozen layer %s open for writing (flags %#o) after its descriptor sets were emptied: its reopen read-only failed", m.cfg.Name, m.proc.Pid, left[0].FD, frozen[left[0].ID], left[0].Flags)
		m.log.Error("a frozen layer is writable by its QEMU", "machine", m.cfg.Name, "pid", m.proc.Pid, "fd", left[0].FD, "layer", frozen[left[0].ID], "descriptors", len(left))
		return err
	}
	return nil
}

// fileID is a file by device and inode.
type fileID struct{ Dev, Ino uint64 }

func idOf(fi os.FileInfo) fileID {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}
	}
	return fileID{Dev: uint64(st.Dev), Ino: st.Ino}
}

// openFile is one descriptor of a process: the file it names and the
// flags it was opened with.
type openFile struct {
	FD    int
	ID    fileID
	Flags int
}

// frozenWritable is the descriptors of fds that name a frozen file and
// were opened for writing.
func frozenWritable(fds []openFile, frozen map[fileID]string) []openFile {
	var left []openFile
	for _, f := range fds {
		if _, ok := frozen[f.ID]; ok && f.Flags&unix.O_ACCMODE != unix.O_RDONLY {
			left = append(left, f)
		}
	}
	return left
}

// openFiles reads every descriptor of process pid (/proc/PID/fd and
// fdinfo); one that closes meanwhile is left out, one whose flags cannot
// be read counts as writable.
func openFiles(pid int) ([]openFile, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var fds []openFile
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fi, err := os.Stat(dir + "/" + e.Name())
		if err != nil {
			continue
		}
		f := openFile{FD: fd, ID: idOf(fi), Flags: unix.O_RDWR}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd)); err == nil {
			if flags, ok := fdinfoFlags(b); ok {
				f.Flags = flags
			}
		}
		fds = append(fds, f)
	}
	return fds, nil
}

// fdset is one of QEMU's descriptor sets (query-fdsets).
type fdset struct {
	ID     int
	FDs    []int
	Opaque string // the first descriptor's
}

func parseFdsets(ret json.RawMessage) ([]fdset, error) {
	var raw []struct {
		ID  int `json:"fdset-id"`
		FDs []struct {
			FD     int    `json:"fd"`
			Opaque string `json:"opaque"`
		} `json:"fds"`
	}
	if err := json.Unmarshal(ret, &raw); err != nil {
		return nil, fmt.Errorf("query-fdsets: %w", err)
	}
	sets := make([]fdset, 0, len(raw))
	for _, r := range raw {
		s := fdset{ID: r.ID}
		for i, f := range r.FDs {
			s.FDs = append(s.FDs, f.FD)
			if i == 0 {
				s.Opaque = f.Opaque
			}
		}
		sets = append(sets, s)
	}
	return sets, nil
}

// writable tells whether descriptor fd of process pid was opened for
// writing (its fdinfo flags); an unreadable one counts as writable, so
// that it is removed rather than kept.
func writable(pid, fd int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
	if err != nil {
		return true
	}
	flags, ok := fdinfoFlags(b)
	return !ok || flags&unix.O_ACCMODE != unix.O_RDONLY
}

// fdinfoFlags reads the flags line of /proc/PID/fdinfo/FD (octal).
func fdinfoFlags(b []byte) (int, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != "flags" {
			continue
		}
		f, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
		if err != nil {
			return 0, false
		}
		return int(f), true
	}
	return 0, false
}

// noSpace makes an error that QEMU reported as text (a migration's
// error-desc, a monitor's answer) and that says the disk was full match
// errors.Is(err, syscall.ENOSPC), as a failed write of our own would:
// QEMU gives no errno, only strerror's words.
func noSpace(err error) error {
	if err == nil || errors.Is(err, syscall.ENOSPC) {
		return err
	}
	msg := err.Error()
	if !strings.Contains(msg, "No space left on device") && !strings.Contains(msg, "ENOSPC") {
		return err
	}
	return spaceError{err}
}

// spaceError is a QEMU error that said its disk was full.
type spaceError struct{ err error }

func (e spaceError) Error() string   { return e.err.Error() }
func (e spaceError) Unwrap() []error { return []error{e.err, syscall.ENOSPC} }

func migrationStatus(ctx context.Context, q *QMP) (string, error) {
	ret, err := q.Execute(ctx, "query-migrate", nil)
	if err != nil {
		return "", err
	}
	var info struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(ret, &info); err != nil {
		return "", fmt.Errorf("query-migrate: %w", err)
	}
	return info.Status, nil
}

func migrationError(ctx context.Context, q *QMP) string {
	ret, err := q.Execute(ctx, "query-migrate", nil)
	if err != nil {
		return ""
	}
	var info struct {
		Desc string `json:"error-desc"`
	}
	if json.Unmarshal(ret, &info) != nil || info.Desc == "" {
		return ""
	}
	return ": " + info.Desc
}

func migrationTotals(ctx context.Context, q *QMP) (transferred int64, passes int) {
	ret, err := q.Execute(ctx, "query-migrate", nil)
	if err != nil {
		return 0, 0
	}
	var info struct {
		RAM struct {
			Transferred int64 `json:"transferred"`
			Syncs       int   `json:"dirty-sync-count"`
		} `json:"ram"`
	}
	json.Unmarshal(ret, &info)
	return info.RAM.Transferred, info.RAM.Syncs
}
