package holders

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Holder kinds: how a process uses a directory.
const (
	KindCwd            = "cwd"             // its working directory is at or under the directory
	KindRoot           = "root"            // it is chrooted at or under the directory
	KindFD             = "fd"              // it holds an open file descriptor there
	KindMmap           = "mmap"            // it maps a file from there, its executable included
	KindMountNamespace = "mount-namespace" // its mount namespace holds a mount of the directory
	KindUnknown        = "unknown"         // a /proc entry of it could not be read
	KindUnseen         = "unseen"          // pid 0: a kernel gate saw a user that no scan found
)

// Holder is a process that uses a directory.
type Holder struct {
	PID     int    `json:"pid"`
	Command string `json:"command"` // from /proc/PID/comm
	Kind    string `json:"kind"`    // one of the Kind constants
}

// Target says what counts as using a directory.
type Target struct {
	// Path is the directory as seen in the caller's mount namespace.
	Path string
	// Dev is st_dev of the filesystem serving Path; for a managed root, the
	// overlay superblock's device.
	Dev uint64
	// WholeDev is true when Dev belongs to Path alone (an overlay mounted at
	// Path): any use of Dev counts, wherever it is reached from. When false
	// (a plain directory on a shared filesystem), a holder must also resolve
	// at or under Path; Dev 0 then means "match by path alone".
	WholeDev bool
	// BackingDirs are the layer directories behind the overlay. A mapping
	// whose path lies under one of them counts.
	BackingDirs []string
}

// Scanner finds the processes that use a directory by reading a /proc tree.
type Scanner struct {
	// Proc is the procfs mount point; "" means "/proc". Tests point it at a
	// fake tree built in a temporary directory.
	Proc string
}

// NewScanner returns a Scanner reading proc ("" for "/proc").
func NewScanner(proc string) *Scanner {
	if proc == "" {
		proc = "/proc"
	}
	return &Scanner{Proc: proc}
}

// Holders returns every process that uses the target, one entry per
// (pid, kind), sorted by pid then kind; nil when there is none. The calling
// process is never listed. A process that exits during the scan is left
// out. A /proc entry that exists but cannot be read (EACCES, ELOOP, EIO...)
// makes its process a holder of kind "unknown": unreadable is not idle.
//
// See the package documentation for what each kind matches, and why the
// answer is advisory.
func (s *Scanner) Holders(ctx context.Context, t Target) ([]Holder, error) {
	return s.run(ctx, t, false)
}

// MountNamespaces is the part of Holders that no kernel gate in the
// caller's namespace covers: the processes whose mount namespace holds a
// mount of the target (kind mount-namespace), and those whose namespace
// cannot be read (kind unknown). It reads one link per process and one
// mountinfo per foreign namespace, so it costs a fraction of Holders.
func (s *Scanner) MountNamespaces(ctx context.Context, t Target) ([]Holder, error) {
	return s.run(ctx, t, true)
}

func (s *Scanner) run(ctx context.Context, t Target, nsOnly bool) ([]Holder, error) {
	proc := s.Proc
	if proc == "" {
		proc = "/proc"
	}
	if t.Path == "" || t.Path[0] != '/' {
		return nil, fmt.Errorf("holders: target path %q is not absolute", t.Path)
	}
	t.Path = filepath.Clean(t.Path)
	backing := make([]string, 0, len(t.BackingDirs))
	for _, b := range t.BackingDirs {
		if b != "" {
			backing = append(backing, filepath.Clean(b))
		}
	}
	t.BackingDirs = backing

	selfNS, err := os.Readlink(proc + "/self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("holders: own mount namespace: %w", err)
	}
	pids, err := listPIDs(proc)
	if err != nil {
		return nil, err
	}
	sc := &scan{
		proc:   proc,
		t:      t,
		major:  unix.Major(t.Dev),
		minor:  unix.Minor(t.Dev),
		selfNS: selfNS,
		nsOnly: nsOnly,
		nsSeen: make(map[string]*nsAnswer),
	}

	workers := min(runtime.GOMAXPROCS(0), 16, len(pids))
	results := make([][]Holder, workers)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ws := newWorkspace()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(pids) {
					return
				}
				results[w] = sc.process(pids[i], ws, results[w])
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	var holders []Holder
	for _, r := range results {
		holders = append(holders, r...)
	}
	slices.SortFunc(holders, func(a, b Holder) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.Kind, b.Kind))
	})
	return holders, nil
}

