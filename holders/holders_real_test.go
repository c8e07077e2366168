package holders

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/testenv"
)

// spawned maps the pid of each process a test started to what it should be
// found as.
type spawned map[int][]string

// waitHolders scans until the holders among the spawned processes are
// exactly want (processes take a moment to set up), or fails after 10 s.
// Holders that are not ours are logged, not judged: the machine is shared.
func waitHolders(t *testing.T, target Target, want spawned) []Holder {
	t.Helper()
	s := NewScanner("")
	deadline := time.Now().Add(10 * time.Second)
	for {
		all, err := s.Holders(context.Background(), target)
		if err != nil {
			t.Fatal(err)
		}
		got := spawned{}
		var ours []Holder
		for _, h := range all {
			if _, ok := want[h.PID]; ok {
				got[h.PID] = append(got[h.PID], h.Kind)
				ours = append(ours, h)
				if h.Command == "" {
					t.Errorf("holder %d has no command", h.PID)
				}
			}
		}
		for pid, kinds := range want {
			if len(kinds) == 0 && got[pid] == nil {
				got[pid] = kinds
			}
		}
		if reflect.DeepEqual(got, want) {
			for _, h := range all {
				if _, ok := want[h.PID]; !ok {
					t.Logf("another process also holds the target: %+v", h)
				}
			}
			return ours
		}
		if time.Now().After(deadline) {
			t.Fatalf("holders of %s:\n got %v\nwant %v\n(all: %+v)", target.Path, got, want, all)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func command(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	return cmd
}

// writeHolderFiles writes the files the holder processes use: a file to
// open, a page to map, and a copy of sleep to run.
func writeHolderFiles(t *testing.T, dir string) {
	t.Helper()
	writeTree(t, dir, []node{mkdir("sub"), file("f")})
	if err := os.WriteFile(filepath.Join(dir, "big"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "mysleep"), data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestHoldersRealProcesses finds real processes using a plain directory:
// a working directory, an open fd, a mapping without fd, an executable and
// a chroot, and not a process elsewhere.
func TestHoldersRealProcesses(t *testing.T) {
	testenv.RequiresRoot(t)
	dir := t.TempDir()
	writeHolderFiles(t, dir)
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	want := spawned{
		spawn(t, command(filepath.Join(dir, "sub"), "sleep", "600"), false):                                     {KindCwd},
		spawn(t, command("/", "sh", "-c", `exec 3<"$1"; exec sleep 600`, "sh", filepath.Join(dir, "f")), false): {KindFD},
		spawn(t, helperCmd(t, "mmap:"+filepath.Join(dir, "big")), true):                                         {KindMmap},
		spawn(t, command("/", filepath.Join(dir, "mysleep"), "600"), false):                                     {KindMmap},
		spawn(t, helperCmd(t, "chroot:"+dir), true):                                                             {KindCwd, KindRoot},
		spawn(t, command("/", "sleep", "600"), false):                                                           nil,
	}
	got := waitHolders(t, Target{Path: dir, Dev: uint64(st.Dev)}, want)
	for _, h := range got {
		if h.Kind == KindFD && h.Command != "sleep" {
			t.Errorf("fd holder command = %q, want sleep", h.Command)
		}
	}
}

// TestHoldersRealOverlay finds the users of an overlay by its device:
// every kind, a process in another mount namespace that still has the
// overlay, and all of them again once the overlay is detached from this
// namespace (paths no longer resolve; devices still do).
func TestHoldersRealOverlay(t *testing.T) {
	testenv.RequiresRootMounts(t)
	base := t.TempDir()
	l, u, w, m := filepath.Join(base, "l"), filepath.Join(base, "u"), filepath.Join(base, "w"), filepath.Join(base, "m")
	writeTree(t, base, []node{mkdir("l"), mkdir("u"), mkdir("w"), mkdir("m")})
	writeHolderFiles(t, l)
	mount(t, "overlay", m, "overlay", fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", l, u, w))
	var st unix.Stat_t
	if err := unix.Stat(m, &st); err != nil {
		t.Fatal(err)
	}
	target := Target{Path: m, Dev: uint64(st.Dev), WholeDev: true, BackingDirs: []string{l, u}}

	want := spawned{
		spawn(t, command(filepath.Join(m, "sub"), "sleep", "600"), false):                                     {KindCwd},
		spawn(t, command("/", "sh", "-c", `exec 3<"$1"; exec sleep 600`, "sh", filepath.Join(m, "f")), false): {KindFD},
		spawn(t, helperCmd(t, "mmap:"+filepath.Join(m, "big")), true):                                         {KindMmap},
		spawn(t, command("/", filepath.Join(m, "mysleep"), "600"), false):                                     {KindMmap},
		spawn(t, helperCmd(t, "chroot:"+m), true):                                                             {KindCwd, KindRoot},
		spawn(t, command("/", "unshare", "-m", "--propagation", "private", "sleep", "600"), false):            {KindMountNamespace},
		spawn(t, command("/", "unshare", "-m", "--propagation", "private", "sh", "-c",
			`umount -l "$1" && exec sleep 600`, "sh", m), false): nil, // its namespace dropped the overlay
		spawn(t, command("/", "sleep", "600"), false): nil,
	}
	waitHolders(t, target, want)

	// The real gate: the kernel refuses to unmount a used overlay.
	if err := unix.Unmount(m, 0); err != unix.EBUSY {
		t.Fatalf("umount of a used overlay = %v, want EBUSY", err)
	}
	if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	waitHolders(t, target, want)
}

// TestHoldersRealNamespacePlainDir finds processes of other mount
// namespaces that mounted something under a plain directory or bind
// mounted a part of it elsewhere, and not those that merely see it.
func TestHoldersRealNamespacePlainDir(t *testing.T) {
	testenv.RequiresRootMounts(t)
	dir := t.TempDir()
	elsewhere := t.TempDir()
	writeTree(t, dir, []node{mkdir("sub"), mkdir("sub2")})
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	unshare := func(script string, args ...string) *exec.Cmd {
		return command("/", append([]string{"unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"}, args...)...)
	}
	want := spawned{
		spawn(t, unshare(`mount -t tmpfs tmpfs "$1" && exec sleep 600`, filepath.Join(dir, "sub")), false):          {KindMountNamespace},
		spawn(t, unshare(`mount --bind "$1" "$2" && exec sleep 600`, filepath.Join(dir, "sub2"), elsewhere), false): {KindMountNamespace},
		spawn(t, unshare(`exec sleep 600`), false):                                                                  nil,
		spawn(t, unshare(`mount -t tmpfs tmpfs "$1" && exec sleep 600`, elsewhere), false):                          nil,
	}
	waitHolders(t, Target{Path: dir, Dev: uint64(st.Dev)}, want)
}

// BenchmarkHolders scans a /proc with 1,000 extra sleep processes, none of
// which uses the target.
func BenchmarkHolders(b *testing.B) {
	dir := b.TempDir()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		b.Fatal(err)
	}
	for range 1000 {
		spawn(b, command("/", "sleep", "3600"), false)
	}
	for _, bc := range []struct {
		name   string
		target Target
	}{
		// A plain directory on the root filesystem: most links share its
		// device, so most need a readlink too.
		{"plain", Target{Path: dir, Dev: uint64(st.Dev)}},
		// An overlay's device: one stat per link decides.
		{"whole-dev", Target{Path: dir, Dev: unix.Mkdev(0, 0xfffff), WholeDev: true, BackingDirs: []string{dir + "/l"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := NewScanner("")
			for b.Loop() {
				hs, err := s.Holders(context.Background(), bc.target)
				if err != nil {
					b.Fatal(err)
				}
				if slices.ContainsFunc(hs, func(h Holder) bool { return h.Kind != KindUnknown }) {
					b.Fatalf("unexpected holders %v", hs)
				}
			}
		})
	}
}
