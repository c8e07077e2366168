package vmm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The control directory (Config.Ctl) is where the host and a QEMU meet:
// root's alone, so that nothing the host dials or writes there can be
// swapped by the QEMU's uid (connect(2) and open(2) follow links, and an
// escaped QEMU could otherwise point the host at another sandbox's
// sockets). QEMU inherits its sockets as listening descriptors and never
// learns the directory's path.

// LogBytes caps each of a machine's logs (the console's, QEMU's own): the
// current file holds at most LogBytes, and the one before it (name.1)
// another LogBytes. A guest that writes its console without end costs the
// host 2 × LogBytes of disk, and no memory beyond a copy buffer.
const LogBytes = 1 << 20

// openControlDir opens the control directory, refusing a link, anything
// but a directory, and a directory that is not root's alone.
func openControlDir(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control directory %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("control directory %s: %w", path, err)
	}
	if err := checkControlDir(st); err != nil {
		f.Close()
		return nil, fmt.Errorf("control directory %s: %w", path, err)
	}
	return f, nil
}

// checkControlDir refuses a control directory that anyone but root could
// write, or even read.
func checkControlDir(st unix.Stat_t) error {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return errors.New("not a directory")
	}
	if st.Uid != 0 || st.Mode&0o077 != 0 {
		return fmt.Errorf("owned by uid %d with mode %#o: want root's, 0700", st.Uid, st.Mode&0o7777)
	}
	return nil
}

// listenIn makes a listening unix socket named name in the directory dir
// (a descriptor: the socket is bound through it, never through a path
// that could have changed since dir was checked), replacing one a
// previous QEMU of the machine was handed.
func listenIn(dir *os.File, name string) (*os.File, error) {
	if err := unix.Unlinkat(int(dir.Fd()), name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("socket %s: %w", name, err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	addr := &unix.SockaddrUnix{Name: fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), name)}
	if err := unix.Bind(fd, addr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("socket %s: bind: %w", name, err)
	}
	if err := unix.Fchmodat(int(dir.Fd()), name, 0o600, 0); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("socket %s: %w", name, err)
	}
	if err := unix.Listen(fd, 8); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("socket %s: listen: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// cappedLog is a log file of at most max bytes, rotated to path.1 when
// full. A write never fails and never blocks on anything but the file: a
// log that cannot be written (a full file system) drops what it is given,
// so that whoever drains a guest into it never stops draining.
type cappedLog struct {
	path string
	max  int64

	mu   sync.Mutex
	f    *os.File
	size int64
}

func newCappedLog(path string, max int64) *cappedLog {
	return &cappedLog{path: path, max: max}
}

func (l *cappedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		if l.f == nil || l.size >= l.max {
			if !l.open(l.f != nil) {
				return n, nil
			}
		}
		chunk := p[:min(int64(len(p)), l.max-l.size)]
		w, err := l.f.Write(chunk)
		l.size += int64(w)
		if err != nil {
			return n, nil
		}
		p = p[len(chunk):]
	}
	return n, nil
}

// open opens the current file, appending to what an earlier writer left,
// after rotating it when rotate or when it is full; it reports whether
// there is a file to write.
func (l *cappedLog) open(rotate bool) bool {
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	if !rotate {
		if fi, err := os.Lstat(l.path); err == nil && fi.Mode().IsRegular() && fi.Size() >= l.max {
			rotate = true
		}
	}
	if rotate {
		os.Rename(l.path, l.path+".1")
	}
	f, err := openRegular(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return false
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return false
	}
	size := fi.Size()
	if size >= l.max {
		// Not rotated (the rename failed): its content goes rather than
		// the cap.
		if f.Truncate(0) != nil {
			f.Close()
			return false
		}
		size = 0
	}
	l.f, l.size = f, size
	return true
}

// Close closes the current file.
func (l *cappedLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	return nil
}

// drainConsole copies the guest's console into its capped log until QEMU
// has exited (gone) and its last bytes are read, or stop is closed, dialling the console socket again when
// the connection ends while QEMU runs (QEMU serves one client at a time,
// and drops what the guest writes while none is connected: the guest's
// writes never wait on the host for long).
func drainConsole(path string, log *cappedLog, gone, stop <-chan struct{}) {
	defer log.Close()
	buf := make([]byte, 32<<10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			end := context.AfterFunc(ctx, func() { conn.Close() })
			io.CopyBuffer(log, conn, buf)
			end()
			conn.Close()
		}
		select {
		case <-gone:
			return
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ReadTail returns the last n bytes of a log of a machine (ConsoleLog,
// QEMULog): from the file at path, and from the one it rotated to
// (path.1) when the current one holds less than n.
func ReadTail(path string, n int64) []byte {
	cur := readFileTail(path, n)
	if int64(len(cur)) >= n {
		return cur
	}
	prev := readFileTail(path+".1", n-int64(len(cur)))
	return append(prev, cur...)
}

// ReadHead returns the first n bytes of the oldest part kept of a capped
// log: its rotated part (path.1) when there is one, else the log itself;
// never following a link. A guest that fails and restarts in a loop
// fills the tail; the boot's first lines say why (they are kept until the
// log has rotated twice: 1 MiB after them).
func ReadHead(path string, n int64) []byte {
	f, err := openRegular(path+".1", os.O_RDONLY, 0)
	if err != nil {
		if f, err = openRegular(path, os.O_RDONLY, 0); err != nil {
			return nil
		}
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return b
}

// readFileTail returns the last n bytes of the regular file at path,
// never following a link.
func readFileTail(path string, n int64) []byte {
	f, err := openRegular(path, os.O_RDONLY, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return b
}

// RunDirOf is the working directory of process pid: a machine's QEMU runs
// in its Config.Dir, which is how the caller tells the QEMUs of its
// machines directory from other processes (killStrays, tests). No path
// of the host's is in a QEMU's command line any more.
func RunDirOf(pid int) (string, error) {
	return os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
}

// isMachineOf tells whether a process with this command line (NUL
// separated, as /proc/PID/cmdline) and working directory is the QEMU of
// cfg: its -name is the machine's, and it runs in the machine's run
// directory.
func isMachineOf(cmdline []byte, cwd string, cfg Config) bool {
	args := bytes.Split(bytes.TrimSuffix(cmdline, []byte{0}), []byte{0})
	named := false
	for i := 0; i+1 < len(args); i++ {
		if string(args[i]) == "-name" {
			named = string(args[i+1]) == cfg.Name+",debug-threads=on"
			break
		}
	}
	return named && filepath.Clean(cwd) == filepath.Clean(cfg.Dir)
}
