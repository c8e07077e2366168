package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"strata/channel"
	"strata/egress"
	"strata/internal/guestclient"
	"strata/vmm"
)

// Manager runs the microVM sandboxes of one state directory.
type Manager struct {
	cfg Config
	log *slog.Logger

	// creating serializes the choice of a new sandbox's uid with the
	// insert of its record, so that two creates never share one.
	creating sync.Mutex
	// storeMu keeps collect from deleting a store file between its
	// making and the record that names it (store.go).
	storeMu   sync.RWMutex
	templates templateLocks

	// ids is the deployment's range of uids and gids; dirLock holds
	// <Dir>/.lock until Close.
	ids     IDRange
	dirLock *os.File

	// leases are what work under way holds of the host (leases.go):
	// admission's memory and disks, store files made and not yet named,
	// snapshots being restored, compactions' work files.
	leases leases
	// diskMu makes disk admissions one at a time (holdDisk).
	diskMu sync.Mutex

	mu   sync.Mutex
	live map[string]*machine
	// savingSeq numbers the leases of restores' old machines
	// (admitLaterSave); laterSaves waits for their writes.
	savingSeq  int
	laterSaves sync.WaitGroup
	// written are the background writes of automatic snapshots under
	// way ("sandbox/snapshot"), closed when each ends.
	written map[string]chan struct{}
	// gids are template groups being given (allocGid) and not yet
	// recorded.
	gids map[uint32]bool
	// templateUIDs are the uids of template QEMUs made ahead
	// (templateLater), by count: no new sandbox gets one while its
	// QEMU holds a sandbox's memory, even once that sandbox is gone.
	templateUIDs map[uint32]int
	// aheadLatest is each sandbox's latest memory snapshot whose
	// template is to be made ahead; aheadSlot lets one such template
	// QEMU run at a time.
	aheadLatest map[string]string
	aheadSlot   chan struct{}
	// pauseTemplates are the pause templates being made, by sandbox.
	pauseTemplates map[string]*pauseTemplate
	// warmed are the RAM files read into the page cache (warmRAM), or
	// being read, by path, until they are gone from the store.
	warmed map[string]struct{}
	// closed is set by Close: background work (goAfter) no longer starts.
	closed bool
	// busy marks the sandboxes a lifecycle operation is under way on,
	// each with the number of its operation (ops counts them).
	busy    map[string]uint64
	ops     uint64
	running map[string]*running // background operations, by sandbox
	wg      sync.WaitGroup      // background transitions
	syncs   sync.WaitGroup      // snapshots being written to disk
	ctx     context.Context     // ends with Close
	stop    context.CancelFunc

	// compacts are the compactions of disk chains under way or due
	// (compact.go), by sandbox.
	compacts map[string]*compactRun

	// poolTake serializes takes of pooled sandboxes; poolFill runs the
	// pool's filling (pool.go).
	poolTake sync.Mutex
	poolFill refill

	// forkAheadTake serializes takes of forks made ahead, and
	// forksAheadFill runs their filling; forkAheadMu guards the
	// snapshots that want one and the forks made ahead whose CPUs are
	// stopped (forkahead.go).
	forkAheadTake  sync.Mutex
	forksAheadFill refill
	forkAheadMu    sync.Mutex
	forksWanted    []From
	aheadHeld      time.Time
	stoppedAhead   map[string]bool
}

// machine is a sandbox whose QEMU runs.
type machine struct {
	id      string
	vm      vmm.Machine
	groups  []uint32 // supplementary groups QEMU runs with (a template's)
	ch      *channel.Host
	guestLn net.Listener
	// guest is the manager's own client of guestd (guestCall).
	guest *guestclient.Client
	// healing is set while a heal runs (heal); again asks for another.
	healing, again bool
	// session is the newest channel session that told whether its
	// guest answers (answering): an older one's word is stale.
	session uint64
	// memoryMiB is its guest's memory, as memory admission counts it.
	memoryMiB int
	// stuck is QEMU's run state when the heartbeat last found it
	// stopped on a fault (io-error), "" otherwise.
	stuck atomic.Value
	// expected is set before an exit that someone asked for (stop,
	// delete), so that the watcher does not call it a failure.
	mu       sync.Mutex
	expected bool
	// net is the guest's network (startNetwork), under mu; nil when it
	// has none. netMu serializes the applications of its setting.
	net   *egress.Net
	netMu sync.Mutex
}

func (m *machine) expectExit() {
	m.mu.Lock()
	m.expected = true
	m.mu.Unlock()
}

