package guestd

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// oomScoreAdj is guestd's own oom_score_adj inside a microVM: the kernel's
// out-of-memory killer never picks it (init, PID 1, is never picked
// either).
const oomScoreAdj = "-1000"

// execCgroups is the exec cgroup tree of a running guestd (cgroup.go):
// the parent of the execs' cgroups, held open, and their limits.
type execCgroups struct {
	dir    *os.File // cgroupExec
	limits execLimits
	log    *slog.Logger
	seq    atomic.Uint64

	// live names the cgroups of execs under way, which sweep leaves
	// alone (one is empty between its creation and its program's start).
	mu   sync.Mutex
	live map[string]bool

	// protected tells that guestd's oom_score_adj is oomScoreAdj; starts
	// then hold startMu while they switch it (see start).
	protected bool
	startMu   sync.Mutex
}

// setupCgroups applies setupPlan on the cgroup2 file system mounted at
// mount, with limits from the guest's memory and task limits, makes
// guestd's oom_score_adj oomScoreAdj, and removes the empty exec cgroups
// an earlier guestd of this boot left (populated ones, the background
// processes of earlier execs, stay).
func setupCgroups(mount string, log *slog.Logger) (*execCgroups, error) {
	root, err := os.Open(mount)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(root.Fd()), &st); err != nil {
		return nil, os.NewSyscallError("fstatfs "+mount, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, fmt.Errorf("%s is not a cgroup2 file system", mount)
	}
	available, err := readAt(root, "cgroup.controllers")
	if err != nil {
		return nil, err
	}
	controllers, err := controllersFor(strings.Fields(available))
	if err != nil {
		return nil, err
	}
	lim, err := guestLimits()
	if err != nil {
		return nil, err
	}
	for _, c := range controllers {
		lim.CPU = lim.CPU || c == "cpu"
	}
	for _, w := range setupPlan(controllers, lim) {
		if err := applyAt(root, w); err != nil {
			return nil, err
		}
	}
	fd, err := unix.Openat(int(root.Fd()), cgroupExec, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, os.NewSyscallError("open "+cgroupExec, err)
	}
	c := &execCgroups{dir: os.NewFile(uintptr(fd), mount+"/"+cgroupExec), limits: lim, log: log, live: map[string]bool{}}
	if err := writeOOMScoreAdj(oomScoreAdj); err != nil {
		log.Warn("exec cgroups: guestd cannot protect itself from the out-of-memory killer", "err", err)
	} else {
		c.protected = true
	}
	c.sweep()
	return c, nil
}

// guestLimits reads the guest's memory and task limits and computes the
// execs' (limitsFor).
func guestLimits() (execLimits, error) {
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return execLimits{}, err
	}
	mem, err := parseMeminfo(string(meminfo))
	if err != nil {
		return execLimits{}, err
	}
	tasks := uint64(1) << 22 // the kernel's PID_MAX_LIMIT
	for _, f := range []string{"/proc/sys/kernel/threads-max", "/proc/sys/kernel/pid_max"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return execLimits{}, err
		}
		n, err := parseCount(string(b))
		if err != nil {
			return execLimits{}, fmt.Errorf("%s: %w", f, err)
		}
		tasks = min(tasks, n)
	}
	return limitsFor(mem, tasks), nil
}

// applyAt does one step of a plan relative to dir. A cgroup that exists
// already is no failure (an earlier guestd of this boot made it).
func applyAt(dir *os.File, w cgroupWrite) error {
	if w.Mkdir != "" {
		if err := unix.Mkdirat(int(dir.Fd()), w.Mkdir, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("cgroup: %s: %w", w, err)
		}
		return nil
	}
	if err := writeAt(dir, w.File, w.Value); err != nil {
		return fmt.Errorf("cgroup: %s: %w", w, err)
	}
	return nil
}

// writeAt writes value to the file name below dir, in one write (a
// cgroup file takes one value a write).
func writeAt(dir *os.File, name, value string) error {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(value))
	return err
}

// readAt reads the file name below dir (a small kernel file).
func readAt(dir *os.File, name string) (string, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", fmt.Errorf("cgroup: open %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	return string(b), err
}

