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
// it is killed. fn must do its file-system work on its own goroutine.
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
