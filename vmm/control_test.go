package vmm

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/testenv"
)

// TestIsMachineOf: Attach adopts a process only when its -name is the
// machine's and it runs in the machine's run directory (no path of the
// machine is in a QEMU's command line any more).
func TestIsMachineOf(t *testing.T) {
	c := testConfig()
	argv, err := c.Argv()
	if err != nil {
		t.Fatal(err)
	}
	cmdline := []byte(strings.Join(append([]string{"qemu-system-x86_64"}, argv...), "\x00") + "\x00")
	other := c
	other.Name = "sb-other"
	otherArgv, _ := other.Argv()
	for _, tc := range []struct {
		name    string
		cmdline []byte
		cwd     string
		want    bool
	}{
		{"its qemu", cmdline, c.Dir, true},
		{"its qemu, cwd with a slash", cmdline, c.Dir + "/", true},
		{"another machine's qemu", []byte(strings.Join(otherArgv, "\x00")), c.Dir, false},
		{"its name, another run dir", cmdline, "/run/vm/sb-other/run", false},
		{"no -name", []byte("qemu-system-x86_64\x00-m\x00512\x00"), c.Dir, false},
		{"a name that starts like it", bytes.Replace(cmdline, []byte("sb-test,"), []byte("sb-test2,"), 1), c.Dir, false},
		{"empty", nil, c.Dir, false},
	} {
		if got := isMachineOf(tc.cmdline, tc.cwd, c); got != tc.want {
			t.Errorf("%s: isMachineOf = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestCheckControlDir(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   unix.Stat_t
		ok   bool
	}{
		{"root 0700", unix.Stat_t{Mode: unix.S_IFDIR | 0o700}, true},
		{"root 0500", unix.Stat_t{Mode: unix.S_IFDIR | 0o500}, true},
		{"group readable", unix.Stat_t{Mode: unix.S_IFDIR | 0o750}, false},
		{"world writable", unix.Stat_t{Mode: unix.S_IFDIR | 0o703}, false},
		{"the sandbox's uid's", unix.Stat_t{Mode: unix.S_IFDIR | 0o700, Uid: 200001}, false},
		{"a file", unix.Stat_t{Mode: unix.S_IFREG | 0o600}, false},
		{"a link", unix.Stat_t{Mode: unix.S_IFLNK | 0o777}, false},
	} {
		if err := checkControlDir(tc.st); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestOpenControlDirRefusesALink: a link in the place of the control
// directory is refused, even one to a directory that would pass.
func TestOpenControlDirRefusesALink(t *testing.T) {
	testenv.RequiresRoot(t)
	dir := t.TempDir()
	ctl := filepath.Join(dir, "ctl")
	if err := os.Mkdir(ctl, 0o700); err != nil {
		t.Fatal(err)
	}
	if f, err := openControlDir(ctl); err != nil {
		t.Fatalf("a root 0700 directory: %v", err)
	} else {
		f.Close()
	}
	link := filepath.Join(dir, "link")
	os.Symlink(ctl, link)
	if f, err := openControlDir(link); err == nil {
		f.Close()
		t.Fatal("a link to the control directory was opened")
	}
}

// TestCappedLog: whatever is written, the current file holds at most the
// cap and the rotated one at most the cap; the newest bytes are the
// current file's end, and ReadTail reads across the rotation.
func TestCappedLog(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "console.log")
	const max = 1000
	l := newCappedLog(path, max)
	var all []byte
	for i := 0; i < 57; i++ {
		chunk := bytes.Repeat([]byte{byte('a' + i%26)}, 37*i+1)
		if n, err := l.Write(chunk); n != len(chunk) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		all = append(all, chunk...)
	}
	l.Close()
	cur, _ := os.ReadFile(path)
	prev, _ := os.ReadFile(path + ".1")
	if len(cur) > max || len(prev) > max || len(cur) == 0 {
		t.Fatalf("current %d bytes, previous %d: cap %d", len(cur), len(prev), max)
	}
	if !bytes.HasSuffix(all, append(prev, cur...)) {
		t.Fatal("the two files are not the end of what was written")
	}
	if got := ReadTail(path, 1500); !bytes.Equal(got, all[len(all)-min(1500, len(prev)+len(cur)):]) {
		t.Fatalf("ReadTail across the rotation: %d bytes", len(got))
	}
	if got := ReadHead(path, 100); !bytes.Equal(got, prev[:min(100, len(prev))]) {
		t.Fatalf("ReadHead of a rotated log: %q, want the rotated part's start", got)
	}
	one := filepath.Join(dir, "one.log")
	os.WriteFile(one, []byte("strata-init: stage 1\nmore"), 0o600)
	if got := string(ReadHead(one, 20)); got != "strata-init: stage 1" {
		t.Fatalf("ReadHead of a log never rotated: %q", got)
	}
	if got := ReadHead(filepath.Join(dir, "none.log"), 20); got != nil {
		t.Fatalf("ReadHead of no log: %q", got)
	}
	// A second writer (after a restart) appends, and keeps the cap.
	l2 := newCappedLog(path, max)
	l2.Write(bytes.Repeat([]byte("z"), 3*max+7))
	l2.Close()
	cur, _ = os.ReadFile(path)
	prev, _ = os.ReadFile(path + ".1")
	if len(cur) > max || len(prev) > max || !bytes.HasSuffix(cur, []byte("zzz")) {
		t.Fatalf("after a second writer: current %d, previous %d", len(cur), len(prev))
	}
}

// TestCappedLogRefusesALink: a link in the place of the log is not
// written through.
func TestCappedLogRefusesALink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("keep"), 0o600)
	path := filepath.Join(dir, "console.log")
	os.Symlink(target, path)
	l := newCappedLog(path, 100)
	l.Write([]byte("written"))
	l.Close()
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatalf("the link's target became %q", b)
	}
}
