package hostproxy

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"strata/internal/fault"
	"strata/internal/jsend"
)

// Authentication: which credential a request carries, and whose it is.
// The key comes in X-Api-Key or as Authorization: Bearer (the same keys
// and tokens), or, on a WebSocket upgrade with neither, as a "key.<key>"
// subprotocol (a browser's or Node's WebSocket cannot send headers).

var errKeyConflict = jsend.InvalidField("authorization", "X-Api-Key and Authorization: Bearer hold different keys; send one key")

// failedKeyPrefix is how much of a wrong key names its failures' bucket,
// beside the client address (keyPrefix).
const failedKeyPrefix = 8

// authenticate returns the principal of the request's key, and applies
// its rate limit. Failed authentications are limited per client address
// and key prefix (failureBucket): a client that keeps sending a wrong key
// is slowed down (429) without locking out the others behind the same
// address (a proxy's), and a correct key is never refused by it. Keys
// and tokens are 32 random bytes: the limit is against load and noise in
// the logs, not against guessing.
//
// A call through a sandbox's channel is refused (401) while that
// sandbox's access is none, whatever key it carries: the guest was given
// none, and a key it found elsewhere (a fork's memory holds its source's)
// must not open the API either.
func (s *Server) authenticate(c echo.Context) (Principal, error) {
	r := c.Request()
	ctx := r.Context()
	key, err := requestKey(r)
	if err != nil && fault.KindOf(err) != fault.Unauthorized {
		return Principal{}, err
	}
	var via *Sandbox
	if id := channelSandbox(ctx); id != "" {
		sb, verr := s.reg.Sandbox(ctx, id)
		switch {
		case errors.Is(verr, errSandboxNotFound):
			return Principal{}, errUnauthorized
		case verr != nil:
			return Principal{}, verr
		case accessOf(sb).None:
			return Principal{}, errNoAccess
		}
		via = &sb
	}
	var p Principal
	if err == nil {
		p, err = s.principal(ctx, key, via)
	}
	now := time.Now()
	if err != nil {
		if fault.KindOf(err) == fault.Unauthorized {
			if ok, wait := s.failures.allow(failureBucket(c.RealIP(), key), now); !ok {
				return Principal{}, s.rateLimited(c, errLoginsLimited, wait)
			}
		}
		return Principal{}, err
	}
	if ok, wait := s.limits.allow(p.ID, now); !ok {
		return Principal{}, s.rateLimited(c, errRateLimited, wait)
	}
	return p, nil
}

// failureBucket names the bucket of a failed authentication: the client
// address and the key's first failedKeyPrefix bytes.
func failureBucket(addr, key string) string {
	if len(key) > failedKeyPrefix {
		key = key[:failedKeyPrefix]
	}
	return addr + " " + key
}

// requestKey is the request's key, "" for none. X-Api-Key sent twice, or
// Authorization: Bearer twice, is refused (401) rather than read as
// either: a proxy and hostproxy could each act on a different one; both
// headers with different keys are 400 invalid_field.
func requestKey(r *http.Request) (string, error) {
	keys := r.Header.Values("X-Api-Key")
	var bearer []string
	for _, v := range r.Header.Values("Authorization") {
		scheme, token, ok := strings.Cut(strings.TrimSpace(v), " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			bearer = append(bearer, strings.TrimSpace(token))
		}
	}
	switch {
	case len(keys) > 1 || len(bearer) > 1:
		return "", errTwoKeys
	case len(keys) == 1 && len(bearer) == 1 && keys[0] != bearer[0]:
		return "", errKeyConflict
	case len(keys) == 1:
		return keys[0], nil
	case len(bearer) == 1:
		return bearer[0], nil
	case !strings.EqualFold(r.Header.Get("Upgrade"), "websocket"):
		return "", nil
	}
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if k, ok := strings.CutPrefix(strings.TrimSpace(p), keyProtocol); ok {
				keys = append(keys, k)
			}
		}
	}
	switch len(keys) {
	case 0:
		return "", nil
	case 1:
		return keys[0], nil
	}
	return "", errTwoKeys
}

// principal authenticates key; via is the sandbox whose channel the call
// came through (nil from the network), the only place a channel key is
// taken.
func (s *Server) principal(ctx context.Context, key string, via *Sandbox) (Principal, error) {
	switch {
	case key == "":
		return Principal{}, errUnauthorized
	case isChannelKey(key):
		return s.reg.authenticateChannel(via, key)
	}
	return s.reg.Authenticate(ctx, key)
}
