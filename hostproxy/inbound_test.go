package hostproxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"strata/internal/api"
	"strata/sandbox"
)

// TestBodiesFromInsideBounded pins issue 30's bodies of calls from
// inside a sandbox: a POST …/sessions body of up to 8 MiB was read (and
// decoded) before any limit on the sandbox's calls, so 32 of them
// through the channel held 32 × 8 MiB, and their decoding 150 MiB each.
// 32 bodies of 8 MiB sent at once through the channel, half a flood of
// values, half one long string, chunked and not: each is answered, and
// what hostproxy holds at once stays within guestHeapBound.
func TestBodiesFromInsideBounded(t *testing.T) {
	v := newVMTest(t)
	v.setState(sandbox.Running)
	// The guest's key may start sessions: the bodies reach the budget.
	if _, err := v.s.reg.Update(t.Context(), "sb-vm", func(r *Sandbox) error {
		r.Access = api.Access{Scopes: api.Scopes{api.ScopeExec}}.String()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Every call waits its turn however slow the machine (each body is
	// read and decoded alone): none is refused for the time it waited,
	// which would close its connection before its body was sent.
	v.s.timeouts.read = 10 * time.Minute
	url := v.serveChannel("sb-vm") + "/v1/sandboxes/sb-vm/sessions"
	key := v.s.reg.ChannelKey("sb-vm")
	flood := []byte(`{"cmd":[` + strings.Repeat(`"",`, (api.MaxExecBody-16)/3) + `""]}`)
	long := []byte(`{"cmd":["` + strings.Repeat("x", api.MaxExecBody-16) + `"]}`)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)

	const calls = maxGuestConns
	stop := heapWatch()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := range calls {
		wg.Go(func() {
			body := flood
			if i%2 == 1 {
				body = long
			}
			var rd io.Reader = bytes.NewReader(body)
			if i%4 >= 2 {
				rd = io.MultiReader(rd) // no length: chunked
			}
			req, _ := http.NewRequest("POST", url, rd)
			req.Header.Set("X-Api-Key", key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var env struct{ Data struct{ Code string } }
			json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&env)
			mu.Lock()
			defer mu.Unlock()
			statuses[resp.StatusCode]++
			// Refused once read: too many values, cmd too long.
			if resp.StatusCode != 400 {
				t.Errorf("call %d: %d %s", i, resp.StatusCode, env.Data.Code)
			}
		})
	}
	wg.Wait()
	peak := stop()
	t.Logf("%d calls of %d bytes: %v; held at most %d MiB", calls, len(flood), statuses, peak>>20)
	if peak > guestHeapBound {
		t.Errorf("held %d bytes at once, bound %d", peak, guestHeapBound)
	}
	if v.guest.Requests() != 0 {
		t.Errorf("%d bodies reached the guest", v.guest.Requests())
	}
}
