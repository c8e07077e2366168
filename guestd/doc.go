// Package guestd is the daemon inside a sandbox: it serves the local
// checkpoint API (create, list, restore, delete) and exec over any
// net.Listener (the microVM's channel, a root-only unix socket, loopback
// TCP in tests) and
// drives the layer store that does the work.
//
// A guestd serves one sandbox, so its routes carry no sandbox id:
// POST/GET /v1/checkpoints, POST /v1/checkpoints/{id}/restore and
// DELETE /v1/checkpoints/{id}, with the bodies, envelopes and error codes
// of the public API; beside them GET /v1/directories (extension: each
// managed directory and the checkpoint its live content continues from),
// the routes of issue 8 (GET /v1/checkpoints/{id}/changes[?against=],
// GET /v1/checkpoints/{id}/files/{path...}, POST
// /v1/checkpoints/{id}/restore-paths and /clone, POST
// /v1/directories/release: each goes to the store that holds the
// checkpoint, or the managed directory, it names),
// PUT /v1/credentials (the host hands over the API address, sandbox id and
// access token, written root-readable for processes in the sandbox; after
// a boot it may send only the token's hash, and the token guestd has is
// kept if it matches),
// POST /v1/exec (a program run without a shell in its own process group
// and, inside a microVM, its own cgroup with limits that leave guestd its
// share of the guest, see cgroup.go; output capped; killed whole at its
// timeout), /v1/sessions (exec sessions: programs that run on their own,
// with pipes or a terminal, their output in a buffer of at least 1 MiB
// that WebSocket attachments read from their own offsets; session.go),
// /v1/files/{path…} (a file's bytes in and out, streamed, a directory's
// listing or tar, a tar unpacked through an os.Root of its directory, a
// removal; files.go), GET /v1/check (the open
// stores' consistency report, for tests and support), GET /v1/health and
// GET /metrics (Prometheus). Inside a strata microVM (Config.PowerOff set,
// guestd --vm) POST /v1/shutdown is the host's clean stop; POST /v1/resync
// is the host's call after it restores the VM from a memory snapshot or
// forks it ({"time_unix_nano", "seed" (base64, 32 to 512 bytes),
// "hostname"?}: the wall clock is stepped to the host's, the seed mixed
// into the kernel's RNG and its CRNG made to reseed, the hostname set;
// the answer is {"clock_step_ns", "reseeded", "hostname"}); and ForwardAPI
// carries the guest's calls to the public API through the channel. Until
// the host's resync, a restored or forked guest runs on the snapshot's
// clock and shares its siblings' randomness: the host must resync it
// before anything else is asked of it.
// Requests are validated here as well as at the host's edge: the guest
// trusts nothing it is sent.
//
// Before New returns, the store has swept half-done work and remounted
// every managed root, so a guestd that serves has its directories back.
// Operations on one directory are serialized by the store (a second one at
// the same time gets 409 operation_in_progress at once); operations on
// different directories run in parallel.
package guestd
