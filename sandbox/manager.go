package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"strata/channel"
	"strata/internal/failpoint"
	"strata/internal/fault"
	"strata/internal/guestclient"
	"strata/vmm"
)

// Config configures a Manager. Dir, Image, Driver, Accel and Records are
// required.
type Config struct {
	// Dir holds one directory per sandbox (its disk and run files). It
	// and its parents must be traversable by the sandboxes' uids, owned by
	// root (or this process's uid) and not writable by group or others
	// (sticky parents excepted): New checks both (checkOwnership).
	Dir     string
	Image   Image
	Driver  vmm.Driver
	Accel   vmm.Probe
	Records Records
	Log     *slog.Logger
	// UIDBase is the first id of this deployment's range (ids.go): its
	// sandboxes' QEMUs get the lowest uid (and gid) free from there, its
	// templates' groups count from UIDBase+IDRangeSize/2. Zero: the
	// range the deployment already claims, or the first free one from
	// DefaultUIDBase. A range another deployment on the host claims, or
	// that overlaps the host's own ids, is refused.
	UIDBase uint32
	// IDClaims is the host-wide file of the deployments' claims of id
	// ranges (DefaultIDClaims when empty); one for every deployment of
	// the host.
	IDClaims string
	// BootTimeout bounds a boot to guestd answering (120 s); StopTimeout
	// a clean shutdown before QEMU is killed (10 s).
	BootTimeout, StopTimeout time.Duration
	// ReserveMiB is host memory kept free beyond the sandboxes' own
	// (512 MiB when zero): a create that would cut into it is refused
	// with host_capacity.
	ReserveMiB int
	// Booted is called once guestd answers after each boot, before the
	// sandbox is running (hostproxy hands the guest its credentials).
	Booted func(ctx context.Context, r Record) error
	// ServeGuest serves the calls processes in the sandbox make through
	// its channel, until ln is closed.
	ServeGuest func(id string, ln net.Listener)
	// MemAvailable and MemTotal read the host's available and total
	// memory in MiB (/proc/meminfo when nil).
	MemAvailable, MemTotal func() (int, error)
	// Overcommit is the ratio of the sandboxes' memory to the host's
	// (MemTotal less ReserveMiB) that admission allows (1 when zero:
	// none).
	Overcommit float64
	// StoreReserveBytes is the free space kept on the store's filesystem
	// (DefaultStoreReserveBytes when zero): an operation that would cut
	// into it answers insufficient_storage.
	StoreReserveBytes int64
	// DiskOvercommit is the ratio of what the disks of the sandboxes with
	// a QEMU may still grow by (each its disk_gib less its top's
	// allocated bytes) to the store's free space less StoreReserveBytes
	// that admission allows at create, fork and start
	// (DefaultDiskOvercommit when zero).
	DiskOvercommit float64
	// SnapshotQuotaBytes caps the bytes of one sandbox's snapshots
	// (DefaultSnapshotQuotaFactor × its memory and disk when zero).
	SnapshotQuotaBytes int64
	// QEMUVersion is the host's `qemu --version` (vmm.QEMU.Version): a
	// memory snapshot records it and loads only into the same.
	QEMUVersion string
	// Heartbeat is how often the host pings each guest through its
	// channel (1 s when zero; negative: never), and PingTimeout how long
	// a ping of a guest whose CPUs run may go unanswered before its
	// channel is reset and the sandbox is unresponsive (3 s when zero).
	Heartbeat, PingTimeout time.Duration
	// UnresponsiveLimit is how long a sandbox may stay unresponsive
	// before its QEMU is stopped and it is put in error (3 minutes when
	// zero).
	UnresponsiveLimit time.Duration
	// Pool is how many sandboxes of PoolShape are kept booted ahead, of
	// no account, for creates of that shape to take (pool.go); 0: none.
	// NewID names them (hostproxy's ids).
	Pool      int
	PoolShape Shape
	NewID     func() (string, error)
	// ForksAhead is how many snapshots, the last forked host-wide, keep
	// one fork made ahead for the next fork to take (forkahead.go); 0: none.
	// NewID names them.
	ForksAhead int
	// LazyTemplates makes a memory snapshot's template at its first fork
	// instead of as soon as the snapshot is taken (templateLater): no
	// template QEMU for snapshots never forked, a first fork slower by
	// the template's load.
	LazyTemplates bool
}

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

	mu   sync.Mutex
	live map[string]*machine
	// reserved is the memory of the boots under way, by sandbox.
	reserved map[string]int
	// saving is the memory of the machines a restore left to write
	// their automatic snapshot (laterSave), by admitLaterSave's key.
	saving     map[string]int
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
	// claimed are store files an operation made and has not yet named
	// in a record (claimFile), by name, with the number of claims.
	claimed map[string]int
	// inUse are the snapshots a restore is loading ("sandbox/snapshot"):
	// a delete of one answers snapshot_in_use.
	inUse map[string]int
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
	// (compact.go), by sandbox; work the store's work files they make.
	compacts map[string]*compactRun
	workMu   sync.Mutex
	work     map[string]bool

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
	return &Manager{cfg: cfg, log: cfg.Log, ids: ids, dirLock: lock, live: map[string]*machine{}, reserved: map[string]int{}, saving: map[string]int{}, written: map[string]chan struct{}{}, running: map[string]*running{}, busy: map[string]uint64{}, gids: map[uint32]bool{}, templateUIDs: map[uint32]int{}, aheadLatest: map[string]string{}, aheadSlot: make(chan struct{}, 1), stoppedAhead: map[string]bool{}, pauseTemplates: map[string]*pauseTemplate{}, warmed: map[string]struct{}{}, claimed: map[string]int{}, inUse: map[string]int{}, compacts: map[string]*compactRun{}, work: map[string]bool{}, ctx: ctx, stop: stop}, nil
}

// checkTraversable fails when an unprivileged uid could not reach dir:
// QEMU runs as one and opens its run directory below it.
func checkTraversable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("sandbox: %s is not traversable by others (mode %v): the sandboxes' QEMU runs unprivileged below it; chmod o+x %s", d, fi.Mode().Perm(), d)
		}
		if d == "/" {
			return nil
		}
	}
}

// dirInfo is what checkOwnership weighs of one directory.
type dirInfo struct {
	Path string
	Uid  uint32
	Mode os.FileMode
}

// checkRootOwned fails when another uid than root or hostproxy's own could
// swap an entry on the way to dir or in it: hostproxy trusts
// <dir>/<id>/ctl to be its own. Links on the way are resolved first, so
// the directories checked are the ones really walked.
func checkRootOwned(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	real, err = filepath.Abs(real)
	if err != nil {
		return err
	}
	var chain []dirInfo
	for d := real; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("sandbox: no owner for %s", d)
		}
		chain = append(chain, dirInfo{Path: d, Uid: st.Uid, Mode: fi.Mode()})
		if d == "/" {
			break
		}
	}
	return checkOwnership(chain, uint32(os.Geteuid()))
}

