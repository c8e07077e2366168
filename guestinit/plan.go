package guestinit

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is one mount(2) call as a value: the plans below are computed and
// tested without root; the stages apply them in order.
type Mount struct {
	Source string
	Target string
	FSType string
	Flags  uintptr
	Data   string
	// DirMode is the mode of Target when it has to be created.
	DirMode uint32
}

// NewRoot is where stage 1 mounts the root disk.
const NewRoot = "/newroot"

// GuestdPath is where guestd runs from, on the tmpfs /run of the real
// root; InitramfsGuestd is the copy that the image put in the initramfs.
// createos goes the same way, and CreateosLink (on the guest's PATH)
// points at it: the CLI of the image the guest booted, whatever the disk
// holds from an older one.
const (
	GuestdPath        = "/run/strata/bin/guestd"
	InitramfsGuestd   = "/guestd"
	CreateosPath      = "/run/strata/bin/createos"
	InitramfsCreateos = "/createos"
	CreateosLink      = "/usr/local/bin/createos"
	ModulesOrder      = "/modules.order"
	// InitramfsPython holds the Python SDK package (strata/…), which
	// goes to PythonPath on /run the same way; PythonLinks says where the
	// system Python finds it.
	InitramfsPython = "/python"
	PythonPath      = "/run/strata/python"
)

// PythonLinks are the links that put the SDK package (PythonPath/strata)
// on the path of each system Python: given the entries of the root's
// /usr/lib, it maps /usr/local/lib/python3.N/dist-packages/strata (where
// Debian's python3.N looks for local packages) to the package, for each
// python3.N there.
func PythonLinks(usrLib []string) map[string]string {
	links := map[string]string{}
	for _, name := range usrLib {
		minor, ok := strings.CutPrefix(name, "python3.")
		if !ok || minor == "" || strings.Trim(minor, "0123456789") != "" {
			continue
		}
		links["/usr/local/lib/"+name+"/dist-packages/strata"] = PythonPath + "/strata"
	}
	return links
}

