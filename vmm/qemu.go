package vmm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"log/slog"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Process identifies a QEMU process across restarts of its caller: a pid
// alone could be reused by another program.
type Process struct {
	Pid int `json:"pid"`
	// StartTime is the process's start time in clock ticks since boot
	// (/proc/PID/stat, field 22).
	StartTime uint64 `json:"start_time"`
}

// Machine is a running QEMU of one Config.
type Machine interface {
	// Process identifies the QEMU, to Attach to it again later.
	Process() Process
	// Pause stops the guest's CPUs; Resume starts them again.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// Running tells whether the guest's CPUs run (false when paused).
	Running(ctx context.Context) (bool, error)
	// State is QEMU's run state: whether the CPUs run, and why not.
	State(ctx context.Context) (RunState, error)
	// Kill ends QEMU at once (a power cut for the guest).
	Kill() error
	// Done is closed once QEMU has exited.
	Done() <-chan struct{}
	// Close drops the control connection; QEMU keeps running.
	Close() error

	// Save writes the guest's memory and device state (a snapshot, or a
	// pause that frees the host's memory); Load reads one into a machine
	// started with Incoming.
	Save(ctx context.Context, state *os.File, opts SaveOptions) (SaveStats, error)
	Load(ctx context.Context, state *os.File) error
	// CancelSave ends a save its caller did not finish (it crashed).
	CancelSave(ctx context.Context) error
	// SwitchDisk freezes the disk's top under a new, empty one.
	SwitchDisk(ctx context.Context, top Layer) error
	// StreamDisk merges the layers between the top and base into the
	// top and drops them (their node names).
	StreamDisk(ctx context.Context, base Layer, drop []string) error
	// RebaseDisk puts onto, a frozen layer that reads the same as the
	// layers drop (their node names, top first) over the node backing,
	// in their place under the node above, and drops them.
	RebaseDisk(ctx context.Context, above string, onto Layer, backing string, drop []string) error
	// Quit ends QEMU through its monitor and waits for its exit.
	Quit(ctx context.Context) error
	// Background lowers QEMU's priority: its work is the host's own,
	// which nobody waits for (Background, background.go).
	Background() error
}

// Driver starts and adopts machines.
type Driver interface {
	Start(ctx context.Context, cfg Config) (Machine, error)
	Attach(ctx context.Context, cfg Config, p Process) (Machine, error)
}

// QEMU is the Driver for qemu-system-x86_64.
type QEMU struct {
	// Binary is the QEMU program (qemu-system-x86_64 on PATH when empty).
	Binary string
	Log    *slog.Logger
}

// Version returns the first line of `qemu --version`; a memory snapshot
// records it.
func (d *QEMU) Version(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, d.binary(), "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", d.binary(), err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line), nil
}

func (d *QEMU) binary() string {
	if d.Binary != "" {
		return d.Binary
	}
	return "qemu-system-x86_64"
}

func (d *QEMU) log() *slog.Logger {
	if d.Log != nil {
		return d.Log
	}
	return slog.New(slog.DiscardHandler)
}

