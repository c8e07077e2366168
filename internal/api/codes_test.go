package api_test

import (
	"testing"

	"strata/holders"
	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/httpx"
	"strata/internal/jsend"
	"strata/layers"
	"strata/layers/meta"
	"strata/pathpolicy"
)

// TestGuestFailCodes holds the list of codes hostproxy relays from a guest
// to the errors guestd answers with, as their packages define them: a
// code guestd gains must be added (or hostproxy answers it as a guest
// error), and the list never holds a code of the edge's own checks
// (issue 30: a guest relayed 401 unauthorized and 404 sandbox_not_found
// through hostproxy).
func TestGuestFailCodes(t *testing.T) {
	fromGuestd := []*fault.Error{
		jsend.ErrInvalidJSON, jsend.ErrBodyTooLarge, jsend.ErrUnsupportedMedia, jsend.ErrQueryNotAllowed, jsend.ErrBodyNotAllowed,
		jsend.InvalidField("f", "r"), fault.New(fault.Invalid, "unknown_field", ""),
		httpx.ErrNoRoute, httpx.ErrMethodNotAllowed,
		layers.ErrCheckpointNotFound, layers.ErrInProgress, layers.ErrNotManaged, layers.ErrEntryNotFound,
		layers.ErrFileTooLarge, layers.ErrCheckpointLimit, layers.ErrCheckpointOtherDirectory, layers.ErrLiveUnavailable,
		layers.ErrDirectoryMoved, meta.ErrIdempotencyKeyReused,
		fault.As(holders.BusyError("/p", nil)),
		api.ErrExecBodyTooLarge, api.ExecFailed("x"), api.ErrSessionLimit, api.ErrSessionNotFound,
		api.ErrFileNotFound, api.ErrNotAFile, api.ErrDirectoryNotEmpty,
	}
	for _, code := range pathpolicy.ViolationCodes {
		fromGuestd = append(fromGuestd, fault.New(fault.Unprocessable, code, ""))
	}
	for _, fe := range fromGuestd {
		if kind, ok := api.GuestFailCodes[fe.Code]; !ok || kind != fe.Kind {
			t.Errorf("guestd's %s (%v) is relayed as %v, %v", fe.Code, fe.Kind, kind, ok)
		}
	}
	for code, kind := range api.GuestFailCodes {
		status := jsend.Status(kind)
		if status < 400 || status >= 500 || status == 401 || status == 403 || status == 429 {
			t.Errorf("%s: status %d may not come from a guest", code, status)
		}
	}
	for _, code := range []string{"unauthorized", "forbidden", "sandbox_not_found", "rate_limited", "token_not_found", "attach_limit", "transfer_limit"} {
		if _, ok := api.GuestFailCodes[code]; ok {
			t.Errorf("the edge's %s is relayed from a guest", code)
		}
	}
}