// checkOwnership is the rule checkRootOwned applies to the directories
// from dir (chain[0]) up to /, for a hostproxy running as uid self (root
// in production): every one is owned by root or self and writable by
// neither its group nor others, except that a parent (never dir itself)
// may be writable by all when it is sticky (as /tmp is: only an entry's
// owner, and the directory's, may rename or remove it; the entry below
// is root's or self's by the same rule, and so is the sticky directory).
func checkOwnership(chain []dirInfo, self uint32) error {
	for i, d := range chain {
		if d.Uid != 0 && d.Uid != self {
			return fmt.Errorf("sandbox: %s is owned by uid %d, neither root nor hostproxy's: whoever owns it could swap a sandbox's directories below it; chown root %s", d.Path, d.Uid, d.Path)
		}
		if d.Mode.Perm()&0o022 == 0 {
			continue
		}
		if i > 0 && d.Mode&os.ModeSticky != 0 {
			continue
		}
		return fmt.Errorf("sandbox: %s is writable by its group or others (mode %v): they could swap a sandbox's directories below it; chmod go-w %s", d.Path, d.Mode, d.Path)
	}
	return nil
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

// ramFile is the template RAM a machine maps, if any.
func (m *Manager) ramFile(mach *Machine) *vmm.RAMFile {
	if mach.RAM == "" {
		return nil
	}
	return &vmm.RAMFile{Path: m.ramPath(mach.RAM, mach.RAMOffset), Offset: mach.RAMOffset}
}

// warmRAM reads the RAM a running machine maps from a file (a snapshot's
// state, a pause's, a template's RAM file) into the page cache, holes
// included, in the background. The machine reads only the pages it
// touches; but a save of its memory (a snapshot, a pause) reads every
// page, and a page not in the cache then waits on the disk, or, in a
// hole (a page the guest never wrote), on a page the kernel allocates and
// zeroes under the save: the pause of a 1 GiB guest took 1.5 to 3 s, and
// 0.8 s with the file cached. The pages are the page cache's, shared by
// every machine that maps the file, and the first to go when the host
// needs memory. (FADV_WILLNEED reads the data alone, not the holes.)
func (m *Manager) warmRAM(path string, offset, size int64) {
	m.mu.Lock()
	_, done := m.warmed[path]
	m.warmed[path] = struct{}{}
	others := slices.Collect(maps.Keys(m.warmed))
	m.mu.Unlock()
	if done {
		return // the forks of one snapshot read it once
	}
	for _, p := range others {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			m.mu.Lock()
			delete(m.warmed, p) // collected
			m.mu.Unlock()
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return
	}
	if !m.goAfter(func() {
		defer f.Close()
		t0 := time.Now()
		const chunk = 64 << 20
		for off := int64(0); off < size && m.ctx.Err() == nil; off += chunk {
			b, err := unix.Mmap(int(f.Fd()), offset+off, int(min(chunk, size-off)), unix.PROT_READ, unix.MAP_SHARED)
			if err == nil {
				err = unix.Madvise(b, unix.MADV_POPULATE_READ)
				unix.Munmap(b)
			}
			if err != nil {
				m.log.Debug("RAM file not read into the page cache", "path", path, "err", err)
				return
			}
		}
		m.log.Debug("RAM file in the page cache", "path", path, "bytes", size, "took", time.Since(t0).Round(time.Millisecond))
	}) {
		f.Close()
	}
}

func ramGroups(mach *Machine) []uint32 {
	if mach.RAM == "" {
		return nil
	}
	return []uint32{mach.RAMGid}
}

func hostname(r Record) string {
	if r.Name != "" {
		return r.Name
	}
	return r.ID
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

// Create records r (in state creating, with a uid of its own) and boots
// it in the background. r carries the id, account, name and size.
func (m *Manager) Create(ctx context.Context, r Record) (Record, error) {
	if taken, ok, err := m.takePooled(ctx, r); ok {
		return taken, err
	}
	return giveWay(ctx, m, func() (Record, error) { return m.bootNew(ctx, r) })
}

// bootNew is Create that boots: a new sandbox from the image.
func (m *Manager) bootNew(ctx context.Context, r Record) (Record, error) {
	if err := m.checkStorage(layerBytes); err != nil {
		return Record{}, err
	}
	if err := m.checkDisks(ctx, r.ID, r.DiskGiB, ""); err != nil {
		return Record{}, err
	}
	return m.create(ctx, r, Machine{BaseDisk: m.cfg.Image.Disk, Image: m.cfg.Image.Key})
}

// create records r with mach (given a uid of its own) and boots it in
// the background.
func (m *Manager) create(ctx context.Context, r Record, mach Machine) (Record, error) {
	m.creating.Lock()
	defer m.creating.Unlock()
	uid, err := m.freeUID(ctx)
	if err != nil {
		return Record{}, err
	}
	r.State = Creating
	mach.Uid, mach.Gid = uid, uid
	r.Machine = &mach
	done, err := m.begin(r.ID)
	if err != nil {
		return Record{}, err
	}
	if err := m.reserve(ctx, r.ID, r.MemoryMiB); err != nil {
		done()
		return Record{}, err
	}
	if err := m.cfg.Records.Insert(ctx, r); err != nil {
		m.unreserve(r.ID)
		done()
		return Record{}, err
	}
	m.log.Info("sandbox creating", "sandbox", r.ID, "memory_mib", r.MemoryMiB, "vcpus", r.VCPUs, "disk_gib", r.DiskGiB, "uid", uid, "load", mach.Saved != "")
	m.background(r.ID, done, func(ctx context.Context) { m.boot(ctx, r.ID, Creating) })
	return r, nil
}

// Start boots a stopped sandbox, or one in error, from its disk: a cold
// boot. A sandbox already creating or running is returned as it is.
func (m *Manager) Start(ctx context.Context, id string) (Record, error) {
	return giveWay(ctx, m, func() (Record, error) { return m.start(ctx, id) })
}

func (m *Manager) start(ctx context.Context, id string) (Record, error) {
	if r, err := m.cfg.Records.Get(ctx, id); err == nil && r.Machine != nil && m.machineOf(id) == nil && (r.State == Stopped || r.State == Error) {
		if err := m.checkDisks(ctx, id, r.DiskGiB, topOf(r)); err != nil {
			return Record{}, err
		}
	}
	done, err := m.begin(id)
	if err != nil {
		return Record{}, err
	}
	return m.bootAs(ctx, id, done, Creating, func(r *Record) (bool, error) {
		switch {
		case r.Machine == nil:
			return false, ErrNotAMachine
		case r.State == Running || r.State == Creating || m.machineOf(id) != nil:
			return false, nil
		case r.State != Stopped && r.State != Error:
			return false, ErrWrongState.With("state", string(r.State))
		}
		// A start is a cold boot from the disk, whatever memory was
		// saved (an error may have come from loading it).
		r.Error, r.Machine.Saved, r.Machine.LoadDisk = "", "", nil
		r.Machine.dropRAM()
		r.Machine.FromTemplate = nil
		return true, nil
	})
}

// bootAs records a boot that allow lets go ahead (false: the sandbox is
// already where the boot leads, or on its way), in state via, with the
// memory it needs reserved, and runs it in the background. The record is
// written in the registry's transaction, so allow may look at m.live
// (lock order: registry, then m.mu).
func (m *Manager) bootAs(ctx context.Context, id string, done func(), via State, allow func(*Record) (bool, error)) (Record, error) {
	boots := false
	r, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
		ok, err := allow(r)
		if err != nil || !ok {
			return err
		}
		if err := m.reserve(ctx, id, r.MemoryMiB); err != nil {
			return err
		}
		r.State, boots = via, true
		return nil
	})
	if err != nil || !boots {
		m.unreserve(id) // none, or one a failed write left
		done()
		return r, err
	}
	m.log.Info("sandbox booting", "sandbox", id, "as", via, "load", r.Machine.Saved != "")
	m.background(id, done, func(ctx context.Context) { m.boot(ctx, id, via) })
	return r, nil
}

