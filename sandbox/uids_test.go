package sandbox_test

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
)

// TestUIDNotReusedWhileItsProcessLives: a deleted sandbox's uid is not
// given to a new sandbox while any process still runs as it (a QEMU that
// outlives its record: a restore's old machine writing auto-N, a template
// QEMU); once that process is gone, the uid is free again.
//
// Regression: uids were free as soon as no record named them, so a new
// sandbox could get the uid of a QEMU that still held another's memory
// (ptrace, /proc/PID/mem).
func TestUIDNotReusedWhileItsProcessLives(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	m := h.manager(nil)
	uid := h.running(m, "sb-1").Machine.Uid
	// A process of sb-1's uid that outlives its record.
	p := exec.Command("sleep", "600")
	p.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Process.Kill(); p.Wait() })
	if err := m.Delete(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if got := h.running(m, "sb-2").Machine.Uid; got == uid {
		t.Fatalf("sb-2 got uid %d, which a live process still holds", got)
	}
	p.Process.Kill()
	p.Wait()
	if got := h.running(m, "sb-3").Machine.Uid; got != uid {
		t.Fatalf("sb-3 got uid %d; want %d, the lowest free once its process ended", got, uid)
	}
}
