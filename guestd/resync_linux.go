package guestd

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// randomDevice is where the RNG ioctls are made; any of the kernel's
// random devices takes them.
const randomDevice = "/dev/urandom"

// linuxKernel is the running kernel: resyncKernel's system calls. Each
// needs root (CAP_SYS_TIME for the clock, CAP_SYS_ADMIN for the rest).
type linuxKernel struct{}

func (linuxKernel) realtime() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return 0, os.NewSyscallError("clock_gettime", err)
	}
	return ts.Nano(), nil
}

func (linuxKernel) setRealtime(ns int64) error {
	ts := unix.NsecToTimespec(ns)
	return os.NewSyscallError("clock_settime", unix.ClockSettime(unix.CLOCK_REALTIME, &ts))
}

func (linuxKernel) addEntropy(poolInfo []byte) error {
	return randomIoctl("ioctl RNDADDENTROPY", unix.RNDADDENTROPY, unsafe.Pointer(unsafe.SliceData(poolInfo)))
}

func (linuxKernel) reseed() error {
	return randomIoctl("ioctl RNDRESEEDCRNG", unix.RNDRESEEDCRNG, nil)
}

// randomIoctl makes the ioctl req, with argument arg, on randomDevice.
func randomIoctl(op string, req uint, arg unsafe.Pointer) error {
	fd, err := unix.Open(randomDevice, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: randomDevice, Err: err}
	}
	defer unix.Close(fd)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg)); errno != 0 {
		return &os.PathError{Op: op, Path: randomDevice, Err: errno}
	}
	return nil
}

func (linuxKernel) setHostname(name string) error {
	return os.NewSyscallError("sethostname", unix.Sethostname([]byte(name)))
}

func (linuxKernel) hostname() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", os.NewSyscallError("uname", err)
	}
	return unix.ByteSliceToString(u.Nodename[:]), nil
}
