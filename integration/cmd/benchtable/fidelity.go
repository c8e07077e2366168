package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"strata/holders"
	"strata/internal/fault"
	"strata/layers"
	"strata/pathpolicy"
)

// The fidelity rows: what a writer in a managed directory sees while it
// is captured, block-level copy-on-write on XFS beside ext4's whole-file
// copy-up, and btrfs's own snapshot of the same tree as a reference.

// stepRecorder keeps the duration of every step of every operation, as
// the store's step hook reports them.
type stepRecorder struct {
	mu    sync.Mutex
	order []string
	steps map[string][]time.Duration // by "op step"
}

func (r *stepRecorder) hook(op, step string, d time.Duration, err error) {
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.steps == nil {
		r.steps = map[string][]time.Duration{}
	}
	k := op + " " + step
	if _, ok := r.steps[k]; !ok {
		r.order = append(r.order, k)
	}
	r.steps[k] = append(r.steps[k], d)
}

func (r *stepRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.order, r.steps = nil, nil
}

// summary is the median of each step of op, in the order they ran.
func (r *stepRecorder) summary(op string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, k := range r.order {
		if step, ok := strings.CutPrefix(k, op+" "); ok {
			out = append(out, step+" "+dur(median(r.steps[k])))
		}
	}
	return strings.Join(out, ", ")
}

// windowSteps are the steps from the freeze to the swap: the window in
// which a new write into the directory fails with EROFS.
// The seal and the commit come after the swap.
var windowSteps = []string{"freeze", "validate.layer", "mount.swap"}

// writerRows runs a tight loop opening one file of a managed directory
// for writing (and closing it) while the directory is captured captures
// times, once with nothing else
// dirty on the filesystem and once while another file of a gigabyte is
// rewritten without end beside it, and reports the errors the loop saw
// and the window (freeze to swap) of each capture.
func writerRows(ctx context.Context, base string, captures int) ([]row, error) {
	var mu sync.Mutex
	var window time.Duration
	var windows []time.Duration
	steps := map[string][]time.Duration{}
	hook := func(op, step string, d time.Duration, err error) {
		if op != "capture" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if slices.Contains(windowSteps, step) && err == nil {
			window += d
			steps[step] = append(steps[step], d)
		}
		if step == "mount.swap" && err == nil {
			windows = append(windows, window)
		}
		if step == "mount.check" {
			window = 0
		}
	}
	store, err := layers.Open(ctx, layers.Config{Dir: filepath.Join(base, "wstore"), Policy: &pathpolicy.Policy{}, Scanner: holders.NewScanner("/proc"), StepHook: hook})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	dir := filepath.Join(base, "written")
	if err := makeTree(dir, 200, 200<<10); err != nil {
		return nil, err
	}
	if _, err := store.Capture(ctx, dir, "first"); err != nil {
		return nil, err
	}
	var rows []row
	for _, dirty := range []bool{false, true} {
		stopDirty := func() {}
		if dirty {
			stopDirty, err = keepDirty(filepath.Join(base, "dirty"), 1<<30)
			if err != nil {
				return nil, err
			}
		}
		mu.Lock()
		windows = nil
		clear(steps)
		mu.Unlock()
		// With a gigabyte to write back before each capture (the sync
		// before the freeze), fewer captures.
		n := captures
		if dirty {
			n = max(captures/50, 1)
		}
		w := startWriter(filepath.Join(dir, "f"))
		var done, busy int
		t0 := time.Now()
		// The writer has the file open most of the time, and a capture
		// then answers busy: try until n are taken.
		for done < n && time.Since(t0) < 4*time.Minute {
			_, err := store.Capture(ctx, dir, "")
			switch {
			case err == nil:
				done++
			case fault.CodeOf(err) == holders.CodeDirectoryBusy:
				busy++
			default:
				w.stop()
				stopDirty()
				return nil, err
			}
		}
		writes, failed, spells := w.stop()
		took := time.Since(t0)
		stopDirty()
		mu.Lock()
		ws := slices.Clone(windows)
		var per string
		for _, st := range windowSteps {
			if len(steps[st]) > 0 {
				per += fmt.Sprintf(", %s %s", st, dur(median(steps[st])))
			}
		}
		mu.Unlock()
		what := "captures beside a tight loop opening a file for writing"
		if dirty {
			what += ", 1 GiB of other data kept dirty on the filesystem"
		}
		if len(ws) == 0 {
			rows = append(rows, row{what, "", "", fmt.Sprintf("no capture taken in %s: all %d tries refused busy (the writer had the file open each time)", dur(took), busy), "", ""})
			continue
		}
		errs := "no write failed"
		if len(failed) > 0 {
			errs = "failed writes:"
			for e, n := range failed {
				errs += fmt.Sprintf(" %d %s", n, e)
			}
			errs += fmt.Sprintf(", in %d spells", len(spells))
		}
		if len(spells) == 0 {
			spells = []time.Duration{0}
		}
		rows = append(rows, row{what + ": the longest spell of failed writes, per capture", dur(median(spells)), dur(slices.Max(spells)), fmt.Sprintf("p99 column: worst; %d captures taken in %s, %d refused busy (the writer had the file open); %d writes, %s; step medians (window %s)%s",
			done, dur(took), busy, writes, errs, dur(median(ws)), per), "", ""})
	}
	return rows, nil
}

