package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"strata/holders"
	"strata/internal/fault"
)

// TestWriterDuringCaptures: a tight loop writes numbered files into a
// managed directory (each written under a temporary name, then renamed:
// one step that is done or not) while the directory is captured 200
// times. The loop sees no error but EROFS (the window: freeze to swap),
// and each checkpoint holds exactly the files 0..m-1 for an m between
// the files done when its capture was asked and when it answered: a
// state the writer produced, never one without a write answered before
// the capture began, never a write twice or torn. The last checkpoint
// restores to its content. With the mount(2) mounter the window also
// holds the empty mountpoint between its unmount and mount (EPERM,
// ENOENT), as design.md says.
func TestWriterDuringCaptures(t *testing.T) {
	forEachMounter(t, func(t *testing.T, h *harness) {
		// The window's errors: EROFS; with mount(2), also those of the
		// empty mountpoint between its unmount and mount (EPERM from the
		// immutable flag, ENOENT for the missing subdirectory).
		window := []unix.Errno{unix.EROFS}
		if h.legacy {
			window = append(window, unix.EPERM, unix.ENOENT)
		}
		ctx := context.Background()
		dir := h.mkdir("written", func(d string) { write(t, d+"/w/keep", "k") })
		h.capture(dir, "first")

		var done atomic.Int64 // files renamed into place
		var quit atomic.Bool
		failed := map[string]int{}
		erofs := 0
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			for n := int64(0); !quit.Load(); {
				tmp, final := filepath.Join(dir, "w", ".tmp"), filepath.Join(dir, "w", strconv.FormatInt(n, 10))
				err := os.WriteFile(tmp, []byte(strconv.FormatInt(n, 10)), 0o644)
				if err == nil {
					err = os.Rename(tmp, final)
				}
				var en unix.Errno
				switch {
				case err == nil:
					n++
					done.Store(n)
					// A breath between writes: with its file open all the
					// time, the freeze's gate would refuse every capture
					// (busy), as it must.
					time.Sleep(500 * time.Microsecond)
				case errors.As(err, &en) && slices.Contains(window, en):
					erofs++
				default:
					failed[err.Error()]++
				}
			}
		}()

		type taken struct {
			id       string
			low, top int64 // files done when asked, and when answered
		}
		var cps []taken
		busy := 0
		for t0 := time.Now(); len(cps) < 200 && time.Since(t0) < 2*time.Minute; {
			low := done.Load()
			cp, err := h.store.Capture(ctx, dir, "")
			top := done.Load()
			switch {
			case err == nil:
				cps = append(cps, taken{cp.ID, low, top})
			case fault.CodeOf(err) == holders.CodeDirectoryBusy:
				busy++ // the writer had its file open: the freeze's gate
			default:
				quit.Store(true)
				<-stopped
				t.Fatalf("capture %d: %v", len(cps), err)
			}
		}
		quit.Store(true)
		<-stopped
		t.Logf("%d captures (%d refused busy), %d files written, %d writes refused in the window", len(cps), busy, done.Load(), erofs)
		if len(failed) > 0 {
			t.Fatalf("writes failed otherwise than EROFS: %v", failed)
		}
		if len(cps) < 200 {
			t.Fatalf("only %d captures in 2 minutes (%d refused busy)", len(cps), busy)
		}
		for i, c := range cps {
			e, err := h.store.ReadEntry(ctx, c.id, "w")
			if err != nil {
				t.Fatal(err)
			}
			var nums []int64
			for _, de := range e.Entries {
				if de.Name == "keep" || de.Name == ".tmp" {
					continue
				}
				n, err := strconv.ParseInt(de.Name, 10, 64)
				if err != nil {
					t.Fatalf("checkpoint %d holds %q", i, de.Name)
				}
				nums = append(nums, n)
			}
			slices.Sort(nums)
			m := int64(len(nums))
			for j, n := range nums {
				if n != int64(j) {
					t.Fatalf("checkpoint %d holds files %v…: not 0..%d", i, nums[:min(len(nums), j+3)], m-1)
				}
			}
			if m < c.low || m > c.top {
				t.Fatalf("checkpoint %d holds %d files; %d were done when it was asked, %d when it answered", i, m, c.low, c.top)
			}
			if m > 0 {
				last, err := h.store.ReadEntry(ctx, c.id, fmt.Sprintf("w/%d", m-1))
				if err != nil || string(last.Content) != strconv.FormatInt(m-1, 10) {
					t.Fatalf("checkpoint %d: file %d holds %q (%v)", i, m-1, last.Content, err)
				}
			}
		}
		last := cps[len(cps)-1]
		h.restore(last.id)
		ents, err := os.ReadDir(filepath.Join(dir, "w"))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := h.store.ReadEntry(ctx, last.id, "w")
		if len(ents) != len(want.Entries) {
			t.Fatalf("restored the last checkpoint: %d entries, it holds %d", len(ents), len(want.Entries))
		}
		h.assertClean()
	})
}
