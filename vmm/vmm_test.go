package vmm

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

func testConfig() Config {
	return Config{
		Name: "sb-test", Dir: "/run/vm/sb-test/run", Ctl: "/run/vm/sb-test/ctl", Kernel: "/img/vmlinux", Initrd: "/img/initramfs.cpio",
		Disk:      []Layer{{Node: "l-top", Path: "/var/lib/vm/layers/top.qcow2"}, {Node: "l-base", Path: "/img/base.qcow2"}},
		MemoryMiB: 512, VCPUs: 1, Accel: TCG, TSCKHz: 2100000,
		KernelArgs: []string{"strata.hostname=sb-test"}, Uid: 200001, Gid: 200001,
	}
}

// TestArgvIsAPlan: the command line is a pure function of the config,
// holds the fixed device set with its ids, and carries what TCG needs.
func TestArgvIsAPlan(t *testing.T) {
	c := testConfig()
	a, err := c.Argv()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.Argv()
	if !slices.Equal(a, b) {
		t.Fatal("Argv differs between two calls")
	}
	line := strings.Join(a, " ")
	for _, want := range []string{
		"-M microvm,pit=off,pic=on,rtc=on",
		"-accel tcg,thread=multi -cpu max",
		"-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-no-reboot", "-nodefaults",
		"tsc_early_khz=2100000", "reboot=t", "strata.hostname=sb-test",
		"-device virtio-serial-device,id=vser0",
		"name=" + ChannelPort,
		// The monitor, console and channel: inherited listening sockets.
		"-chardev socket,id=qmp0,fd=3,server=on,wait=off -mon chardev=qmp0,mode=control",
		"-chardev socket,id=console0,fd=5,server=on,wait=off -serial chardev:console0",
		"-chardev socket,id=channel0,fd=4,server=on,wait=off -device virtserialport,bus=vser0.0,chardev=channel0",
		// The NIC: its backend an inherited listening socket too.
		"-netdev stream,id=net0,server=on,addr.type=fd,addr.str=6 -device virtio-net-device,netdev=net0,id=nic0,mac=" + NICMAC,
		"-add-fd fd=7,set=1,opaque=l-top -add-fd fd=8,set=1,opaque=l-top -add-fd fd=9,set=2,opaque=l-base",
		`"filename":"/dev/fdset/1"`, `"backing":{"backing":null`, `"node-name":"l-base","read-only":true`,
		"-device virtio-blk-device,drive=l-top,id=blk0",
		"-m 512", "-smp 1",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("argv lacks %q:\n%s", want, line)
		}
	}
	// No path of the run or control directory: QEMU has no name there
	// to follow, and the host none to dial that QEMU's uid could swap.
	for _, arg := range a {
		if strings.Contains(arg, c.Dir) || strings.Contains(arg, c.Ctl) || strings.Contains(arg, "/run/vm/sb-test") {
			t.Errorf("argv names a path of the machine's directories: %q", arg)
		}
	}
	for _, never := range []string{"-runas", "-nic", "user,", "tap,", "-incoming", "-qmp", "file:", "path="} {
		if strings.Contains(line, never) {
			t.Errorf("argv has %q:\n%s", never, line)
		}
	}
	c.Incoming = true
	in, _ := c.Argv()
	if !strings.Contains(strings.Join(in, " "), "-S -incoming defer") {
		t.Error("an incoming machine lacks -incoming defer")
	}
	// A fork's RAM: the template's file, mapped privately from a
	// read-only descriptor; a template's: shared, written.
	c.Incoming = false
	c.RAM = &RAMFile{Path: "/store/t.ram"}
	fork, _ := c.Argv()
	if l := strings.Join(fork, " "); !strings.Contains(l, "memory-backend-file,id=microvm.ram,size=512M,mem-path=/store/t.ram,share=off,readonly=on,rom=off") || !strings.Contains(l, "memory-backend=microvm.ram") {
		t.Errorf("fork argv: %s", l)
	}
	c.RAM.Shared = true
	tpl, _ := c.Argv()
	if l := strings.Join(tpl, " "); !strings.Contains(l, "mem-path=/store/t.ram,share=on") || strings.Contains(l, "readonly") {
		t.Errorf("template argv: %s", l)
	}
	// A fork of a mapped-ram state: the state's file from its RAM's
	// pages; a template's RAM in memory: a memfd after the disk's
	// descriptors (two layers: 7, 8, 9), shared.
	c.RAM = &RAMFile{Path: "/store/s.state", Offset: 1 << 20}
	mapped, _ := c.Argv()
	if l := strings.Join(mapped, " "); !strings.Contains(l, "mem-path=/store/s.state,offset=1048576,share=off,readonly=on,rom=off") {
		t.Errorf("mapped fork argv: %s", l)
	}
	c.RAM = &RAMFile{InMemory: true, Shared: true}
	mem, _ := c.Argv()
	if l := strings.Join(mem, " "); !strings.Contains(l, "mem-path=/proc/self/fd/10,share=on") || strings.Contains(l, "readonly") {
		t.Errorf("template in memory argv: %s", l)
	}
	c.RAM = nil
	c.Accel = KVM
	k, _ := c.Argv()
	if l := strings.Join(k, " "); !strings.Contains(l, "-accel kvm -cpu host,-arch-capabilities") || strings.Contains(l, "tsc_early_khz") {
		t.Errorf("kvm argv: %s", l)
	}
}

