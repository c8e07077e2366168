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
const DeviceSet = "microvm-3"

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

// Config describes one machine. Paths are absolute. Dir is the machine's
// run directory (QEMU's working directory), writable by Uid; Ctl is its
// control directory, root's alone, where the caller's process makes the
// sockets QEMU is handed and keeps the logs it drains from QEMU. QEMU
// gets no path into either: its sockets are inherited descriptors.
type Config struct {
	// Name identifies the machine in QEMU's process title and logs (the
	// sandbox id).
	Name string
	// Dir is the run directory: QEMU's working directory, and nothing
	// else. It is Uid's, so the host opens nothing there: an escaped
	// QEMU could put a link in the place of any name in it.
	Dir string
	// Ctl is the control directory: root's, mode 0700 (Start and Attach
	// check it, and never follow a link to it). It holds the QMP,
	// channel and console sockets (made by Start, handed to QEMU as
	// descriptors) and the console's and QEMU's logs, capped.
	Ctl string
	// Kernel is the uncompressed vmlinux, booted through its PVH entry.
	Kernel string
	// Initrd is the initramfs.
	Initrd string
	// Disk is the machine's root disk: a chain of qcow2 layers, the
	// writable top first, then the read-only layers under it down to the
	// base. QEMU opens none of them by name: Start passes it descriptors
	// the caller's process opened (-add-fd), so the files stay root's and
	// a layer can be shared by machines of different uids.
	Disk []Layer
	// MemoryMiB and VCPUs are the machine's size.
	MemoryMiB int
	VCPUs     int
	// Accel is the accelerator; TSCKHz the host TSC frequency in kHz,
	// required under TCG (tsc_early_khz).
	Accel  Accel
	TSCKHz int
	// KernelArgs are added to the kernel command line (strata.hostname=…).
	KernelArgs []string
	// Uid and Gid run QEMU; never 0. Groups are supplementary groups
	// (a template's, whose RAM file QEMU opens).
	Uid, Gid uint32
	Groups   []uint32
	// RAM, when set, is a file that holds the guest's RAM (a template):
	// shared, QEMU writes the guest's memory into it; private, the guest
	// starts from its content and its writes stay its own (copy on
	// write), so that many machines share the pages they only read.
	// A save of a shared one or a load into a private one skips the
	// RAM (x-ignore-shared): it writes or reads the devices only.
	RAM *RAMFile
	// Incoming starts QEMU waiting for a migration stream
	// (-incoming defer), for a restore from a memory snapshot; the guest
	// stays stopped once the stream is in (-S).
	Incoming bool
}

// RAMFile is a file that holds a machine's RAM: shared, QEMU writes the
// guest's memory into it (a template being made); private, QEMU opens it
// read-only and the guest's writes are its own (a fork).
type RAMFile struct {
	// Path is the file QEMU opens by name: its uid (or one of its
	// Groups) must be allowed to.
	Path string
	// Offset is where the RAM starts in the file: a memory snapshot's
	// mapped-ram state, whose pages a fork maps where they are
	// (RAMRegionOf). A multiple of the page size.
	Offset int64
	// InMemory is RAM in a memfd Start makes and QEMU inherits, instead
	// of Path: shared, so that a save skips it (a template's QEMU loads
	// a whole state into it to save the devices alone), and gone with
	// the QEMU; nothing of it reaches a disk.
	InMemory bool
	Shared   bool
}

// RAMID is the id of the guest RAM's memory backend: microvm's own, so
// that a state saved with QEMU's default RAM loads into a file-backed one
// (a migration stream names its RAM blocks by it).
const RAMID = "microvm.ram"

// Layer is one qcow2 file of a disk chain.
type Layer struct {
	// Node is the layer's QEMU block node name: a letter, then letters,
	// digits, '-' or '_', at most 31 characters, unique in the chain.
	Node string
	Path string
}

// The files of a machine in its control directory.
const (
	qmpSocket     = "qmp.sock"
	channelSocket = "channel.sock"
	consoleSocket = "console.sock"
	netSocket     = "net.sock"
	consoleLog    = "console.log"
	qemuLog       = "qemu.log"
)

// The descriptors QEMU inherits (Start opens them in this order): the
// listening sockets of its monitor, channel, console and NIC, then the
// disk's layers (diskFDs), then RAM in memory (ramFD).
const (
	fdQMP = 3 + iota
	fdChannel
	fdConsole
	fdNet
	fdDisk
)

// NICMAC is the guest NIC's MAC address: every machine has the same, each
// on a network of its own (package egress).
const NICMAC = "52:54:00:12:34:56"

