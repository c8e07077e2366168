package cli

import (
	"bufio"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// umask is this process's file mode creation mask: what a download
// clears from the modes the sandbox sends, as cp and tar do for a user
// (a variable, for tests).
var umask = processUmask

// processUmask reads the mask where Linux shows it (/proc/self/status,
// since 4.7), without changing it. Elsewhere it is set and put back at
// once: umask(2) has no read-only form, and createos makes no file
// meanwhile (the mask is read before a download writes anything).
func processUmask() fs.FileMode {
	if m, ok := statusUmask("/proc/self/status"); ok {
		return m
	}
	old := syscall.Umask(0o022)
	syscall.Umask(old)
	return fs.FileMode(old) & fs.ModePerm
}

// statusUmask is the Umask line of a /proc/PID/status file.
func statusUmask(file string) (fs.FileMode, bool) {
	f, err := os.Open(file)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "Umask:")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
		if err != nil || n > 0o777 {
			return 0, false
		}
		return fs.FileMode(n), true
	}
	return 0, false
}