// boot brings a sandbox in state via (creating, or resuming from a pause
// that freed its memory) to running: disk, QEMU, its saved memory if it
// has one, channel, guestd answering, credentials. On failure the sandbox
// is in error and no QEMU of it runs.
func (m *Manager) boot(ctx context.Context, id string, via State) {
	// Once the guest has booted, the host's available memory shows what
	// it takes; until then its reservation stands for it.
	defer m.unreserve(id)
	t0 := time.Now()
	r, err := m.cfg.Records.Get(ctx, id)
	if err != nil {
		m.log.Error("sandbox boot: no record", "sandbox", id, "err", err)
		return
	}
	fail := func(sentence string, err error) {
		if m.ctx.Err() != nil {
			m.leaveBoot(id, err)
			return
		}
		if ctx.Err() != nil {
			// Cancelled for a delete, which takes it from here.
			m.log.Info("sandbox boot cancelled", "sandbox", id)
			m.teardown(id)
			return
		}
		m.log.Error("sandbox boot failed", "sandbox", id, "err", err)
		m.teardown(id)
		m.setState(id, Error, sentence, via)
	}
	if _, err := os.Stat(r.Machine.BaseDisk); err != nil {
		fail(errBaseDiskMissing, err)
		return
	}
	if r, err = m.prepare(ctx, r); err != nil {
		fail(errStartFailedOnHost, err)
		return
	}
	if r.Machine.FromTemplate != nil {
		tr, err := m.startFromTemplate(ctx, r)
		if err != nil {
			fail(errStartFailedOnHost, err)
			return
		}
		if tr.Machine.RAM == "" {
			m.log.Warn("fork loads the snapshot's whole state: no template", "sandbox", id)
		}
		r = tr
	}
	if r.Machine.Saved != "" {
		if r, err = m.loadTop(ctx, r); err != nil {
			fail(errStartFailedOnHost, err)
			return
		}
	}
	cfg := m.vmConfig(r)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	vm, err := m.cfg.Driver.Start(sctx, cfg)
	cancel()
	if err != nil && via == Resuming && r.Machine.SavedTemplate != nil && r.Machine.RAM != "" && ctx.Err() == nil {
		// Through the pause's template, the QEMU did not start (its
		// state lost the group, say): the whole state loads instead.
		m.log.Warn("resume through the pause template failed to start; the whole state loads", "sandbox", id, "err", err)
		if r, err = m.unmapResume(ctx, id); err == nil {
			cfg = m.vmConfig(r)
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			vm, err = m.cfg.Driver.Start(sctx, cfg)
			cancel()
		}
	}
	if err != nil {
		fail(errStartFailedOnHost, err)
		return
	}
	p := vm.Process()
	if _, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
		r.Machine.Process = &p
		r.Machine.Image = m.cfg.Image.Key
		r.Machine.Handshake = true
		return nil
	}); err != nil {
		vm.Kill()
		fail(errStartFailedOnHost, err)
		return
	}
	var loadedIn time.Duration
	if cfg.Incoming {
		if err := m.load(ctx, vm, r.Machine.Saved); err != nil {
			vm.Kill()
			<-vm.Done()
			if via == Resuming && m.ctx.Err() == nil && ctx.Err() == nil {
				// A paused sandbox's memory is kept: resume may be
				// tried again, or a stop drops it.
				m.log.Error("saved memory not loaded; the sandbox stays paused", "sandbox", id, "err", err)
				m.teardown(id)
				if r.Machine.SavedTemplate != nil && r.Machine.RAM != "" {
					m.unmapResume(context.WithoutCancel(ctx), id)
				}
				m.setState(id, Paused, errResumeFailed, Resuming)
				return
			}
			m.dropSaved(id)
			fail(errLoadFailed, err)
			return
		}
	}
	if cfg.Incoming {
		loadedIn = time.Since(t0)
		failpoint.Hit(FailpointBootLoaded)
	}
	mc := m.adopt(id, vm, cfg, true)
	// The credentials go to the guest beside the first call, not after
	// it: calls in flight together on the channel cost one round trip,
	// and the credentials use neither the guest's clock nor its RNG. A
	// cold boot's wait their turn: its guest answers seconds later.
	booted := make(chan error, 1)
	var answeredIn, credentialsIn time.Duration
	// A boot that fails ends the credentials' call rather than wait
	// for it (a guest that never answers would hold it to its timeout).
	bctx, endCredentials := context.WithCancel(ctx)
	defer endCredentials()
	sendCredentials := func() {
		if m.cfg.Booted == nil {
			booted <- nil
			return
		}
		go func() {
			err := m.cfg.Booted(bctx, r)
			credentialsIn = time.Since(t0)
			booted <- err
		}()
	}
	// A loaded guest's first call is its resync, which must come before
	// anything else it is asked: its memory is another moment's (or
	// another sandbox's), and its clock and RNG are told so before it is
	// running. Forks of one snapshot must not run with one RNG state.
	probe, what := func(ctx context.Context) error { return guestHealth(ctx, mc) }, "health"
	if cfg.Incoming {
		probe, what = func(ctx context.Context) error { return m.resync(ctx, mc, r) }, "resync"
		sendCredentials()
	}
	if err := m.waitGuest(ctx, mc, what, probe); err != nil {
		if cfg.Incoming {
			endCredentials()
			<-booted
			err = fmt.Errorf("the guest's clock and RNG were not resynced: %w", err)
		}
		fail(errBootFailed, fmt.Errorf("%w%s", err, consoleTail(cfg.ConsoleLog())))
		return
	}
	answeredIn = time.Since(t0)
	m.log.Debug("guestd answered", "sandbox", id, "after", answeredIn.Round(time.Millisecond), "call", what)
	if !cfg.Incoming {
		sendCredentials()
	} else {
		if _, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
			r.Machine.Saved, r.Machine.LoadDisk, r.Machine.SavedTemplate = "", nil, nil
			return nil
		}); err != nil {
			endCredentials()
			<-booted
			fail(errStartFailedOnHost, err)
			return
		}
		// The state goes unless a snapshot or a fork names it; not on
		// the way to running.
		m.collectLater()
	}
	if err := <-booted; err != nil {
		if ctx.Err() != nil {
			fail(errBootFailed, err)
			return
		}
		m.log.Warn("sandbox booted, but its guest did not take its credentials", "sandbox", id, "err", err)
	}
	m.setState(id, Running, "", via)
	m.compactLater(id)
	if cfg.RAM != nil && cfg.RAM.Path != "" {
		m.warmRAM(cfg.RAM.Path, cfg.RAM.Offset, int64(cfg.MemoryMiB)<<20)
	}
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	m.log.Info("sandbox running", "sandbox", id, "boot", ms(time.Since(t0)), "loaded", cfg.Incoming, "loaded_in", ms(loadedIn),
		"answered_in", ms(answeredIn), "credentials_in", ms(credentialsIn))
}

