package guestinit

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// GuestdEnv is guestd's whole environment.
var GuestdEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LANG=C.UTF-8",
}

// Timeouts of the shutdown: together well under the host's 10 s before it
// kills QEMU, so that a clean stop always reaches the unmounts.
const (
	guestdStopTimeout = 4 * time.Second
	termTimeout       = 2 * time.Second
	killTimeout       = 1 * time.Second
	restartBackoff    = 1 * time.Second
)

// system is PID 1's state: the console it prints on and its children.
type system struct {
	con    io.Writer
	reaper *reaper
	params Params
}

// Main is strata-init: it never returns. Run anywhere but as PID 1 it
// refuses at once (it would mount and reboot the machine it runs on).
func Main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "strata-init: this is the init of a strata microVM; it runs only as PID 1")
		os.Exit(2)
	}
	s := &system{con: os.Stdout, reaper: newReaper()}
	defer func() {
		if r := recover(); r != nil {
			s.fatal(fmt.Errorf("panic: %v\n%s", r, debug.Stack()))
		}
	}()
	if err := s.boot(); err != nil {
		s.fatal(err)
	}
	s.serve()
}

func (s *system) logf(format string, args ...any) {
	fmt.Fprintf(s.con, "strata-init: "+format+"\n", args...)
}

// fatal prints err, syncs and reboots (the VM ends); PID 1 never exits.
func (s *system) fatal(err error) {
	s.logf("fatal: %v", err)
	s.reboot()
}

func (s *system) reboot() {
	unix.Sync()
	s.logf("rebooting")
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
		s.logf("reboot: %v", err)
	}
	for {
		time.Sleep(time.Hour)
	}
}

// boot runs stage 1 when "/" is the initramfs, then stage 2.
func (s *system) boot() error {
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil {
		return fmt.Errorf("statfs /: %w", err)
	}
	if st.Type == unix.RAMFS_MAGIC || st.Type == unix.TMPFS_MAGIC {
		if err := s.stage1(); err != nil {
			return fmt.Errorf("stage 1: %w", err)
		}
	} else if err := s.kernelMounts(); err != nil {
		return err
	}
	return s.stage2()
}

// apply makes m.Target (when missing) and mounts m.
func apply(m Mount) error {
	if err := os.MkdirAll(m.Target, os.FileMode(m.DirMode&0o777)); err != nil {
		return fmt.Errorf("mkdir %s: %w", m.Target, err)
	}
	if err := unix.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", m.Source, m.FSType, m.Target, err)
	}
	return nil
}

// kernelMounts mounts /proc, /sys and /dev when strata-init starts on a
// real root (no initramfs) and they are not there yet.
func (s *system) kernelMounts() error {
	magic := map[string]int64{"/proc": unix.PROC_SUPER_MAGIC, "/sys": unix.SYSFS_MAGIC, "/dev": unix.TMPFS_MAGIC}
	for _, m := range Stage1Mounts() {
		var st unix.Statfs_t
		if unix.Statfs(m.Target, &st) == nil && st.Type == magic[m.Target] {
			continue
		}
		if err := apply(m); err != nil {
			return err
		}
	}
	return nil
}

func (s *system) readParams() {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		s.logf("cannot read the kernel command line: %v; using defaults", err)
	}
	s.params = ParseCmdline(string(b))
	for _, w := range s.params.Warnings {
		s.logf("%s", w)
	}
}

