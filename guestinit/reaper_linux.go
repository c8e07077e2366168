package guestinit

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// reaper reaps every child of the process: PID 1 inherits every orphan of
// the guest, and a zombie nobody waits for stays forever. A child that
// strata-init waits for itself is started through start, which registers
// it under the lock that reap takes: its status goes to its channel, never
// lost to the loop.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
}

func newReaper() *reaper {
	return &reaper{waiters: map[int]chan unix.WaitStatus{}}
}

// start starts argv[0] (an absolute path) and returns its pid and a
// channel that receives its wait status once.
func (r *reaper) start(argv []string, attr *os.ProcAttr) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := os.StartProcess(argv[0], argv, attr)
	if err != nil {
		return 0, nil, err
	}
	pid := p.Pid
	// Reaping is ours (wait4 on any pid): drop os.Process's pidfd.
	_ = p.Release()
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

// reap collects every child that has exited, without blocking, and
// reports whether children remain.
func (r *reaper) reap() (children bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil { // ECHILD: no children at all
			return false
		}
		if pid == 0 {
			return true
		}
		if ch, ok := r.waiters[pid]; ok {
			ch <- ws
			delete(r.waiters, pid)
		}
	}
}

// waitGone reaps until no child is left or d has passed; wake ticks on
// SIGCHLD. It reports whether every child is gone.
func (r *reaper) waitGone(wake <-chan os.Signal, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for {
		if !r.reap() {
			return true
		}
		select {
		case <-wake:
		case <-poll.C:
		case <-deadline.C:
			return !r.reap()
		}
	}
}

// describe says how a process ended, for the console.
func describe(ws unix.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		return fmt.Sprintf("killed by %v", ws.Signal())
	default:
		return fmt.Sprintf("wait status %#x", uint32(ws))
	}
}
