// Package testenv holds the preconditions of strata's root-only tests:
// they fail, never skip, when they cannot run, unless -short is given.
package testenv

import (
	"os"
	"testing"
)

// RequiresRoot fails t unless the test runs as root (as `make test`
// arranges), for a test that needs root but makes no mount. Under -short
// the test is skipped instead.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs root; skipped under -short")
	}
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root: run it with `make test` (or -short to skip it)")
	}
}

// RequiresRootMounts fails t unless the test runs as root in a private
// mount namespace (as `make test` arranges), so that no mount it makes can
// leak onto the machine. Under -short the test is skipped instead.
func RequiresRootMounts(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs root and a private mount namespace; skipped under -short")
	}
	RequiresRoot(t)
	// make test records the namespace it started in; /proc/1 is often
	// unreadable inside sandboxes, even to root.
	outer := os.Getenv("STRATA_OUTER_MNTNS")
	if outer == "" {
		t.Fatal("this test mounts: run it with `make test`, which runs tests in a private mount namespace (or use -short to skip it)")
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatalf("cannot read this process's mount namespace: %v", err)
	}
	if self == outer {
		t.Fatal("this test mounts: run it in a private mount namespace with `make test` (unshare --mount --propagation private)")
	}
}
