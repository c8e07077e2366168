// Package failpoint kills the process at named steps, for crash tests.
//
// A step calls Hit(name) right after it completes. When the environment
// variable STRATA_FAILPOINTS lists name (comma-separated), the process
// sends itself SIGKILL there: no deferred function, no cleanup, exactly as
// a power cut or an OOM kill would leave things. When STRATA_FAILPOINT_TRACE
// names a file, every name hit is appended to it, so a test can learn the
// steps of an operation and then crash at each one in turn. With neither
// variable set, Hit costs one map lookup on an empty map.
package failpoint

import (
	"os"
	"strings"
	"sync"
	"syscall"
)

var (
	armed     = map[string]bool{}
	traceFile string
	traceMu   sync.Mutex
)

func init() {
	for _, n := range strings.Split(os.Getenv("STRATA_FAILPOINTS"), ",") {
		if n = strings.TrimSpace(n); n != "" {
			armed[n] = true
		}
	}
	traceFile = os.Getenv("STRATA_FAILPOINT_TRACE")
}

// Hit marks that the step name has completed.
func Hit(name string) {
	if traceFile != "" {
		traceMu.Lock()
		if f, err := os.OpenFile(traceFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
			_, _ = f.WriteString(name + "\n")
			_ = f.Sync()
			f.Close()
		}
		traceMu.Unlock()
	}
	if armed[name] {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not delivered synchronously; never return.
	}
}
