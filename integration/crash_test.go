package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"strata/internal/fstree"
	"strata/layers"
)

// scenario is one operation to crash in: setup runs on a healthy guestd,
// op is the operation under test, and returns the checkpoint ids the list
// must hold if the operation took effect.
type scenario struct {
	name  string
	setup func(t *testing.T, g *guest, dir string) (state map[string]string)
	op    func(t *testing.T, g *guest, dir string, state map[string]string) error
	// after lists the checkpoint ids expected once op took effect, given
	// the ids before; nil means "one more, unknown".
	after func(before []string, state map[string]string) []string
	xfs   bool // the store and the directory on an XFS
}

var scenarios = []scenario{
	{
		name: "enroll",
		setup: func(t *testing.T, g *guest, dir string) map[string]string {
			writeFile(t, dir+"/a", "a")
			writeFile(t, dir+"/sub/b", "b")
			return nil
		},
		op: func(t *testing.T, g *guest, dir string, _ map[string]string) error {
			_, err := g.do("POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q,"name":"first"}`, dir))
			return err
		},
	},
	{
		name: "capture",
		setup: func(t *testing.T, g *guest, dir string) map[string]string {
			writeFile(t, dir+"/a", "a")
			g.create(dir, "one")
			writeFile(t, dir+"/a", "changed")
			writeFile(t, dir+"/new", "new")
			os.Remove(dir + "/gone")
			return nil
		},
		op: func(t *testing.T, g *guest, dir string, _ map[string]string) error {
			_, err := g.do("POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, dir))
			return err
		},
	},
	{
		name: "restore",
		setup: func(t *testing.T, g *guest, dir string) map[string]string {
			writeFile(t, dir+"/a", "A")
			a := g.create(dir, "A")["id"].(string)
			writeFile(t, dir+"/a", "B")
			writeFile(t, dir+"/b-only", "b")
			g.create(dir, "B")
			writeFile(t, dir+"/unsaved", "u")
			return map[string]string{"A": a}
		},
		op: func(t *testing.T, g *guest, dir string, st map[string]string) error {
			_, err := g.do("POST", "/v1/checkpoints/"+st["A"]+"/restore", "", "")
			return err
		},
		// after nil: the unsaved file makes one automatic checkpoint.
	},
	{
		// Each path is before or after; the failpoints fall between
		// steps, where every path is on the same side.
		name: "restore-paths",
		setup: func(t *testing.T, g *guest, dir string) map[string]string {
			writeFile(t, dir+"/a", "A")
			writeFile(t, dir+"/d/deep/x", "x")
			writeFile(t, dir+"/other", "o")
			a := g.create(dir, "A")["id"].(string)
			writeFile(t, dir+"/a", "unsaved")
			os.RemoveAll(dir + "/d")
			writeFile(t, dir+"/new", "n")
			writeFile(t, dir+"/other", "unsaved, not restored")
			return map[string]string{"A": a}
		},
		op: func(t *testing.T, g *guest, dir string, st map[string]string) error {
			_, err := g.do("POST", "/v1/checkpoints/"+st["A"]+"/restore-paths", "application/json", `{"paths":["a","d/deep","new"]}`)
			return err
		},
		// after nil: the unsaved changes make one automatic checkpoint
		// (a capture) before the paths are restored.
	},
	{
		name: "delete",
		setup: func(t *testing.T, g *guest, dir string) map[string]string {
			writeFile(t, dir+"/a", "A")
			g.create(dir, "A")
			writeFile(t, dir+"/a", "B")
			b := g.create(dir, "B")["id"].(string)
			writeFile(t, dir+"/a", "C")
			g.create(dir, "C")
			return map[string]string{"B": b}
		},
		op: func(t *testing.T, g *guest, dir string, st map[string]string) error {
			_, err := g.do("DELETE", "/v1/checkpoints/"+st["B"], "", "")
			if err == nil {
				time.Sleep(500 * time.Millisecond) // B's layer is squashed into C's
			}
			return err
		},
		after: func(before []string, st map[string]string) []string {
			return slices.DeleteFunc(slices.Clone(before), func(id string) bool { return id == st["B"] })
		},
	},
	{
		// The clone is a sibling of the directory; the directory and its
		// list stay as they were, the store check after recovery finds
		// no half clone.
		name: "clone",
		setup: func(t *testing.T, g *guest, dir string) map[string]string {
			writeFile(t, dir+"/a", "A")
			a := g.create(dir, "A")["id"].(string)
			writeFile(t, dir+"/a", "unsaved")
			return map[string]string{"A": a}
		},
		op: func(t *testing.T, g *guest, dir string, st map[string]string) error {
			_, err := g.do("POST", "/v1/checkpoints/"+st["A"]+"/clone", "application/json", fmt.Sprintf(`{"path":%q}`, dir+"-clone"))
			return err
		},
		after: func(before []string, _ map[string]string) []string { return before },
	},
	{
		// Before: managed, its checkpoints listed; after: plain with the
		// same content, its checkpoints gone.
		name: "release",
		setup: func(t *testing.T, g *guest, dir string) map[string]string {
			writeFile(t, dir+"/a", "A")
			g.create(dir, "A")
			writeFile(t, dir+"/a", "B")
			writeFile(t, dir+"/sub/b", "b")
			g.create(dir, "B")
			writeFile(t, dir+"/unsaved", "u")
			return nil
		},
		op: func(t *testing.T, g *guest, dir string, _ map[string]string) error {
			_, err := g.do("POST", "/v1/directories/release", "application/json", fmt.Sprintf(`{"path":%q}`, dir))
			return err
		},
		after: func([]string, map[string]string) []string { return nil },
	},
	{
		// The fourth capture makes the background worker merge layers.
		name: "compact",
		setup: func(t *testing.T, g *guest, dir string) map[string]string {
			for i := 0; i < 3; i++ {
				writeFile(t, fmt.Sprintf("%s/f%d", dir, i), "x")
				g.create(dir, "")
			}
			writeFile(t, dir+"/f3", "x")
			return nil
		},
		op: func(t *testing.T, g *guest, dir string, _ map[string]string) error {
			_, err := g.do("POST", "/v1/checkpoints", "application/json", fmt.Sprintf(`{"path":%q}`, dir))
			if err == nil {
				time.Sleep(500 * time.Millisecond) // let the worker reach its failpoints
			}
			return err
		},
	},
}

// run prepares a scenario on a fresh guestd and stops it, returning the
// guest (stopped), the directory and the state.
func prepare(t *testing.T, sc scenario) (*guest, string, map[string]string) {
	g := newGuest(t)
	dir := filepath.Join(t.TempDir(), "project")
	if sc.xfs {
		// The store and the directory on one XFS (as in a sandbox).
		base := xfsDir(t)
		g = newGuestIn(t, base, "--allow-mount="+xfs.mnt)
		dir = filepath.Join(base, "project")
	}
	cleanupMounts(t, filepath.Dir(dir))
	os.MkdirAll(dir, 0o755)
	// Compaction waits for the operation, so that it runs the same way
	// in every run of the scenario.
	g.start("-no-compaction")
	st := sc.setup(t, g, dir)
	g.stop()
	return g, dir, st
}

// TestCrashAtEveryStep kills guestd (SIGKILL, from a failpoint) at every
// step of enroll, capture, restore, delete and background compaction,
// restarts it, and checks that the directory equals its state before or
// after the operation, that the checkpoint list agrees, that the store
// has no orphan, and that the directory still takes checkpoints.
func TestCrashAtEveryStep(t *testing.T) {
	all := slices.Clone(scenarios)
	for _, sc := range scenarios {
		// A capture's order (its window, its seal and commit after the
		// swap) on XFS too, whose fsync and reflink differ from ext4's.
		if sc.name == "capture" {
			sc.name, sc.xfs = "capture-xfs", true
			all = append(all, sc)
		}
	}
	for _, sc := range all {
		t.Run(sc.name, func(t *testing.T) {
			// A clean run learns the steps and the state after.
			g, dir, st := prepare(t, sc)
			trace := filepath.Join(t.TempDir(), "trace")
			g.start("STRATA_FAILPOINT_TRACE=" + trace)
			beforeList := ids(g.list())
			if err := sc.op(t, g, dir, st); err != nil {
				t.Fatal(err)
			}
			g.stop()
			raw, err := os.ReadFile(trace)
			if err != nil {
				t.Fatal(err)
			}
			var steps []string
			for _, s := range strings.Fields(string(raw)) {
				if !slices.Contains(steps, s) && !strings.HasPrefix(s, "recover.") {
					steps = append(steps, s)
				}
			}
			if len(steps) == 0 {
				t.Fatal("the operation hit no failpoint")
			}
			t.Logf("steps: %v (before: %d checkpoints)", steps, len(beforeList))
			for _, step := range steps {
				t.Run(step, func(t *testing.T) {
					crashAt(t, sc, step)
				})
			}
		})
	}
}

func crashAt(t *testing.T, sc scenario, step string) {
	g, dir, st := prepare(t, sc)
	before := fstree.MustSnapshot(t, dir)
	g.start()
	beforeList := ids(g.list())
	g.stop()

	// The reference: what the operation leaves when it completes.
	ref, refDir, refSt := prepare(t, sc)
	ref.start()
	refBefore := ids(ref.list())
	if err := sc.op(t, ref, refDir, refSt); err != nil {
		t.Fatal(err)
	}
	after := fstree.MustSnapshot(t, refDir)
	refAfter := ids(ref.list())
	ref.stop()

	g.start("STRATA_FAILPOINTS=" + step)
	sc.op(t, g, dir, st)
	if !g.waitKilled(10 * time.Second) {
		t.Fatalf("failpoint %s did not kill guestd\n%s", step, g.log)
	}
	g.start()
	got := fstree.MustSnapshot(t, dir)
	gotList := ids(g.list())
	dBefore, dAfter := fstree.Diff(before, got), fstree.Diff(after, got)
	if len(dBefore) > 0 && len(dAfter) > 0 {
		t.Fatalf("after a crash at %s the directory is neither before nor after:\nvs before:\n%s\nvs after:\n%s",
			step, strings.Join(dBefore, "\n"), strings.Join(dAfter, "\n"))
	}
	// The list: unchanged, or changed the way the operation changes it.
	okList := slices.Equal(gotList, beforeList)
	if !okList && len(gotList) == len(refAfter) {
		if sc.after != nil {
			okList = slices.Equal(gotList, sc.after(beforeList, st))
		} else {
			okList = len(gotList) == len(refBefore)+1 && slices.Equal(gotList[:len(beforeList)], beforeList)
		}
	}
	if !okList {
		t.Fatalf("after a crash at %s the list is %v; before %v, a completed operation leaves %d", step, gotList, beforeList, len(refAfter))
	}
	// Still working: one more checkpoint, restored.
	cp := g.create(dir, "after-crash")
	writeFile(t, dir+"/post", "p")
	g.must("POST", "/v1/checkpoints/"+cp["id"].(string)+"/restore", "")
	if _, err := os.Stat(dir + "/post"); !os.IsNotExist(err) {
		t.Fatalf("restore after recovery kept a later file: %v", err)
	}
	g.stop()
	rep, err := layers.Check(g.store)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) > 0 {
		t.Fatalf("store after a crash at %s and recovery:\n%s", step, strings.Join(rep.Problems, "\n"))
	}
}

// TestColdBoot unmounts every managed root (as a reboot does) and starts
// guestd again: every directory is back with its unsaved changes.
func TestColdBoot(t *testing.T) {
	g := newGuest(t)
	base := t.TempDir()
	cleanupMounts(t, base)
	g.start()
	var dirs []string
	var snaps []fstree.Tree
	for i := 0; i < 3; i++ {
		dir := filepath.Join(base, fmt.Sprintf("p%d", i))
		writeFile(t, dir+"/f", "saved")
		g.create(dir, "")
		writeFile(t, dir+"/f", fmt.Sprintf("unsaved %d", i))
		writeFile(t, dir+"/g", "new")
		dirs = append(dirs, dir)
		snaps = append(snaps, fstree.MustSnapshot(t, dir))
	}
	list := ids(g.list())
	g.stop()
	for _, d := range dirs {
		if err := syscallUnmount(d); err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Fatalf("%s is not empty while unmounted", d)
		}
	}
	g.start()
	for i, d := range dirs {
		if diff := fstree.Diff(snaps[i], fstree.MustSnapshot(t, d)); len(diff) > 0 {
			t.Fatalf("%s after cold boot:\n%s", d, strings.Join(diff, "\n"))
		}
	}
	if got := ids(g.list()); !slices.Equal(got, list) {
		t.Fatalf("list after cold boot %v, want %v", got, list)
	}
	g.stop()
}

