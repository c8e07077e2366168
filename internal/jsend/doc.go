// Package jsend is the transport edge shared by guestd and hostproxy: it
// writes JSend envelopes, maps fault kinds to HTTP statuses (the one place
// in strata that does), and decodes request bodies under the API's rules.
// What it takes from someone untrusted (a large body, a guest's fail) is
// bounded before it is decoded, by a scanner that allocates nothing
// (scan.go): encoding/json makes a structure of every value first.
//
// Success is 200 with {"status":"success","data":…}. A client error (4xx)
// is {"status":"fail","data":{"code","message",…fields}}. A server error
// (5xx) is {"status":"error","message","code":<http status>}, plus
// "data":{"code":<stable code>} when the error has one (insufficient_storage,
// guest_unavailable…); its cause is logged with the request id and never
// sent. Internal errors carry no detail at all: the client sees
// "internal error" and the X-Request-Id.
package jsend