func (s *system) stage1() error {
	t0 := time.Now()
	for _, m := range Stage1Mounts() {
		if err := apply(m); err != nil {
			return err
		}
	}
	s.readParams()
	up, _ := os.ReadFile("/proc/uptime")
	kernelUp, _, _ := strings.Cut(string(up), " ")
	order, err := os.ReadFile(ModulesOrder)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	mods := ParseModulesOrder(string(order))
	var times []string
	for _, m := range mods {
		tm := time.Now()
		// A module that fails to load is tried again a few times (a
		// guest without overlay has no guestd, and a boot under load
		// once lost it): each failure is on the console.
		for try := 1; ; try++ {
			err := loadModule(m)
			if err == nil {
				break
			}
			s.logf("module %s (try %d): %v", m, try, err)
			if try == 5 {
				break
			}
			time.Sleep(time.Duration(try) * 100 * time.Millisecond)
		}
		times = append(times, fmt.Sprintf("%s=%v", strings.TrimSuffix(filepath.Base(m), ".ko"), time.Since(tm).Round(time.Millisecond)))
	}
	s.ensureFilesystems(mods)
	if err := waitForDevice(s.params.Root, 10*time.Second); err != nil {
		return err
	}
	for _, m := range RootMounts(s.params) {
		if err := apply(m); err != nil {
			return err
		}
	}
	if err := copyFile(InitramfsGuestd, NewRoot+GuestdPath, 0o755); err != nil {
		return fmt.Errorf("copy guestd: %w", err)
	}
	if err := installCreateos(NewRoot); err != nil {
		// The guest boots without the CLI rather than not at all.
		s.logf("createos not installed: %v", err)
	}
	if err := installPython(NewRoot); err != nil {
		s.logf("the Python SDK not installed: %v", err)
	}
	// Free the initramfs copies: the rootfs stays in memory after the switch.
	for _, p := range []string{InitramfsGuestd, InitramfsCreateos, InitramfsPython, "/modules", ModulesOrder} {
		_ = os.RemoveAll(p)
	}
	for _, m := range MovedMounts() {
		if err := os.MkdirAll(NewRoot+m, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m, NewRoot+m, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s into the new root: %w", m, err)
		}
	}
	// switch_root: the new root's mount takes the place of "/".
	if err := unix.Chdir(NewRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move %s onto /: %w", NewRoot, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	s.logf("stage 1 done in %v (init started at uptime %ss; modules: %s)", time.Since(t0).Round(time.Millisecond), kernelUp, strings.Join(times, " "))
	return nil
}

// installCreateos copies the initramfs's createos next to guestd and
// points the root's CreateosLink at it (an image without one
// leaves the root as it is).
func installCreateos(root string) error {
	if _, err := os.Stat(InitramfsCreateos); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := copyFile(InitramfsCreateos, root+CreateosPath, 0o755); err != nil {
		return err
	}
	link := root + CreateosLink
	if target, err := os.Readlink(link); err == nil && target == CreateosPath {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return err
	}
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Symlink(CreateosPath, link)
}

// installPython copies the initramfs's Python SDK package to the root's
// PythonPath and links it into each system Python (PythonLinks); an image
// without one leaves the root as it is.
func installPython(root string) error {
	if _, err := os.Stat(InitramfsPython); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	err := filepath.WalkDir(InitramfsPython, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(InitramfsPython, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(root+PythonPath, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case d.Type().IsRegular():
			return copyFile(p, dst, 0o644)
		}
		return nil
	})
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(root + "/usr/lib")
	if err != nil {
		return err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	for link, target := range PythonLinks(names) {
		if t, err := os.Readlink(root + link); err == nil && t == target {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(root+link), 0o755); err != nil {
			return err
		}
		// A package installed there by hand (a directory) is the
		// guest's choice: it stays, and wins.
		if err := os.Remove(root + link); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s is taken: %w", link, err)
		}
		if err := os.Symlink(target, root+link); err != nil {
			return err
		}
	}
	return nil
}

// neededFilesystems are the filesystems a guest cannot do without (the
// root's and the store's layers), by the module that registers each.
var neededFilesystems = map[string]string{"xfs.ko": "xfs", "overlay.ko": "overlay"}

// ensureFilesystems checks, after the modules are loaded, that every
// needed filesystem whose module the image holds is registered, and loads
// its module again until it is (for about 10 s): a guest without overlay
// has no guestd, and a few boots in hundreds under load came up without
// it. Each miss is on the console, with the kernel's modules.
func (s *system) ensureFilesystems(mods []string) {
	for _, m := range mods {
		fs, ok := neededFilesystems[filepath.Base(m)]
		if !ok {
			continue
		}
		for try := 1; !fsRegistered(fs); try++ {
			loaded, _ := os.ReadFile("/proc/modules")
			s.logf("filesystem %s not registered after its module was loaded (try %d); modules: %s", fs, try, strings.Join(strings.Fields(string(loaded)), " "))
			if try > 40 {
				break
			}
			if err := loadModule(m); err != nil {
				s.logf("module %s: %v", m, err)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
}

// fsRegistered tells whether the kernel knows the filesystem type fs.
func fsRegistered(fs string) bool {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false
	}
	return HasFilesystem(string(b), fs)
}

// loadModule loads a module without its appended signature: the kernel
// takes an unsigned module (it only taints itself), while a signature it
// fails to verify is refused for good. Under TCG the check failed now and
// then for a whole boot ("key was rejected by service", EKEYREJECTED),
// and that guest had no overlay; the image's modules are the image's
// own, checked by its key when it was built.
func loadModule(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	err = unix.InitModule(StripModuleSignature(b), "")
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("init_module: %w", err)
	}
	return nil
}

func waitForDevice(dev string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(dev); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("root disk %s did not appear within %v: %w", dev, d, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func copyFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(mode); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func (s *system) stage2() error {
	if s.params.Root == "" {
		s.readParams()
	}
	// The kernel starts init with HOME and TERM only; exec.LookPath and the
	// checks need a PATH.
	for _, kv := range GuestdEnv {
		k, v, _ := strings.Cut(kv, "=")
		_ = os.Setenv(k, v)
	}
	for _, m := range Stage2Mounts() {
		if err := apply(m); err != nil {
			return err
		}
	}
	for link, target := range DevLinks() {
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(target, link); err != nil {
				s.logf("symlink %s: %v", link, err)
			}
		}
	}
	for _, dir := range []struct {
		path string
		mode os.FileMode
	}{{"/run/strata", 0o755}, {"/run/lock", 0o1777}} {
		if err := os.MkdirAll(dir.path, 0o755); err != nil {
			return err
		}
		_ = os.Chmod(dir.path, dir.mode)
	}
	s.linkVirtioPorts()
	for path, v := range QuietSysctls() {
		if err := os.WriteFile(path, []byte(v), 0); err != nil {
			s.logf("sysctl %s: %v", path, err)
		}
	}
	if err := unix.Sethostname([]byte(s.params.Hostname)); err != nil {
		s.logf("sethostname: %v", err)
	}
	if err := loopbackUp(); err != nil {
		s.logf("loopback: %v", err)
	}
	if err := s.netUp(); err != nil {
		s.logf("network: %v", err)
	}
	s.growRoot()
	// ctrl-alt-del sends SIGINT to PID 1 instead of rebooting at once.
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)
	s.logf("%s", s.selfCheck())
	return nil
}

// linkVirtioPorts makes /dev/virtio-ports/NAME -> ../vportNpM for each
// named virtio-serial port, as udev would.
func (s *system) linkVirtioPorts() {
	ports, _ := filepath.Glob("/sys/class/virtio-ports/vport*")
	for _, p := range ports {
		b, err := os.ReadFile(p + "/name")
		name := strings.TrimSpace(string(b))
		if err != nil || name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			continue
		}
		_ = os.MkdirAll("/dev/virtio-ports", 0o755)
		link := "/dev/virtio-ports/" + name
		_ = os.Remove(link)
		if err := os.Symlink("../"+filepath.Base(p), link); err != nil {
			s.logf("symlink %s: %v", link, err)
		}
	}
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS: %w", err)
	}
	return nil
}

