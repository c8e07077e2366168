package client

import (
	"context"
	"net/http"

	"strata/internal/api"
)

// Snapshot is a VM snapshot record of the API. Memory tells a snapshot of
// memory, devices and disk (processes come back running) from a
// disk-only one (a fresh boot); Auto marks the ones a restore keeps of the
// state it replaced.
type Snapshot = api.Snapshot

// Snapshot statuses.
const (
	SnapshotProcessing = "processing"
	SnapshotReady      = "ready"
	SnapshotFailed     = "failed"
)

// RetentionDeleteOldest is the one retention mode: at the limit, the
// oldest snapshot of the same kind that is not pinned goes.
const RetentionDeleteOldest = "delete_oldest"

// SnapshotCreateRequest is the body of POST /v1/sandboxes/{id}/snapshots;
// nil fields are left out (the API's defaults: no comment, memory kept,
// no retention).
type SnapshotCreateRequest = api.SnapshotCreateRequest

// Retention lets a create delete old snapshots instead of failing with
// snapshot_limit.
type Retention = api.Retention

// SnapshotRestored is the answer of a snapshot restore: the snapshot, the
// automatic snapshot that keeps the state it replaced, and the sandbox's
// state after.
type SnapshotRestored = api.SnapshotRestore

// ForkRequest is the body of POST …/snapshots/{snapshot}/fork.
type ForkRequest = api.ForkRequest

// Forks is the answer of a fork of several sandboxes: each is made or
// refused on its own. Sandboxes are the records of the ones made; Failed,
// the ones refused, when some were made (API.md does not say how a
// refused fork shows; hostproxy answers this; a fork that fails later
// goes to state error).
type Forks struct {
	Sandboxes []Sandbox     `json:"sandboxes"`
	Failed    []ForkRefusal `json:"failed,omitempty"`
}

// ForkRefusal is a fork of a batch that was not made, and why.
type ForkRefusal struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// CreateSnapshot snapshots the sandbox.
func (c *Client) CreateSnapshot(ctx context.Context, sandbox string, req SnapshotCreateRequest, opts ...CallOption) (Snapshot, error) {
	var s Snapshot
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "snapshots"), nil, req, &s, opts)
	return s, err
}

// ListSnapshots returns every snapshot of the sandbox, oldest first.
func (c *Client) ListSnapshots(ctx context.Context, sandbox string, opts ...CallOption) ([]Snapshot, error) {
	var list []Snapshot
	err := c.call(ctx, http.MethodGet, SandboxPath(sandbox, "snapshots"), nil, nil, &list, opts)
	return list, err
}

// GetSnapshot returns one snapshot's record.
func (c *Client) GetSnapshot(ctx context.Context, sandbox, id string, opts ...CallOption) (Snapshot, error) {
	var s Snapshot
	err := c.call(ctx, http.MethodGet, SandboxPath(sandbox, "snapshots", id), nil, nil, &s, opts)
	return s, err
}

// DeleteSnapshot deletes a snapshot; forks made from it are unaffected.
func (c *Client) DeleteSnapshot(ctx context.Context, sandbox, id string, opts ...CallOption) error {
	return c.call(ctx, http.MethodDelete, SandboxPath(sandbox, "snapshots", id), nil, nil, nil, opts)
}

// RestoreSnapshot puts the sandbox back to the snapshot; with diskOnly,
// only its disk, as a fresh boot. The body is sent only then.
func (c *Client) RestoreSnapshot(ctx context.Context, sandbox, id string, diskOnly bool, opts ...CallOption) (SnapshotRestored, error) {
	var body any
	if diskOnly {
		body = api.SnapshotRestoreRequest{DiskOnly: true}
	}
	var r SnapshotRestored
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "snapshots", id, "restore"), nil, body, &r, opts)
	return r, err
}

// PinSnapshot pins a snapshot (retention never deletes it), or unpins it.
func (c *Client) PinSnapshot(ctx context.Context, sandbox, id string, pin bool, opts ...CallOption) (Snapshot, error) {
	op := "unpin"
	if pin {
		op = "pin"
	}
	var s Snapshot
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "snapshots", id, op), nil, nil, &s, opts)
	return s, err
}

// ForkSnapshot makes req.Count sandboxes from a snapshot in one call; the
// records come back on their way to running. A non-empty idempotencyKey
// is sent as the Idempotency-Key header: a retry with the same key and
// request gets the forks the first call made instead of new ones.
func (c *Client) ForkSnapshot(ctx context.Context, sandbox, id string, req ForkRequest, idempotencyKey string, opts ...CallOption) (Forks, error) {
	var f Forks
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "snapshots", id, "fork"), idempotency(idempotencyKey), req, &f, opts)
	return f, err
}
