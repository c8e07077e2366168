package vmm

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// Host is what ProbeAccel reads of the machine; tests give their own.
type Host struct {
	// CPUInfo is the content of /proc/cpuinfo.
	CPUInfo []byte
	// KVM tells whether /dev/kvm can be opened read-write.
	KVM bool
	// PVM tells whether /dev/kvm is the PVM software hypervisor
	// (/sys/module/kvm_pvm exists).
	PVM bool
}

// ReadHost reads the running machine.
func ReadHost() (Host, error) {
	info, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return Host{}, err
	}
	h := Host{CPUInfo: info}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
		f.Close()
		h.KVM = true
	}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		h.PVM = true
	}
	return h, nil
}

// Probe is the accelerator chosen for a host, and why.
type Probe struct {
	Accel  Accel
	TSCKHz int
	Reason string
}

// ProbeAccel chooses the accelerator for h. want is "" (choose), "tcg" or
// "kvm"; asking for KVM where it cannot boot a stock kernel is an error.
func ProbeAccel(h Host, want string) (Probe, error) {
	flags, mhz := cpuFlags(h.CPUInfo)
	hw := flags["vmx"] || flags["svm"]
	p := Probe{TSCKHz: int(math.Round(mhz * 1000))}
	kvmOK := h.KVM && hw && !h.PVM
	switch {
	case want == string(KVM) && !kvmOK:
		return Probe{}, fmt.Errorf("accelerator kvm: %s", kvmWhyNot(h, hw))
	case want == string(KVM) || (want == "" && kvmOK):
		p.Accel, p.Reason = KVM, "the CPU has hardware virtualisation and /dev/kvm is usable"
	case want == "" || want == string(TCG):
		p.Accel, p.Reason = TCG, "software emulation: "+kvmWhyNot(h, hw)
		if want == string(TCG) {
			p.Reason = "software emulation, as asked"
		}
		if p.TSCKHz <= 0 {
			return Probe{}, fmt.Errorf("accelerator tcg: /proc/cpuinfo gives no \"cpu MHz\" for tsc_early_khz")
		}
	default:
		return Probe{}, fmt.Errorf("accelerator %q: want tcg or kvm", want)
	}
	return p, nil
}

func kvmWhyNot(h Host, hw bool) string {
	switch {
	case !h.KVM:
		return "/dev/kvm cannot be opened"
	case h.PVM:
		return "/dev/kvm is the PVM software hypervisor, on which a stock kernel does not boot"
	case !hw:
		return "the CPU has no vmx or svm flag"
	}
	return "KVM is usable"
}

// cpuFlags reads the first processor's flags and clock of /proc/cpuinfo.
func cpuFlags(info []byte) (map[string]bool, float64) {
	flags := map[string]bool{}
	var mhz float64
	sc := bufio.NewScanner(bytes.NewReader(info))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	seenFlags, seenMHz := false, false
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "flags":
			if !seenFlags {
				for _, f := range strings.Fields(v) {
					flags[f] = true
				}
				seenFlags = true
			}
		case "cpu MHz":
			if !seenMHz {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && f > 0 && f < 1e6 {
					mhz = f
				}
				seenMHz = true
			}
		}
	}
	return flags, mhz
}