// Start runs QEMU for cfg and returns once its QMP answers. QEMU runs in a
// session of its own as cfg.Uid: it outlives its caller, which finds it
// again with Attach. A QEMU that fails to come up is killed before Start
// returns.
func (d *QEMU) Start(ctx context.Context, cfg Config) (Machine, error) {
	argv, err := cfg.Argv()
	if err != nil {
		return nil, err
	}
	ctl, err := openControlDir(cfg.Ctl)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	// Nothing the caller holds may leak into a QEMU that outlives it:
	// every descriptor beyond stdio becomes close-on-exec (Go's own are).
	unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	// The monitor, channel, console and NIC sockets, in the order of the
	// fd numbers Argv gives them (fdQMP, fdChannel, fdConsole, fdNet).
	var socks []*os.File
	defer func() { closeAll(socks) }()
	for _, name := range []string{qmpSocket, channelSocket, consoleSocket, netSocket} {
		f, err := listenIn(ctl, name)
		if err != nil {
			return nil, err
		}
		socks = append(socks, f)
	}
	groups := append([]uint32{}, cfg.Groups...)
	if cfg.Accel == KVM {
		// QEMU opens /dev/kvm as the machine's uid: through its group.
		var st unix.Stat_t
		if err := unix.Stat("/dev/kvm", &st); err == nil {
			groups = append(groups, st.Gid)
		}
	}
	disk, err := openDisk(cfg.Disk)
	if err != nil {
		return nil, err
	}
	defer closeAll(disk)
	extra := append(slices.Clone(socks), disk...)
	if cfg.RAM != nil && cfg.RAM.InMemory {
		ram, err := memfd(cfg.Name, int64(cfg.MemoryMiB)<<20)
		if err != nil {
			return nil, err
		}
		defer ram.Close()
		extra = append(extra, ram)
	}
	// QEMU's own output goes through a pipe into a capped log of the
	// control directory (exec copies it; Wait returns once it is all
	// in). After the caller restarts, the pipe has no reader: QEMU
	// ignores SIGPIPE, and what it says then is lost.
	qlog := newCappedLog(cfg.QEMULog(), LogBytes)
	cmd := exec.Command(d.binary(), argv...)
	cmd.ExtraFiles = extra
	cmd.Dir = cfg.Dir
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = qlog, qlog
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setsid:     true,
		Credential: &syscall.Credential{Uid: cfg.Uid, Gid: cfg.Gid, Groups: groups},
		// A network namespace of its own, with nothing but a loopback
		// that is down: QEMU needs no network (its sockets are handed
		// over), and its seccomp filter allows connect(2), so a QEMU
		// the guest escaped into would otherwise reach the host's
		// services and networks. About 1.5 ms more per start.
		Cloneflags: syscall.CLONE_NEWNET,
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", d.binary(), err)
	}
	closeAll(socks) // QEMU's now
	socks = nil
	m := newMachine(cfg, d.log())
	m.proc.Pid = cmd.Process.Pid
	go func() {
		err := cmd.Wait()
		qlog.Close()
		// How it ended (an exit status, or the signal that killed it):
		// a QEMU that ends in its first second says nothing else.
		d.log().Debug("qemu exited", "machine", cfg.Name, "pid", m.proc.Pid, "how", cmd.ProcessState.String(), "after", time.Since(t0).Round(time.Millisecond))
		m.exited(err)
	}()
	m.drain()
	fail := func(err error) (Machine, error) {
		cmd.Process.Kill()
		<-m.done
		m.Close()
		return nil, fmt.Errorf("%w%s", err, logTail(cfg.QEMULog()))
	}
	if m.proc.StartTime, err = startTime(m.proc.Pid); err != nil {
		return fail(err)
	}
	if err := m.connect(ctx); err != nil {
		return fail(err)
	}
	d.log().Debug("qemu started", "machine", cfg.Name, "pid", m.proc.Pid, "took", time.Since(t0))
	return m, nil
}

// Attach adopts the QEMU p that an earlier process started for cfg. It
// fails when p is no longer that QEMU (exited, or its pid reused).
func (d *QEMU) Attach(ctx context.Context, cfg Config, p Process) (Machine, error) {
	// The pidfd first: once it is open, the pid cannot be reused under
	// the checks that follow.
	pidfd, err := unix.PidfdOpen(p.Pid, 0)
	if err != nil {
		return nil, fmt.Errorf("qemu of %s (pid %d): %w", cfg.Name, p.Pid, ErrGone)
	}
	st, err := startTime(p.Pid)
	if err != nil || st != p.StartTime {
		unix.Close(pidfd)
		return nil, fmt.Errorf("qemu of %s (pid %d): %w", cfg.Name, p.Pid, ErrGone)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.Pid))
	cwd, cerr := RunDirOf(p.Pid)
	if err != nil || cerr != nil || !isMachineOf(cmdline, cwd, cfg) {
		unix.Close(pidfd)
		return nil, fmt.Errorf("qemu of %s (pid %d): the process is not this machine's QEMU: %w", cfg.Name, p.Pid, ErrGone)
	}
	// Its sockets are dialled in the control directory only: checked
	// here, as Start checks it.
	if ctl, err := openControlDir(cfg.Ctl); err != nil {
		unix.Close(pidfd)
		return nil, fmt.Errorf("qemu of %s (pid %d): %w", cfg.Name, p.Pid, err)
	} else {
		ctl.Close()
	}
	m := newMachine(cfg, d.log())
	m.proc, m.pidfd = p, pidfd
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(pidfd)
		return nil, err
	}
	m.wake = wake
	go func() {
		// Not our child: its exit is seen through the pidfd, and init
		// reaps it. The eventfd ends the watch of an Attach that failed.
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}, {Fd: int32(wake), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err != unix.EINTR {
				break
			}
		}
		m.mu.Lock()
		unix.Close(m.wake)
		m.wake = -1
		given := fds[1].Revents != 0 && fds[0].Revents == 0
		if given {
			unix.Close(m.pidfd)
			m.pidfd = -1
		}
		m.mu.Unlock()
		if !given {
			m.exited(nil)
		}
	}()
	m.drain()
	if err := m.connect(ctx); err != nil {
		select {
		case <-m.done:
			m.stopWatching()
			m.Close()
			return nil, fmt.Errorf("qemu of %s (pid %d): %w", cfg.Name, p.Pid, ErrGone)
		default:
		}
		// Alive, but its monitor does not answer now (stopped, wedged):
		// it is adopted all the same (it can be killed, its exit is
		// seen), and the monitor is dialled again when next needed.
		d.log().Warn("adopted QEMU's monitor does not answer; it is dialled again when needed", "machine", cfg.Name, "pid", p.Pid, "err", err)
	}
	return m, nil
}