func (m *machine) exitExpected() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.expected
}

// New checks the configuration and the state directory; Recover must run
// before the sandboxes are used.
func New(cfg Config) (*Manager, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) || cfg.Driver == nil || cfg.Records == nil || cfg.Image.Key == "" {
		return nil, errors.New("sandbox: Dir (absolute), Image, Driver and Records are required")
	}
	if cfg.IDClaims == "" {
		cfg.IDClaims = DefaultIDClaims
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 120 * time.Second
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 10 * time.Second
	}
	if cfg.ReserveMiB == 0 {
		cfg.ReserveMiB = 512
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.PingTimeout == 0 {
		cfg.PingTimeout = 3 * time.Second
	}
	if cfg.UnresponsiveLimit == 0 {
		cfg.UnresponsiveLimit = 3 * time.Minute
	}
	if cfg.MemAvailable == nil {
		cfg.MemAvailable = memAvailable
	}
	if cfg.MemTotal == nil {
		cfg.MemTotal = memTotal
	}
	if cfg.Overcommit == 0 {
		cfg.Overcommit = 1
	}
	if cfg.DiskOvercommit == 0 {
		cfg.DiskOvercommit = DefaultDiskOvercommit
	}
	if cfg.Overcommit < 0 || cfg.DiskOvercommit < 0 || cfg.StoreReserveBytes < 0 || cfg.SnapshotQuotaBytes < 0 {
		return nil, errors.New("sandbox: Overcommit, DiskOvercommit, StoreReserveBytes and SnapshotQuotaBytes must not be negative")
	}
	if cfg.Pool < 0 || cfg.Pool > MaxPool || cfg.Pool > 0 && (cfg.NewID == nil || cfg.PoolShape.MemoryMiB <= 0 || cfg.PoolShape.VCPUs <= 0 || cfg.PoolShape.DiskGiB <= 0) {
		return nil, fmt.Errorf("sandbox: Pool %d: want 0 to %d, and with a pool, NewID and a PoolShape", cfg.Pool, MaxPool)
	}
	if cfg.ForksAhead < 0 || cfg.ForksAhead > MaxForksAhead || cfg.ForksAhead > 0 && cfg.NewID == nil {
		return nil, fmt.Errorf("sandbox: ForksAhead %d: want 0 to %d, and with forks ahead, NewID", cfg.ForksAhead, MaxForksAhead)
	}
	if cfg.StoreReserveBytes == 0 {
		cfg.StoreReserveBytes = DefaultStoreReserveBytes
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o711); err != nil {
		return nil, err
	}
	if err := checkTraversable(cfg.Dir); err != nil {
		return nil, err
	}
	if err := checkRootOwned(cfg.Dir); err != nil {
		return nil, err
	}
	cfg.Dir = filepath.Clean(cfg.Dir)
	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	records, err := cfg.Records.List(context.Background())
	var ids IDRange
	if err == nil {
		ids, err = claimIDs(cfg.IDClaims, cfg.Dir, cfg.UIDBase, heldIDs(records), "/etc")
	}
	if err != nil {
		lock.Close()
		return nil, err
	}
	cfg.UIDBase = ids.Base
	cfg.Log.Info("sandbox ids", "dir", cfg.Dir, "range", ids.String(), "claims", cfg.IDClaims)
	ctx, stop := context.WithCancel(context.Background())
	return &Manager{cfg: cfg, log: cfg.Log, ids: ids, dirLock: lock, live: map[string]*machine{}, written: map[string]chan struct{}{}, running: map[string]*running{}, busy: map[string]uint64{}, gids: map[uint32]bool{}, templateUIDs: map[uint32]int{}, aheadLatest: map[string]string{}, aheadSlot: make(chan struct{}, 1), stoppedAhead: map[string]bool{}, pauseTemplates: map[string]*pauseTemplate{}, warmed: map[string]struct{}{}, compacts: map[string]*compactRun{}, ctx: ctx, stop: stop}, nil
}

// Close stops watching the machines and drops their channels. QEMUs keep
// running: the next Manager adopts them. A boot under way is left in
// creating, for the next Manager's Recover to finish.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true // no background work starts from here
	m.mu.Unlock()
	m.stop()
	m.wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, mc := range m.live {
		mc.guestLn.Close()
		mc.ch.Close()
		mc.vm.Close()
		delete(m.live, id)
	}
	m.dirLock.Close() // the next Manager on Dir may start
}

// IDs is the deployment's range of uids and gids on this host.
func (m *Manager) IDs() IDRange { return m.ids }