// listPIDs returns the numeric entries of proc, without the caller's pid.
func listPIDs(proc string) ([]int, error) {
	f, err := os.Open(proc)
	if err != nil {
		return nil, fmt.Errorf("holders: %w", err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("holders: list %s: %w", proc, err)
	}
	self := os.Getpid()
	pids := make([]int, 0, len(names))
	for _, n := range names {
		if n == "" || n[0] < '0' || n[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(n)
		if err != nil || pid <= 0 || pid == self {
			continue
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// scan is the shared state of one Holders call.
type scan struct {
	proc         string
	t            Target
	major, minor uint32
	selfNS       string
	nsOnly       bool // mount namespaces only (MountNamespaces)

	nsMu   sync.Mutex
	nsSeen map[string]*nsAnswer // by mount namespace

	relOnce sync.Once
	relPath string // Path relative to the root of its filesystem
}

// workspace holds one worker's buffers, reused across processes.
type workspace struct {
	dents []byte
	link  []byte
	file  []byte
	st    unix.Stat_t
}

func newWorkspace() *workspace {
	return &workspace{
		dents: make([]byte, 8<<10),
		link:  make([]byte, unix.PathMax+64),
		file:  make([]byte, 64<<10),
	}
}

// kind bits, in the sort order of their names.
const (
	bitCwd = 1 << iota
	bitFD
	bitMmap
	bitMountNamespace
	bitRoot
	bitUnknown
)

var bitKinds = [...]string{KindCwd, KindFD, KindMmap, KindMountNamespace, KindRoot, KindUnknown}

// gone reports whether err says the process or the entry no longer exists.
func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH)
}

// process scans one process and appends its holders to out.
func (sc *scan) process(pid int, ws *workspace, out []Holder) []Holder {
	dirfd, err := unix.Open(sc.proc+"/"+strconv.Itoa(pid), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if gone(err) {
			return out
		}
		return append(out, Holder{PID: pid, Kind: KindUnknown})
	}
	defer unix.Close(dirfd)

	var bits int
	mark := func(bit int, match bool, err error) {
		switch {
		case err != nil && !gone(err):
			bits |= bitUnknown
		case err == nil && match:
			bits |= bit
		}
	}

	ns, err := readlinkAt(dirfd, "ns/mnt", ws)
	if err != nil && gone(err) {
		return out // exited before we looked
	}
	mark(0, false, err)

	if !sc.nsOnly {
		m, err := sc.linkMatches(dirfd, "cwd", ws)
		mark(bitCwd, m, err)
		m, err = sc.linkMatches(dirfd, "root", ws)
		mark(bitRoot, m, err)
		m, err = sc.linkMatches(dirfd, "exe", ws)
		mark(bitMmap, m, err)
		m, err = sc.fdsMatch(dirfd, ws)
		mark(bitFD, m, err)
		if bits&bitMmap == 0 {
			m, err = sc.mapsMatch(dirfd, ws)
			mark(bitMmap, m, err)
		}
	}
	if ns != "" && ns != sc.selfNS {
		m, err := sc.namespaceMatches(dirfd, ns, ws)
		mark(bitMountNamespace, m, err)
	}
	if bits == 0 {
		return out
	}

	// Reading comm doubles as the check that the process still exists.
	comm, err := readFileAt(dirfd, "comm", ws)
	if err != nil && gone(err) {
		return out
	}
	command := strings.TrimSuffix(string(comm), "\n")
	for i, k := range bitKinds {
		if bits&(1<<i) != 0 {
			out = append(out, Holder{PID: pid, Command: command, Kind: k})
		}
	}
	return out
}

// linkMatches stats the magic link name under dirfd (cwd, root, exe,
// fd/N) and reports whether it resolves into the target.
func (sc *scan) linkMatches(dirfd int, name string, ws *workspace) (bool, error) {
	if err := unix.Fstatat(dirfd, name, &ws.st, 0); err != nil {
		return false, err
	}
	devEq := uint64(ws.st.Dev) == sc.t.Dev
	if sc.t.WholeDev {
		return devEq, nil
	}
	if !devEq && sc.t.Dev != 0 {
		return false, nil
	}
	target, err := readlinkAt(dirfd, name, ws)
	if err != nil {
		return false, err
	}
	return atOrUnder(trimDeleted(target), sc.t.Path), nil
}

// fdsMatch reports whether any open file descriptor resolves into the
// target. A descriptor closed during the scan is skipped.
func (sc *scan) fdsMatch(dirfd int, ws *workspace) (bool, error) {
	fdfd, err := unix.Openat(dirfd, "fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fdfd)
	for {
		n, err := unix.Getdents(fdfd, ws.dents)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, err
		}
		if n <= 0 {
			return false, nil
		}
		for off := 0; off < n; {
			reclen := int(binary.NativeEndian.Uint16(ws.dents[off+16:]))
			name := ws.dents[off+19 : off+reclen]
			off += reclen
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if len(name) == 0 || name[0] == '.' {
				continue
			}
			m, err := sc.linkMatches(fdfd, unsafeString(name), ws)
			switch {
			case err != nil && !gone(err):
				// The access check is per process: if one fd is
				// unreadable, all are; do not pay for hundreds.
				return false, err
			case err == nil && m:
				return true, nil
			}
		}
	}
}

// mapsMatch reports whether a memory mapping of the process is a file of
// the target, reading /proc/PID/maps (one read per process, rather than one
// stat per map_files entry). A line reads
//
//	start-end perms offset major:minor inode   path
//
// with major and minor in hex. A mapping counts when its device is Dev
// (WholeDev; what 6.8+ kernels print for an overlay file), when its path is
// at or under Path (with Dev, or WholeDev: older kernels print the
// overlay's path with the layer file's device), or when its path is under
// a backing directory (kernels that print the layer file's own path).
func (sc *scan) mapsMatch(dirfd int, ws *workspace) (bool, error) {
	data, err := readFileAt(dirfd, "maps", ws)
	if err != nil {
		return false, err
	}
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		maj, min, path, ok := parseMapsLine(line)
		if !ok {
			continue
		}
		devEq := maj == sc.major && min == sc.minor
		if sc.t.WholeDev && devEq {
			return true, nil
		}
		if len(path) == 0 || path[0] != '/' {
			continue
		}
		p := trimDeleted(unsafeString(path))
		if atOrUnder(p, sc.t.Path) && (sc.t.WholeDev || devEq || sc.t.Dev == 0) {
			return true, nil
		}
		for _, b := range sc.t.BackingDirs {
			if atOrUnder(p, b) {
				return true, nil
			}
		}
	}
	return false, nil
}

// parseMapsLine returns the device and the path of a maps line; ok is
// false for anonymous mappings (inode 0) and malformed lines.
func parseMapsLine(line []byte) (maj, min uint32, path []byte, ok bool) {
	// Skip address range, perms and offset.
	for range 3 {
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			return 0, 0, nil, false
		}
		line = line[i+1:]
	}
	maj, line, ok = parseHex(line, ':')
	if !ok {
		return 0, 0, nil, false
	}
	min, line, ok = parseHex(line, ' ')
	if !ok {
		return 0, 0, nil, false
	}
	i := bytes.IndexByte(line, ' ')
	if i < 0 {
		i = len(line)
	}
	if i == 1 && line[0] == '0' {
		return 0, 0, nil, false // anonymous
	}
	line = bytes.TrimLeft(line[i:], " ")
	return maj, min, line, true
}

// parseHex parses hex digits up to sep and returns the rest after sep.
func parseHex(b []byte, sep byte) (uint32, []byte, bool) {
	var v uint32
	for i, c := range b {
		switch {
		case c == sep && i > 0:
			return v, b[i+1:], true
		case c >= '0' && c <= '9':
			v = v<<4 | uint32(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | uint32(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | uint32(c-'A'+10)
		default:
			return 0, nil, false
		}
	}
	return 0, nil, false
}

// nsAnswer is whether one mount namespace holds the target. Its mutex
// makes the processes of a namespace wait for the first one to read the
// mount table, rather than read it again.
type nsAnswer struct {
	mu    sync.Mutex
	known bool
	holds bool
}

// namespaceMatches reports whether the mount namespace ns, read through
// /proc/PID/mountinfo, holds a mount of the target. The answer is kept per
// namespace for the duration of the scan; a failed read is not kept, so the
// next process of the namespace tries again.
func (sc *scan) namespaceMatches(dirfd int, ns string, ws *workspace) (bool, error) {
	sc.nsMu.Lock()
	a := sc.nsSeen[ns]
	if a == nil {
		a = new(nsAnswer)
		sc.nsSeen[ns] = a
	}
	sc.nsMu.Unlock()

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.known {
		return a.holds, nil
	}
	data, err := readFileAt(dirfd, "mountinfo", ws)
	if err != nil {
		return false, err
	}
	mounts, err := mountinfo.GetMountsFromReader(bytes.NewReader(data), nil)
	if err != nil {
		return false, err
	}
	a.known, a.holds = true, sc.mountsHold(mounts)
	return a.holds, nil
}

// mountsHold applies the mount-namespace rule to another namespace's mount
// table. WholeDev: any mount of Dev (a copy of the overlay keeps its
// superblock alive). Plain directory: a mount of the directory or below it
// (a bind mount: same device, mount root at or under the directory's path
// inside its filesystem), or any mount whose mount point is at or under
// Path.
func (sc *scan) mountsHold(mounts []*mountinfo.Info) bool {
	for _, m := range mounts {
		devEq := uint32(m.Major) == sc.major && uint32(m.Minor) == sc.minor
		if sc.t.WholeDev {
			if devEq {
				return true
			}
			continue
		}
		if atOrUnder(m.Mountpoint, sc.t.Path) {
			return true
		}
		if devEq && atOrUnder(m.Root, sc.rootRelPath()) {
			return true
		}
	}
	return false
}

// rootRelPath returns Path relative to the root of the filesystem that
// serves it, from the caller's own mount table: /home/u/app on a mount of
// root "/" at "/home" is "/u/app".
func (sc *scan) rootRelPath() string {
	sc.relOnce.Do(func() {
		sc.relPath = sc.t.Path
		data, err := os.ReadFile(sc.proc + "/self/mountinfo")
		if err != nil {
			return
		}
		mounts, err := mountinfo.GetMountsFromReader(bytes.NewReader(data), nil)
		if err != nil {
			return
		}
		var best *mountinfo.Info
		for _, m := range mounts {
			if atOrUnder(sc.t.Path, m.Mountpoint) && (best == nil || len(m.Mountpoint) >= len(best.Mountpoint)) {
				best = m
			}
		}
		if best != nil {
			sc.relPath = filepath.Join(best.Root, strings.TrimPrefix(sc.t.Path, best.Mountpoint))
			if !strings.HasPrefix(sc.relPath, "/") {
				sc.relPath = "/" + sc.relPath
			}
		}
	})
	return sc.relPath
}

// readlinkAt reads the symlink name under dirfd into ws.link.
func readlinkAt(dirfd int, name string, ws *workspace) (string, error) {
	for {
		n, err := unix.Readlinkat(dirfd, name, ws.link)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return "", err
		}
		return string(ws.link[:n]), nil
	}
}

// readFileAt reads the whole file name under dirfd into ws.file, growing
// it as needed. The result aliases ws.file.
func readFileAt(dirfd int, name string, ws *workspace) ([]byte, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	n := 0
	for {
		if n == len(ws.file) {
			ws.file = append(ws.file, make([]byte, len(ws.file))...)
		}
		m, err := unix.Read(fd, ws.file[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if m <= 0 {
			return ws.file[:n], nil
		}
		n += m
	}
}

// trimDeleted drops the " (deleted)" the kernel appends to the path of an
// unlinked file: it still pins the filesystem.
func trimDeleted(p string) string {
	return strings.TrimSuffix(p, " (deleted)")
}

// atOrUnder reports whether p is dir or lies below it. Both must be
// absolute and clean; "/" is above every other path.
func atOrUnder(p, dir string) bool {
	if p == dir {
		return true
	}
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return len(p) > len(dir) && p[len(dir)] == '/' && strings.HasPrefix(p, dir)
}