// writer is a tight loop opening one file for writing and closing it.
type writer struct {
	quit   atomic.Bool
	done   chan struct{}
	writes int
	failed map[string]int // by errno name
	// spells are the stretches of time in which every write failed, from
	// the start of the first failed one to the start of the next one that
	// went through: the window as the writer sees it.
	spells []time.Duration
}

func startWriter(path string) *writer {
	w := &writer{done: make(chan struct{}), failed: map[string]int{}}
	go func() {
		defer close(w.done)
		var failing time.Time
		for !w.quit.Load() {
			w.writes++
			began := time.Now()
			// Open for writing, truncating, and close: the call that fails
			// with EROFS in the window. No data: a write(2) would be
			// throttled while a gigabyte is dirty, with the file open, and
			// every capture would find the directory busy.
			fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
			if err == nil {
				err = unix.Close(fd)
			}
			switch {
			case err != nil && failing.IsZero():
				failing = began
			case err == nil && !failing.IsZero():
				// To the start of the write that went through: how long
				// that one took (the page cache may throttle it) is not
				// the window's.
				w.spells = append(w.spells, began.Sub(failing))
				failing = time.Time{}
			}
			if err != nil {
				var en unix.Errno
				if errors.As(err, &en) {
					w.failed[unix.ErrnoName(en)]++
				} else {
					w.failed[err.Error()]++
				}
			}
		}
	}()
	return w
}

func (w *writer) stop() (int, map[string]int, []time.Duration) {
	w.quit.Store(true)
	<-w.done
	return w.writes, w.failed, w.spells
}

// keepDirty rewrites a file of size bytes at path over and over without
// syncing, so that the filesystem always has about that much dirty data,
// until the returned stop is called.
func keepDirty(path string, size int64) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	var quit atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer f.Close()
		buf := make([]byte, 1<<20)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		for off := int64(0); !quit.Load(); off = (off + int64(len(buf))) % size {
			buf[0]++
			if _, err := f.WriteAt(buf, off); err != nil {
				return
			}
		}
	}()
	// Let it get a gigabyte ahead first.
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if dirtyBytes() >= size*3/4 {
			break
		}
	}
	return func() {
		quit.Store(true)
		<-done
		os.Remove(path)
	}, nil
}

// dirtyBytes is the kernel's count of dirty page-cache bytes.
func dirtyBytes() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	var kb int64
	for _, l := range strings.Split(string(b), "\n") {
		if _, err := fmt.Sscanf(l, "Dirty: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	return 0
}

// loopFS makes a filesystem of size bytes in an image file under base,
// formatted by mkfs with args, and mounts it at base/<name>.
func loopFS(base, name string, size int64, mkfs ...string) (string, error) {
	img := filepath.Join(base, name+".img")
	f, err := os.Create(img)
	if err != nil {
		return "", err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return "", err
	}
	f.Close()
	if out, err := exec.Command(mkfs[0], append(mkfs[1:], img)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s: %v: %s", mkfs[0], err, out)
	}
	mnt := filepath.Join(base, name)
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return "", err
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		return "", fmt.Errorf("mount %s: %v: %s", img, err, out)
	}
	return mnt, nil
}