// growRoot grows the root XFS onto the whole disk when the disk is larger
// than the filesystem (a sandbox's disk is larger than the base image):
// once, at the disk's first boot.
func (s *system) growRoot() {
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil {
		s.logf("statfs /: %v", err)
		return
	}
	fsBytes := st.Blocks * uint64(st.Bsize)
	b, err := os.ReadFile("/sys/class/block/" + filepath.Base(s.params.Root) + "/size")
	if err != nil {
		s.logf("size of %s: %v", s.params.Root, err)
		return
	}
	sectors, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		s.logf("size of %s: %v", s.params.Root, err)
		return
	}
	if !NeedsGrow(fsBytes, sectors*512) {
		return
	}
	t0 := time.Now()
	if _, _, err := growXFS("/", sectors*512); err != nil {
		s.logf("growing the root: %v", err)
		return
	}
	if unix.Statfs("/", &st) == nil {
		s.logf("root grown from %s to %s in %v", human(fsBytes), human(st.Blocks*uint64(st.Bsize)), time.Since(t0).Round(time.Millisecond))
	}
}

// selfCheck describes the root filesystem and what the userland has, in
// one line.
func (s *system) selfCheck() string {
	var b strings.Builder
	b.WriteString("check")
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil {
		fmt.Fprintf(&b, " root=error(%v)", err)
	} else {
		fs := fmt.Sprintf("%#x", st.Type)
		if st.Type == unix.XFS_SUPER_MAGIC {
			fs = "xfs"
		}
		fmt.Fprintf(&b, " root=%s reflink=%d size=%s free=%s", fs, btoi(reflinks("/")),
			human(st.Blocks*uint64(st.Bsize)), human(st.Bavail*uint64(st.Bsize)))
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		fmt.Fprintf(&b, " kernel=%s hostname=%s", unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Nodename[:]))
	}
	for _, prog := range []string{"sh", "git", "python3"} {
		p, err := exec.LookPath(prog)
		if err != nil {
			p = "missing"
		}
		fmt.Fprintf(&b, " %s=%s", prog, p)
	}
	ports, _ := filepath.Glob("/dev/virtio-ports/*")
	names := make([]string, 0, len(ports))
	for _, p := range ports {
		names = append(names, filepath.Base(p))
	}
	fmt.Fprintf(&b, " ports=%s", strings.Join(names, ","))
	return b.String()
}

// reflinks reports whether the filesystem of dir clones files (FICLONE on
// two unnamed temporary files).
func reflinks(dir string) bool {
	src, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false
	}
	defer unix.Close(src)
	dst, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false
	}
	defer unix.Close(dst)
	if _, err := unix.Write(src, make([]byte, 4096)); err != nil {
		return false
	}
	return unix.IoctlFileClone(dst, src) == nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// serve supervises guestd until a shutdown is asked for, then shuts the
