package vmm

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// DeviceSet names the devices every machine gets, with their ids. Bump it
// whenever Argv's devices change: a memory snapshot records it and can be
// restored only into the same set.
const DeviceSet = "microvm-1"

// ChannelPort is the name of the virtio-serial port of the host↔guest
// channel, as the guest sees it in /sys/class/virtio-ports/*/name.
const ChannelPort = "org.strata.guest"

// Accel is a QEMU accelerator.
type Accel string

// The accelerators.
const (
	TCG Accel = "tcg"
	KVM Accel = "kvm"
)

// Config describes one machine. Paths are absolute; Dir is the machine's
// run directory, where QEMU makes its sockets, and must be writable by
// Uid.
type Config struct {
	// Name identifies the machine in QEMU's process title and logs (the
	// sandbox id).
	Name string
	// Dir is the run directory: QMP and channel sockets, console log.
	Dir string
	// Kernel is the uncompressed vmlinux, booted through its PVH entry.
	Kernel string
	// Initrd is the initramfs.
	Initrd string
	// Disk is the machine's root disk, a qcow2 image (its backing file is
	// opened read-only by QEMU).
	Disk string
	// MemoryMiB and VCPUs are the machine's size.
	MemoryMiB int
	VCPUs     int
	// Accel is the accelerator; TSCKHz the host TSC frequency in kHz,
	// required under TCG (tsc_early_khz).
	Accel  Accel
	TSCKHz int
	// KernelArgs are added to the kernel command line (strata.hostname=…).
	KernelArgs []string
	// Uid and Gid run QEMU; never 0.
	Uid, Gid uint32
	// Incoming starts QEMU waiting for a migration stream
	// (-incoming defer), for a restore from a memory snapshot.
	Incoming bool
}

// The files of a machine in its run directory.
const (
	qmpSocket     = "qmp.sock"
	channelSocket = "channel.sock"
	consoleLog    = "console.log"
)

// QMPSocket is the path of the machine's QMP socket.
func (c Config) QMPSocket() string { return filepath.Join(c.Dir, qmpSocket) }

// ChannelSocket is the path of the unix socket behind the machine's
// virtio-serial channel port: one client at a time.
func (c Config) ChannelSocket() string { return filepath.Join(c.Dir, channelSocket) }

// ConsoleLog is the file that receives the guest's serial console.
func (c Config) ConsoleLog() string { return filepath.Join(c.Dir, consoleLog) }

// Validate reports what is missing or out of range in c.
func (c Config) Validate() error {
	var errs []error
	for name, p := range map[string]string{"Dir": c.Dir, "Kernel": c.Kernel, "Initrd": c.Initrd, "Disk": c.Disk} {
		if !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("vmm config: %s %q: want an absolute path", name, p))
		}
		if strings.ContainsAny(p, ",\x00") {
			// QEMU's option syntax splits on commas.
			errs = append(errs, fmt.Errorf("vmm config: %s %q: a comma or NUL cannot be passed to QEMU", name, p))
		}
	}
	if c.Name == "" || strings.ContainsAny(c.Name, ", =\x00") {
		errs = append(errs, fmt.Errorf("vmm config: name %q: want a non-empty name without commas, spaces or '='", c.Name))
	}
	if c.MemoryMiB < 64 || c.MemoryMiB > 1<<20 {
		errs = append(errs, fmt.Errorf("vmm config: memory %d MiB: out of range", c.MemoryMiB))
	}
	if c.VCPUs < 1 || c.VCPUs > 64 {
		errs = append(errs, fmt.Errorf("vmm config: %d vCPUs: out of range", c.VCPUs))
	}
	switch c.Accel {
	case TCG:
		if c.TSCKHz <= 0 {
			errs = append(errs, errors.New("vmm config: the TSC frequency is required under TCG (tsc_early_khz)"))
		}
	case KVM:
	default:
		errs = append(errs, fmt.Errorf("vmm config: accelerator %q: want tcg or kvm", c.Accel))
	}
	if c.Uid == 0 || c.Gid == 0 {
		errs = append(errs, errors.New("vmm config: uid and gid 0: QEMU never runs as root"))
	}
	for _, a := range c.KernelArgs {
		if a == "" || strings.ContainsAny(a, " \t\n\x00") {
			errs = append(errs, fmt.Errorf("vmm config: kernel argument %q: want one word", a))
		}
	}
	return errors.Join(errs...)
}

// KernelCmdline is the guest kernel's command line.
func (c Config) KernelCmdline() string {
	args := []string{
		"console=ttyS0", "quiet", "panic=-1",
		// Microvm has no PCI bus: probing for one only costs boot time.
		"pci=off",
		// A restart is how the guest powers off: microvm has no ACPI
		// power button here, and -no-reboot makes QEMU exit on it.
		"reboot=t",
		// The guest's RNG is seeded by virtio-rng; trusting the CPU's
		// too keeps the first getrandom calls from blocking under TCG.
		"random.trust_cpu=on",
	}
	if c.Accel == TCG {
		// Microvm has no HPET or PM timer: TSC calibration against the
		// PIT fails under load, and boots hang (VMM.md).
		args = append(args, "tsc_early_khz="+strconv.Itoa(c.TSCKHz))
	}
	return strings.Join(append(args, c.KernelArgs...), " ")
}

// Argv is QEMU's command line for c, without the program itself. It is a
// pure function of c: the same Config gives the same argv.
func (c Config) Argv() ([]string, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	argv := []string{
		"-name", c.Name + ",debug-threads=on",
		"-nographic", "-nodefaults", "-no-user-config", "-no-reboot",
		// QEMU's seccomp filter. No -runas: QEMU 7.2 installs the filter
		// before it drops privileges and is then killed by its own
		// setgid; the caller starts it as the unprivileged user instead.
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-M", "microvm,pit=on,pic=on,rtc=on",
		"-m", strconv.Itoa(c.MemoryMiB),
		"-smp", strconv.Itoa(c.VCPUs),
	}
	switch c.Accel {
	case KVM:
		argv = append(argv, "-accel", "kvm", "-cpu", "host,-arch-capabilities")
	default:
		argv = append(argv, "-accel", "tcg,thread=multi", "-cpu", "max")
	}
	argv = append(argv,
		"-kernel", c.Kernel,
		"-initrd", c.Initrd,
		"-append", c.KernelCmdline(),
		"-serial", "file:"+c.ConsoleLog(),
		"-qmp", "unix:"+c.QMPSocket()+",server=on,wait=off",
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=rng0",
		"-device", "virtio-serial-device,id=vser0",
		"-chardev", "socket,id=channel0,path="+c.ChannelSocket()+",server=on,wait=off",
		"-device", "virtserialport,bus=vser0.0,chardev=channel0,name="+ChannelPort,
		"-blockdev", blockdev(c.Disk),
		"-device", "virtio-blk-device,drive=disk0,id=blk0",
	)
	if c.Incoming {
		argv = append(argv, "-incoming", "defer")
	}
	return argv, nil
}

// blockdev is the -blockdev JSON of the root disk.
func blockdev(path string) string {
	b, _ := json.Marshal(map[string]any{
		"driver": "qcow2", "node-name": "disk0",
		"file": map[string]any{"driver": "file", "filename": path},
	})
	return string(b)
}
