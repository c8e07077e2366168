// Command benchtable measures strata's engine on this machine and prints
// the table of docs/performance.md: capture and restore latency for a
// small and a large directory beside cp -a and tar of the same tree, the
// list of 1,000 checkpoints, the busy scan among 1,000 processes, and the
// cost of stat and readdir in a live directory after 1,000 checkpoints.
// With -vm-image it also runs hostproxy with microVM sandboxes and
// measures them through the public API: boots, exec, capture and restore
// inside a VM, host memory per idle sandbox, and a boot beside many idle
// ones.
//
// It needs root and must run in a private mount namespace: `make bench`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"strata/holders"
	"strata/layers"
	"strata/pathpolicy"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

var (
	bigFiles = flag.Int("big-files", 100000, "files in the large directory")
	bigBytes = flag.Int64("big-bytes", 1<<30, "bytes in the large directory")
	rounds   = flag.Int("rounds", 30, "captures and restores measured per directory")
	many     = flag.Int("many", 1000, "checkpoints for the list and lookup rows")
	procs    = flag.Int("procs", 1000, "processes for the busy-scan row")
	writeCap = flag.Int("write-captures", 1000, "captures beside the write loop (a fiftieth of them with a gigabyte kept dirty)")
	noCopies = flag.Bool("no-copies", false, "skip the cp -a and tar baselines")
	fidOnly  = flag.Bool("fidelity-only", false, "measure only the write loop and the one-byte writes on ext4 and XFS")
)

// row is one line of a table: for the microVM rows, ref is what the
// prototype did on these machines (or the limit here) and goal the
// target (issue 18), when there are ones.
type row struct{ what, median, p99, note, ref, goal string }

