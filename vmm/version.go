package vmm

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Version is a QEMU release: major.minor.micro.
type Version struct {
	Major, Minor, Micro int
}

// MinVersion is the oldest QEMU strata runs: fork QEMUs map template RAM
// read-only (memory-backend-file readonly=on,rom=off, QEMU 8.2), a
// disk's frozen top is reopened read-only by blockdev-snapshot, and live
// saves under multi-threaded TCG are correct (QEMU 7.2 corrupted about
// one load in ten; VMM.md).
var MinVersion = Version{Major: 10}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro) }

// Less tells whether v is an older release than w.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Micro < w.Micro
}

// maxVersionPart bounds each number of a version: QEMU's are small, and
// a parser of untrusted text keeps its numbers far from overflow.
const maxVersionPart = 9999

// ParseVersion reads a QEMU version from the first line of
// `qemu-system-x86_64 --version` ("QEMU emulator version 10.0.2 (Debian
// 1:10.0.2+ds-2…)"), or from the return value of QMP's query-version
// ({"qemu":{"major":10,"minor":0,"micro":2},"package":"…"}).
func ParseVersion(s string) (Version, error) {
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "{") {
		var q struct {
			QEMU *struct {
				Major, Minor, Micro *int
			} `json:"qemu"`
		}
		if err := json.Unmarshal([]byte(t), &q); err != nil || q.QEMU == nil || q.QEMU.Major == nil || q.QEMU.Minor == nil || q.QEMU.Micro == nil {
			return Version{}, fmt.Errorf("qemu version: %.100q is no query-version answer", s)
		}
		v := Version{*q.QEMU.Major, *q.QEMU.Minor, *q.QEMU.Micro}
		for _, n := range []int{v.Major, v.Minor, v.Micro} {
			if n < 0 || n > maxVersionPart {
				return Version{}, fmt.Errorf("qemu version: %.100q: a number out of range", s)
			}
		}
		return v, nil
	}
	line, _, _ := strings.Cut(t, "\n")
	const marker = "QEMU emulator version "
	i := strings.Index(line, marker)
	if i < 0 {
		return Version{}, fmt.Errorf("qemu version: %.100q does not say %q", line, strings.TrimSpace(marker))
	}
	word, _, _ := strings.Cut(line[i+len(marker):], " ")
	parts := strings.Split(word, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return Version{}, fmt.Errorf("qemu version: %q is not major.minor[.micro]", word)
	}
	var n [3]int
	for j, p := range parts {
		if p == "" || len(p) > 4 || strings.Trim(p, "0123456789") != "" {
			return Version{}, fmt.Errorf("qemu version: %q is not major.minor[.micro]", word)
		}
		n[j], _ = strconv.Atoi(p)
	}
	return Version{n[0], n[1], n[2]}, nil
}

// ErrOldQEMU is the class of CheckVersion's refusal.
var ErrOldQEMU = errors.New("QEMU is too old")

// CheckVersion parses the host QEMU's version (see ParseVersion) and
// refuses one older than MinVersion, naming the version found and the
// one needed.
func CheckVersion(s string) (Version, error) {
	v, err := ParseVersion(s)
	if err != nil {
		return Version{}, err
	}
	if v.Less(MinVersion) {
		return v, fmt.Errorf("%w: found QEMU %s (%q), strata needs QEMU %d.%d or later (make qemu installs it from Debian's bookworm-backports)",
			ErrOldQEMU, v, firstLine(s), MinVersion.Major, MinVersion.Minor)
	}
	return v, nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
