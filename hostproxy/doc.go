// Package hostproxy is strata's public REST API: it authenticates callers
// with account API keys, sandbox access tokens and channel keys (in
// X-Api-Key or as Authorization: Bearer), authorizes them by one table,
// validates every request at the edge, and forwards the checkpoint
// operations (the seed's four and the extensions: changes, files,
// restore-paths, clone, directories and their release) to the guest
// daemon (guestd) of the sandbox they name.
//
// Who may call what is one table (authz.go): for every route, the kinds
// of credential that may call it (account key, the sandbox's own token,
// its channel key through its own channel), the scope a token or channel
// key needs (api.Scope: checkpoints, snapshots, exec, files, ports,
// watch), and whether a call from inside a sandbox may reach it at all.
// One middleware checks it and looks up the sandbox the route names
// before any handler runs; openapi.json prints it; a route without a rule
// does not start. A token has the scopes of its issue (checkpoints and
// snapshots by default); a channel key those of its sandbox's access
// setting (access.go), read from the record at each call; a configured
// sandbox's token never has exec or files (its guestd may be the host's,
// as root: make run-local).
//
// What it does:
//   - serves /v1/sandboxes/{id}/checkpoints… and /v1/sandboxes/{id}/access-token…
//     with JSend envelopes on every response, an X-Request-Id header on every
//     response, and one error-to-HTTP mapping (jsend.Error);
//   - keeps a registry of accounts, key hashes, sandboxes and access-token
//     hashes in a bbolt file under the data directory, seeded from the
//     configuration at start (see Config), with two indexes written in
//     the same transactions as the records (names.go): sandbox names, so
//     that a name works wherever an id does (in every route's {id} and in
//     a fork's from), and VM snapshot refs ("sn-…", given by the registry
//     as a snapshot is first recorded, never given twice), so that a
//     snapshot is named on the whole deployment and a fork's from needs
//     no sandbox;
//   - keeps each microVM sandbox's env and labels (given by its create or
//     fork, labels replaced by PUT …/labels, lists filtered by label=) and
//     puts the env under the call's own in every exec and session body it
//     forwards (api.WithSandboxEnv), so that guestd sees one env within
//     exec's rules;
//   - refuses a bad request before it reaches a guest: query strings, bodies
//     where none is taken, bodies over 16 KiB, non-JSON content types, unknown
//     fields, wrong types, trailing data, malformed ids, bad names, and
//     paths that break the rules of the string alone (pathpolicy.CheckSyntax:
//     absolute, clean, not protected), the against query of changes, the
//     {path…} of the files route (relative, clean, inside: unescaped once
//     from echo's wildcard) and restore-paths' paths (api package), with
//     the codes guestd would use;
//   - checks the Idempotency-Key header of create and restore
//     (api.IdempotencyKey) and forwards it unchanged: guestd keeps the
//     answers, so a retry is answered by the guest that did the work;
//   - relays guestd's answer, which it does not trust (root inside a
//     sandbox can answer for guestd): a success's data as it was sent; a
//     fail's code, message and fields as they were sent when its code is
//     one of guestd's with guestd's status (api.GuestFailCodes: never 401,
//     403, 429 or sandbox_not_found) and it is within jsend.ParseFail's
//     bounds; a session list checked within bounds (api.EachSession) and
//     written with the sandbox's id added; a 5xx becomes a JSend error
//     with a fixed message; any other answer is 502 guest_error, the
//     guest's text logged only; an unreachable or silent guest becomes
//     503 within the dial and request timeouts, without holding up other
//     sandboxes. What a guest's answers make hostproxy hold is bounded
//     per guest (docs/design.md, "What a guest can make the host hold");
//   - limits requests per credential (429 rate_limited with Retry-After),
//     and failed authentications per client address and key prefix (a
//     correct key is never refused by that limit: authn.go), exports
//     Prometheus metrics on /metrics (account keys only), serves its OpenAPI document
//     at /v1/openapi.json (openapi.go), logs one structured line per
//     request, and shuts down gracefully, finishing requests in flight;
//   - with a vms configuration, serves the sandbox lifecycle
//     (/v1/sandboxes: create, list, get, delete, pause, resume, stop, start,
//     the access setting: account keys only; exec: the exec scope) and exec
//     sessions (the exec scope; an attachment is the
//     client's WebSocket joined to one to guestd, frame by frame, each
//     bounded, at most 16 per sandbox, 1024 per account, 4096 on the
//     host; sessions.go) and files (streamed through a 32 KiB buffer both
//     ways, at most 8 transfers per sandbox, 256 per account; a file is
//     always application/octet-stream and every answer nosniff, whatever
//     the guest says; files.go) through package
//     sandbox, keeps the microVMs' records in its registry, reaches their
//     guestd through each VM's channel (the vm:// guest address; execs on a
//     connection pool of their own), and serves the calls processes inside
//     a sandbox make through that channel, scoped to that sandbox whatever
//     key they carry, refused (401) while its access is none (at most 32
//     connections per sandbox, none of the account's routes, no /metrics;
//     a body over 16 KiB is read only within the sandbox's budget of
//     bodies, inbound.go). Every stream hostproxy holds to a guest, calls,
//     execs, transfers and attachments, is one of its two pools' places
//     (maxGuestCalls each);
//   - hands each guest its credentials (API address, sandbox id, token):
//     a microVM guest that cannot take a token when it is issued or
//     rotated is owed it, in memory only, until it boots or is found
//     running (credentials.go); a microVM guest gets its channel key too,
//     which acts on its sandbox with the scopes of the sandbox's access
//     setting, through its own channel only, and is its CREATEOS_API_KEY
//     while it has no token (channelkey.go); with access none it gets no
//     key at all.
//
// What it does not do: it never touches a checkpoint itself and keeps no
// checkpoint state; a configured sandbox's state comes from the
// configuration (or Registry.SetSandboxState), not from a lifecycle.
//
// Order of checks on a checkpoint route: the key's headers (400 for two
// different keys, 401 for one sent twice), a call from inside a sandbox
// whose access is none (401), credential (401, or 429 once the client
// address's failures with that key prefix are over the limit), rate limit
// (429), the authorization table (403: from inside a sandbox, another
// sandbox or a route never served there; a kind of credential the route
// does not take; a token of another sandbox; a scope lacking, named in
// data.scope), the sandbox (by its id or its name, resolved among the
// caller's account's before the table is checked; 404 sandbox_not_found
// for one that does not exist or is another account's), request shape (400, 413, 415, 422 for
// the path rules checked here), sandbox state (409 sandbox_not_running),
// checkpoint id shape (404 checkpoint_not_found), then the guest.
//
// Races: the sandbox state, the credential and its scopes (a channel
// key's: its sandbox's access setting) are read once per request; a token
// revoked or rotated, or an access setting changed, while a request is in
// flight does not stop that request, only the next one. A sandbox paused after the state check is
// discovered by the guest call failing (503).
package hostproxy
