package channel

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Port is an open virtio-serial port of the guest.
type Port struct {
	*os.File
	sigio chan os.Signal
}

// OpenPort opens the virtio-serial port called name (its device is
// /dev/vportNpM; the name is in /sys/class/virtio-ports/vportNpM/name).
func OpenPort(name string) (*Port, error) {
	dev, err := FindPort("/sys/class/virtio-ports", name)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join("/dev", dev), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return &Port{File: f}, nil
}

// Close stops the port's signals and closes it.
func (p *Port) Close() error {
	if p.sigio != nil {
		signal.Stop(p.sigio)
	}
	return p.File.Close()
}

// AwaitHost waits, at most d or until ctx ends, for the host end of the
// port to be connected. The port tells it by no signal of its own: while
// no host end is connected, a read gives EOF at once and poll answers
// POLLHUP. But the kernel sends SIGIO to the port's owner when QEMU says
// a host end connected (the port is set O_ASYNC and owned by this
// process for the wait), so the wait costs no CPU and ends at once.
// poll is asked after the signal is armed: a host that connected just
// before is seen then, never missed.
func (p *Port) AwaitHost(ctx context.Context, d time.Duration) {
	if p.sigio == nil {
		// Notify before O_ASYNC: SIGIO's default action ends the process.
		p.sigio = make(chan os.Signal, 1)
		signal.Notify(p.sigio, syscall.SIGIO)
	}
	raw, err := p.SyscallConn()
	if err != nil {
		sleep(ctx, d)
		return
	}
	setAsync := func(on bool) (err error) {
		cerr := raw.Control(func(fd uintptr) {
			flags, ferr := unix.FcntlInt(fd, unix.F_GETFL, 0)
			if ferr != nil {
				err = ferr
				return
			}
			if on {
				if _, err = unix.FcntlInt(fd, unix.F_SETOWN, os.Getpid()); err != nil {
					return
				}
				flags |= unix.O_ASYNC
			} else {
				flags &^= unix.O_ASYNC
			}
			_, err = unix.FcntlInt(fd, unix.F_SETFL, flags)
		})
		if err == nil {
			err = cerr
		}
		return err
	}
	if setAsync(true) != nil {
		sleep(ctx, d)
		return
	}
	defer setAsync(false)
	// Drained first: a signal of an earlier wait says nothing now.
	select {
	case <-p.sigio:
	default:
	}
	hup := true
	raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n == 1 {
			hup = fds[0].Revents&unix.POLLHUP != 0
		}
	})
	if !hup {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.sigio:
	case <-t.C:
	case <-ctx.Done():
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// FindPort returns the device name of the port called name under sysDir.
func FindPort(sysDir, name string) (string, error) {
	ents, err := os.ReadDir(sysDir)
	if err != nil {
		return "", fmt.Errorf("virtio-serial port %q: %w", name, err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysDir, e.Name(), "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return e.Name(), nil
		}
	}
	return "", fmt.Errorf("virtio-serial port %q: not found under %s", name, sysDir)
}
