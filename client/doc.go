// Package client is the Go client of strata's public API (docs/api.md):
// directory checkpoints, sandboxes and their lifecycle, exec and exec
// sessions, files, VM snapshots and forks, access tokens. createos is
// built on it; a Go program uses it the same way:
//
//	c, err := client.FromEnv() // CREATEOS_API_URL, CREATEOS_API_KEY, or inside a sandbox its credentials file
//	sb, err := c.CreateSandbox(ctx, api.SandboxCreateRequest{Name: &name})
//	res, err := c.Exec(ctx, "scratch", api.ExecRequest{Cmd: []string{"uname", "-a"}}) // a sandbox by its id or name
//
// Each call returns its data, decoded, and an error, as Go clients do; a
// refusal is an *Error carrying the API's stable code, message, status,
// fields and the answer as sent (Body). A caller that wants a success's
// data as the server sent it (to print it whole, or to read a field this
// package does not know) passes Raw(&raw). Calls are one HTTP request
// each: retries are the caller's (with an idempotency key where the API
// takes one). Files and session attachments stream (Stream, WriteFile,
// ReadFile, Attach): nothing is held whole.
//
// Which word is which level: CreateCheckpoint, ListCheckpoints,
// RestoreCheckpoint and DeleteCheckpoint are directory checkpoints
// (CreateOS's checkpoints: one directory inside a running sandbox);
// CreateSnapshot, RestoreSnapshot, ForkSnapshot and Fork are VM snapshots
// and forks of them (what loam's and OpenComputer's "checkpoints" are:
// loam's c.CreateCheckpoint is c.CreateSnapshot here).
//
// What it does not do: it does not wait for a sandbox by itself
// (WaitSandbox is one long poll; createos loops on it), and it knows no
// route that docs/api.md does not name.
package client
