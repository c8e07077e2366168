package holders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
)

// fakeProc is a /proc tree written as files and symlinks in a temporary
// directory, in the spirit of procfs's fixtures. Magic links become plain
// symlinks: stat follows them to a real file whose st_dev the test knows.
type fakeProc struct {
	t    *testing.T
	proc string
}

// fakeProcess describes one /proc/PID directory. Empty fields are left out
// (an absent entry reads as ENOENT, like a process that exited).
type fakeProcess struct {
	comm      string
	ns        string            // ns/mnt link target, e.g. "mnt:[1]"
	links     map[string]string // cwd, root, exe -> target
	fds       []string          // fd/3, fd/4, ... -> target
	maps      string
	mountinfo string
	dirs      []string // entries made directories, to make them unreadable as files
}

const selfNS = "mnt:[4026531841]"

func newFakeProc(t *testing.T, selfMountinfo string) *fakeProc {
	t.Helper()
	proc := filepath.Join(t.TempDir(), "proc")
	writeTree(t, proc, []node{mkdir("self/ns"), symlink("self/ns/mnt", selfNS), file("sys/notapid"), file("cmdline")})
	if err := os.WriteFile(filepath.Join(proc, "self/mountinfo"), []byte(selfMountinfo), 0o644); err != nil {
		t.Fatal(err)
	}
	return &fakeProc{t: t, proc: proc}
}