// ErrGone is returned by Attach for a QEMU that no longer runs, or whose
// pid is now another process's. Any other error of Attach is a QEMU that
// runs but cannot be controlled now.
var ErrGone = errors.New("the process is gone")

type qemuMachine struct {
	cfg  Config
	proc Process

	// stop ends the console's drain (Close); drained is closed once it
	// has ended.
	stop     chan struct{}
	stopOnce sync.Once
	drained  chan struct{}

	qmpMu sync.Mutex
	qmp   *QMP

	mu      sync.Mutex
	pidfd   int
	wake    int // eventfd that ends an adopted machine's watch
	done    chan struct{}
	gone    chan struct{} // closed at QEMU's exit, before done
	exitErr error

	log *slog.Logger
}

func newMachine(cfg Config, log *slog.Logger) *qemuMachine {
	return &qemuMachine{cfg: cfg, log: log, done: make(chan struct{}), gone: make(chan struct{}), pidfd: -1, wake: -1, stop: make(chan struct{}), drained: make(chan struct{})}
}

// drain copies the guest's console into its capped log in the
// background, until QEMU exits or Close.
func (m *qemuMachine) drain() {
	go func() {
		defer close(m.drained)
		drainConsole(m.cfg.consoleSocket(), newCappedLog(m.cfg.ConsoleLog(), LogBytes), m.gone, m.stop)
	}()
}

// stopWatching ends the watch of an adopted machine that is given up.
func (m *qemuMachine) stopWatching() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.wake >= 0 {
		var one [8]byte
		one[0] = 1
		unix.Write(m.wake, one[:])
	}
}

func (m *qemuMachine) Process() Process      { return m.proc }
func (m *qemuMachine) Done() <-chan struct{} { return m.done }

// exited records QEMU's exit. Done closes once the console's drain has
// read what QEMU wrote before it exited (a stop's last console lines are
// in the log when Done closes), or after drainGrace.
func (m *qemuMachine) exited(err error) {
	m.mu.Lock()
	m.exitErr = err
	if m.pidfd >= 0 {
		unix.Close(m.pidfd)
		m.pidfd = -1
	}
	m.mu.Unlock()
	close(m.gone)
	select {
	case <-m.drained:
	case <-time.After(drainGrace):
	}
	close(m.done)
}

// drainGrace bounds the wait for the console's last bytes after QEMU
// exits.
const drainGrace = 2 * time.Second

