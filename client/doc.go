// Package client is the Go client of strata's public API (docs/api.md):
// directory checkpoints, sandboxes and their lifecycle, exec and exec
// sessions, files, VM snapshots and forks, access tokens. createos is
// built on it; a Go program uses it the same way:
//
//	c, err := client.FromEnv() // CREATEOS_API_URL, CREATEOS_API_KEY, or inside a sandbox its credentials file
//	sb, _, err := c.CreateSandbox(ctx, api.SandboxCreateRequest{})
//	res, _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"uname", "-a"}})
//
// Each call answers its data, decoded, and the JSend data as sent (for
// printing it whole); a refusal is an *Error carrying the API's stable
// code, message, status and fields. Calls are one HTTP request each:
// retries are the caller's (with an idempotency key where the API takes
// one). Files and session attachments stream (Stream, WriteFile,
// ReadFile, Attach): nothing is held whole.
//
// What it does not do: it does not wait for a sandbox by itself
// (WaitSandbox is one long poll; createos loops on it), and it knows no
// route that docs/api.md does not name.
package client
