// Package servertiming carries the Server-Timing metrics of one request
// (RFC: W3C Server Timing): where a request's time went, step by step,
// for a caller or a benchmark to read from the answer's header.
//
// The HTTP edge (package httpx) puts a Recorder in every request's
// context (With) and writes its metrics into the Server-Timing header
// when the response starts, after a "total" of its own. Code below the
// edge adds a metric with Add (the directory engine: one per step of an
// operation, "capture.prepare"); outside a request it does nothing.
// hostproxy forwards the metrics of a guest's answer (Parse) under the
// prefix "guest.", beside its own.
//
// Bounds, because a guest is untrusted and its header is forwarded: a
// Recorder keeps at most MaxMetrics metrics (later ones are dropped);
// a name is 1 to MaxName characters of A-Z a-z 0-9 - _ . (anything else
// is dropped, not escaped); a duration is between 0 and MaxDuration.
// Parse reads at most MaxMetrics metrics from at most MaxHeader bytes and
// ignores what it does not understand (a description, other parameters).
//
// Written by hand: the format is a few lines, and the libraries for it
// either add dependencies or keep no bounds.
package servertiming