// connect waits for the QMP socket (QEMU makes it early in its start)
// and negotiates it.
func (m *qemuMachine) connect(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		q, err := DialQMP(ctx, m.cfg.QMPSocket())
		if err == nil {
			m.qmp = q
			return nil
		}
		select {
		case <-m.done:
			return fmt.Errorf("qemu of %s exited while starting (%v)", m.cfg.Name, m.exitErr)
		case <-ctx.Done():
			return fmt.Errorf("qemu of %s: qmp: %w (last: %v)", m.cfg.Name, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// monitor is the QMP connection, dialled again when an adopted QEMU's
// did not answer at first or has closed.
func (m *qemuMachine) monitor(ctx context.Context) (*QMP, error) {
	m.qmpMu.Lock()
	defer m.qmpMu.Unlock()
	if m.qmp != nil {
		select {
		case <-m.qmp.Done():
		default:
			return m.qmp, nil
		}
	}
	q, err := DialQMP(ctx, m.cfg.QMPSocket())
	if err != nil {
		return nil, fmt.Errorf("qemu of %s: monitor: %w", m.cfg.Name, err)
	}
	m.qmp = q
	return q, nil
}

func (m *qemuMachine) execute(ctx context.Context, command string) (json.RawMessage, error) {
	q, err := m.monitor(ctx)
	if err != nil {
		return nil, err
	}
	return q.Execute(ctx, command, nil)
}

func (m *qemuMachine) Pause(ctx context.Context) error {
	_, err := m.execute(ctx, "stop")
	return err
}

func (m *qemuMachine) Resume(ctx context.Context) error {
	_, err := m.execute(ctx, "cont")
	return err
}

func (m *qemuMachine) Running(ctx context.Context) (bool, error) {
	st, err := m.State(ctx)
	return st.Running, err
}

func (m *qemuMachine) State(ctx context.Context) (RunState, error) {
	ret, err := m.execute(ctx, "query-status")
	if err != nil {
		return RunState{}, err
	}
	return parseRunState(ret)
}

// RunState is QEMU's run state (query-status).
type RunState struct {
	// Running tells whether the guest's CPUs run.
	Running bool
	// Status is QEMU's word for the state: "running", "paused" (a stop),
	// "postmigrate" (after a save), "io-error" (a disk write failed:
	// QEMU stops the guest on ENOSPC, werror=enospc, its default),
	// "internal-error", "guest-panicked", ...
	Status string
}

// Stuck tells whether QEMU stopped the guest for a fault that nothing
// lifts by itself: its guest cannot answer, and is not paused by anyone
// who will resume it.
func (s RunState) Stuck() bool {
	switch s.Status {
	case "io-error", "internal-error", "guest-panicked":
		return true
	}
	return false
}

func parseRunState(ret json.RawMessage) (RunState, error) {
	var st struct {
		Running bool   `json:"running"`
		Status  string `json:"status"`
	}
	if err := json.Unmarshal(ret, &st); err != nil {
		return RunState{}, fmt.Errorf("query-status: %w", err)
	}
	return RunState{Running: st.Running, Status: st.Status}, nil
}

// Kill sends SIGKILL: through the pidfd for an adopted QEMU (a reused pid
// cannot be hit), to the child otherwise (its pid is ours until reaped).
func (m *qemuMachine) Kill() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-m.gone:
		return nil // a child's pid may be another process's now
	default:
	}
	if m.pidfd >= 0 {
		return unix.PidfdSendSignal(m.pidfd, unix.SIGKILL, nil, 0)
	}
	return unix.Kill(m.proc.Pid, unix.SIGKILL)
}

// Close drops the monitor and ends the console's drain (what the guest
// writes meanwhile is dropped, until the next Attach drains it again).
func (m *qemuMachine) Close() error {
	m.stopOnce.Do(func() { close(m.stop) })
	<-m.drained
	m.qmpMu.Lock()
	defer m.qmpMu.Unlock()
	if m.qmp != nil {
		return m.qmp.Close()
	}
	return nil
}

// openDisk opens the layers of a disk chain as QEMU inherits them, in the
// order of diskFDs: the top read-write and read-only, the rest read-only.
func openDisk(layers []Layer) ([]*os.File, error) {
	var files []*os.File
	open := func(path string, flag int) error {
		f, err := os.OpenFile(path, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("disk layer: %w", err)
		}
		files = append(files, f)
		return nil
	}
	for i, l := range layers {
		flags := []int{os.O_RDONLY}
		if i == 0 {
			flags = []int{os.O_RDWR, os.O_RDONLY}
		}
		for _, fl := range flags {
			if err := open(l.Path, fl); err != nil {
				closeAll(files)
				return nil, err
			}
		}
	}
	return files, nil
}

// memfd is RAM in memory for a machine: a memfd of size bytes (QEMU's
// file backend refuses a file smaller than the RAM), which QEMU's uid
// opens again through /proc/self/fd (a memfd's mode lets anyone who holds
// it do so).
func memfd(name string, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate("strata-ram-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("RAM in memory: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:strata-ram-"+name)
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("RAM in memory: %w", err)
	}
	return f, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// startTime reads field 22 of /proc/PID/stat.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStartTime(b)
}

// parseStartTime reads the start time from a /proc/PID/stat line. The
// command name (field 2) may hold spaces and parentheses: fields are
// counted after its last ')'.
func parseStartTime(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return 0, errors.New("stat: too few fields")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// openRegular opens path without following a symbolic link at its end,
// and fails unless it is a regular file.
func openRegular(path string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK, perm)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	return f, nil
}

// logTail is the end of QEMU's log, for an error about its start.
func logTail(path string) string {
	b := ReadTail(path, 2000)
	if len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return ": qemu says: " + strings.TrimSpace(string(b))
}