// guest down. It never returns.
func (s *system) serve() {
	wake := make(chan os.Signal, 16)
	signal.Notify(wake, unix.SIGCHLD)
	term := make(chan os.Signal, 4)
	signal.Notify(term, unix.SIGTERM, unix.SIGINT, unix.SIGPWR)
	stop := make(chan struct{})
	checked := make(chan struct{})
	if s.params.Check != CheckNone {
		go func() {
			s.runChecks()
			if s.params.Check == CheckShutdown {
				close(checked)
			}
		}()
	}
	go func() {
		select {
		case sig := <-term:
			s.logf("%v: shutting down", sig)
		case <-checked:
			s.logf("check done: shutting down")
		}
		close(stop)
	}()
	sup := &supervisor{reaper: s.reaper, spawn: s.spawnGuestd, backoff: restartBackoff, logf: s.logf}
	pid, done := sup.run(stop, wake)
	s.shutdown(pid, done, wake)
}

func (s *system) spawnGuestd() (int, <-chan unix.WaitStatus, error) {
	con, err := os.OpenFile("/dev/console", os.O_WRONLY|unix.O_NOCTTY, 0)
	if err != nil {
		return 0, nil, err
	}
	defer con.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, nil, err
	}
	defer null.Close()
	return s.reaper.start([]string{GuestdPath, "--vm"}, &os.ProcAttr{
		Dir:   "/",
		Env:   GuestdEnv,
		Files: []*os.File{null, con, con},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
}

// runChecks runs sh, git and python3 once (strata.check=) and prints what
// they answered.
func (s *system) runChecks() {
	checks := []struct {
		name string
		argv []string
	}{
		{"sh", []string{"/bin/sh", "-c", "echo ok"}},
		{"git", []string{"/usr/bin/git", "--version"}},
		{"python3", []string{"/usr/bin/python3", "-c", "import sys; print(sys.version.split()[0])"}},
	}
	var b strings.Builder
	b.WriteString("check run")
	for _, c := range checks {
		argv := c.argv
		out, err := s.output(argv, 30*time.Second)
		if err != nil {
			fmt.Fprintf(&b, " %s=error(%v)", c.name, err)
			continue
		}
		fmt.Fprintf(&b, " %s=%q", c.name, strings.TrimSpace(out))
	}
	s.logf("%s", b.String())
}

// output runs argv through the reaper and returns its stdout and stderr.
func (s *system) output(argv []string, timeout time.Duration) (string, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return "", err
	}
	defer r.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		w.Close()
		return "", err
	}
	pid, done, err := s.reaper.start(argv, &os.ProcAttr{Dir: "/", Env: GuestdEnv, Files: []*os.File{null, w, w}})
	null.Close()
	w.Close()
	if err != nil {
		return "", err
	}
	read := make(chan string, 1)
	go func() {
		out, _ := io.ReadAll(io.LimitReader(r, 4096))
		read <- string(out)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case ws := <-done:
		var out string
		select {
		case out = <-read:
		case <-timer.C: // a grandchild holds the pipe open
		}
		if ws.Exited() && ws.ExitStatus() == 0 {
			return out, nil
		}
		return out, errors.New(describe(ws))
	case <-timer.C:
		_ = unix.Kill(pid, unix.SIGKILL)
		return "", fmt.Errorf("timed out after %v", timeout)
	}
}

// shutdown stops guestd, then every other process, syncs, unmounts and
// reboots.
func (s *system) shutdown(pid int, done <-chan unix.WaitStatus, wake <-chan os.Signal) {
	if pid != 0 {
		_ = unix.Kill(pid, unix.SIGTERM)
		timeout := time.NewTimer(guestdStopTimeout)
	wait:
		for {
			select {
			case ws := <-done:
				s.logf("guestd ended: %s", describe(ws))
				break wait
			case <-wake:
				s.reaper.reap()
			case <-timeout.C:
				s.logf("guestd did not stop within %v", guestdStopTimeout)
				break wait
			}
		}
		timeout.Stop()
	}
	_ = unix.Kill(-1, unix.SIGTERM)
	if !s.reaper.waitGone(wake, termTimeout) {
		_ = unix.Kill(-1, unix.SIGKILL)
		s.reaper.waitGone(wake, killTimeout)
	}
	unix.Sync()
	s.unmountAll()
	s.reboot()
}

func (s *system) unmountAll() {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		s.logf("mountinfo: %v", err)
	}
	for _, mp := range UnmountOrder(string(b)) {
		if err := unix.Unmount(mp, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			s.logf("unmount %s: %v", mp, err)
		}
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		s.logf("remount / read-only: %v", err)
	}
}
