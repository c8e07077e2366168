package guestinit

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// supervisor keeps one guestd running.
type supervisor struct {
	reaper  *reaper
	spawn   func() (int, <-chan unix.WaitStatus, error)
	backoff time.Duration
	logf    func(format string, args ...any)
	starts  int
}

// run starts guestd and restarts it backoff after each exit (or failed
// start), reaping every child when wake ticks (SIGCHLD), until stop is
// closed. It returns the running guestd's pid and exit channel (0 and nil
// when none runs), for the shutdown to stop.
func (s *supervisor) run(stop <-chan struct{}, wake <-chan os.Signal) (int, <-chan unix.WaitStatus) {
	var (
		pid   int
		done  <-chan unix.WaitStatus
		retry <-chan time.Time
	)
	start := func() {
		var err error
		pid, done, err = s.spawn()
		if err != nil {
			s.logf("cannot start guestd: %v; retrying in %v", err, s.backoff)
			pid, done, retry = 0, nil, time.After(s.backoff)
			return
		}
		s.starts++
		if s.starts == 1 {
			s.logf("guestd started")
		} else {
			s.logf("guestd restarted (pid %d, start %d)", pid, s.starts)
		}
	}
	start()
	for {
		select {
		case <-stop:
			return pid, done
		case <-wake:
			s.reaper.reap()
		case ws := <-done:
			s.logf("guestd (pid %d) ended: %s; restarting in %v", pid, describe(ws), s.backoff)
			pid, done, retry = 0, nil, time.After(s.backoff)
		case <-retry:
			retry = nil
			start()
		}
	}
}
