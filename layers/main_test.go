package layers

import (
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain doubles as a helper process: with STRATA_TEST_MMAP=file it maps
// the file shared, closes it and sleeps, so a test can show a holder that
// has no fd and no cwd in the directory, only a mapping.
func TestMain(m *testing.M) {
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
	os.Exit(m.Run())
}