// unmapResume undoes a resume's choice of the pause template, which did
// not work: the record names the paused state as the memory to load
// again, whole, and forgets the template.
func (m *Manager) unmapResume(ctx context.Context, id string) (Record, error) {
	return m.cfg.Records.Update(ctx, id, func(r *Record) error {
		if t := r.Machine.SavedTemplate; t != nil && r.Machine.RAM == t.RAM && r.Machine.Saved == t.State {
			r.Machine.Saved, r.Machine.SavedTemplate = t.RAM, nil
			r.Machine.dropRAM()
		}
		return nil
	})
}

// loadTop puts a new, empty top over the disk a saved state goes with
// (LoadDisk), unless the current top is one already, never run on: a load
// that starts over after a crash must not find the writes of the guest it
// loaded the first time.
func (m *Manager) loadTop(ctx context.Context, r Record) (Record, error) {
	load := r.Machine.LoadDisk
	if len(load) == 0 {
		load = r.Machine.Disk // recorded before LoadDisk existed
	}
	if r.Machine.FreshTop {
		return m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
			rec.Machine.FreshTop, rec.Machine.LoadDisk = false, slices.Clone(load)
			return nil
		})
	}
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	top, err := m.newLayer(ctx, r.Machine.BaseDisk, load[0], m.diskBytes(r.DiskGiB))
	if err != nil {
		return r, err
	}
	return m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		rec.Machine.Disk = append([]string{top}, load...)
		rec.Machine.LoadDisk = slices.Clone(load)
		return nil
	})
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

// leaveBoot leaves a boot that the Manager's Close interrupted as it is:
// the sandbox stays creating and its QEMU, if it has one, runs on; the
// next Manager's Recover finishes the boot. (Close is a restart of the
// host service, which must never cost a sandbox its boot.)
func (m *Manager) leaveBoot(id string, err error) {
	m.log.Warn("sandbox boot interrupted by the host service stopping; the next start finishes it", "sandbox", id, "err", err)
}

// prepare makes the sandbox's directories and, on the first boot, its
// disk: an empty top layer in the store over the base (a create copies
// nothing). It returns the record as the boot must use it.
func (m *Manager) prepare(ctx context.Context, r Record) (Record, error) {
	uid, gid := int(r.Machine.Uid), int(r.Machine.Gid)
	dir := m.dir(r.ID)
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return r, err
	}
	if err := os.Lchown(dir, 0, 0); err != nil {
		return r, err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return r, err
	}
	run := m.runDir(r.ID)
	if err := os.Mkdir(run, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return r, err
	}
	if err := os.Lchown(run, uid, gid); err != nil {
		return r, err
	}
	// Root's alone; vmm checks it (not a link, root's, 0700) before use.
	if err := os.Mkdir(m.ctlDir(r.ID), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return r, err
	}
	if len(r.Machine.Disk) > 0 {
		return r, nil
	}
	m.storeMu.RLock()
	defer m.storeMu.RUnlock()
	top, err := m.newLayer(ctx, r.Machine.BaseDisk, "", m.diskBytes(r.DiskGiB))
	if err != nil {
		return r, err
	}
	return m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		if len(rec.Machine.Disk) == 0 {
			rec.Machine.Disk = []string{top}
		}
		return nil
	})
}

// adopt connects the channel of a running QEMU, serves the guest's calls
// and watches for its exit.
func (m *Manager) adopt(id string, vm vmm.Machine, cfg vmm.Config, handshake bool) *machine {
	mc := &machine{id: id, vm: vm, groups: cfg.Groups, memoryMiB: cfg.MemoryMiB}
	mc.ch = channel.Dial(cfg.ChannelSocket(), channel.HostConfig{
		Log:         m.log.With("sandbox", id),
		Plain:       !handshake,
		Heartbeat:   m.cfg.Heartbeat,
		PingTimeout: m.cfg.PingTimeout,
		Stalled: func(ctx context.Context) (bool, error) {
			// A guest whose CPUs are stopped (paused, or being saved)
			// cannot answer; one whose CPUs run should have. One that
			// QEMU stopped on a fault (io-error: its disk found the
			// store full) will not answer either, and nobody will
			// resume it: it counts as not answering, and says why. A
			// failed look is the channel's to count (maxUnsure).
			st, err := vm.State(ctx)
			if err != nil {
				return false, err
			}
			if st.Stuck() {
				mc.stuck.Store(st.Status)
				return true, nil
			}
			mc.stuck.Store("")
			return st.Running, nil
		},
		Answering: func(n uint64, up bool) { m.answering(mc, n, up) },
	})
	mc.guest = guestclient.New(mc.ch.Open, guestCallLimits, guestclient.NewBudget(guestCallBudget))
	mc.guestLn = mc.ch.Listener()
	m.mu.Lock()
	m.live[id] = mc
	m.mu.Unlock()
	if m.cfg.ServeGuest != nil {
		go m.cfg.ServeGuest(id, mc.guestLn)
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-vm.Done():
		case <-m.ctx.Done():
			return
		}
		m.mu.Lock()
		if m.live[id] == mc {
			delete(m.live, id)
		}
		m.mu.Unlock()
		mc.guestLn.Close()
		mc.ch.Close()
		vm.Close()
		if mc.exitExpected() {
			return
		}
		m.log.Error("sandbox's QEMU exited unexpectedly", "sandbox", id, "console", consoleTail(cfg.ConsoleLog()))
		m.cfg.Records.Update(context.Background(), id, func(r *Record) error {
			if r.State == Destroying || r.State == Stopped {
				return nil
			}
			r.State, r.Error = Error, errUnexpectedExit
			if r.Machine != nil {
				r.Machine.Process = nil
			}
			return nil
		})
	}()
	return mc
}