// QMPSocket is the path of the machine's QMP socket.
func (c Config) QMPSocket() string { return filepath.Join(c.Ctl, qmpSocket) }

// ChannelSocket is the path of the unix socket behind the machine's
// virtio-serial channel port: one client at a time.
func (c Config) ChannelSocket() string { return filepath.Join(c.Ctl, channelSocket) }

// NetSocket is the path of the unix socket behind the machine's NIC
// (virtio-net): QEMU listens, and takes one client at a time, which reads
// and writes the guest's Ethernet frames, each after its length (4 bytes,
// big-endian). A client that goes away can be replaced: the guest's
// frames meanwhile are dropped.
func (c Config) NetSocket() string { return filepath.Join(c.Ctl, netSocket) }

// ConsoleLog is the log of the guest's serial console: LogBytes at most,
// and the LogBytes before it in ConsoleLog()+".1" (ReadTail reads both).
func (c Config) ConsoleLog() string { return filepath.Join(c.Ctl, consoleLog) }

// QEMULog is the log of QEMU's own output (stdout and stderr), capped as
// the console's.
func (c Config) QEMULog() string { return filepath.Join(c.Ctl, qemuLog) }

// consoleSocket is the socket QEMU serves the serial console on; the
// caller's process drains it into ConsoleLog.
func (c Config) consoleSocket() string { return filepath.Join(c.Ctl, consoleSocket) }

// Validate reports what is missing or out of range in c.
func (c Config) Validate() error {
	var errs []error
	paths := map[string]string{"Dir": c.Dir, "Ctl": c.Ctl, "Kernel": c.Kernel, "Initrd": c.Initrd}
	if c.Ctl != "" && filepath.Clean(c.Ctl) == filepath.Clean(c.Dir) {
		errs = append(errs, errors.New("vmm config: the control directory is the run directory: QEMU's uid must not write where the host dials"))
	}
	if r := c.RAM; r != nil {
		switch {
		case r.InMemory && (r.Path != "" || r.Offset != 0 || !r.Shared):
			errs = append(errs, errors.New("vmm config: RAM in memory is shared, with no path or offset"))
		case !r.InMemory:
			paths["RAM"] = r.Path
		}
		if r.Offset < 0 || r.Offset%mappedRAMPage != 0 {
			errs = append(errs, fmt.Errorf("vmm config: RAM offset %d: want a multiple of %d", r.Offset, mappedRAMPage))
		}
	}
	if len(c.Disk) == 0 {
		errs = append(errs, errors.New("vmm config: no disk"))
	}
	nodes := map[string]bool{}
	for i, l := range c.Disk {
		paths[fmt.Sprintf("Disk[%d]", i)] = l.Path
		if !ValidNode(l.Node) || nodes[l.Node] {
			errs = append(errs, fmt.Errorf("vmm config: disk layer %d: node name %q: want a unique name of a letter and up to 30 letters, digits, '-' or '_'", i, l.Node))
		}
		nodes[l.Node] = true
	}
	for name, p := range paths {
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
		// TCG's TSC is QEMU's virtual clock, the same for every vCPU and
		// never unstable: the clocksource watchdog, which woke the guest
		// twice a second to compare it with nothing better, is off. So
		// is the soft-lockup watchdog (every 4 s): under TCG on a busy
		// host a vCPU may stall for seconds without being locked up.
		args = append(args, "tsc=reliable", "nowatchdog")
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
		"-M", c.machine(),
		"-m", strconv.Itoa(c.MemoryMiB),
		"-smp", strconv.Itoa(c.VCPUs),
	}
	if c.RAM != nil {
		// A fork maps the template's RAM privately, from a descriptor
		// opened read-only (readonly=on; rom=off keeps the guest's view
		// writable, copy on write): the file is the template's, shared
		// with every other fork of the snapshot, and its QEMU cannot
		// write it (QEMU 8.2; before, it opened the file read-write even
		// to map it privately).
		share := "share=on"
		if !c.RAM.Shared {
			share = "share=off,readonly=on,rom=off"
		}
		path := c.RAM.Path
		if c.RAM.InMemory {
			// memory-backend-file, not -memfd: a save skips only RAM
			// of a named file (x-ignore-shared).
			path = fmt.Sprintf("/proc/self/fd/%d", c.ramFD())
		}
		if c.RAM.Offset != 0 {
			share = fmt.Sprintf("offset=%d,%s", c.RAM.Offset, share)
		}
		argv = append(argv, "-object", fmt.Sprintf("memory-backend-file,id=%s,size=%dM,mem-path=%s,%s",
			RAMID, c.MemoryMiB, path, share))
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
		// The monitor, console and channel are sockets the caller made in
		// its control directory and QEMU inherits (listening): QEMU has no
		// path to them, and nothing the host dials is in a directory
		// QEMU's uid can write.
		"-chardev", fmt.Sprintf("socket,id=qmp0,fd=%d,server=on,wait=off", fdQMP),
		"-mon", "chardev=qmp0,mode=control",
		"-chardev", fmt.Sprintf("socket,id=console0,fd=%d,server=on,wait=off", fdConsole),
		"-serial", "chardev:console0",
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=rng0",
		"-device", "virtio-serial-device,id=vser0",
		"-chardev", fmt.Sprintf("socket,id=channel0,fd=%d,server=on,wait=off", fdChannel),
		"-device", "virtserialport,bus=vser0.0,chardev=channel0,name="+ChannelPort,
		// The NIC's only backend is the host's stack at the other end of
		// the socket (package egress): QEMU itself reaches no network.
		"-netdev", fmt.Sprintf("stream,id=net0,server=on,addr.type=fd,addr.str=%d", fdNet),
		"-device", "virtio-net-device,netdev=net0,id=nic0,mac="+NICMAC,
	)
	for i := range c.Disk {
		for _, fd := range diskFDs(i) {
			// The layer's node names its set (opaque): StreamDisk finds
			// the sets of the layers it drops by it.
			argv = append(argv, "-add-fd", fmt.Sprintf("fd=%d,set=%d,opaque=%s", fd, i+1, c.Disk[i].Node))
		}
	}
	argv = append(argv,
		"-blockdev", blockdev(c.Disk),
		"-device", "virtio-blk-device,drive="+c.Disk[0].Node+",id=blk0",
	)
	if c.Incoming {
		// -S: the guest stays stopped once its state is in, until the
		// caller has checked it and says cont.
		argv = append(argv, "-S", "-incoming", "defer")
	}
	return argv, nil
}