// editRows measures a one-byte write into a 1 GiB file that a checkpoint
// holds: the first open for writing copies the file up into the live
// layer, a whole copy on ext4 and a reflink clone on XFS.
func editRows(ctx context.Context, base string) ([]row, error) {
	xfs, err := loopFS(base, "xfs", 4<<30, "mkfs.xfs", "-q", "-f", "-m", "reflink=1")
	if err != nil {
		return nil, err
	}
	defer unix.Unmount(xfs, unix.MNT_DETACH)
	var rows []row
	for _, fs := range []struct{ name, dir string }{{"ext4", filepath.Join(base, "ext4edit")}, {"XFS", xfs}} {
		if err := os.MkdirAll(fs.dir, 0o755); err != nil {
			return nil, err
		}
		policy := &pathpolicy.Policy{AllowedMounts: append(slices.Clone(pathpolicy.DefaultAllowedMounts), xfs)}
		store, err := layers.Open(ctx, layers.Config{Dir: filepath.Join(fs.dir, "store"), Policy: policy, Scanner: holders.NewScanner("/proc")})
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(fs.dir, "big")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			store.Close()
			return nil, err
		}
		if err := writeBig(filepath.Join(dir, "f"), 1<<30); err != nil {
			store.Close()
			return nil, err
		}
		unix.Sync()
		first, err := store.Capture(ctx, dir, "")
		if err != nil {
			store.Close()
			return nil, err
		}
		var grew []int64
		var editT []time.Duration
		for range 3 {
			if _, err := store.Restore(ctx, first.ID); err != nil {
				store.Close()
				return nil, err
			}
			unix.Sync()
			before := usedBytes(fs.dir)
			t0 := time.Now()
			fd, err := unix.Open(filepath.Join(dir, "f"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if err == nil {
				_, err = unix.Pwrite(fd, []byte{'!'}, 1<<29)
				if cerr := unix.Close(fd); err == nil {
					err = cerr
				}
			}
			editT = append(editT, time.Since(t0))
			if err != nil {
				store.Close()
				return nil, err
			}
			unix.Sync()
			grew = append(grew, usedBytes(fs.dir)-before)
		}
		store.Close()
		how := "the whole file copied up"
		if fs.name == "XFS" {
			how = "the file cloned (reflink), blocks shared"
		}
		rows = append(rows, row{"one-byte write into a 1 GiB file of a checkpoint, " + fs.name, dur(median(editT)), dur(slices.Max(editT)), fmt.Sprintf("3 runs (p99 column: worst), open to close; %s: the filesystem grew %s", how, human(slices.Max(grew))), "", ""})
	}
	return rows, nil
}

func writeBig(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 4<<20)
	for i := range buf {
		buf[i] = byte(i * 13)
	}
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

func usedBytes(dir string) int64 {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return 0
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// btrfsRow times `btrfs subvolume snapshot -r` of the same tree as the
// large directory, the reference for a capture: a copy-on-write
// filesystem's own snapshot.
// btrfsRows are the reference: btrfs's own read-only snapshot of the same
// tree on a loop-mounted btrfs, as BTRFS_IOC_SNAP_CREATE_V2 called from
// this process (as strata's capture is: the fair comparison), with the
// ratio of strata's capture median (capture) to it; and the btrfs command,
// its process start included, as measured before.
func btrfsRows(base string, files int, bytes int64, runs int, capture time.Duration) ([]row, error) {
	what := fmt.Sprintf("%d files / %s (reference)", files, human(bytes))
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		return []row{{"btrfs snapshot, " + what, "", "", "not measured: mkfs.btrfs is missing (btrfs-progs)", "", ""}}, nil
	}
	mnt, err := loopFS(base, "btrfs", bytes*2+(2<<30), "mkfs.btrfs", "-q", "-f")
	if err != nil {
		return nil, err
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	sv := filepath.Join(mnt, "tree")
	if out, err := exec.Command("btrfs", "subvolume", "create", sv).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("btrfs subvolume create: %v: %s", err, out)
	}
	fmt.Fprintf(os.Stderr, "writing the btrfs reference tree…\n")
	if err := makeTree(sv, files, bytes); err != nil {
		return nil, err
	}
	unix.Sync()
	dirFd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dirFd)
	svFd, err := unix.Open(sv, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(svFd)
	ioctlT := timeN(runs, func(i int) error {
		os.WriteFile(filepath.Join(sv, "changing"), []byte(fmt.Sprint(i)), 0o644)
		return btrfsSnapshot(dirFd, svFd, fmt.Sprintf("ioctl-%d", i))
	})
	cmdT := timeN(runs, func(i int) error {
		os.WriteFile(filepath.Join(sv, "changing"), []byte(fmt.Sprint(i)), 0o644)
		return exec.Command("btrfs", "subvolume", "snapshot", "-r", sv, filepath.Join(mnt, fmt.Sprintf("snap-%d", i))).Run()
	})
	ratio := "strata's capture: not measured"
	if m := median(ioctlT); m > 0 && capture > 0 {
		ratio = fmt.Sprintf("strata's capture (%s) is %.2f× this", dur(capture), float64(capture)/float64(m))
	}
	return []row{
		{"btrfs BTRFS_IOC_SNAP_CREATE_V2 (read-only), " + what, dur(median(ioctlT)), dur(p99(ioctlT)),
			fmt.Sprintf("%d runs, one file changed before each; the ioctl from this process, as strata's capture is; %s", runs, ratio), "", ""},
		{"btrfs subvolume snapshot -r, " + what, dur(median(cmdT)), dur(p99(cmdT)),
			fmt.Sprintf("%d runs, one file changed before each; the command, its process start included", runs), "", ""},
	}, nil
}

// procCount is the number of processes on the machine.
func procCount() int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if c := e.Name()[0]; c >= '0' && c <= '9' {
			n++
		}
	}
	return n
}

