// Package logx is the one log format of strata's daemons. guestd and
// hostproxy both build their logger here, so that their lines read alike
// and interleave legibly in one terminal (make run runs both):
//
//	time=2026-12-01T11:18:33.873Z level=INFO msg=request daemon=hostproxy request_id=…
//
// Every line carries the time in UTC to the millisecond, slog's level names
// (DEBUG, INFO, WARN, ERROR), the message and daemon=NAME; the caller's
// attributes follow. Text is the default; --log-format json writes the same
// keys as JSON objects for a log collector. Debug lines appear only with
// --debug.
//
// logx chooses no message and no key beyond those: what a daemon says (one
// line per request and per operation at info, each step at debug) is the
// daemon's business.
package logx