// waitGuest waits for guestd's first answer through the channel: probe
// (its health route, or a loaded guest's resync) is sent at once and
// answered when guestd serves, and sent again while nothing answers. An
// answer that refuses (guestd's error) ends the wait with it.
func (m *Manager) waitGuest(ctx context.Context, mc *machine, what string, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	for {
		attempt, acancel := context.WithTimeout(ctx, 15*time.Second)
		err := probe(attempt)
		acancel()
		if err == nil {
			return nil
		}
		var refused *guestRefused
		if errors.As(err, &refused) {
			return fmt.Errorf("guestd refused its %s: %w", what, err)
		}
		m.log.Debug("guestd not answering yet", "sandbox", mc.id, "call", what, "err", err)
		select {
		case <-mc.vm.Done():
			return errors.New("QEMU exited during the boot")
		case <-ctx.Done():
			return fmt.Errorf("guestd did not answer its %s within %v: %w", what, m.cfg.BootTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func guestHealth(ctx context.Context, mc *machine) error {
	_, err := guestCall(ctx, mc, http.MethodGet, "/v1/health", nil)
	return err
}

// The manager's own calls to a guest (health, resync, shutdown, the sync
// before a disk snapshot) answer a few bytes: at most 4 at once, 64 KiB
// an answer, 256 KiB held, through the host's one guest client.
var guestCallLimits = guestclient.Limits{Calls: 4, MaxAnswer: 64 << 10, Timeout: 30 * time.Second}

const guestCallBudget = 256 << 10

// guestCall sends one request to guestd through the channel (a JSON body,
// or none) and wants a 200, whose body it returns; the call ends at ctx's
// end, answer or not.
func guestCall(ctx context.Context, mc *machine, method, path string, body []byte) ([]byte, error) {
	a, err := mc.guest.Do(ctx, guestclient.Request{
		Method: method, Path: path, Body: body,
		Header:     http.Header{"Content-Type": {"application/json"}},
		Idempotent: method == http.MethodGet,
	})
	if err != nil {
		return nil, err
	}
	defer a.Release()
	b := slices.Clone(a.Body)
	if a.Status != http.StatusOK {
		return b, &guestRefused{fmt.Sprintf("guestd %s %s: %d: %.300s", method, path, a.Status, b)}
	}
	return b, nil
}

// guestRefused is guestd's answer other than 200 to a manager's call.
type guestRefused struct{ msg string }

func (e *guestRefused) Error() string { return e.msg }

// Dial opens a stream to the guestd of a running sandbox (the vm:// guest
// address scheme).
func (m *Manager) Dial(ctx context.Context, id string) (net.Conn, error) {
	mc := m.machineOf(id)
	if mc == nil {
		return nil, &net.OpError{Op: "dial", Net: GuestScheme, Err: fmt.Errorf("sandbox %s has no running machine", id)}
	}
	c, err := mc.ch.Open(ctx)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: GuestScheme, Err: err}
	}
	return c, nil
}

// Pause saves a running sandbox's memory to the host's store and ends its
// QEMU, freeing the host's memory: 202-style, the record says pausing
// until it is paused. Resume loads it back, processes as they were. A
// paused sandbox is returned as it is.
func (m *Manager) Pause(ctx context.Context, id string) (Record, error) {
	// The store must hold the guest's memory: refused now, not after a
	// 202 that a failed save would take back.
	r, err := m.cfg.Records.Get(ctx, id)
	if err != nil {
		return Record{}, err
	}
	if r.Machine != nil && r.State == Running {
		if err := m.checkStorage(int64(r.MemoryMiB) << 20); err != nil {
			return Record{}, err
		}
	}
	return m.transition(ctx, id, Running, Pausing, Paused, m.saveAndQuit)
}

// saveAndQuit writes the guest's memory to a new state, names it in the
// record (the commit point: from there the sandbox's memory is the file),
// and ends QEMU. Before the commit a failure leaves the guest running.
// The store's lock is held only to make the state file, which is claimed
// until the record names it: a collection never waits for the save.
func (m *Manager) saveAndQuit(ctx context.Context, mc *machine) error {
	m.storeMu.RLock()
	sid, f, err := m.newState()
	err = m.storageFault(err)
	release := func() {}
	if err == nil {
		release = m.claimFile(sid + stateExt)
	}
	m.storeMu.RUnlock()
	if err != nil {
		return err
	}
	defer release()
	defer f.Close()
	st, err := mc.vm.Save(ctx, f, vmm.SaveOptions{})
	if err == nil {
		err = f.Sync()
	}
	failpoint.Hit(FailpointPauseSaved)
	if err == nil {
		_, err = m.cfg.Records.Update(ctx, mc.id, func(r *Record) error {
			// The whole memory is in the state now: the next boot needs
			// no template.
			r.Machine.Saved = sid
			r.Machine.dropRAM()
			r.Machine.LoadDisk = slices.Clone(r.Machine.Disk)
			return nil
		})
	}
	if err != nil {
		// The save stopped the guest; it runs on as if never paused.
		mc.vm.Resume(context.WithoutCancel(ctx))
		os.Remove(m.statePath(sid))
		return m.saveFault(err, int64(mc.memoryMiB)<<20)
	}
	m.log.Debug("sandbox memory saved", "sandbox", mc.id, "took", st.Total.Round(time.Millisecond), "bytes", allocated(m.statePath(sid)))
	mc.expectExit()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := mc.vm.Quit(qctx); err != nil {
		mc.vm.Kill()
	}
	m.teardown(mc.id)
	return nil
}

// Resume brings a paused sandbox back: from its saved memory (a pause
// that freed it), or by starting the CPUs of a QEMU that kept it.
func (m *Manager) Resume(ctx context.Context, id string) (Record, error) {
	return giveWay(ctx, m, func() (Record, error) { return m.resume(ctx, id) })
}

func (m *Manager) resume(ctx context.Context, id string) (Record, error) {
	r, err := m.cfg.Records.Get(ctx, id)
	if err != nil {
		return Record{}, err
	}
	if r.Machine == nil || r.Machine.Saved == "" || r.State != Paused {
		return m.transition(ctx, id, Paused, Resuming, Running, func(ctx context.Context, mc *machine) error { return mc.vm.Resume(ctx) })
	}
	// The load runs on a new top (loadTop).
	if err := m.checkStorage(layerBytes); err != nil {
		return Record{}, err
	}
	done, err := m.begin(id)
	if err != nil {
		return Record{}, err
	}
	// A pause template still being made is not waited for.
	m.stopPauseTemplate(id, false)
	return m.bootAs(ctx, id, done, Resuming, func(r *Record) (bool, error) {
		switch {
		case r.State == Running:
			return false, nil
		case r.State != Paused || r.Machine.Saved == "":
			return false, ErrWrongState.With("state", string(r.State))
		}
		if t := r.Machine.savedTemplate(); t != nil && m.haveFiles(m.ramPath(t.RAM, t.RAMOffset), m.statePath(t.State)) {
			// Through the pause's template, as a fork: the paused
			// state's RAM mapped where it is, its devices alone loaded.
			// SavedTemplate stays, for a failure to undo (unmapResume).
			r.Machine.Saved = t.State
			r.Machine.RAM, r.Machine.RAMGid, r.Machine.RAMOffset = t.RAM, t.Gid, t.RAMOffset
		} else {
			r.Machine.SavedTemplate = nil
		}
		return true, nil
	})
}

func (m *Manager) transition(ctx context.Context, id string, from, via, to State, do func(context.Context, *machine) error) (Record, error) {
	done, err := m.begin(id)
	if err != nil {
		return Record{}, err
	}
	r, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
		switch {
		case r.Machine == nil:
			return ErrNotAMachine
		case r.State == to:
			return nil
		case r.State != from:
			return ErrNotRunning.With("state", string(r.State))
		}
		r.State = via
		return nil
	})
	if err != nil || r.State == to {
		done()
		return r, err
	}
	m.background(id, done, func(ctx context.Context) {
		mc := m.machineOf(id)
		if mc == nil {
			m.setState(id, Error, errUnexpectedExit)
			return
		}
		qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := do(qctx, mc)
		cancel()
		op := map[State]string{Pausing: "pause", Resuming: "resume"}[via]
		if err != nil {
			// Answered 202 already: the record says why it is back.
			m.log.Error("sandbox "+string(via)+" failed", "sandbox", id, "err", err)
			failed := &OpError{Operation: op, Message: "the operation failed on the host; the sandbox is as it was", At: time.Now().UTC()}
			if fe := fault.As(err); fe != nil {
				failed.Code, failed.Message = fe.Code, fe.Message
			}
			m.setStateWith(id, from, "", func(r *Record) { r.LastError = failed }, via)
			return
		}
		m.setStateWith(id, to, "", func(r *Record) {
			if r.LastError != nil && r.LastError.Operation == op {
				r.LastError = nil
			}
		}, via)
		m.log.Info("sandbox "+string(to), "sandbox", id)
		if to == Paused {
			m.pauseTemplateLater(id)
		}
	})
	return r, nil
}

