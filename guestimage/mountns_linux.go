package guestimage

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// inPrivateMountNS runs fn on an OS thread of its own in a new, private
// mount namespace. Mounts fn makes (and the processes it starts, which
// are forked from that thread) stay in that namespace; the thread is
// never unlocked, so it exits with the goroutine and the namespace, with
// any mount fn failed to undo, goes away with it, or with the process if
// it is killed. One exception: when the goroutine happens to run on the
// main thread, Go parks that thread instead of ending it, and a mount fn
// left behind lasts until the process exits (strata-image exits right
// after a build; fn unmounts on every path anyway). fn must do its
// file-system work on its own goroutine.
func inPrivateMountNS(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("unshare a mount namespace: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errc <- fmt.Errorf("make the mount namespace private: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
