package vmm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNoSpace: a save or load that QEMU failed with strerror's words for
// a full disk matches ENOSPC, whatever wraps it, and keeps its text;
// other failures do not.
func TestNoSpace(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errors.New("qemu of sb-1: saving its state failed: Unable to write to file: No space left on device"), true},
		{errors.New("qemu of sb-1: saving its state failed: Failed to write: ENOSPC"), true},
		{fmt.Errorf("migrate: %w", errors.New("Could not open '/var/lib/strata/vms/store/x.state': No space left on device")), true},
		{fmt.Errorf("writing: %w", syscall.ENOSPC), true},
		{errors.New("qemu of sb-1: saving its state failed: Unable to write to file: Broken pipe"), false},
		{errors.New("qemu of sb-1: saving its state cancelled"), false},
		{errors.New("no space left on device"), false}, // not QEMU's capitalisation nor an errno
	} {
		got := noSpace(c.err)
		if errors.Is(got, syscall.ENOSPC) != c.want {
			t.Errorf("noSpace(%q) is ENOSPC: %v, want %v", c.err, !c.want, c.want)
		}
		if got.Error() != c.err.Error() {
			t.Errorf("noSpace(%q) says %q", c.err, got)
		}
		if !errors.Is(got, c.err) {
			t.Errorf("noSpace(%q) lost its cause", c.err)
		}
	}
	if noSpace(nil) != nil {
		t.Error("noSpace(nil) is not nil")
	}
}

// TestFrozenWritable: a descriptor is left over when it names a frozen
// file (by device and inode, whatever its name) and its flags allow
// writing; read-only ones, the top's and other files' are not.
func TestFrozenWritable(t *testing.T) {
	frozen := map[fileID]string{{Dev: 8, Ino: 100}: "/store/a.qcow2", {Dev: 8, Ino: 101}: "/store/b.qcow2"}
	const largefile = 0o100000
	fds := []openFile{
		{FD: 3, ID: fileID{8, 100}, Flags: unix.O_RDONLY | unix.O_CLOEXEC},              // the frozen layer, reopened read-only
		{FD: 4, ID: fileID{8, 200}, Flags: unix.O_RDWR},                                 // the top
		{FD: 5, ID: fileID{8, 101}, Flags: unix.O_RDWR | largefile | unix.O_DIRECT},     // a reopen that failed
		{FD: 6, ID: fileID{9, 100}, Flags: unix.O_RDWR},                                 // same inode, other device
		{FD: 7, ID: fileID{8, 100}, Flags: unix.O_WRONLY},                               // write-only
		{FD: 8, ID: fileID{8, 101}, Flags: unix.O_RDONLY | unix.O_NONBLOCK | largefile}, // read-only again
	}
	got := frozenWritable(fds, frozen)
	var want []int
	for _, f := range got {
		want = append(want, f.FD)
	}
	if !slices.Equal(want, []int{5, 7}) {
		t.Errorf("frozenWritable: descriptors %v, want [5 7]", want)
	}
	if left := frozenWritable(fds, nil); len(left) != 0 {
		t.Errorf("nothing frozen, left %v", left)
	}
}

// TestOpenFiles: this process's own descriptors are read with the file
// they name and their flags: a file opened read-write shows so, by its
// device and inode.
func TestOpenFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "layer")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ro, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	fds, err := openFiles(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	left := frozenWritable(fds, map[fileID]string{idOf(fi): path})
	if len(left) != 1 || left[0].FD != int(f.Fd()) {
		t.Errorf("writable descriptors of %s: %+v, want only %d", path, left, f.Fd())
	}
}

// TestParseRunState: query-status's answer gives whether the CPUs run
// and QEMU's word for why not; a guest QEMU stopped on a failed disk
// write (io-error) is stuck, a paused or saved one is not.
func TestParseRunState(t *testing.T) {
	for _, c := range []struct {
		ret   string
		want  RunState
		stuck bool
	}{
		{`{"running":true,"status":"running"}`, RunState{Running: true, Status: "running"}, false},
		{`{"running":false,"status":"paused"}`, RunState{Status: "paused"}, false},
		{`{"running":false,"status":"postmigrate"}`, RunState{Status: "postmigrate"}, false},
		{`{"running":false,"status":"io-error"}`, RunState{Status: "io-error"}, true},
		{`{"running":false,"status":"internal-error"}`, RunState{Status: "internal-error"}, true},
		{`{"running":false,"status":"guest-panicked"}`, RunState{Status: "guest-panicked"}, true},
		{`{"running":false,"singlestep":false,"status":"inmigrate"}`, RunState{Status: "inmigrate"}, false},
	} {
		got, err := parseRunState([]byte(c.ret))
		if err != nil || got != c.want || got.Stuck() != c.stuck {
			t.Errorf("parseRunState(%s) = %+v (stuck %v), %v; want %+v (stuck %v)", c.ret, got, got.Stuck(), err, c.want, c.stuck)
		}
	}
	if _, err := parseRunState([]byte(`[`)); err == nil {
		t.Error("a broken answer parsed")
	}
}