// dir is a sandbox's directory: root's (mode 0711), holding its disk
// (the sandbox's uid's, 0600: the uid can write it, not replace it) and
// its run directory.
func (m *Manager) dir(id string) string { return filepath.Join(m.cfg.Dir, id) }

// runDir is the directory QEMU runs in, the sandbox's uid's (0700).
// The host opens and dials nothing there.
func (m *Manager) runDir(id string) string { return filepath.Join(m.cfg.Dir, id, "run") }

// ctlDir is the sandbox's control directory, root's alone (0700): the
// sockets QEMU is handed as descriptors and the capped logs of its
// console and its own output (vmm.Config.Ctl).
func (m *Manager) ctlDir(id string) string { return filepath.Join(m.cfg.Dir, id, "ctl") }

func (m *Manager) vmConfig(r Record) vmm.Config {
	return vmm.Config{
		Name: r.ID, Dir: m.runDir(r.ID), Ctl: m.ctlDir(r.ID),
		Kernel: m.cfg.Image.Kernel, Initrd: m.cfg.Image.Initrd,
		Disk:      m.chain(r.Machine),
		MemoryMiB: r.MemoryMiB, VCPUs: r.VCPUs,
		Incoming: r.Machine.Saved != "",
		Accel:    m.cfg.Accel.Accel, TSCKHz: m.cfg.Accel.TSCKHz,
		KernelArgs: []string{"strata.hostname=" + hostname(r)},
		Uid:        r.Machine.Uid, Gid: r.Machine.Gid,
		RAM:    m.ramFile(r.Machine),
		Groups: ramGroups(r.Machine),
	}
}

// machineOf is the running machine of a sandbox, or nil.
func (m *Manager) machineOf(id string) *machine {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id]
}

// begin marks a lifecycle operation on id under way, or refuses a second.
// The mark is released by the operation's setState, or else by the func
// begin returns (which releases this operation's mark only).
func (m *Manager) begin(id string) (func(), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.busy[id] == 0 && m.yieldCompaction(id) {
	}
	if m.busy[id] != 0 {
		return nil, ErrInProgress
	}
	m.ops++
	op := m.ops
	m.busy[id] = op
	return func() {
		m.mu.Lock()
		if m.busy[id] == op {
			delete(m.busy, id)
		}
		m.mu.Unlock()
	}, nil
}

// background runs fn with the manager's context, releasing the
// operation's mark when it returns.
func (m *Manager) background(id string, done func(), fn func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(m.ctx)
	run := &running{cancel: cancel, finished: make(chan struct{})}
	m.mu.Lock()
	m.running[id] = run
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			if m.running[id] == run {
				delete(m.running, id)
			}
			m.mu.Unlock()
			cancel()
			close(run.finished)
		}()
		defer done()
		fn(ctx)
	}()
}

// running is a lifecycle operation under way in the background, which a
// delete may cancel.
type running struct {
	cancel   context.CancelFunc
	finished chan struct{}
}

// cancelRunning cancels the background operation on id, if any, and waits
// for it to end: a delete does not wait for a boot that may hang for
// BootTimeout.
func (m *Manager) cancelRunning(ctx context.Context, id string) {
	m.mu.Lock()
	run := m.running[id]
	m.mu.Unlock()
	if run == nil {
		return
	}
	run.cancel()
	select {
	case <-run.finished:
	case <-ctx.Done():
	}
}

// collectLater collects the store in the background.
func (m *Manager) collectLater() {
	m.goAfter(func() {
		if err := m.collect(m.ctx); err != nil && m.ctx.Err() == nil {
			m.log.Warn("store not collected", "err", err)
		}
	})
}

// goAfter runs fn in the background, unless the Manager is closed (the
// next one's Recover does what is left).
func (m *Manager) goAfter(fn func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn()
	}()
	return true
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// consoleHead is the start of a machine's console for the log of a
// failed boot (its modules and mounts), empty when it has none (a boot
// that failed before its machine was planned).
func consoleHead(cfg vmm.Config) string {
	if cfg.Ctl == "" {
		return ""
	}
	return strings.TrimSpace(string(vmm.ReadHead(cfg.ConsoleLog(), 2000)))
}

// consoleTail is the end of a guest's console, for logs; read without
// following a link the sandbox's uid may have planted.
func consoleTail(path string) string {
	b := vmm.ReadTail(path, 1500)
	if len(b) == 0 {
		return ""
	}
	return "; console: " + strings.TrimSpace(string(b))
}