func run(ctx context.Context) error {
	flag.Parse()
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (make bench)")
	}
	if *vmOnly {
		return printVM(ctx, nil)
	}
	base, err := os.MkdirTemp("/var/tmp", "strata-bench-")
	if err != nil {
		return err
	}
	defer cleanup(base)
	rec := &stepRecorder{}
	store, err := layers.Open(ctx, layers.Config{Dir: filepath.Join(base, "store"), Policy: &pathpolicy.Policy{}, Scanner: holders.NewScanner("/proc"), StepHook: rec.hook})
	if err != nil {
		return err
	}
	defer store.Close()
	var rows []row
	if *fidOnly {
		return printRows(ctx, store, base)
	}
	if *beyondOnly {
		br, err := beyondRows(ctx, base)
		if err != nil {
			return err
		}
		printTable(br)
		return nil
	}
	var bigCapture time.Duration
	for _, size := range []struct {
		name  string
		files int
		bytes int64
	}{{"10 files", 10, 10 << 10}, {fmt.Sprintf("%d files / %s", *bigFiles, human(*bigBytes)), *bigFiles, *bigBytes}} {
		dir := filepath.Join(base, fmt.Sprintf("tree-%d", size.files))
		fmt.Fprintf(os.Stderr, "writing %s…\n", size.name)
		if err := makeTree(dir, size.files, size.bytes); err != nil {
			return err
		}
		unix.Sync() // measure checkpoints, not the writeback of the tree just made
		// Baselines first, on the plain tree: what a copy-based checkpoint costs.
		baseRuns := 3
		if *noCopies {
			baseRuns = 0
		}
		cp := timeN(baseRuns, func(i int) error {
			dst := filepath.Join(base, "copy")
			defer os.RemoveAll(dst)
			return exec.Command("cp", "-a", dir, dst).Run()
		})
		tarT := timeN(baseRuns, func(i int) error {
			return exec.Command("tar", "-cf", filepath.Join(base, "t.tar"), "-C", dir, ".").Run()
		})
		os.Remove(filepath.Join(base, "t.tar"))
		nprocs := procCount()
		t0 := time.Now()
		first, err := store.Capture(ctx, dir, "first")
		if err != nil {
			return err
		}
		enroll := time.Since(t0)
		var ids []string
		rec.reset()
		capT := timeN(*rounds, func(i int) error {
			os.WriteFile(filepath.Join(dir, "changing"), []byte(fmt.Sprint(i)), 0o644)
			c, err := store.Capture(ctx, dir, "")
			ids = append(ids, c.ID)
			return err
		})
		capSteps := rec.summary("capture")
		bigCapture = median(capT) // the last size's: the btrfs reference's
		rec.reset()
		resT := timeN(*rounds, func(i int) error {
			id := first.ID
			if i%2 == 1 {
				id = ids[len(ids)-1]
			}
			_, err := store.Restore(ctx, id)
			return err
		})
		rows = append(rows,
			row{"first capture (enroll), " + size.name, dur(enroll), "", "one-time: walks the tree for hardlinks and special files", "", ""},
			row{"capture, " + size.name, dur(median(capT)), dur(p99(capT)), fmt.Sprintf("%d runs, one file changed before each; %d processes on the machine; step medians: %s", len(capT), nprocs, capSteps), "", ""},
			row{"restore, " + size.name, dur(median(resT)), dur(p99(resT)), fmt.Sprintf("%d runs; step medians: %s", len(resT), rec.summary("restore")), "", ""},
		)
		if baseRuns > 0 {
			rows = append(rows,
				row{"cp -a, " + size.name, dur(median(cp)), dur(slices.Max(cp)), "3 runs (p99 column: worst)", "", ""},
				row{"tar -c, " + size.name, dur(median(tarT)), dur(slices.Max(tarT)), "3 runs (p99 column: worst)", "", ""},
			)
		}
	}

	if rs, err := btrfsRows(base, *bigFiles, *bigBytes, *rounds, bigCapture); err != nil {
		return err
	} else {
		rows = append(rows, rs...)
	}

	// 1,000 checkpoints of one directory.
	dir := filepath.Join(base, "many")
	if err := makeTree(dir, 200, 200<<10); err != nil {
		return err
	}
	plain := filepath.Join(base, "plain")
	if err := makeTree(plain, 200, 200<<10); err != nil {
		return err
	}
	unix.Sync()
	fmt.Fprintf(os.Stderr, "taking %d checkpoints…\n", *many)
	var capMany []time.Duration
	for i := 0; i < *many; i++ {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("d%d/new-%d", i%10, i)), []byte("x"), 0o644)
		t := time.Now()
		if _, err := store.Capture(ctx, dir, fmt.Sprint(i)); err != nil {
			return err
		}
		capMany = append(capMany, time.Since(t))
	}
	store.Settle(ctx)
	os.WriteFile(filepath.Join(dir, "last"), nil, 0o644)
	store.Capture(ctx, dir, "last") // mount the settled stack
	listT := timeN(50, func(int) error { _, err := store.List(ctx); return err })
	rows = append(rows,
		row{fmt.Sprintf("capture, %d checkpoints in a row", *many), dur(median(capMany)), dur(p99(capMany)), "the last ones as fast as the first: compaction keeps stacks short", "", ""},
		row{fmt.Sprintf("list of %d checkpoints", *many+1), dur(median(listT)), dur(p99(listT)), "50 runs", "", ""},
	)
	// Lookups in the bottom layer: the file every layer has to be searched for.
	target := "d0/f0"
	for _, c := range []struct {
		name string
		path string
	}{{fmt.Sprintf("after %d checkpoints", *many), dir}, {"plain directory", plain}} {
		statT := timeN(2000, func(int) error {
			var st unix.Stat_t
			return unix.Stat(filepath.Join(c.path, target), &st)
		})
		missT := timeN(2000, func(i int) error {
			var st unix.Stat_t
			unix.Stat(filepath.Join(c.path, fmt.Sprintf("d0/missing-%d", i)), &st)
			return nil
		})
		readT := timeN(200, func(int) error {
			_, err := os.ReadDir(filepath.Join(c.path, "d0"))
			return err
		})
		coldT := timeN(5, func(i int) error {
			os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0)
			var st unix.Stat_t
			return unix.Stat(filepath.Join(c.path, fmt.Sprintf("d%d/f%d", i+1, i+1)), &st)
		})
		rows = append(rows,
			row{"stat (warm), " + c.name, dur(median(statT)), dur(p99(statT)), "2000 runs", "", ""},
			row{"stat of a missing name, " + c.name, dur(median(missT)), dur(p99(missT)), "2000 runs: every layer is searched", "", ""},
			row{"stat (cold, dentries dropped), " + c.name, dur(median(coldT)), dur(slices.Max(coldT)), "5 runs (p99 column: worst)", "", ""},
			row{"readdir of 20 entries, " + c.name, dur(median(readT)), dur(p99(readT)), "200 runs", "", ""},
		)
	}
	depth := stackDepth(dir)
	rows = append(rows, row{fmt.Sprintf("live stack depth after %d checkpoints", *many), fmt.Sprint(depth), "", "lower layers mounted (bound: floor(log2 n)+3 = 12)", "", ""})

	// Busy scan among many processes.
	fmt.Fprintf(os.Stderr, "starting %d processes…\n", *procs)
	var cmds []*exec.Cmd
	for i := 0; i < *procs; i++ {
		c := exec.Command("sleep", "600")
		if err := c.Start(); err != nil {
			return err
		}
		cmds = append(cmds, c)
	}
	scanner := holders.NewScanner("/proc")
	var st unix.Stat_t
	unix.Stat(dir, &st)
	scanT := timeN(10, func(int) error {
		_, err := scanner.Holders(ctx, holders.Target{Path: dir, Dev: st.Dev, WholeDev: true})
		return err
	})
	among := procCount()
	crowdT := timeN(*rounds, func(i int) error {
		os.WriteFile(filepath.Join(dir, "crowd"), []byte(fmt.Sprint(i)), 0o644)
		_, err := store.Capture(ctx, dir, "")
		return err
	})
	for _, c := range cmds {
		c.Process.Kill()
		c.Wait()
	}
	rows = append(rows,
		row{fmt.Sprintf("busy scan, %d processes", *procs), dur(median(scanT)), dur(slices.Max(scanT)), "10 runs (p99 column: worst); a capture runs it only to name holders when the kernel refuses", "", ""},
		row{fmt.Sprintf("capture among %d processes", among), dur(median(crowdT)), dur(p99(crowdT)), fmt.Sprintf("%d runs, one file changed before each (the 1,000-checkpoint directory)", len(crowdT)), "", ""},
	)

	return printRows(ctx, store, base, rows...)
}

