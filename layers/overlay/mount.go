package overlay

import (
	"context"
	"fmt"
)

// Mounter attaches overlay stacks. Two implementations exist: one built on
// the new mount API (fsopen with one "lowerdir+" per layer, then
// move_mount, beneath the old stack where the kernel can), and one built
// on mount(2) with relative layer names for kernels without it. The same
// conformance suite runs against both.
type Mounter interface {
	// Name identifies the implementation in logs and metrics.
	Name() string
	// Options are the options every mount it makes carries.
	Options() Options
	// Mount attaches s at t, on top of whatever is there.
	Mount(ctx context.Context, t Target, s Stack) error
	// Replace puts s at t in place of the mount on top of it, which the
	// caller has frozen. lazy reports that the old mount was still in use
	// and was detached lazily: it lives on, read-only, for its holders.
	Replace(ctx context.Context, t Target, s Stack) (lazy bool, err error)
}

// MountError is a failed mount syscall with its operation and Target.
type MountError struct {
	Op     string
	Target string
	Err    error
}

func (e *MountError) Error() string {
	return fmt.Sprintf("%s %s: %v", e.Op, e.Target, e.Err)
}

func (e *MountError) Unwrap() error { return e.Err }