func (f *fakeProc) add(pid int, p fakeProcess) {
	f.t.Helper()
	base := strconv.Itoa(pid)
	nodes := []node{mkdir(base)}
	if p.ns != "" {
		nodes = append(nodes, symlink(base+"/ns/mnt", p.ns))
	}
	for name, target := range p.links {
		nodes = append(nodes, symlink(base+"/"+name, target))
	}
	nodes = append(nodes, mkdir(base+"/fd"))
	for i, target := range p.fds {
		nodes = append(nodes, symlink(fmt.Sprintf("%s/fd/%d", base, i+3), target))
	}
	for _, d := range p.dirs {
		nodes = append(nodes, mkdir(base+"/"+d))
	}
	writeTree(f.t, f.proc, nodes)
	for name, content := range map[string]string{"comm": p.comm, "maps": p.maps, "mountinfo": p.mountinfo} {
		if content == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(f.proc, base, name), []byte(content), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
}

// mountLine is a mountinfo line for a mount of device dev.
func mountLine(id int, dev uint64, root, mountpoint string) string {
	return fmt.Sprintf("%d 1 %d:%d %s %s rw,relatime - ext4 /dev/x rw\n", id, unix.Major(dev), unix.Minor(dev), root, mountpoint)
}

// mapsLine is a maps line for a file mapping of device dev ("%02x:%02x").
func mapsLine(dev uint64, ino int, path string) string {
	return fmt.Sprintf("7f0000000000-7f0000004000 rw-s 00000000 %02x:%02x %d                    %s\n", unix.Major(dev), unix.Minor(dev), ino, path)
}

const anonMaps = "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n" +
	"7f1000000000-7f1000001000 r--p 00000000 00:00 0 \n"

func TestHoldersFakeProc(t *testing.T) {
	tmp := t.TempDir()
	writeTree(t, tmp, []node{mkdir("ws/project/sub"), file("ws/project/f"), mkdir("ws/elsewhere"), file("ws/elsewhere/f"), mkdir("layers/1/fs")})
	project := filepath.Join(tmp, "ws/project")
	elsewhere := filepath.Join(tmp, "ws/elsewhere")
	var st unix.Stat_t
	if err := unix.Stat(tmp, &st); err != nil {
		t.Fatal(err)
	}
	dev := uint64(st.Dev)
	otherDev := unix.Mkdev(0, 0x99) // a device no test file lives on
	if dev == otherDev {
		t.Fatal("pick another fake device")
	}
	// The caller's own mount table: the temp dir's filesystem is mounted
	// at "/" with root "/", so the directory's path inside it is itself.
	fp := newFakeProc(t, mountLine(1, dev, "/", "/"))
	procDev := "/proc" // on procfs: never the temp dir's device

	fp.add(100, fakeProcess{comm: "shell", ns: selfNS, links: map[string]string{"cwd": project + "/sub", "root": procDev, "exe": procDev}})
	fp.add(101, fakeProcess{comm: "editor", ns: selfNS, links: map[string]string{"cwd": procDev}, fds: []string{procDev, project + "/f", "pipe:[123]"}})
	fp.add(102, fakeProcess{comm: "mapper", ns: selfNS, maps: anonMaps + mapsLine(dev, 7, project+"/f")})
	fp.add(103, fakeProcess{comm: "chrooted", ns: selfNS, links: map[string]string{"root": project, "cwd": project}})
	fp.add(104, fakeProcess{comm: "tool", ns: selfNS, links: map[string]string{"exe": project + "/f", "cwd": elsewhere}})
	fp.add(105, fakeProcess{comm: "elsewhere", ns: selfNS, links: map[string]string{"cwd": elsewhere, "root": procDev},
		fds: []string{elsewhere + "/f"}, maps: mapsLine(dev, 8, elsewhere+"/f")})
	fp.add(106, fakeProcess{comm: "detached", ns: selfNS, maps: mapsLine(dev, 9, "/f (deleted)")})
	fp.add(107, fakeProcess{comm: "oldkernel", ns: selfNS, maps: mapsLine(otherDev, 10, project+"/f")})
	fp.add(108, fakeProcess{comm: "layermap", ns: selfNS, maps: mapsLine(otherDev, 11, filepath.Join(tmp, "layers/1/fs/lib.so"))})
	fp.add(109, fakeProcess{comm: "deleted", ns: selfNS, fds: []string{project + "/gone (deleted)"},
		maps: mapsLine(dev, 12, project+"/old.so (deleted)")})
	// Other mount namespaces: one holds a mount of the overlay's device,
	// one a mount below the directory, one a bind mount of a subdirectory,
	// one nothing of ours. Two processes share the first namespace.
	nsDev := mountLine(1, otherDev, "/", "/") + mountLine(2, dev, "/", "/srv/m")
	fp.add(110, fakeProcess{comm: "ns-dev", ns: "mnt:[2]", mountinfo: nsDev})
	fp.add(111, fakeProcess{comm: "ns-dev-2", ns: "mnt:[2]", mountinfo: nsDev})
	fp.add(112, fakeProcess{comm: "ns-below", ns: "mnt:[3]", mountinfo: mountLine(1, otherDev, "/", "/") + mountLine(2, otherDev, "/", project+"/sub")})
	fp.add(113, fakeProcess{comm: "ns-bind", ns: "mnt:[4]", mountinfo: mountLine(1, otherDev, "/", "/") + mountLine(2, dev, project+"/sub", "/mnt/x")})
	fp.add(114, fakeProcess{comm: "ns-clone", ns: "mnt:[5]", mountinfo: mountLine(1, dev, "/", "/")})
	// Unreadable entries: a symlink loop (ELOOP) and maps as a directory.
	fp.add(120, fakeProcess{comm: "loop", ns: selfNS, links: map[string]string{"cwd": "cwd"}})
	fp.add(121, fakeProcess{comm: "weird", ns: selfNS, dirs: []string{"maps"}})
	fp.add(122, fakeProcess{comm: "badns", ns: "mnt:[6]", mountinfo: "garbage\n"})
	// Gone: no ns link (exited before the scan); no comm (exited during it).
	fp.add(130, fakeProcess{links: map[string]string{"cwd": project}})
	fp.add(131, fakeProcess{ns: selfNS, links: map[string]string{"cwd": project}})
	// The caller itself is never a holder.
	fp.add(os.Getpid(), fakeProcess{comm: "me", ns: selfNS, links: map[string]string{"cwd": project}})

	tests := []struct {
		name   string
		nsOnly bool // MountNamespaces instead of Holders
		target Target
		want   []Holder
	}{
		{
			// Only what no kernel gate of this namespace covers: the
			// foreign namespaces, and the processes that could not be
			// read (the loop and the weird maps are read no more).
			name:   "whole device, mount namespaces only",
			nsOnly: true,
			target: Target{Path: project, Dev: dev, WholeDev: true, BackingDirs: []string{filepath.Join(tmp, "layers/1/fs")}},
			want: []Holder{
				{110, "ns-dev", KindMountNamespace},
				{111, "ns-dev-2", KindMountNamespace},
				{113, "ns-bind", KindMountNamespace},
				{114, "ns-clone", KindMountNamespace},
				{122, "badns", KindUnknown},
			},
		},
		{
			name:   "whole device",
			target: Target{Path: project, Dev: dev, WholeDev: true, BackingDirs: []string{filepath.Join(tmp, "layers/1/fs")}},
			want: []Holder{
				{100, "shell", KindCwd},
				{101, "editor", KindFD},
				{102, "mapper", KindMmap},
				{103, "chrooted", KindCwd}, {103, "chrooted", KindRoot},
				{104, "tool", KindCwd}, {104, "tool", KindMmap}, // cwd elsewhere on the same device counts
				{105, "elsewhere", KindCwd}, {105, "elsewhere", KindFD}, {105, "elsewhere", KindMmap},
				{106, "detached", KindMmap},
				{107, "oldkernel", KindMmap},
				{108, "layermap", KindMmap},
				{109, "deleted", KindMmap},
				{110, "ns-dev", KindMountNamespace},
				{111, "ns-dev-2", KindMountNamespace},
				{113, "ns-bind", KindMountNamespace},
				{114, "ns-clone", KindMountNamespace},
				{120, "loop", KindUnknown},
				{121, "weird", KindUnknown},
				{122, "badns", KindUnknown},
			},
		},
		{
			name:   "plain directory",
			target: Target{Path: project, Dev: dev},
			want: []Holder{
				{100, "shell", KindCwd},
				{101, "editor", KindFD},
				{102, "mapper", KindMmap},
				{103, "chrooted", KindCwd}, {103, "chrooted", KindRoot},
				{104, "tool", KindMmap},
				{109, "deleted", KindMmap},
				{112, "ns-below", KindMountNamespace},
				{113, "ns-bind", KindMountNamespace},
				{120, "loop", KindUnknown},
				{121, "weird", KindUnknown},
				{122, "badns", KindUnknown},
			},
		},
		{
			// With a device that serves none of the links, only the path
			// rules of maps and mountinfo remain.
			name:   "plain directory, other device",
			target: Target{Path: project, Dev: otherDev},
			want: []Holder{
				{107, "oldkernel", KindMmap},
				{112, "ns-below", KindMountNamespace},
				{120, "loop", KindUnknown},
				{121, "weird", KindUnknown},
				{122, "badns", KindUnknown},
			},
		},
		{
			name:   "plain directory, match by path alone",
			target: Target{Path: project},
			want: []Holder{
				{100, "shell", KindCwd},
				{101, "editor", KindFD},
				{102, "mapper", KindMmap},
				{103, "chrooted", KindCwd}, {103, "chrooted", KindRoot},
				{104, "tool", KindMmap},
				{107, "oldkernel", KindMmap},
				{109, "deleted", KindMmap},
				{112, "ns-below", KindMountNamespace},
				{120, "loop", KindUnknown},
				{121, "weird", KindUnknown},
				{122, "badns", KindUnknown},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scan := NewScanner(fp.proc).Holders
			if tt.nsOnly {
				scan = NewScanner(fp.proc).MountNamespaces
			}
			got, err := scan(context.Background(), tt.target)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("holders:\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestHoldersNone(t *testing.T) {
	fp := newFakeProc(t, "")
	fp.add(100, fakeProcess{comm: "idle", ns: selfNS, links: map[string]string{"cwd": "/proc"}})
	got, err := NewScanner(fp.proc).Holders(context.Background(), Target{Path: "/workspace/project", Dev: 1, WholeDev: true})
	if err != nil || got != nil {
		t.Fatalf("Holders = %v, %v; want nil, nil", got, err)
	}
}

func TestHoldersErrors(t *testing.T) {
	fp := newFakeProc(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewScanner(fp.proc).Holders(ctx, Target{Path: "/x", WholeDev: true}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if _, err := NewScanner(fp.proc).Holders(context.Background(), Target{Path: "relative"}); err == nil {
		t.Error("relative target path accepted")
	}
	if _, err := NewScanner(t.TempDir()).Holders(context.Background(), Target{Path: "/x"}); err == nil {
		t.Error("a /proc without self/ns/mnt accepted")
	}
}

func TestParseMapsLine(t *testing.T) {
	tests := []struct {
		line     string
		maj, min uint32
		path     string
		ok       bool
	}{
		{"55fe3cf2f000-55fe3cf31000 r--p 00000000 00:26 9979416                    /tmp/x/m/mysleep", 0, 0x26, "/tmp/x/m/mysleep", true},
		{"7f7382796000-7f738279a000 rw-s 00000000 fe:00 9979415   /a b/c (deleted)", 0xfe, 0, "/a b/c (deleted)", true},
		{"7f0-7f1 r--p 00000000 103:0a 12 /x", 0x103, 0x0a, "/x", true},
		{"7ffd0-7ffd1 rw-p 00000000 00:00 0                          [stack]", 0, 0, "", false},
		{"7ffd0-7ffd1 rw-p 00000000 00:00 0 ", 0, 0, "", false},
		{"", 0, 0, "", false},
		{"garbage", 0, 0, "", false},
		{"a b c zz:00 1 /x", 0, 0, "", false},
	}
	for _, tt := range tests {
		maj, min, path, ok := parseMapsLine([]byte(tt.line))
		if ok != tt.ok || (ok && (maj != tt.maj || min != tt.min || string(path) != tt.path)) {
			t.Errorf("parseMapsLine(%q) = %x:%x %q %v", tt.line, maj, min, path, ok)
		}
	}
}

func FuzzParseMapsLine(f *testing.F) {
	f.Add("55fe3cf2f000-55fe3cf31000 r--p 00000000 00:26 9979416                    /tmp/x")
	f.Add("7ffd0-7ffd1 rw-p 00000000 00:00 0  [stack]")
	f.Fuzz(func(t *testing.T, line string) {
		_, _, path, ok := parseMapsLine([]byte(line))
		if ok && !strings.Contains(line, string(path)) {
			t.Fatalf("path %q not in line %q", path, line)
		}
	})
}

func TestBusyError(t *testing.T) {
	hs := []Holder{{PID: 42, Command: "vim", Kind: KindCwd}}
	err := BusyError("/workspace/project", hs)
	if fe := fault.As(err); fe == nil || fe.Kind != fault.Conflict || fe.Code != CodeDirectoryBusy || fe.Message == "" || fe.Fields["path"] != "/workspace/project" {
		t.Fatalf("BusyError = %#v, want a %s %s with a message and the path", err, fault.Conflict, CodeDirectoryBusy)
	}
	if got := fault.As(err).Fields["holders"]; !reflect.DeepEqual(got, hs) {
		t.Errorf("holders = %v", got)
	}
	b, _ := json.Marshal(fault.As(BusyError("/p", nil)).Fields)
	if string(b) != `{"holders":[],"path":"/p"}` {
		t.Errorf("fields of a busy error without holders = %s", b)
	}
	b, _ = json.Marshal(hs[0])
	if string(b) != `{"pid":42,"command":"vim","kind":"cwd"}` {
		t.Errorf("holder JSON = %s", b)
	}
}