// diskFDs are the descriptor numbers QEMU inherits for layer i of the
// disk: the top layer's file twice, read-write and read-only (QEMU opens
// a layer read-only again when it becomes a backing layer), every other
// layer once, read-only. Start opens them in this order.
func diskFDs(i int) []int {
	if i == 0 {
		return []int{fdDisk, fdDisk + 1}
	}
	return []int{fdDisk + 1 + i}
}

// ramFD is the descriptor number of RAM in memory: after the disk's.
func (c Config) ramFD() int { return fdDisk + len(c.Disk) + 1 }

// machine is the -M value. No PIT (microvm-2): under TCG on a loaded or
// slow host, the PIT's interrupt that SeaBIOS leaves programmed can be
// pending when the guest kernel first enables interrupts, before its
// timers are set up, and the kernel dies of a divide error at that
// moment (start_kernel's local_irq_enable; 6 to 9 of 10 boots here on
// 2026-12-03, none without the PIT). The kernel needs no PIT: its TSC
// frequency is given (tsc_early_khz) and its timer is the local APIC's.
func (c Config) machine() string {
	m := "microvm,pit=off,pic=on,rtc=on"
	if c.RAM != nil {
		m += ",memory-backend=" + RAMID
	}
	return m
}

// blockdev is the -blockdev JSON of the disk: the whole chain spelled out,
// each layer's file a descriptor set (/dev/fdset/N), so that QEMU never
// follows the backing names recorded in the files.
func blockdev(layers []Layer) string {
	var node any = nil // the base has no backing
	for i := len(layers) - 1; i >= 0; i-- {
		node = map[string]any{
			"driver": "qcow2", "node-name": layers[i].Node, "read-only": i > 0,
			"file":    fileNode(i+1, i > 0),
			"backing": node,
		}
	}
	b, _ := json.Marshal(node)
	return string(b)
}

// fileNode is the file node of a layer whose descriptors are fd set set.
// QEMU's image locking is off: it takes its locks on the open file
// descriptions of the set, and a layer reopened read-only when it becomes
// a backing layer keeps its read-write description (and that one's locks)
// in the set, so the next activation (a cont after a save) conflicts with
// itself. Exclusion is the caller's: each layer is written by one machine
// only (its top), and shared layers are never written.
func fileNode(set int, readOnly bool) map[string]any {
	n := map[string]any{"driver": "file", "filename": fmt.Sprintf("/dev/fdset/%d", set), "locking": "off"}
	if readOnly {
		n["read-only"] = true
	}
	return n
}

// ValidNode tells whether s can name a QEMU block node.
func ValidNode(s string) bool {
	if len(s) == 0 || len(s) > 31 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '-' || r == '_'):
		default:
			return false
		}
	}
	return true
}
