// Package guestclient is the host's one HTTP client of a guest daemon
// (guestd): hostproxy's calls for clients (checkpoints, exec) and the
// sandbox manager's own (health, resync, shutdown, the sync before a disk
// snapshot) both go through it.
//
// A guest is untrusted: root inside a sandbox controls its guestd, or
// replaces it with anything that speaks the channel. So everything a
// guest's answer can make the host hold is bounded:
//   - the status line and headers: Limits.MaxHeader (64 KiB), then the
//     call fails;
//   - the body: read into a buffer of its Content-Length, or in 64 KiB
//     pieces when it has none, never past Limits.MaxAnswer (the call fails
//     with ErrAnswerTooLarge);
//   - calls in flight to one guest: Limits.Calls, a semaphore; more wait,
//     up to their deadline. A stream the caller opens itself (HTTPClient,
//     StreamClient) takes a place too, for as long as it lasts (Hold),
//     or is refused when there is none;
//   - bytes of answers held at once: a Budget, which the clients of one
//     sandbox share; a call waits for room, up to its deadline, and gives
//     its bytes back when the caller releases the answer (Answer.Release);
//   - time: every call has a deadline (Request.Timeout, or the client's).
//
// So N guests cost the host at most N times one guest's figure, whatever
// they answer (docs/design.md).
//
// What it does not do: it does not know JSend or the API's routes (its
// callers parse the answers), and it does not dial by itself: Dial opens
// a stream of the sandbox's channel, or a connection to a configured
// guest's address. Every call opens a connection of its own (no pooling):
// a channel stream costs one frame, and a call whose stream the guest
// never accepted is then known to have never reached guestd.
//
// Retries: a call is sent again once when its connection failed before
// any answer and either the guest never accepted its stream
// (channel.NeverAccepted: a session reset while it waited), or the call is
// idempotent (Request.Idempotent). Nothing else is retried.
package guestclient
