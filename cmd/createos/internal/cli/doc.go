// Package cli is the createos command line: cobra commands over a small
// client of the public API (Client), with tables for people and -o json
// for programs.
//
// Run executes one command line and returns the exit status: 0 on success,
// 1 when the API or the network fails (the server's code and message are
// printed), 2 on a usage error. The API address and key come from flags or
// the environment (CREATEOS_API_URL, CREATEOS_API_KEY); the SANDBOX
// argument of the checkpoint and access-token commands and of snapshot
// create, list and get defaults to CREATEOS_SANDBOX_ID, and every other
// command takes it only as given (so that no rm, restore or fork acts on
// a sandbox by inheritance). What those leave unset comes
// from the sandbox's credentials file (CREATEOS_CREDENTIALS, default
// /run/strata/credentials.env), and a failure says which values did, so
// that a stale file is never used silently.
//
// It keeps no state between runs: the tree command draws what the list
// endpoint returns, nothing more (see docs/cli.md for what that can and
// cannot show).
package cli