// Stage1Mounts are the kernel filesystems that stage 1 needs before it can
// load modules and find the root disk.
func Stage1Mounts() []Mount {
	return []Mount{
		{Source: "proc", Target: "/proc", FSType: "proc", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, DirMode: 0o555},
		{Source: "sysfs", Target: "/sys", FSType: "sysfs", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, DirMode: 0o555},
		{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", Flags: unix.MS_NOSUID, Data: "mode=0755", DirMode: 0o755},
	}
}

// RootMounts mount the root disk (XFS, read-write) on NewRoot and a tmpfs
// on its /run.
func RootMounts(p Params) []Mount {
	return []Mount{
		{Source: p.Root, Target: NewRoot, FSType: "xfs", DirMode: 0o755},
		{Source: "tmpfs", Target: NewRoot + "/run", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755", DirMode: 0o755},
	}
}

// MovedMounts are the stage-1 mounts that move into the new root before
// the switch.
func MovedMounts() []string { return []string{"/dev", "/proc", "/sys"} }

// Stage2Mounts are what a Debian userland needs that stage 1 did not mount.
// /tmp is not among them: it stays on the disk.
func Stage2Mounts() []Mount {
	return []Mount{
		{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "gid=5,mode=0620,ptmxmode=0666", DirMode: 0o755},
		{Source: "tmpfs", Target: "/dev/shm", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777", DirMode: 0o1777},
		{Source: "cgroup2", Target: "/sys/fs/cgroup", FSType: "cgroup2", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: "nsdelegate", DirMode: 0o555},
	}
}

// QuietSysctls are the kernel settings that keep an idle guest idle:
// under TCG every wakeup of the guest's CPU costs its QEMU host CPU, so
// the kernel's own periodic work that a sandbox does not need is turned
// off or spaced out (an idle guest woke about 30 times a second; traced
// with timer:timer_expire_entry).
func QuietSysctls() map[string]string {
	return map[string]string{
		// Proactive compaction: kcompactd woke every 500 ms to look.
		"/proc/sys/vm/compaction_proactiveness": "0",
		// Per-CPU memory statistics folded every 10 s, not every second
		// (vmstat_update): they are only read by tools.
		"/proc/sys/vm/stat_interval": "10",
	}
}

// GuestNet is the guest's network: its NIC, address and gateway, and
// the DNS server it asks. The host's end (package egress) has the same
// addresses; every sandbox has a network of its own, so all have these.
var GuestNet = struct {
	Interface string
	Addr      netip.Prefix
	Gateway   netip.Addr
	DNS       netip.Addr
}{
	Interface: "eth0",
	Addr:      netip.MustParsePrefix("10.0.2.15/24"),
	Gateway:   netip.MustParseAddr("10.0.2.2"),
	DNS:       netip.MustParseAddr("10.0.2.3"),
}

// ResolvConf is the guest's /etc/resolv.conf: the host's DNS server on
// the guest's network, and nothing to search.
func ResolvConf() string {
	return "# Written by strata-init at every boot: the sandbox's DNS server,\n" +
		"# answered by the host under the sandbox's network policy.\n" +
		"nameserver " + GuestNet.DNS.String() + "\noptions timeout:2 attempts:2\n"
}

// NetSysctls turn IPv6 off on the guest's NIC: the host's end carries
// IPv4 alone, and a guest that tried IPv6 first would wait on it.
func NetSysctls() map[string]string {
	return map[string]string{
		"/proc/sys/net/ipv6/conf/all/disable_ipv6":     "1",
		"/proc/sys/net/ipv6/conf/default/disable_ipv6": "1",
	}
}

// DevLinks are the /dev symlinks that udev or systemd would make and
// shells expect (process substitution uses /dev/fd).
func DevLinks() map[string]string {
	return map[string]string{
		"/dev/fd":     "/proc/self/fd",
		"/dev/stdin":  "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1",
		"/dev/stderr": "/proc/self/fd/2",
		"/dev/ptmx":   "pts/ptmx",
	}
}

// ParseModulesOrder reads /modules.order: one module file a line, in the
// order to load them; blank lines and lines starting with '#' are skipped,
// a relative path is taken from "/", and a repeated path is loaded once.
func ParseModulesOrder(data string) []string {
	var mods []string
	seen := map[string]bool{}
	for _, line := range strings.Split(data, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p := path.Clean("/" + line)
		if p == "/" || seen[p] {
			continue
		}
		seen[p] = true
		mods = append(mods, p)
	}
	return mods
}

// moduleSigMagic ends a module with a signature appended; before it is
// the signature's description (struct module_signature, 12 bytes, the
// signature's length big-endian in its last 4) and before that the
// signature.
const moduleSigMagic = "~Module signature appended~\n"

// StripModuleSignature returns a module without its appended signature,
// or as it is when it has none (or a description that does not fit).
func StripModuleSignature(b []byte) []byte {
	if !bytes.HasSuffix(b, []byte(moduleSigMagic)) {
		return b
	}
	end := len(b) - len(moduleSigMagic)
	if end < 12 {
		return b
	}
	sigLen := int(binary.BigEndian.Uint32(b[end-4 : end]))
	if sigLen < 0 || sigLen > end-12 {
		return b
	}
	return b[:end-12-sigLen]
}

// HasFilesystem tells whether a /proc/filesystems listing holds fs (each
// line a type, after "nodev" and a tab for those with no device).
func HasFilesystem(listing, fs string) bool {
	for _, line := range strings.Split(listing, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[len(f)-1] == fs {
			return true
		}
	}
	return false
}

// UnmountOrder reads a mountinfo (/proc/self/mountinfo) and returns the
// mount points to unmount at shutdown: every one but "/", the last
// mounted first (mountinfo lists mounts in mount order, so a mount comes
// after its parent), each once.
func UnmountOrder(mountinfo string) []string {
	var points []string
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		// id parent major:minor root mountpoint options ...
		if len(f) < 5 {
			continue
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if mp == "/" || !strings.HasPrefix(mp, "/") {
			continue
		}
		points = append(points, mp)
	}
	var order []string
	seen := map[string]bool{}
	for i := len(points) - 1; i >= 0; i-- {
		if !seen[points[i]] {
			seen[points[i]] = true
			order = append(order, points[i])
		}
	}
	return order
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space,
// \011, \012, \134) in a mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// NeedsGrow reports whether a root filesystem of fsBytes (statfs) should
// be grown onto a disk of diskBytes: when the disk is larger by more than
// XFS's own overhead (the internal log, up to 64 MiB on small disks) and
// a margin, so that a grown filesystem is not grown again at every boot.
func NeedsGrow(fsBytes, diskBytes uint64) bool {
	const slack = 256 << 20
	return diskBytes > fsBytes+slack
}

// human prints a byte count in binary units with one decimal.
func human(n uint64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatUint(n, 10) + "B"
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return strconv.FormatFloat(float64(n)/float64(div), 'f', 1, 64) + string("KMGTPE"[exp]) + "iB"
}

// GrowBlocks is the data section's size in blocks of blocksize that fills
// a device of diskBytes (what xfs_growfs -d asks for); 0 for a block size
// of 0.
func GrowBlocks(diskBytes uint64, blocksize uint32) uint64 {
	if blocksize == 0 {
		return 0
	}
	return diskBytes / uint64(blocksize)
}

// RouteMessage is the rtnetlink request that adds the IPv4 default route
// via gw on the interface of index index, asking for an acknowledgement.
func RouteMessage(index int, gw [4]byte) []byte {
	attr := func(typ uint16, data []byte) []byte {
		b := make([]byte, unix.SizeofRtAttr+len(data))
		binary.NativeEndian.PutUint16(b[0:2], uint16(len(b)))
		binary.NativeEndian.PutUint16(b[2:4], typ)
		copy(b[unix.SizeofRtAttr:], data)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	oif := make([]byte, 4)
	binary.NativeEndian.PutUint32(oif, uint32(index))
	body := []byte{
		unix.AF_INET, 0, 0, 0, // family, dst_len, src_len, tos
		unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST,
		0, 0, 0, 0, // flags
	}
	body = append(body, attr(unix.RTA_GATEWAY, gw[:])...)
	body = append(body, attr(unix.RTA_OIF, oif)...)
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:4], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:6], unix.RTM_NEWROUTE)
	binary.NativeEndian.PutUint16(msg[6:8], unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	binary.NativeEndian.PutUint32(msg[8:12], 1) // sequence
	return append(msg, body...)
}

// RouteAnswer reads rtnetlink's acknowledgement of RouteMessage: nil, or
// the error it carries.
func RouteAnswer(b []byte) error {
	h := unix.SizeofNlMsghdr
	if len(b) < h+4 {
		return errors.New("rtnetlink: a short answer")
	}
	if t := binary.NativeEndian.Uint16(b[4:6]); t != unix.NLMSG_ERROR {
		return fmt.Errorf("rtnetlink: an answer of type %d, want an acknowledgement", t)
	}
	if e := int32(binary.NativeEndian.Uint32(b[h : h+4])); e != 0 {
		return unix.Errno(-e)
	}
	return nil
}