// enrollRow measures how long a directory looks empty while it is
// enrolled (its first capture): a reader stats one of its files in a
// tight loop, and the spell in which the file is missing is the window
// between the exchange that moves the contents into the store and the
// mount that shows them again.
func enrollRow(ctx context.Context, base string, runs int) (row, error) {
	store, err := layers.Open(ctx, layers.Config{Dir: filepath.Join(base, "estore"), Policy: &pathpolicy.Policy{}, Scanner: holders.NewScanner("/proc")})
	if err != nil {
		return row{}, err
	}
	defer store.Close()
	var spells []time.Duration
	for i := range runs {
		dir := filepath.Join(base, fmt.Sprintf("enrolled-%d", i))
		if err := makeTree(dir, 2000, 2<<20); err != nil {
			return row{}, err
		}
		var quit atomic.Bool
		done := make(chan time.Duration)
		go func() {
			var longest time.Duration
			var missing time.Time
			var st unix.Stat_t
			for !quit.Load() {
				began := time.Now()
				err := unix.Stat(filepath.Join(dir, "d0", "f0"), &st)
				switch {
				case err != nil && missing.IsZero():
					missing = began
				case err == nil && !missing.IsZero():
					longest = max(longest, began.Sub(missing))
					missing = time.Time{}
				}
			}
			done <- longest
		}()
		_, err := store.Capture(ctx, dir, "")
		time.Sleep(time.Millisecond)
		quit.Store(true)
		spells = append(spells, <-done)
		if err != nil {
			return row{}, err
		}
	}
	return row{"first capture (enroll): how long the directory looks empty", dur(median(spells)), dur(slices.Max(spells)), fmt.Sprintf("%d runs (p99 column: worst), 2000 files; a reader stats a file in a loop: the exchange, the scan for holders of the old directory, the mount; %d processes on the machine", runs, procCount()), "", ""},
		nil
}