// Stop shuts a sandbox down cleanly: guestd syncs, init unmounts and
// powers off; QEMU is killed if it has not exited within StopTimeout.
func (m *Manager) Stop(ctx context.Context, id string) (Record, error) {
	done, err := m.begin(id)
	if err != nil {
		return Record{}, err
	}
	defer done()
	m.stopPauseTemplate(id, false)
	r, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
		switch {
		case r.Machine == nil:
			return ErrNotAMachine
		case r.State == Stopped:
			return nil
		case r.State == Destroying || r.State == Destroyed:
			return ErrWrongState.With("state", string(r.State))
		}
		r.State = Stopping
		// A stopped sandbox boots cold: memory a pause saved goes.
		r.Machine.Saved, r.Machine.FromTemplate, r.Machine.SavedTemplate = "", nil, nil
		r.Machine.dropRAM()
		r.Machine.LoadDisk = nil
		return nil
	})
	if err != nil || r.State == Stopped {
		return r, err
	}
	m.shutdown(id)
	r, err = m.setState(id, Stopped, "", Stopping)
	if cerr := m.collect(ctx); cerr != nil {
		m.log.Warn("store not collected after a stop", "sandbox", id, "err", cerr)
	}
	m.compactLater(id) // the disk a pause saved may have gone
	return r, err
}

// shutdown ends the sandbox's QEMU, cleanly if it can.
func (m *Manager) shutdown(id string) {
	mc := m.machineOf(id)
	if mc == nil {
		return
	}
	mc.expectExit()
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.StopTimeout)
	defer cancel()
	if running, err := mc.vm.Running(ctx); err == nil && !running {
		mc.vm.Resume(ctx)
	}
	clean := m.askShutdown(ctx, mc) == nil
	select {
	case <-mc.vm.Done():
	case <-ctx.Done():
		clean = false
		mc.vm.Kill()
		<-mc.vm.Done()
	}
	m.teardown(id)
	m.log.Info("sandbox stopped", "sandbox", id, "clean", clean, "took", time.Since(t0).Round(time.Millisecond))
}

func (m *Manager) askShutdown(ctx context.Context, mc *machine) error {
	_, err := guestCall(ctx, mc, http.MethodPost, "/v1/shutdown", nil)
	return err
}

// teardown kills the sandbox's QEMU if it still runs and forgets it.
func (m *Manager) teardown(id string) {
	m.mu.Lock()
	mc := m.live[id]
	delete(m.live, id)
	m.mu.Unlock()
	if mc == nil {
		return
	}
	mc.expectExit()
	mc.vm.Kill()
	<-mc.vm.Done()
	mc.guestLn.Close()
	mc.ch.Close()
	mc.vm.Close()
}

// Delete ends the sandbox's QEMU, deletes its disk and run directory, and
// then its record.
func (m *Manager) Delete(ctx context.Context, id string) error {
	return m.deleteIf(ctx, id, func(*Record) error { return nil })
}

// deleteIf is Delete of a sandbox whose record check lets it, checked in
// the transaction that marks it destroying.
func (m *Manager) deleteIf(ctx context.Context, id string, check func(*Record) error) error {
	done, err := m.begin(id)
	if errors.Is(err, ErrInProgress) {
		// A boot, pause or resume in the background gives way to a
		// delete; a stop or another delete (in the foreground) does not.
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		m.cancelRunning(wctx, id)
		cancel()
		done, err = m.begin(id)
	}
	if err != nil {
		return err
	}
	defer done()
	m.stopPauseTemplate(id, false)
	if _, err := m.cfg.Records.Update(ctx, id, func(r *Record) error {
		if r.Machine == nil {
			return ErrNotAMachine
		}
		if err := check(r); err != nil {
			return err
		}
		r.State = Destroying
		return nil
	}); err != nil {
		return err
	}
	// Recorded as destroying: the rest runs to its end even if the
	// caller hangs up.
	return m.destroy(context.WithoutCancel(ctx), id)
}