func TestConfigValidate(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"relative disk":         func(c *Config) { c.Disk[1].Path = "base.qcow2" },
		"no disk":               func(c *Config) { c.Disk = nil },
		"bad node name":         func(c *Config) { c.Disk[0].Node = "1top" },
		"same node twice":       func(c *Config) { c.Disk[1].Node = c.Disk[0].Node },
		"comma in a path":       func(c *Config) { c.Kernel = "/img/a,b" },
		"root":                  func(c *Config) { c.Uid = 0 },
		"no memory":             func(c *Config) { c.MemoryMiB = 0 },
		"no cpus":               func(c *Config) { c.VCPUs = 0 },
		"tcg without tsc":       func(c *Config) { c.TSCKHz = 0 },
		"unknown accel":         func(c *Config) { c.Accel = "hvf" },
		"spaced kernel arg":     func(c *Config) { c.KernelArgs = []string{"a b"} },
		"name with a comma":     func(c *Config) { c.Name = "a,b" },
		"empty name":            func(c *Config) { c.Name = "" },
		"empty kernel arg":      func(c *Config) { c.KernelArgs = []string{""} },
		"relative run dir":      func(c *Config) { c.Dir = "run" },
		"relative ctl dir":      func(c *Config) { c.Ctl = "ctl" },
		"no ctl dir":            func(c *Config) { c.Ctl = "" },
		"ctl is the run dir":    func(c *Config) { c.Ctl = c.Dir + "/" },
		"absurd memory (TiB)":   func(c *Config) { c.MemoryMiB = 2 << 20 },
		"relative RAM file":     func(c *Config) { c.RAM = &RAMFile{Path: "t.ram"} },
		"RAM offset unaligned":  func(c *Config) { c.RAM = &RAMFile{Path: "/store/s.state", Offset: 100} },
		"RAM offset negative":   func(c *Config) { c.RAM = &RAMFile{Path: "/store/s.state", Offset: -4096} },
		"RAM in memory private": func(c *Config) { c.RAM = &RAMFile{InMemory: true} },
		"RAM in memory and a file": func(c *Config) {
			c.RAM = &RAMFile{InMemory: true, Shared: true, Path: "/store/t.ram"}
		},
	} {
		c := testConfig()
		mutate(&c)
		if _, err := c.Argv(); err == nil {
			t.Errorf("%s: Argv accepted it", name)
		}
	}
	if err := testConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

const cpuinfoPVM = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu MHz\t\t: 2100.000\nflags\t\t: fpu vme sse sse2 hypervisor\n\nprocessor\t: 1\ncpu MHz\t\t: 1.0\nflags\t\t: vmx\n"
const cpuinfoVMX = "processor\t: 0\ncpu MHz\t\t: 3000.5\nflags\t\t: fpu vmx sse\n"

