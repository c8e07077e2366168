package hostproxy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"strata/hostproxy/hostproxytest"
	"strata/internal/fault"
	"strata/sandbox"
)

// TestStreamsCountAgainstTheGuestsCap pins issue 30's streams outside the
// per-sandbox limits: file transfers and attachments opened channel
// streams beside the pools' caps (60 streams to a guest, not 36). Every
// place of the exec pool held, a transfer and an attachment are refused
// (409 stream_limit) without reaching the guest; one place given back,
// a transfer goes through.
func TestStreamsCountAgainstTheGuestsCap(t *testing.T) {
	v := newVMTest(t)
	v.setState(sandbox.Running)
	v.guest.SetRoute("GET", "/v1/files/f", hostproxytest.Fault{Status: 200, Body: "x", Header: map[string]string{"Content-Type": "application/octet-stream"}})
	var held []func()
	for range maxGuestCalls {
		release, err := v.s.guests.holdStream(guestAddress("sb-vm"))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, release)
	}
	if _, err := v.s.guests.holdStream(guestAddress("sb-vm")); fault.CodeOf(err) != "stream_limit" {
		t.Fatalf("a place past the cap: %v", err)
	}
	get := func(path string, h map[string]string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("X-Api-Key", testKey)
		for k, v := range h {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		v.s.Handler().ServeHTTP(w, r)
		return w
	}
	before := v.guest.Requests()
	if w := get("/v1/sandboxes/sb-vm/files/f", nil); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), `"stream_limit"`) {
		t.Errorf("a transfer with every place held: %d %s", w.Code, w.Body)
	}
	ws := map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
	if w := get("/v1/sandboxes/sb-vm/sessions/se-0123456789abcdef/attach", ws); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), `"stream_limit"`) {
		t.Errorf("an attachment with every place held: %d %s", w.Code, w.Body)
	}
	if n := v.guest.Requests() - before; n != 0 {
		t.Errorf("%d refused streams reached the guest", n)
	}
	held[0]()
	if w := get("/v1/sandboxes/sb-vm/files/f", nil); w.Code != http.StatusOK || w.Body.String() != "x" {
		t.Errorf("a transfer with a place free: %d %s", w.Code, w.Body)
	}
	for _, release := range held[1:] {
		release()
	}
}

// TestAttachmentsAndTransfersPerAccount pins issue 30's host-wide limits
// that one account could take from every other: one account's 256
// sandboxes could hold all of the host's 4096 attachments. An account
// holds at most maxAccountAttachments attachments and
// maxAccountTransfers transfers; others still get theirs, up to the
// host's attachments.
func TestAttachmentsAndTransfersPerAccount(t *testing.T) {
	var a attachments
	fill := func(account string, n int) error {
		for i := range n {
			if err := a.add(account, fmt.Sprintf("%s-sb%d", account, i/maxAttachments), &attached{}); err != nil {
				return err
			}
		}
		return nil
	}
	if err := fill("acct-a", maxAccountAttachments); err != nil {
		t.Fatal(err)
	}
	if err := a.add("acct-a", "acct-a-sb-new", &attached{}); err != errAccountAttachLimit {
		t.Fatalf("acct-a past its limit: %v", err)
	}
	for _, acct := range []string{"acct-b", "acct-c", "acct-d"} {
		if err := fill(acct, maxAccountAttachments); err != nil {
			t.Fatalf("%s: %v", acct, err)
		}
	}
	if err := a.add("acct-e", "acct-e-sb0", &attached{}); err != errHostAttachLimit {
		t.Fatalf("past the host's limit: %v", err)
	}
	var tr transfers
	var releases []func()
	for i := range maxAccountTransfers {
		release, err := tr.take("acct-a", fmt.Sprintf("sb%d", i/maxTransfers))
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	if _, err := tr.take("acct-a", "sb-new"); err != errAccountTransferLimit {
		t.Fatalf("acct-a past its transfers: %v", err)
	}
	if _, err := tr.take("acct-b", "sb-b"); err != nil {
		t.Fatalf("acct-b: %v", err)
	}
	releases[0]()
	if _, err := tr.take("acct-a", "sb-new"); err != nil {
		t.Fatalf("acct-a after a transfer ended: %v", err)
	}
	// A sandbox's own limit comes first.
	if err := a.add("acct-a", "acct-a-sb0", &attached{}); err != errAttachLimit {
		t.Fatalf("a full sandbox: %v", err)
	}
}
