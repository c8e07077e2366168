// Package integration tests strata end to end: the real guestd (and,
// where a test says so, hostproxy and createos) as processes, real overlay
// mounts, real HTTP. Every test here needs root and a private mount
// namespace (`make test` provides both) and fails without them, unless
// -short is given.
package integration