func TestProbeAccel(t *testing.T) {
	for _, tc := range []struct {
		name    string
		host    Host
		want    string
		accel   Accel
		khz     int
		wantErr bool
	}{
		{name: "pvm host: tcg", host: Host{CPUInfo: []byte(cpuinfoPVM), KVM: true, PVM: true}, accel: TCG, khz: 2100000},
		{name: "no vmx: tcg (only the first processor counts)", host: Host{CPUInfo: []byte(cpuinfoPVM), KVM: true}, accel: TCG, khz: 2100000},
		{name: "vmx and kvm: kvm", host: Host{CPUInfo: []byte(cpuinfoVMX), KVM: true}, accel: KVM, khz: 3000500},
		{name: "vmx without /dev/kvm: tcg", host: Host{CPUInfo: []byte(cpuinfoVMX)}, accel: TCG, khz: 3000500},
		{name: "kvm asked on pvm: error", host: Host{CPUInfo: []byte(cpuinfoPVM), KVM: true, PVM: true}, want: "kvm", wantErr: true},
		{name: "tcg asked on a kvm host", host: Host{CPUInfo: []byte(cpuinfoVMX), KVM: true}, want: "tcg", accel: TCG, khz: 3000500},
		{name: "tcg without a clock: error", host: Host{CPUInfo: []byte("flags: fpu\n")}, wantErr: true},
		{name: "unknown accelerator", host: Host{CPUInfo: []byte(cpuinfoVMX)}, want: "hvf", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ProbeAccel(tc.host, tc.want)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("got %+v, want an error", p)
				}
				return
			}
			if err != nil || p.Accel != tc.accel || p.TSCKHz != tc.khz || p.Reason == "" {
				t.Fatalf("got %+v, %v; want %s at %d kHz with a reason", p, err, tc.accel, tc.khz)
			}
		})
	}
}

func TestParseStartTime(t *testing.T) {
	stat := "1234 (qemu (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 987654 1000 200"
	got, err := parseStartTime([]byte(stat))
	if err != nil || got != 987654 {
		t.Fatalf("parseStartTime = %d, %v; want 987654", got, err)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2"} {
		if _, err := parseStartTime([]byte(bad)); err == nil {
			t.Errorf("parseStartTime(%q) succeeded", bad)
		}
	}
}

func FuzzParseStartTime(f *testing.F) {
	f.Add([]byte("1 (a) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0 0"))
	f.Add([]byte("1 (a) b) c"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := parseStartTime(b)
		if err == nil && !strings.Contains(string(b), ")") {
			t.Fatalf("accepted %q without a command name (%d)", b, v)
		}
	})
}

func FuzzCPUFlags(f *testing.F) {
	f.Add([]byte(cpuinfoPVM))
	f.Add([]byte(cpuinfoVMX))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, mhz := cpuFlags(b)
		if mhz < 0 || mhz >= 1e6 {
			t.Fatalf("clock %v out of range", mhz)
		}
	})
}

func TestParseFDSets(t *testing.T) {
	got, err := parseFDSets([]byte(`[{"fds": [{"fd": 7, "opaque": "lT"}, {"fd": 8, "opaque": "lT"}], "fdset-id": 1},
		{"fds": [{"fd": 9}], "fdset-id": 2}, {"fds": [{"fd": 10, "opaque": "la"}, {"fd": 11, "opaque": "lb"}], "fdset-id": 3},
		{"fds": [{"fd": 12, "opaque": "l a"}], "fdset-id": 4}, {"fds": [{"fd": 13, "opaque": "base"}], "fdset-id": 5}]`))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"lT": 1, "base": 5}; !maps.Equal(got, want) {
		t.Fatalf("parseFDSets = %v, want %v", got, want)
	}
}

// FuzzParseFDSets: every set named is one the answer lists, under a
// valid node name.
func FuzzParseFDSets(f *testing.F) {
	f.Add([]byte(`[{"fds": [{"fd": 7, "opaque": "lT"}], "fdset-id": 1}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		sets, err := parseFDSets(b)
		if err != nil {
			return
		}
		for node := range sets {
			if !ValidNode(node) {
				t.Fatalf("node %q", node)
			}
		}
	})
}
