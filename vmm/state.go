package vmm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// A state file says how it was written. A classic migration stream (what
// QEMU's fd: migration writes, and every state strata wrote before
// mapped-ram) starts with QEMU's own magic; a mapped-ram state starts
// with stateHeader's page, and QEMU's part begins at stateOffset. The
// format is the file's own, so that every record that names a state
// (snapshots, pauses, templates) needs no field for it, and a state
// written before the change still loads.
//
// mapped-ram puts every RAM page at a fixed offset of the file: the file
// is as large as the guest's RAM and sparse (what the guest never touched
// is a hole), multifd's channels write and read it in parallel, and
// direct-io bypasses the page cache (a save is durable when it ends, and
// a load leaves the host's memory at the pages the guest touched).
const (
	stateMagic  = "strata vm state\n"
	stateOffset = 4096
	// stateChannels is multifd's channels: one per host core of the
	// machines this runs on (VMM.md: 2 channels, 10x a classic save).
	stateChannels = 2
	// stateOpaque names the descriptor sets of a state in QEMU, so that
	// the checks of frozen disk layers leave them alone.
	stateOpaque = "state"
)

// StateFormat is how a state file was written.
type StateFormat string

const (
	// FormatStream is QEMU's classic migration stream.
	FormatStream StateFormat = "stream"
	// FormatMappedRAM is QEMU's mapped-ram format after strata's header.
	FormatMappedRAM StateFormat = "mapped-ram"
)

// stateHeader is the first page of a mapped-ram state.
func stateHeader() []byte {
	b := make([]byte, stateOffset)
	copy(b, stateMagic+"format="+string(FormatMappedRAM)+"\n")
	return b
}

// ParseStateHeader reads the format of a state from its first bytes: a
// strata header names it; anything else is a classic stream (QEMU checks
// its own magic when it loads). A strata header with a format this
// version does not know is an error, never a guess.
func ParseStateHeader(b []byte) (StateFormat, error) {
	if !bytes.HasPrefix(b, []byte(stateMagic)) {
		return FormatStream, nil
	}
	rest := b[len(stateMagic):]
	line, _, ok := bytes.Cut(rest, []byte("\n"))
	if !ok {
		return "", errors.New("state header: no format line")
	}
	v, ok := strings.CutPrefix(string(line), "format=")
	if !ok {
		return "", fmt.Errorf("state header: %.40q is not a format line", line)
	}
	switch f := StateFormat(v); f {
	case FormatMappedRAM:
		return f, nil
	default:
		return "", fmt.Errorf("state header: format %.40q is not known to this version", v)
	}
}

// StateFormatOf reads the format of the state file f (by descriptor).
func StateFormatOf(f *os.File) (StateFormat, error) {
	b := make([]byte, len(stateMagic)+64)
	n, err := f.ReadAt(b, 0)
	if n == 0 && err != nil {
		return "", fmt.Errorf("state: reading its header: %w", err)
	}
	return ParseStateHeader(b[:n])
}

// stateFiles opens state again, by its descriptor, in the modes QEMU asks
// its descriptor set for: QEMU's file migration opens the file with the
// access mode of its side (write to save, read to load), its multifd
// channels with O_DIRECT when direct-io is on, and takes from the set a
// descriptor whose access mode and O_DIRECT match. direct tells whether
// the filesystem took O_DIRECT (tmpfs does not); with cached, it is not
// asked for: the state is read through the page cache.
func stateFiles(state *os.File, write, cached bool) (files []*os.File, direct bool, err error) {
	mode := unix.O_RDONLY
	if write {
		mode = unix.O_WRONLY
	}
	self := fmt.Sprintf("/proc/self/fd/%d", state.Fd())
	open := func(flags int) (*os.File, error) {
		fd, err := unix.Open(self, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		return os.NewFile(uintptr(fd), state.Name()), nil
	}
	plain, err := open(mode)
	if err != nil {
		return nil, false, fmt.Errorf("state: opening it again: %w", err)
	}
	files = append(files, plain)
	if cached {
		return files, false, nil
	}
	if d, err := open(mode | unix.O_DIRECT); err == nil {
		files = append(files, d)
		direct = true
	}
	return files, direct, nil
}

// addFDSet hands QEMU files in one new descriptor set, each named opaque
// (a disk layer's node name, or stateOpaque), and returns the set's id.
// On an error no set is left.
func addFDSet(ctx context.Context, q *QMP, opaque string, files []*os.File) (int, error) {
	set := -1
	for _, f := range files {
		args := map[string]any{"opaque": opaque}
		if set >= 0 {
			args["fdset-id"] = set
		}
		ret, err := q.ExecuteWithFile(ctx, "add-fd", args, f)
		var info struct {
			Set int `json:"fdset-id"`
		}
		if err == nil {
			if uerr := json.Unmarshal(ret, &info); uerr != nil {
				err = fmt.Errorf("add-fd: %w", uerr)
			}
		}
		if err != nil {
			if set >= 0 {
				q.cleanup("remove-fd", map[string]any{"fdset-id": set})
			}
			return 0, err
		}
		set = info.Set
	}
	return set, nil
}

// mappedRAM sets the capabilities and parameters of a mapped-ram
// migration on q (both sides set the same), with the other capabilities
// caps the caller wants.
func mappedRAM(ctx context.Context, q *QMP, caps []map[string]any, direct bool) error {
	caps = append(caps,
		map[string]any{"capability": "mapped-ram", "state": true},
		map[string]any{"capability": "multifd", "state": true})
	if _, err := q.Execute(ctx, "migrate-set-capabilities", map[string]any{"capabilities": caps}); err != nil {
		return err
	}
	_, err := q.Execute(ctx, "migrate-set-parameters", map[string]any{"multifd-channels": stateChannels, "direct-io": direct})
	return err
}

// stateURI is the file: URI of a state's descriptor set.
func stateURI(set int) string {
	return fmt.Sprintf("file:/dev/fdset/%d,offset=%d", set, stateOffset)
}

// classic sets the capabilities of a classic stream: caps, and mapped-ram
// and multifd off (a QEMU keeps them from an earlier migration: a
// template's QEMU loads a mapped-ram state, then saves its devices).
func classic(ctx context.Context, q *QMP, caps []map[string]any) error {
	caps = append(caps,
		map[string]any{"capability": "mapped-ram", "state": false},
		map[string]any{"capability": "multifd", "state": false})
	_, err := q.Execute(ctx, "migrate-set-capabilities", map[string]any{"capabilities": caps})
	return err
}
