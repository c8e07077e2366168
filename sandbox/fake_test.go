package sandbox_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"strata/channel"
	"strata/sandbox"
	"strata/vmm"
)

// plan is how the next machines a fakeDriver starts behave.
type plan struct {
	// gate, when not nil, holds guestd back until it is closed: a slow
	// boot the test releases.
	gate <-chan struct{}
	// hang is a boot that never ends: guestd never serves.
	hang bool
	// stuckShutdown is a guest that takes POST /v1/shutdown and never
	// answers it nor powers off.
	stuckShutdown bool
	// saveGate, when not nil, holds every Save back (after its disk
	// switch) until it is closed: a save the test releases.
	saveGate <-chan struct{}
	// streamGate, when not nil, holds every StreamDisk back until it is
	// closed (or its context ends): a compaction the test releases.
	streamGate <-chan struct{}
	// saveENOSPC fails every Save as a full disk would.
	saveENOSPC bool
	// saveFails, when not empty, fails every Save (after saveGate) with
	// this text and no errno, as QEMU's monitor reports a failed
	// migration.
	saveFails string
}

// fakeDriver is a TEST DOUBLE of vmm.QEMU. Start plays QEMU: it serves
// the channel socket of the machine's run directory and runs a fake guest
// behind it (the guest end of package channel, and an HTTP server with
// guestd's /v1/health and /v1/shutdown). Machines are kept by pid, so
// that a second Manager can Attach to them as a restarted hostproxy does.
type fakeDriver struct {
	log *slog.Logger

	mu       sync.Mutex
	next     plan
	pid      int
	machines map[int]*fakeMachine
	byID     map[string][]*fakeMachine // every machine started, per sandbox
}

func newFakeDriver(log *slog.Logger) *fakeDriver {
	return &fakeDriver{log: log, pid: 4000, machines: map[int]*fakeMachine{}, byID: map[string][]*fakeMachine{}}
}

var _ vmm.Driver = (*fakeDriver)(nil)

// setPlan makes every machine started from now on behave as p.
func (d *fakeDriver) setPlan(p plan) {
	d.mu.Lock()
	d.next = p
	d.mu.Unlock()
}

// last is the machine last started for sandbox id, or nil.
func (d *fakeDriver) last(id string) *fakeMachine {
	d.mu.Lock()
	defer d.mu.Unlock()
	ms := d.byID[id]
	if len(ms) == 0 {
		return nil
	}
	return ms[len(ms)-1]
}

// starts is the number of machines started for sandbox id.
func (d *fakeDriver) starts(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.byID[id])
}

// running is every machine that has not exited.
func (d *fakeDriver) running() []*fakeMachine {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*fakeMachine
	for _, m := range d.machines {
		if !m.exited() {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].proc.Pid < out[j].proc.Pid })
	return out
}