func (m *Manager) destroy(ctx context.Context, id string) error {
	m.teardown(id)
	m.setForkAheadStopped(id, false)
	if err := os.RemoveAll(m.dir(id)); err != nil {
		return err
	}
	if err := syncDir(m.cfg.Dir); err != nil {
		return err
	}
	if err := m.cfg.Records.Delete(ctx, id); err != nil {
		return err
	}
	m.log.Info("sandbox destroyed", "sandbox", id)
	// Its disk and snapshots go, except what forks still name.
	if err := m.collect(ctx); err != nil {
		m.log.Warn("store not collected after a delete", "sandbox", id, "err", err)
	}
	return nil
}

// setState writes a final state (and its error sentence) and returns the
// record; with from given, only over one of those states (a watcher that
// saw the QEMU die has written error meanwhile: that stands). A running
// QEMU's process stays recorded; a stopped one's is dropped. The
// operation's busy mark is released in the same transaction, so that a
// client that reads the final state can act on it at once.
//
// Lock order: the registry's transaction, then m.mu; never the reverse
// (nothing calls Records while holding m.mu).
func (m *Manager) setState(id string, s State, sentence string, from ...State) (Record, error) {
	return m.setStateWith(id, s, sentence, nil, from...)
}

// setStateWith is setState that also applies edit (when not nil) to the
// record it moves.
func (m *Manager) setStateWith(id string, s State, sentence string, edit func(*Record), from ...State) (Record, error) {
	r, err := m.cfg.Records.Update(context.Background(), id, func(r *Record) error {
		m.mu.Lock()
		delete(m.busy, id)
		m.mu.Unlock()
		if len(from) > 0 && !slices.Contains(from, r.State) {
			m.log.Info("sandbox state kept", "sandbox", id, "state", r.State, "not", s)
			return nil
		}
		r.State, r.Error = s, sentence
		if edit != nil {
			edit(r)
		}
		if r.Machine != nil && (s == Stopped || s == Error || s == Paused && r.Machine.Saved != "") {
			// No QEMU runs for it (a pause that saved its memory
			// ended its QEMU).
			r.Machine.Process = nil
		}
		return nil
	})
	if err != nil {
		m.log.Error("sandbox state not recorded", "sandbox", id, "state", s, "err", err)
	}
	return r, err
}

// Recover adopts the QEMUs an earlier process left running, kills QEMUs
// of this state directory that no record claims, and then settles the
// transitions the earlier process left half-done. A sandbox that cannot
// be settled is put in error; it does not keep the others, or the host
// service, from starting.
func (m *Manager) Recover(ctx context.Context) error {
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return err
	}
	for _, r := range records {
		if r.Machine != nil {
			if err := m.adoptLegacyDisk(ctx, r); err != nil {
				m.log.Error("sandbox disk not moved into the store", "sandbox", r.ID, "err", err)
			}
		}
	}
	if records, err = m.cfg.Records.List(ctx); err != nil {
		return err
	}
	// Adopt first: whatever is adopted is claimed, and only then are the
	// unclaimed QEMUs killed, before any boot below starts a new one.
	claimed := map[int]bool{}
	adopted := map[string]vmm.Machine{}
	for _, r := range records {
		if r.Machine == nil || r.Machine.Process == nil {
			continue
		}
		p := r.Machine.Process
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		vm, err := m.cfg.Driver.Attach(actx, m.vmConfig(r), *p)
		cancel()
		if err != nil {
			m.log.Warn("sandbox's QEMU is gone", "sandbox", r.ID, "err", err)
			continue
		}
		claimed[p.Pid] = true
		adopted[r.ID] = vm
	}
	m.killStrays(claimed)
	// The directories of template QEMUs made ahead that a crash left
	// (their QEMUs were strays).
	if dirs, err := filepath.Glob(filepath.Join(m.cfg.Dir, "*"+templateDirSuffix)); err == nil {
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	for _, r := range records {
		m.failUnfinished(ctx, r, adopted[r.ID])
		m.failTorn(ctx, r)
		m.dropUnfinishedTemplates(ctx, r)
		m.dropUnfinishedPauseTemplate(ctx, r)
	}
	for _, r := range records {
		if r.Machine == nil {
			continue
		}
		if err := m.settle(ctx, r, adopted[r.ID], m.vmConfig(r)); err != nil {
			m.log.Error("sandbox could not be settled", "sandbox", r.ID, "err", err)
			m.setState(r.ID, Error, errStartFailedOnHost)
		}
	}
	if err := m.collect(ctx); err != nil {
		m.log.Error("store not collected", "err", err)
	}
	// Chains left long (by an earlier hostproxy, or a compaction a stop
	// interrupted) are shortened in the background.
	for _, r := range records {
		if r.Machine != nil {
			m.compactLater(r.ID)
		}
	}
	m.poolLater()
	// Those left are dropped, whatever Config.ForksAhead says: no
	// snapshot wants one yet.
	m.goAfter(func() { m.dropForksAhead(m.ctx) })
	return ctx.Err()
}

// dropUnfinishedTemplates forgets the templates a crash left half-made
// (their files are collected); the next fork makes them again.
func (m *Manager) dropUnfinishedTemplates(ctx context.Context, r Record) {
	if !slices.ContainsFunc(r.Snapshots, func(s Snapshot) bool { return s.Template != nil && s.Template.Building }) {
		return
	}
	for _, s := range r.Snapshots {
		if t := s.Template; t != nil && t.Building && t.RAMOffset > 0 {
			// The snapshot's state may have been given the template's
			// group already: root's alone again.
			p := m.ramPath(t.RAM, t.RAMOffset)
			if err := errors.Join(os.Lchown(p, 0, 0), os.Chmod(p, 0o600)); err != nil && !errors.Is(err, os.ErrNotExist) {
				m.log.Warn("a dropped template's group stays on the snapshot's state", "sandbox", r.ID, "snapshot", s.ID, "err", err)
			}
		}
	}
	m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		for i := range rec.Snapshots {
			if t := rec.Snapshots[i].Template; t != nil && t.Building {
				rec.Snapshots[i].Template = nil
			}
		}
		return nil
	})
}

// failTorn fails the ready snapshots whose files had not reached the disk
// when the host went down (a boot id not this boot's), and writes back
// the others' (a restart of the host service only).
func (m *Manager) failTorn(ctx context.Context, r Record) {
	boot := bootID()
	var torn []string
	for _, s := range r.Snapshots {
		switch {
		case s.Unsynced == "" || s.Status != SnapshotReady:
		case s.Unsynced == boot:
			m.syncLater(r.ID, s)
		default:
			torn = append(torn, s.ID)
		}
	}
	if len(torn) == 0 {
		return
	}
	m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		for i := range rec.Snapshots {
			if s := &rec.Snapshots[i]; slices.Contains(torn, s.ID) {
				s.Status, s.State, s.Disk, s.SizeBytes, s.Template, s.Unsynced = SnapshotFailed, "", nil, 0, nil, ""
				m.log.Warn("snapshot not on disk when the host went down: failed", "sandbox", r.ID, "snapshot", s.ID)
			}
		}
		return nil
	})
}