// printRows adds the fidelity rows to rows, prints the engine table, and
// goes on to the microVM tables.
func printRows(ctx context.Context, store *layers.Store, base string, rows ...row) error {
	if !*fidOnly {
		br, err := beyondRows(ctx, base)
		if err != nil {
			return err
		}
		rows = append(rows, br...)
	}
	fmt.Fprintf(os.Stderr, "captures beside a write loop…\n")
	wr, err := writerRows(ctx, base, *writeCap)
	if err != nil {
		return err
	}
	rows = append(rows, wr...)
	er0, err := enrollRow(ctx, base, 10)
	if err != nil {
		return err
	}
	rows = append(rows, er0)
	fmt.Fprintf(os.Stderr, "one-byte writes into a 1 GiB file, ext4 and XFS…\n")
	er, err := editRows(ctx, base)
	if err != nil {
		return err
	}
	rows = append(rows, er...)

	printTable(rows)
	fmt.Printf("\nmounter: %s; kernel: %s\n", store.Mounter(), kernel())
	return printVM(ctx, nil)
}

// printTable prints rows as a Markdown table.
func printTable(rows []row) {
	fmt.Printf("| measurement | median | p99 | notes |\n| --- | ---: | ---: | --- |\n")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %s | %s |\n", r.what, r.median, r.p99, r.note)
	}
}

// printVM prints the microVM table when -vm-image is given.
func printVM(ctx context.Context, _ []row) error {
	if *vmImage == "" {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	bin := os.Getenv("STRATA_BIN")
	if bin == "" {
		bin = filepath.Dir(exe)
	}
	rows, err := vmRows(ctx, bin)
	if err != nil {
		return err
	}
	fmt.Printf("\n### microVM sandboxes\n\n| measurement | median | p99 | prototype / limit here | goal | notes |\n| --- | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", r.what, r.median, r.p99, r.ref, r.goal, r.note)
	}
	return nil
}

func stackDepth(dir string) int {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	depth := 0
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			depth = strings.Count(l, "lowerdir+=")
			if depth == 0 {
				if i := strings.Index(l, "lowerdir="); i >= 0 {
					depth = strings.Count(strings.SplitN(l[i:], ",", 2)[0], ":") + 1
				}
			}
		}
	}
	return depth
}

func kernel() string {
	var u unix.Utsname
	unix.Uname(&u)
	return unix.ByteSliceToString(u.Release[:])
}

// makeTree writes files files of about bytes in total under dir, ten per
// subdirectory level d0..d9 and then flat.
func makeTree(dir string, files int, bytes int64) error {
	per := max(int(bytes/int64(files)), 1)
	buf := make([]byte, per)
	for i := range buf {
		buf[i] = byte(i)
	}
	for i := 0; i < files; i++ {
		sub := filepath.Join(dir, fmt.Sprintf("d%d", i%10), fmt.Sprintf("s%d", i/10%100))
		if i < 100 {
			sub = filepath.Join(dir, fmt.Sprintf("d%d", i%10))
		}
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return err
		}
		name := filepath.Join(sub, fmt.Sprintf("f%d", i))
		if i < 10 {
			name = filepath.Join(dir, fmt.Sprintf("d%d", i), fmt.Sprintf("f%d", i))
		}
		if err := os.WriteFile(name, buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func timeN(n int, fn func(i int) error) []time.Duration {
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		t := time.Now()
		if err := fn(i); err != nil {
			fmt.Fprintln(os.Stderr, "benchtable:", err)
			os.Exit(1)
		}
		out = append(out, time.Since(t))
	}
	return out
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func p99(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*99/100)]
}

func dur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1e3)
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

func human(b int64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%d MiB", b>>20)
}

// cleanup unmounts what the run mounted and removes its files.
func cleanup(base string) {
	for i := 0; i < 4; i++ {
		filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
			if d != nil && d.IsDir() {
				unix.Unmount(p, unix.MNT_DETACH)
			}
			return nil
		})
	}
	filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			if fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0); err == nil {
				if fl, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS); err == nil && fl&0x10 != 0 {
					unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(fl&^0x10))
				}
				unix.Close(fd)
			}
		}
		return nil
	})
	os.RemoveAll(base)
}