func writeOOMScoreAdj(v string) error {
	return os.WriteFile("/proc/self/oom_score_adj", []byte(v), 0)
}

// sweep removes the exec cgroups that no process is left in: those of
// execs whose background processes have ended since, and those whose
// removal after a kill came before the kernel had emptied them.
// Populated ones fail with EBUSY and stay.
func (c *execCgroups) sweep() {
	f, err := openDirAt(c.dir, ".")
	if err != nil {
		c.log.Warn("exec cgroups: sweep", "err", err)
		return
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		c.log.Warn("exec cgroups: sweep", "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range entries {
		if e.IsDir() && !c.live[e.Name()] {
			_ = unix.Unlinkat(int(c.dir.Fd()), e.Name(), unix.AT_REMOVEDIR)
		}
	}
}

func openDirAt(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, os.NewSyscallError("open "+name, err)
	}
	return os.NewFile(uintptr(fd), dir.Name()+"/"+name), nil
}

// execCgroup is the cgroup of one exec, held open.
type execCgroup struct {
	parent *execCgroups
	name   string
	dir    *os.File
}

// create makes a new exec's cgroup with its limits (execPlan). It first
// sweeps the empty ones.
func (c *execCgroups) create() (*execCgroup, error) {
	c.sweep()
	name, err := c.mkdir()
	if err != nil {
		return nil, err
	}
	dir, err := openDirAt(c.dir, name)
	if err != nil {
		c.forget(name)
		_ = unix.Unlinkat(int(c.dir.Fd()), name, unix.AT_REMOVEDIR)
		return nil, fmt.Errorf("exec cgroup: %w", err)
	}
	g := &execCgroup{parent: c, name: name, dir: dir}
	for _, w := range execPlan(c.limits) {
		if err := applyAt(dir, w); err != nil {
			g.remove()
			return nil, fmt.Errorf("exec cgroup %s: %w", name, err)
		}
	}
	return g, nil
}

// mkdir makes a cgroup of a new name and marks it live.
func (c *execCgroups) mkdir() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		name := strconv.FormatUint(c.seq.Add(1), 10)
		err := unix.Mkdirat(int(c.dir.Fd()), name, 0o755)
		if err == nil {
			c.live[name] = true
			return name, nil
		}
		if !errors.Is(err, unix.EEXIST) { // EEXIST: one an earlier guestd left populated
			return "", fmt.Errorf("exec cgroup: mkdir %s/%s: %w", c.dir.Name(), name, err)
		}
	}
}

func (c *execCgroups) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.live, name)
}

// start starts cmd inside g. guestd's oom_score_adj (oomScoreAdj) would
// pass to the program at the fork, and a program's own processes could
// then never be picked by the out-of-memory killer; so the fork happens
// with guestd's switched back to 0 for its duration, under startMu.
func (c *execCgroups) start(cmd *exec.Cmd, g *execCgroup) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(g.dir.Fd())
	c.startMu.Lock()
	defer c.startMu.Unlock()
	if c.protected {
		if err := writeOOMScoreAdj("0"); err != nil {
			c.log.Warn("exec: oom_score_adj", "err", err)
		}
		defer func() {
			if err := writeOOMScoreAdj(oomScoreAdj); err != nil {
				c.log.Warn("exec: oom_score_adj", "err", err)
			}
		}()
	}
	return cmd.Start()
}

// kill kills every process in g (cgroup.kill): the kernel sends SIGKILL
// to each, forks under way included.
func (g *execCgroup) kill() error {
	return writeAt(g.dir, "cgroup.kill", "1")
}

// oomKills is how many of g's processes the out-of-memory killer killed
// (memory.events oom_kill); 0 when it cannot be read.
func (g *execCgroup) oomKills() uint64 {
	s, err := readAt(g.dir, "memory.events")
	if err != nil {
		return 0
	}
	return parseFlatKeyed(s)["oom_kill"]
}

// remove closes g and removes its cgroup; it fails with EBUSY while a
// process is left in it, and the cgroup is no longer live: a later sweep
// removes it once it is empty.
func (g *execCgroup) remove() error {
	g.dir.Close()
	defer g.parent.forget(g.name)
	return unix.Unlinkat(int(g.parent.dir.Fd()), g.name, unix.AT_REMOVEDIR)
}
