package vmm

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
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
