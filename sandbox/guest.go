package sandbox

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"strata/internal/guestclient"
)

func guestHealth(ctx context.Context, mc *machine) error {
	_, err := guestCall(ctx, mc, http.MethodGet, "/v1/health", nil)
	return err
}

// The manager's own calls to a guest (health, resync, shutdown, the sync
// before a disk snapshot) answer a few bytes: at most 4 at once, 64 KiB
// an answer, 256 KiB held, through the host's one guest client.
var guestCallLimits = guestclient.Limits{Calls: 4, MaxAnswer: 64 << 10, Timeout: 30 * time.Second}

const guestCallBudget = 256 << 10

// guestCall sends one request to guestd through the channel (a JSON body,
// or none) and wants a 200, whose body it returns; the call ends at ctx's
// end, answer or not.
func guestCall(ctx context.Context, mc *machine, method, path string, body []byte) ([]byte, error) {
	a, err := mc.guest.Do(ctx, guestclient.Request{
		Method: method, Path: path, Body: body,
		Header:     http.Header{"Content-Type": {"application/json"}},
		Idempotent: method == http.MethodGet,
	})
	if err != nil {
		return nil, err
	}
	defer a.Release()
	b := slices.Clone(a.Body)
	if a.Status != http.StatusOK {
		return b, &guestRefused{fmt.Sprintf("guestd %s %s: %d: %.300s", method, path, a.Status, b)}
	}
	return b, nil
}

// guestRefused is guestd's answer other than 200 to a manager's call.
type guestRefused struct{ msg string }

func (e *guestRefused) Error() string { return e.msg }

// Dial opens a stream to the guestd of a running sandbox (the vm:// guest
// address scheme).
func (m *Manager) Dial(ctx context.Context, id string) (net.Conn, error) {
	mc := m.machineOf(id)
	if mc == nil {
		return nil, &net.OpError{Op: "dial", Net: GuestScheme, Err: fmt.Errorf("sandbox %s has no running machine", id)}
	}
	c, err := mc.ch.Open(ctx)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: GuestScheme, Err: err}
	}
	return c, nil
}
