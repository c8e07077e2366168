package hostproxy

import (
	"strata/internal/fault"
	"strata/sandbox"
)

// The errors hostproxy itself answers with. Codes are part of the API
// (docs/api.md); messages are one sentence for a person. An unknown route
// and a wrong method are httpx.ErrNoRoute and httpx.ErrMethodNotAllowed,
// the same in guestd.
var (
	errUnauthorized       = fault.New(fault.Unauthorized, "unauthorized", "a valid account API key or sandbox access token is required, in the X-Api-Key header or as Authorization: Bearer")
	errNoAccess           = fault.New(fault.Unauthorized, "unauthorized", "this sandbox's access is none: calls from inside it are refused, whatever key they carry")
	errSandboxNotFound    = sandbox.ErrNotFound
	errCheckpointNotFound = fault.New(fault.NotFound, "checkpoint_not_found", "no checkpoint has this id")
	errSandboxNotRunning  = sandbox.ErrNotRunning
	errTokenExists        = fault.New(fault.Conflict, "token_exists", "the sandbox already has an access token; rotate or revoke it first")
	errTokenNotFound      = fault.New(fault.NotFound, "token_not_found", "the sandbox has no access token")
	errTwoKeys            = fault.New(fault.Unauthorized, "unauthorized", "send one key, once: X-Api-Key or Authorization: Bearer, not several times")
	errRateLimited        = fault.New(fault.TooManyRequests, "rate_limited", "too many requests with this credential; retry later")
	errLoginsLimited      = fault.New(fault.TooManyRequests, "rate_limited", "too many failed authentications from this address with this key; retry later")
	errGuestUnavailable   = fault.New(fault.Unavailable, "guest_unavailable", "the sandbox's guest daemon cannot be reached")
	errGuestTimeout       = fault.New(fault.Unavailable, "guest_timeout", "the sandbox's guest daemon did not answer in time")
	// errGuestAnswer is a guest's answer that is not guestd's: not JSend,
	// over a bound, or a fail whose code is not one guestd answers with
	// (api.GuestFailCodes). A guest is not trusted: it is told apart from
	// hostproxy's own failures (500), and what it sent is logged only.
	errGuestAnswer = fault.New(fault.BadGateway, "guest_error", "the sandbox's guest daemon gave an answer that is not the API's")
)

// guest5xx are the only messages a client sees for a guest's 5xx: the
// guest's own text may name host paths or Go errors, so it is logged only.
var guest5xx = map[int]*fault.Error{
	507: fault.New(fault.InsufficientStorage, "insufficient_storage", "not enough free space to proceed safely"),
	503: errGuestUnavailable,
}