// failUnfinished marks the snapshots a crash interrupted as failed (their
// state may be half-written; their files are collected) and lets a guest
// the save had stopped run again. The sandbox's disk needs nothing: its
// record names the new top from before the save began (snapshot).
func (m *Manager) failUnfinished(ctx context.Context, r Record, vm vmm.Machine) {
	unfinished := false
	for _, s := range r.Snapshots {
		unfinished = unfinished || s.Status == SnapshotProcessing
	}
	if !unfinished {
		return
	}
	if vm != nil {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := vm.CancelSave(qctx); err != nil {
			m.log.Warn("interrupted save not cancelled", "sandbox", r.ID, "err", err)
		}
		if r.State == Running {
			if err := vm.Resume(qctx); err != nil {
				m.log.Warn("guest stopped by an interrupted save not resumed", "sandbox", r.ID, "err", err)
			}
		}
		cancel()
	}
	if _, err := m.cfg.Records.Update(ctx, r.ID, func(rec *Record) error {
		for i := range rec.Snapshots {
			if s := &rec.Snapshots[i]; s.Status == SnapshotProcessing {
				s.Status, s.State, s.Disk, s.SizeBytes = SnapshotFailed, "", nil, 0
				m.log.Warn("snapshot interrupted by the host service stopping: failed", "sandbox", r.ID, "snapshot", s.ID)
			}
		}
		return nil
	}); err != nil {
		m.log.Error("interrupted snapshots not recorded as failed", "sandbox", r.ID, "err", err)
	}
}

// settle finishes what a crash interrupted for one sandbox.
func (m *Manager) settle(ctx context.Context, r Record, vm vmm.Machine, cfg vmm.Config) error {
	id := r.ID
	if vm == nil {
		switch r.State {
		case Destroying, Destroyed:
			return m.destroy(ctx, id)
		case Stopping, Stopped:
			_, err := m.setState(id, Stopped, "")
			return err
		case Creating, Resuming:
			if r.State == Resuming && r.Machine.Saved == "" {
				break
			}
			done, err := m.begin(id)
			if err != nil {
				return err
			}
			m.background(id, done, func(ctx context.Context) { m.boot(ctx, id, r.State) })
			return nil
		case Paused:
			if r.Machine.Saved != "" {
				return nil // its memory is in the store
			}
		case Error:
			return nil
		}
		_, err := m.setState(id, Error, errGoneWhileAway)
		return err
	}
	if (r.State == Creating || r.State == Resuming) && r.Machine.Saved != "" {
		// A load the crash interrupted: the QEMU waiting for (or
		// holding half of) the state is of no use; the load starts over.
		vm.Kill()
		<-vm.Done()
		vm.Close()
		return m.settle(ctx, r, nil, cfg)
	}
	mc := m.adopt(id, vm, cfg, r.Machine.Handshake)
	switch r.State {
	case Destroying, Destroyed:
		return m.destroy(ctx, id)
	case Stopping:
		m.shutdown(id)
		_, err := m.setState(id, Stopped, "")
		return err
	case Creating:
		done, err := m.begin(id)
		if err != nil {
			return err
		}
		m.background(id, done, func(ctx context.Context) {
			if err := m.waitGuest(ctx, mc, "health", func(ctx context.Context) error { return guestHealth(ctx, mc) }); err != nil {
				if m.ctx.Err() != nil {
					m.leaveBoot(id, err)
					return
				}
				m.teardown(id)
				if ctx.Err() != nil {
					return // cancelled for a delete
				}
				m.setState(id, Error, errBootFailed, Creating)
				return
			}
			if m.cfg.Booted != nil {
				m.cfg.Booted(ctx, r)
			}
			m.setState(id, Running, "", Creating)
		})
		return nil
	}
	if (r.State == Pausing || r.State == Paused) && r.Machine.Saved != "" {
		// A pause whose memory is saved and named, and whose QEMU had not
		// ended yet: it ends now.
		mc.expectExit()
		m.teardown(id)
		_, err := m.setState(id, Paused, "")
		return err
	}
	// Running, paused, or half-way between: the CPUs say which.
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	running, err := vm.Running(qctx)
	if err == nil && !running && (r.State == Running || r.State == Pausing) {
		// Stopped by a save that the crash interrupted (a snapshot, a
		// restore's automatic one, a pause not yet named): a paused
		// sandbox's memory is never kept in QEMU, so it runs on.
		m.log.Info("guest stopped by an interrupted save: it runs on", "sandbox", id)
		vm.CancelSave(qctx)
		if err = vm.Resume(qctx); err == nil {
			running = true
		}
	}
	cancel()
	if err != nil {
		// One machine that does not answer must not keep hostproxy from
		// starting: it keeps its recorded state.
		m.log.Warn("adopted sandbox's QEMU does not say whether it runs", "sandbox", id, "err", err)
		return nil
	}
	s := Paused
	if running {
		s = Running
	}
	if s != r.State {
		_, err = m.setState(id, s, "")
	}
	m.log.Info("sandbox adopted", "sandbox", id, "state", s, "pid", vm.Process().Pid)
	return err
}

// killStrays kills QEMUs whose command line names a run directory of this
// manager but that no record claims (a crash between starting QEMU and
// recording it), and waits for them to exit, so that none still holds the
// disk a boot is about to open.
func (m *Manager) killStrays(claimed map[int]bool) {
	procs, _ := os.ReadDir("/proc")
	prefix := []byte(m.cfg.Dir + "/")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || claimed[pid] {
			continue
		}
		// The pidfd first: the pid cannot be reused under the check.
		pidfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		// A machine's QEMU runs in its run directory (its command line
		// names no path of the machines directory).
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		cwd, cerr := vmm.RunDirOf(pid)
		if err != nil || cerr != nil || !bytes.Contains(cmdline, []byte("qemu-system")) || !strings.HasPrefix(cwd, string(prefix)) {
			unix.Close(pidfd)
			continue
		}
		m.log.Warn("killing a QEMU that no sandbox record claims", "pid", pid)
		if unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0) == nil {
			unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, 5000)
		}
		unix.Close(pidfd)
	}
}

// freeUID is the lowest uid of the deployment's range that no record
// holds.
func (m *Manager) freeUID(ctx context.Context) (uint32, error) {
	records, err := m.cfg.Records.List(ctx)
	if err != nil {
		return 0, err
	}
	used := map[uint32]bool{}
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

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
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
