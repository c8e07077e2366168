// Package httpx is the HTTP layer that guestd and hostproxy share: the
// request id, the access log line, the one way an error becomes a response,
// and serving with a graceful shutdown. Each daemon keeps its own routes
// (guestd a net/http ServeMux, hostproxy echo) and wraps them in an Edge.
//
// What an Edge does for every request, matched or not:
//
//   - request id: with AcceptRequestID, a caller's X-Request-Id is kept when
//     it is sent once and is sane (ValidRequestID: 1 to 64 characters of
//     A-Z a-z 0-9 - _ . :); otherwise, and always without AcceptRequestID,
//     a new one is made (NewRequestID). The id is set on the response before
//     the handler runs and is in the request's context (RequestID);
//
//   - errors: a handler that fails calls WriteError (or Respond), which
//     writes the JSend envelope through jsend.Error, the one place that maps
//     a fault kind to an HTTP status. An unclassified error is a bare 500
//     ("internal error") whose cause is only logged, with the request id; a
//     panic is such an error. An error after the response has started is
//     logged, never written into the body;
//
//   - one access log line at info, "request", with the keys request_id,
//     method, route, status, duration_ms in that order, then the attributes
//     the daemon added (Annotate: hostproxy's remote, credential, account,
//     sandbox), then code when the request failed with a classified error.
//     route is the pattern the request matched (SetRoute, else the
//     ServeMux's pattern), "unmatched" when none did or the request was
//     answered with ErrNoRoute: never the raw path, so ids and paths stay
//     out of route labels.
//
//   - Server-Timing: every answer carries the daemon's time until its
//     status ("total") and the metrics code below added to the request's
//     context (package servertiming), in the Server-Timing header;
//
// Serve runs an http.Server on a listener until its context is done, then
// stops accepting, waits for the requests in flight up to the shutdown
// timeout, and closes what is still open. Requests in flight are not
// cancelled by the context: their contexts keep its values, not its end.
//
// What it does not do: routing, authentication, decoding bodies (package
// jsend), metrics (a daemon observes each request through Edge.Observe).
//
// Races: the per-request state (route, attributes, error) is set and read
// on the request's goroutine; a handler must not call Annotate, SetRoute or
// WriteError from another goroutine after it has returned.
package httpx
