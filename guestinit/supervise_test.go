package guestinit

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// subreaper makes the test process the reaper of its orphans, as PID 1 is
// in the guest, for the duration of the test.
func subreaper(t *testing.T) <-chan os.Signal {
	t.Helper()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	wake := make(chan os.Signal, 16)
	signal.Notify(wake, unix.SIGCHLD)
	t.Cleanup(func() {
		signal.Stop(wake)
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	})
	return wake
}

func quiet(t *testing.T) *os.ProcAttr {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { null.Close() })
	return &os.ProcAttr{Files: []*os.File{null, null, null}}
}

// The supervisor restarts a guestd that exits, after the backoff, logs
// each restart, and every child it leaves behind (orphans included) is
// reaped.
func TestSupervisorRestartsAndReaps(t *testing.T) {
	wake := subreaper(t)
	r := newReaper()
	attr := quiet(t)
	var mu sync.Mutex
	var lines []string
	starts := make(chan struct{}, 16)
	logf := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		mu.Lock()
		lines = append(lines, line)
		mu.Unlock()
		if strings.HasPrefix(line, "guestd started") || strings.HasPrefix(line, "guestd restarted") {
			starts <- struct{}{}
		}
	}
	spawn := func() (int, <-chan unix.WaitStatus, error) {
		// An orphan (sleep) outlives each "guestd", which exits 3.
		return r.start([]string{"/bin/sh", "-c", "sleep 0.1 & exit 3"}, attr)
	}
	s := &supervisor{reaper: r, spawn: spawn, backoff: 20 * time.Millisecond, logf: logf}
	stop := make(chan struct{})
	go func() {
		for range 3 {
			select {
			case <-starts:
			case <-time.After(10 * time.Second):
			}
		}
		close(stop)
	}()
	pid, done := s.run(stop, wake)
	if pid != 0 {
		_ = unix.Kill(pid, unix.SIGKILL)
		go func() {
			for range done {
			}
		}()
	}
	if !r.waitGone(wake, 10*time.Second) {
		t.Error("children left after the supervisor stopped")
	}
	mu.Lock()
	defer mu.Unlock()
	if s.starts < 3 {
		t.Fatalf("%d starts, want 3; log:\n%s", s.starts, strings.Join(lines, "\n"))
	}
	if lines[0] != "guestd started" {
		t.Errorf("first line %q, want %q", lines[0], "guestd started")
	}
	var ended, restarted int
	for _, l := range lines {
		if strings.Contains(l, "ended: exit status 3; restarting in 20ms") {
			ended++
		}
		if strings.HasPrefix(l, "guestd restarted") {
			restarted++
		}
	}
	if ended < 2 || restarted < 2 {
		t.Errorf("ended %d, restarted %d times; log:\n%s", ended, restarted, strings.Join(lines, "\n"))
	}
}

// A child started through the reaper gets its own status even while the
// reap loop runs all the time (registration and wait4(-1) share a lock).
func TestReaperDeliversStatus(t *testing.T) {
	wake := subreaper(t)
	r := newReaper()
	attr := quiet(t)
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		for {
			select {
			case <-stop:
				return
			case <-wake:
			case <-time.After(time.Millisecond):
			}
			r.reap()
		}
	}()
	for i := range 20 {
		_, done, err := r.start([]string{"/bin/sh", "-c", fmt.Sprintf("exit %d", i)}, attr)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ws := <-done:
			if !ws.Exited() || ws.ExitStatus() != i {
				t.Errorf("child %d: %s", i, describe(ws))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("child %d: no status", i)
		}
	}
	close(stop)
	<-loopDone
}
