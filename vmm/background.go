package vmm

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// BackgroundNice is the nice value of a QEMU whose work nobody waits for.
const BackgroundNice = 10

// Background lowers every thread of process pid to BackgroundNice: a
// QEMU whose work is the host's own (a template made ahead of the first
// fork, a restore's old machine writing its memory after the restore
// answered) then yields, on a host whose CPUs are busy, to the QEMUs
// users wait for (under TCG a QEMU loading a state takes a whole core for
// seconds). On Linux a nice value is a thread's, and a thread inherits
// its creator's: the threads QEMU makes later are lowered too. Not the
// idle class: on a host busy for minutes the work must still end within
// its bounds.
func Background(pid int) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, BackgroundNice); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("thread %d: %w", tid, err))
		}
	}
	return errors.Join(errs...)
}

// Background lowers the machine's QEMU (the function Background).
func (m *qemuMachine) Background() error { return Background(m.proc.Pid) }
