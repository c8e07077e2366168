package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequiresImage fails t unless it can boot microVMs: root, QEMU on PATH,
// and the guest image that `make image` built, named by $STRATA_IMAGE
// (make test sets it). It returns the image directory. Under -short the
// test is skipped instead.
func RequiresImage(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("boots microVMs; skipped under -short")
	}
	RequiresRoot(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatal("this test boots microVMs: qemu-system-x86_64 is not on PATH (make deps installs it)")
	}
	dir := os.Getenv("STRATA_IMAGE")
	if dir == "" {
		t.Fatal("this test boots microVMs: set STRATA_IMAGE to the guest image directory (make test does it, after make image)")
	}
	if _, err := os.Stat(filepath.Join(dir, "image.json")); err != nil {
		t.Fatalf("STRATA_IMAGE=%s: %v (rebuild it with make image)", dir, err)
	}
	return dir
}