func (d *fakeDriver) Start(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, l := range cfg.Disk {
		if _, err := os.Stat(l.Path); err != nil {
			return nil, fmt.Errorf("fake qemu: disk: %w", err)
		}
	}
	// QEMU makes its socket anew: a stale one of an earlier boot is removed.
	if err := os.Remove(cfg.ChannelSocket()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.Listen("unix", cfg.ChannelSocket())
	if err != nil {
		return nil, fmt.Errorf("fake qemu: %w", err)
	}
	// QEMU is handed its socket as a descriptor and never unlinks it: a
	// machine that ends while a newer one of the sandbox runs (a
	// restore's automatic snapshot written in the background) leaves
	// the newer one's socket in place.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	d.mu.Lock()
	d.pid++
	m := &fakeMachine{
		cfg: cfg, plan: d.next, ln: ln,
		proc:  vmm.Process{Pid: d.pid, StartTime: uint64(d.pid) * 7},
		conns: make(chan net.Conn, 4),
		done:  make(chan struct{}),
		top:   cfg.Disk[0].Node,
	}
	m.paused.Store(cfg.Incoming)
	d.mu.Unlock()
	m.boot(d.log.With("fake", cfg.Name))
	d.mu.Lock()
	d.machines[m.proc.Pid] = m
	d.byID[cfg.Name] = append(d.byID[cfg.Name], m)
	d.mu.Unlock()
	return m, nil
}

// Attach adopts a machine this driver started and that still runs, as
// vmm.QEMU does through the pid and its start time.
func (d *fakeDriver) Attach(ctx context.Context, cfg vmm.Config, p vmm.Process) (vmm.Machine, error) {
	d.mu.Lock()
	m := d.machines[p.Pid]
	d.mu.Unlock()
	if m == nil || m.proc != p || m.cfg.Name != cfg.Name || m.exited() {
		return nil, fmt.Errorf("fake qemu of %s (pid %d): %w", cfg.Name, p.Pid, vmm.ErrGone)
	}
	return m, nil
}

// fakeMachine is one fake QEMU and the guest inside it.
type fakeMachine struct {
	cfg  vmm.Config
	plan plan
	proc vmm.Process
	ln   net.Listener
	// conns are the connections accepted on the channel socket: the
	// guest end's port reads the next one, as a virtio-serial port reads
	// whichever host end QEMU has connected.
	conns chan net.Conn
	guest *channel.Guest
	srv   *http.Server

	paused    atomic.Bool
	ioError   atomic.Bool  // State says io-error
	loaded    atomic.Value // string: the machine whose state Load read
	loadedTop atomic.Value // string: the disk top that state was saved over
	saves     atomic.Int32 // Save calls begun
	lowered   atomic.Int32 // Background calls
	streams   atomic.Int32 // StreamDisk calls begun
	streamed  atomic.Int32 // StreamDisk calls completed
	rebases   atomic.Int32 // RebaseDisk calls completed
	topMu     sync.Mutex
	top       string       // the disk's top node
	shutdowns atomic.Int32 // POST /v1/shutdown received
	resyncs   atomic.Int32 // POST /v1/resync received
	hostname  atomic.Value // string: the last hostname a resync sent
	healths   atomic.Int32 // GET /v1/health answered

	once sync.Once
	done chan struct{}
	how  atomic.Value // string: "killed" or "powered off"

	// guestd plays the guest's daemon restarting (killGuestd): the port
	// each guest end opened, and whether its daemon was killed.
	portMu sync.Mutex
	port   *guestdPort
}

// guestdPort is the port as one guestd has it open: the connection is
// QEMU's and outlives the guestd. When that guestd is killed its reads
// end and its writes go nowhere; the connection stays open, unread, for
// the next guestd, as a virtio-serial port does.
type guestdPort struct {
	net.Conn
	killed atomic.Bool
}

func (p *guestdPort) Read(b []byte) (int, error) {
	n, err := p.Conn.Read(b)
	if p.killed.Load() {
		return 0, io.EOF
	}
	return n, err
}

func (p *guestdPort) Write(b []byte) (int, error) {
	if p.killed.Load() {
		return len(b), nil
	}
	return p.Conn.Write(b)
}

func (p *guestdPort) Close() error {
	if p.killed.Load() {
		return nil
	}
	return p.Conn.Close()
}

// killGuestd kills the guest's daemon: its end of the channel goes
// silent while the host's connection stays open. With restart, a new
// daemon opens the port after a moment, as guestinit starts one.
func (m *fakeMachine) killGuestd(log *slog.Logger, restart bool) {
	m.portMu.Lock()
	old, p := m.guest, m.port
	m.portMu.Unlock()
	if p != nil {
		p.killed.Store(true)
		p.Conn.SetReadDeadline(time.Now()) // its reader ends
	}
	old.Close()
	if !restart {
		return
	}
	time.Sleep(100 * time.Millisecond)
	if p != nil {
		p.Conn.SetReadDeadline(time.Time{})
		// The new daemon first reads the connection that is still open.
		m.conns <- p.Conn
	}
	g := channel.ListenGuest(m.openPort, log)
	m.portMu.Lock()
	m.guest = g
	m.portMu.Unlock()
	go m.srv.Serve(g.Listener())
}

func (m *fakeMachine) boot(log *slog.Logger) {
	go func() {
		for {
			c, err := m.ln.Accept()
			if err != nil {
				return
			}
			select {
			case m.conns <- c:
			case <-m.done:
				c.Close()
				return
			}
		}
	}()
	m.guest = channel.ListenGuest(m.openPort, log)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		m.healths.Add(1)
		writeJSend(w, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("POST /v1/resync", func(w http.ResponseWriter, r *http.Request) {
		m.resyncs.Add(1)
		var req struct{ Hostname *string }
		if json.NewDecoder(r.Body).Decode(&req) == nil && req.Hostname != nil {
			m.hostname.Store(*req.Hostname)
		}
		writeJSend(w, map[string]any{"clock_step_ns": 0, "reseeded": true})
	})
	mux.HandleFunc("POST /v1/shutdown", func(w http.ResponseWriter, r *http.Request) {
		m.shutdowns.Add(1)
		if m.plan.stuckShutdown {
			<-m.done
			return
		}
		writeJSend(w, map[string]string{})
		// guestd answers, then init syncs, unmounts and powers off.
		go func() {
			time.Sleep(20 * time.Millisecond)
			m.exit("powered off")
		}()
	})
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ln := m.guest.Listener()
	go func() {
		if m.plan.hang {
			return
		}
		if m.plan.gate != nil {
			select {
			case <-m.plan.gate:
			case <-m.done:
				return
			}
		}
		m.srv.Serve(ln)
	}()
}

func writeJSend(w http.ResponseWriter, data any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": data})
}

// openPort is the guest end's port: the next host end QEMU accepted.
func (m *fakeMachine) openPort() (io.ReadWriteCloser, error) {
	select {
	case c := <-m.conns:
		p := &guestdPort{Conn: c}
		m.portMu.Lock()
		m.port = p
		m.portMu.Unlock()
		return p, nil
	case <-m.done:
		return nil, io.EOF
	}
}

// exit ends the machine once: Done closes at once, then the guest and
// the socket go away.
func (m *fakeMachine) exit(how string) {
	m.once.Do(func() {
		m.how.Store(how)
		close(m.done)
		m.ln.Close()
		m.srv.Close()
		m.portMu.Lock()
		g := m.guest
		m.portMu.Unlock()
		g.Close()
	})
}

func (m *fakeMachine) exited() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// howExited is "killed", "powered off", or "" while the machine runs.
func (m *fakeMachine) howExited() string {
	s, _ := m.how.Load().(string)
	return s
}

func (m *fakeMachine) Process() vmm.Process { return m.proc }

func (m *fakeMachine) Pause(ctx context.Context) error {
	if m.exited() {
		return errors.New("fake qemu: exited")
	}
	m.paused.Store(true)
	return nil
}

func (m *fakeMachine) Resume(ctx context.Context) error {
	if m.exited() {
		return errors.New("fake qemu: exited")
	}
	m.paused.Store(false)
	return nil
}

func (m *fakeMachine) Running(ctx context.Context) (bool, error) {
	st, err := m.State(ctx)
	return st.Running, err
}

// State is running or paused, or io-error once ioError is set (as QEMU
// stops a guest whose disk write found the store full).
func (m *fakeMachine) State(ctx context.Context) (vmm.RunState, error) {
	switch {
	case m.exited():
		return vmm.RunState{}, errors.New("fake qemu: exited")
	case m.ioError.Load():
		return vmm.RunState{Status: "io-error"}, nil
	case m.paused.Load():
		return vmm.RunState{Status: "paused"}, nil
	}
	return vmm.RunState{Running: true, Status: "running"}, nil
}

// Kill is a power cut: Done closes before Kill returns.
func (m *fakeMachine) Kill() error {
	m.exit("killed")
	return nil
}

func (m *fakeMachine) Done() <-chan struct{} { return m.done }

// Close drops the control connection; the machine keeps running.
func (m *fakeMachine) Close() error { return nil }

// fakeState is what a fake Save writes: the machine and its disk's top.
type fakeState struct {
	Machine string `json:"machine"`
	Top     string `json:"top"`
}

// Save writes a fakeState; a live save leaves the machine running, another
// leaves it paused.
func (m *fakeMachine) Save(ctx context.Context, f *os.File, opts vmm.SaveOptions) (vmm.SaveStats, error) {
	if m.exited() {
		return vmm.SaveStats{}, errors.New("fake qemu: exited")
	}
	m.saves.Add(1)
	var st vmm.SaveStats
	if m.plan.saveENOSPC {
		return st, fmt.Errorf("fake qemu: writing the state: %w", syscall.ENOSPC)
	}
	if opts.Overlay != nil {
		if err := m.SwitchDisk(ctx, *opts.Overlay); err != nil {
			return st, err
		}
		st.Switched = true
	}
	if m.plan.saveGate != nil {
		select {
		case <-m.plan.saveGate:
		case <-m.done:
			return st, errors.New("fake qemu: exited")
		case <-ctx.Done():
			// QEMU's save ends at its caller's deadline too (the
			// monitor's wait for it does).
			return st, ctx.Err()
		}
	}
	if m.plan.saveFails != "" {
		return st, errors.New(m.plan.saveFails)
	}
	if !opts.Live && !opts.Resume {
		m.paused.Store(true)
	}
	state := fakeState{Machine: m.cfg.Name, Top: m.Top0()}
	if m.cfg.RAM != nil && m.cfg.RAM.Shared {
		// A template: it never ran, its memory is the state it loaded;
		// its devices alone are saved.
		loaded, _ := m.loaded.Load().(string)
		top, _ := m.loadedTop.Load().(string)
		state = fakeState{Machine: loaded, Top: top}
		return st, json.NewEncoder(f).Encode(state)
	}
	st.Format = vmm.FormatMappedRAM
	return st, writeFakeState(f, state, int64(m.cfg.MemoryMiB)<<20)
}

// writeFakeState lays a whole state out as QEMU's mapped-ram does after
// strata's header (vmm.RAMRegionOf finds its RAM): one RAM block of
// ramBytes, its pages a hole, and the fakeState after them.
func writeFakeState(f *os.File, state fakeState, ramBytes int64) error {
	var b []byte
	b = append(b, "strata vm state\nformat=mapped-ram\n"...)
	b = append(b, make([]byte, 4096-len(b))...)
	b = append(b, "QEVM\x00\x00\x00\x03\x01\x00\x00\x00\x01\x03ram\x00\x00\x00\x00\x00\x00\x00\x04"...)
	b = binary.BigEndian.AppendUint64(b, uint64(ramBytes)|4)
	b = append(b, "\x0bmicrovm.ram"...)
	b = binary.BigEndian.AppendUint64(b, uint64(ramBytes))
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint64(b, 4096)
	bitmap := int64(len(b)) + 16 // after the two offsets
	pages := (bitmap + (ramBytes/4096+63)/64*8 + 1<<20 - 1) / (1 << 20) * (1 << 20)
	b = binary.BigEndian.AppendUint64(b, uint64(bitmap))
	b = binary.BigEndian.AppendUint64(b, uint64(pages))
	js, err := json.Marshal(state)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		return err
	}
	_, err = f.WriteAt(append(js, '\n'), pages+ramBytes)
	return err
}

// readFakeState reads what Save wrote: a fakeState after a mapped-ram
// layout of ramBytes of RAM, or alone (a template's devices).
func readFakeState(f *os.File, ramBytes int64) (fakeState, error) {
	var st fakeState
	var at int64
	if format, err := vmm.StateFormatOf(f); err != nil {
		return st, err
	} else if format == vmm.FormatMappedRAM {
		fi, err := f.Stat()
		if err != nil {
			return st, err
		}
		region, err := vmm.RAMRegionOf(f, fi.Size(), vmm.RAMID, ramBytes)
		if err != nil {
			return st, err
		}
		at = region.Offset + region.Bytes
	}
	err := json.NewDecoder(io.NewSectionReader(f, at, 1<<20)).Decode(&st)
	return st, err
}

// Load reads a fakeState into a machine started to load one.
func (m *fakeMachine) Load(ctx context.Context, f *os.File) error {
	if !m.cfg.Incoming {
		return errors.New("fake qemu: not started with -incoming")
	}
	if r := m.cfg.RAM; r != nil && !r.InMemory {
		// The RAM file must be there, as QEMU maps it, and the RAM
		// must fit in it from its offset.
		fi, err := os.Stat(r.Path)
		if err != nil {
			return fmt.Errorf("fake qemu: RAM file: %w", err)
		}
		if fi.Size() < r.Offset+int64(m.cfg.MemoryMiB)<<20 {
			return fmt.Errorf("fake qemu: RAM file of %d bytes: no %d MiB of RAM from %d", fi.Size(), m.cfg.MemoryMiB, r.Offset)
		}
	}
	st, err := readFakeState(f, int64(m.cfg.MemoryMiB)<<20)
	if err != nil {
		return fmt.Errorf("fake qemu: load: %w", err)
	}
	m.loaded.Store(st.Machine)
	m.loadedTop.Store(st.Top)
	return nil
}

func (m *fakeMachine) CancelSave(ctx context.Context) error { return nil }

func (m *fakeMachine) SwitchDisk(ctx context.Context, top vmm.Layer) error {
	if _, err := os.Stat(top.Path); err != nil {
		return fmt.Errorf("fake qemu: new top: %w", err)
	}
	if m.streams.Load() != m.streamed.Load() {
		// QEMU would refuse it with a job on the top: block jobs and a
		// snapshot of their node do not mix.
		return errors.New("fake qemu: the disk's top is being streamed")
	}
	m.topMu.Lock()
	m.top = top.Node
	m.topMu.Unlock()
	return nil
}

// StreamDisk checks what a QEMU would: the base is a file, and the job
// runs only in a machine that is running (not in prelaunch, not exited).
func (m *fakeMachine) StreamDisk(ctx context.Context, base vmm.Layer, drop []string) error {
	if m.exited() {
		return errors.New("fake qemu: exited")
	}
	if _, err := os.Stat(base.Path); err != nil {
		return fmt.Errorf("fake qemu: stream base: %w", err)
	}
	m.streams.Add(1)
	if m.plan.streamGate != nil {
		select {
		case <-m.plan.streamGate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	m.streamed.Add(1)
	return nil
}

// RebaseDisk checks what a QEMU would: the new layer is a file, and the
// node above and the dropped ones are named; the top stays the top.
func (m *fakeMachine) RebaseDisk(ctx context.Context, above string, onto vmm.Layer, backing string, drop []string) error {
	if m.exited() {
		return errors.New("fake qemu: exited")
	}
	if _, err := os.Stat(onto.Path); err != nil {
		return fmt.Errorf("fake qemu: rebase onto: %w", err)
	}
	if !vmm.ValidNode(above) || !vmm.ValidNode(backing) || len(drop) == 0 {
		return fmt.Errorf("fake qemu: rebase of %q over %q onto %q, dropping %v", above, backing, onto.Node, drop)
	}
	m.rebases.Add(1)
	return nil
}

func (m *fakeMachine) Top0() string {
	m.topMu.Lock()
	defer m.topMu.Unlock()
	return m.top
}

// Background counts the calls: a fake QEMU has no threads to lower.
func (m *fakeMachine) Background() error {
	m.lowered.Add(1)
	return nil
}

func (m *fakeMachine) Quit(ctx context.Context) error {
	m.exit("quit")
	return nil
}

// memRecords is sandbox.Records in memory. Records are kept as JSON, as
// the registry keeps them, so that no caller shares a Machine with the
// store.
type memRecords struct {
	mu sync.Mutex
	m  map[string][]byte
	// written is every record an update wrote, in order, so that a test
	// can see a state the sandbox was in only for moments.
	written map[string][]sandbox.Record
}

var _ sandbox.Records = (*memRecords)(nil)

func newMemRecords() *memRecords {
	return &memRecords{m: map[string][]byte{}, written: map[string][]sandbox.Record{}}
}

// wrote returns the records of id written since the n-th write, and how
// many there have been.
func (s *memRecords) wrote(id string, n int) ([]sandbox.Record, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := s.written[id]
	return slices.Clone(all[min(n, len(all)):]), len(all)
}

func (s *memRecords) Insert(ctx context.Context, r sandbox.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[r.ID]; ok {
		return fmt.Errorf("record %s exists", r.ID)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	s.m[r.ID] = b
	return nil
}

func (s *memRecords) Update(ctx context.Context, id string, fn func(*sandbox.Record) error) (sandbox.Record, error) {
	return s.update(id, fn, false)
}

// Take is Update that also checks the name, as the registry's does.
func (s *memRecords) Take(ctx context.Context, id string, fn func(*sandbox.Record) error) (sandbox.Record, error) {
	return s.update(id, fn, true)
}

func (s *memRecords) update(id string, fn func(*sandbox.Record) error, named bool) (sandbox.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.get(id)
	if err != nil {
		return sandbox.Record{}, err
	}
	if err := fn(&r); err != nil {
		return sandbox.Record{}, err
	}
	for other := range s.m {
		if !named || r.Name == "" {
			break
		}
		if other == id {
			continue
		}
		o, err := s.get(other)
		if err != nil {
			return sandbox.Record{}, err
		}
		if o.Account == r.Account && o.Name == r.Name && o.State != sandbox.Destroyed {
			return sandbox.Record{}, fmt.Errorf("name %s taken", r.Name)
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return sandbox.Record{}, err
	}
	s.m[id] = b
	s.written[id] = append(s.written[id], r)
	return r, nil
}

func (s *memRecords) get(id string) (sandbox.Record, error) {
	b, ok := s.m[id]
	if !ok {
		return sandbox.Record{}, sandbox.ErrNotFound
	}
	var r sandbox.Record
	err := json.Unmarshal(b, &r)
	return r, err
}

func (s *memRecords) Get(ctx context.Context, id string) (sandbox.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(id)
}

func (s *memRecords) List(ctx context.Context) ([]sandbox.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var all []sandbox.Record
	for id := range s.m {
		r, err := s.get(id)
		if err != nil {
			return nil, err
		}
		all = append(all, r)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	return all, nil
}

func (s *memRecords) Delete(ctx context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
	return nil
}
