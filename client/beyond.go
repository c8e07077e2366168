package client

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"strata/internal/api"
)

// Change is one entry of a checkpoint's changes.
type Change = api.Change

// Entry is one entry as it is in a checkpoint (the files route).
type Entry = api.Entry

// Changes asks what checkpoint id changed against its parent (against
// ""), the live directory ("live") or another checkpoint.
func (c *Client) Changes(ctx context.Context, sandbox, id, against string, opts ...CallOption) ([]Change, error) {
	p := SandboxPath(sandbox, "checkpoints", id, "changes")
	if against != "" {
		p += "?" + url.Values{"against": {against}}.Encode()
	}
	var out []Change
	err := c.call(ctx, http.MethodGet, p, nil, nil, &out, opts)
	return out, err
}

// ReadEntry reads the entry at rel (relative to the directory's root, ""
// for the root) as it is in checkpoint id.
func (c *Client) ReadEntry(ctx context.Context, sandbox, id, rel string, opts ...CallOption) (Entry, error) {
	p := SandboxPath(sandbox, "checkpoints", id, "files")
	if rel != "" {
		segs := strings.Split(rel, "/")
		for i, s := range segs {
			segs[i] = url.PathEscape(s)
		}
		p += "/" + strings.Join(segs, "/")
	}
	var e Entry
	err := c.call(ctx, http.MethodGet, p, nil, nil, &e, opts)
	return e, err
}

// RestorePaths makes the named paths of the live directory what they are
// in checkpoint id.
func (c *Client) RestorePaths(ctx context.Context, sandbox, id string, paths []string, opts ...CallOption) (api.RestorePathsResult, error) {
	var r api.RestorePathsResult
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "checkpoints", id, "restore-paths"), nil, api.RestorePathsRequest{Paths: paths}, &r, opts)
	return r, err
}

// Clone makes dir a new managed directory from checkpoint id.
func (c *Client) Clone(ctx context.Context, sandbox, id, dir string, opts ...CallOption) (api.CloneResult, error) {
	var r api.CloneResult
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "checkpoints", id, "clone"), nil, api.PathRequest{Path: &dir}, &r, opts)
	return r, err
}

// Release turns the managed directory dir back into a plain one.
func (c *Client) Release(ctx context.Context, sandbox, dir string, opts ...CallOption) (api.ReleaseResult, error) {
	var r api.ReleaseResult
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "directories", "release"), nil, api.PathRequest{Path: &dir}, &r, opts)
	return r, err
}
