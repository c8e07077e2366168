package layers

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain doubles as a helper process: with STRATA_TEST_MMAP=file it maps
// the file shared, closes it and sleeps, so a test can show a holder that
// has no fd and no cwd in the directory, only a mapping.
//
// With STRATA_TEST_OP set it runs one store operation and exits (the
// crash tests' child: see runTestOp).
func TestMain(m *testing.M) {
	if os.Getenv("STRATA_TEST_OP") != "" {
		os.Exit(runTestOp())
	}
	if f := os.Getenv("STRATA_TEST_MMAP"); f != "" {
		fd, err := unix.Open(f, unix.O_RDONLY, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if _, err := unix.Mmap(fd, 0, 1, unix.PROT_READ, unix.MAP_SHARED); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		unix.Close(fd)
		fmt.Println("mapped")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	code := m.Run()
	xfs.close()
	os.Exit(code)
}

// xfs is the XFS filesystem (reflink on) of this test binary, made at the
// first test that asks for it: an image under the temporary directory,
// loop-mounted in the binary's private mount namespace. It goes with the
// binary: TestMain unmounts it and removes the image.
var xfs xfsFS

type xfsFS struct {
	once sync.Once
	img  string
	mnt  string
	err  error
}

// xfsDir returns a new empty directory on the test binary's XFS, removed
// when t ends.
func xfsDir(t *testing.T) string {
	t.Helper()
	xfs.once.Do(func() {
		dir, err := os.MkdirTemp("", "strata-xfs-")
		if err != nil {
			xfs.err = err
			return
		}
		xfs.img, xfs.mnt = dir+".img", dir
		f, err := os.Create(xfs.img)
		if err == nil {
			err = errors.Join(f.Truncate(4<<30), f.Close())
		}
		if err != nil {
			xfs.err = err
			return
		}
		if out, err := exec.Command("mkfs.xfs", "-q", "-f", "-m", "reflink=1", xfs.img).CombinedOutput(); err != nil {
			xfs.err = fmt.Errorf("mkfs.xfs: %v: %s", err, out)
			return
		}
		if out, err := exec.Command("mount", "-o", "loop", xfs.img, xfs.mnt).CombinedOutput(); err != nil {
			xfs.err = fmt.Errorf("mount the XFS image: %v: %s", err, out)
		}
	})
	if xfs.err != nil {
		t.Fatalf("XFS for the conformance suite: %v (make test installs xfsprogs)", xfs.err)
	}
	dir, err := os.MkdirTemp(xfs.mnt, "t-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (x *xfsFS) close() {
	if x.mnt != "" {
		unix.Unmount(x.mnt, unix.MNT_DETACH)
		os.Remove(x.mnt)
	}
	if x.img != "" {
		os.Remove(x.img)
	}
}
