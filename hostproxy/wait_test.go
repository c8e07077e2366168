package hostproxy

import (
	"encoding/json"
	"testing"
	"time"

	"strata/sandbox"
)

// TestGetSandboxWaits: GET /v1/sandboxes/{id}?wait_s=N answers a
// sandbox on its way to a state once it has left that state (not after
// its N seconds), answers at once a sandbox that is in no such state, and
// answers as the sandbox is when N runs out; anything but one wait_s of 1
// to 30 is 400 invalid_field.
func TestGetSandboxWaits(t *testing.T) {
	v := newVMTest(t)
	state := func(data json.RawMessage) string {
		var sb struct{ State string }
		if err := json.Unmarshal(data, &sb); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		return sb.State
	}
	type answer struct {
		status int
		data   json.RawMessage
	}
	get := func(query string) chan answer {
		ch := make(chan answer, 1)
		go func() {
			status, data := v.do("GET", "/v1/sandboxes/sb-vm"+query)
			ch <- answer{status, data}
		}()
		return ch
	}

	// Creating: the answer waits for the boot's end.
	ch := get("?wait_s=30")
	select {
	case a := <-ch:
		t.Fatalf("answered %d %s while the sandbox was still creating", a.status, a.data)
	case <-time.After(300 * time.Millisecond):
	}
	v.setState(sandbox.Running)
	select {
	case a := <-ch:
		if a.status != 200 || state(a.data) != "running" {
			t.Fatalf("after the boot: %d %s", a.status, a.data)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no answer 20 s after the sandbox ran, with wait_s=30")
	}

	// Running: at once.
	select {
	case a := <-get("?wait_s=30"):
		if a.status != 200 || state(a.data) != "running" {
			t.Fatalf("running: %d %s", a.status, a.data)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a running sandbox with wait_s=30 was not answered within 20 s")
	}

	// Still pausing when the wait runs out: answered as it is.
	v.setState(sandbox.Pausing)
	if a := <-get("?wait_s=1"); a.status != 200 || state(a.data) != "pausing" {
		t.Fatalf("pausing, wait over: %d %s", a.status, a.data)
	}

	for _, q := range []string{"?wait_s=0", "?wait_s=31", "?wait_s=x", "?wait_s=1.5", "?wait_s=1&wait_s=2", "?wait_s=1&limit=2", "?limit=2", "?", "?wait_s="} {
		status, data := v.do("GET", "/v1/sandboxes/sb-vm"+q)
		var field struct{ Field string }
		json.Unmarshal(data, &field)
		if status != 400 || field.Field != "wait_s" {
			t.Errorf("GET %s: %d %s, want 400 invalid_field wait_s", q, status, data)
		}
	}
}
