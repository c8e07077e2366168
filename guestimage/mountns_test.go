package guestimage

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/testenv"
)

// A mount made inside inPrivateMountNS, by the function or by a process it
// starts, is invisible to the rest of the process and gone afterwards,
// even when the function does not unmount it (the path of a build that
// fails between mount and unmount).
func TestInPrivateMountNS(t *testing.T) {
	testenv.RequiresRoot(t)
	dir := t.TempDir()
	err := inPrivateMountNS(func() error {
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
			return err
		}
		// A child forked from this thread sees the mount too.
		return run(t.Context(), nil, "sh", "-c", `echo inside > "$1"/file`, "sh", dir)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "file")); !os.IsNotExist(err) {
		t.Errorf("the private mount is visible outside: %v", err)
	}
	// /proc/self is the main thread's view, which may be the one that ran
	// fn (see inPrivateMountNS): look from this goroutine's own thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), " "+dir+" ") {
		t.Errorf("%s is still mounted in the test's namespace", dir)
	}
}

func TestCheckStatic(t *testing.T) {
	notELF := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"dynamic": "/bin/sh", "not ELF": notELF, "missing": "/nonexistent", "none": ""} {
		if err := checkStatic(path); err == nil {
			t.Errorf("%s (%s) accepted as a static binary", name, path)
		}
	}
	if err := checkStatic("/bin/sh"); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("a dynamic binary's error should say how to build it: %v", err)
	}
}