// TestCrashDuringRecovery kills guestd in an operation that recovery must
// finish, then kills the restart in the middle of its recovery (between
// two syscalls of the swap it finishes, inside the capture or the
// enrollment it finishes), and checks
// that the next start recovers: the directory is in the operation's after
// state, the list holds its checkpoint, and the store checks clean.
func TestCrashDuringRecovery(t *testing.T) {
	cases := []struct {
		scenario, first, during string
		args                    []string
	}{
		// A capture frozen but not yet swapped is finished by recovery:
		// committed, then swapped (a capture killed after its swap
		// needs no swap: recovery only commits it).
		{"capture", "capture.validate.layer", "mount.swap.beneath", nil},
		{"capture", "capture.validate.layer", "mount.swap.unmounted", []string{"--legacy-mount"}},
		{"capture", "capture.mount.swap", "recover.capture.commit", nil},
		{"restore", "restore.commit", "mount.swap.beneath", nil},
		{"enroll", "enroll.exchange", "recover.enroll.commit", nil},
		{"enroll", "enroll.exchange", "recover.enroll.sync", nil},
	}
	for _, c := range cases {
		t.Run(c.scenario+"/"+c.first+"/"+c.during+strings.Join(c.args, ""), func(t *testing.T) {
			i := slices.IndexFunc(scenarios, func(s scenario) bool { return s.name == c.scenario })
			sc := scenarios[i]
			ref, refDir, refSt := prepare(t, sc)
			ref.start(c.args...)
			if err := sc.op(t, ref, refDir, refSt); err != nil {
				t.Fatal(err)
			}
			after := fstree.MustSnapshot(t, refDir)
			wantN := len(ref.list())
			ref.stop()

			g, dir, st := prepare(t, sc)
			g.start(append([]string{"STRATA_FAILPOINTS=" + c.first}, c.args...)...)
			sc.op(t, g, dir, st)
			if !g.waitKilled(10 * time.Second) {
				t.Fatalf("failpoint %s did not kill guestd\n%s", c.first, g.log)
			}
			g.spawn(append([]string{"STRATA_FAILPOINTS=" + c.during}, c.args...)...)
			if !g.waitKilled(30 * time.Second) {
				t.Fatalf("recovery did not reach failpoint %s\n%s", c.during, g.log)
			}
			g.start(c.args...)
			if d := fstree.Diff(after, fstree.MustSnapshot(t, dir)); len(d) > 0 {
				t.Fatalf("after a crash during recovery the directory is not the operation's result:\n%s", strings.Join(d, "\n"))
			}
			if n := len(g.list()); n != wantN {
				t.Fatalf("%d checkpoints after recovery, want %d", n, wantN)
			}
			g.create(dir, "after")
			g.stop()
			rep, err := layers.Check(g.store)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Problems) > 0 {
				t.Fatalf("store after a crash during recovery:\n%s", strings.Join(rep.Problems, "\n"))
			}
		})
	}
}
