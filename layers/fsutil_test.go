package layers

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"strata/internal/fault"
)

// Running out of blocks, inodes or quota at any step is 507
// insufficient_storage (defect 6 of issue 6: it was a 500); any other
// error, and an error that already has a class, keeps its own.
func TestClassifyNoSpace(t *testing.T) {
	busy := fault.New(fault.Conflict, "directory_busy", "busy")
	for _, tc := range []struct {
		name string
		err  error
		code string // "" for an unclassified error
	}{
		{"ENOSPC", unix.ENOSPC, "insufficient_storage"},
		{"EDQUOT", unix.EDQUOT, "insufficient_storage"},
		{"wrapped", &os.PathError{Op: "mkdir", Path: "/s/tmp/7", Err: unix.ENOSPC}, "insufficient_storage"},
		{"other", unix.EIO, ""},
		{"classified", busy.Wrap(unix.ENOSPC), "directory_busy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := classifyNoSpace(tc.err)
			if got := fault.CodeOf(err); got != tc.code {
				t.Fatalf("code %q, want %q", got, tc.code)
			}
			if !errors.Is(err, tc.err) && tc.code != "directory_busy" {
				t.Fatalf("the cause is lost: %v", err)
			}
		})
	}
	if classifyNoSpace(nil) != nil {
		t.Fatal("nil is not nil")
	}
}
