package client

import (
	"context"
	"encoding/json"
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
func (c *Client) Changes(ctx context.Context, sandbox, id, against string) ([]Change, json.RawMessage, error) {
	p := SandboxPath(sandbox, "checkpoints", id, "changes")
	if against != "" {
		p += "?" + url.Values{"against": {against}}.Encode()
	}
	var out []Change
	raw, err := c.Call(ctx, http.MethodGet, p, nil, &out)
	return out, raw, err
}

// ReadEntry reads the entry at rel (relative to the directory's root, ""
// for the root) as it is in checkpoint id.
func (c *Client) ReadEntry(ctx context.Context, sandbox, id, rel string) (Entry, json.RawMessage, error) {
	p := SandboxPath(sandbox, "checkpoints", id, "files")
	if rel != "" {
		segs := strings.Split(rel, "/")
		for i, s := range segs {
			segs[i] = url.PathEscape(s)
		}
		p += "/" + strings.Join(segs, "/")
	}
	var e Entry
	raw, err := c.Call(ctx, http.MethodGet, p, nil, &e)
	return e, raw, err
}

// RestorePaths makes the named paths of the live directory what they are
// in checkpoint id.
func (c *Client) RestorePaths(ctx context.Context, sandbox, id string, paths []string) (api.RestorePathsResult, json.RawMessage, error) {
	var r api.RestorePathsResult
	raw, err := c.Call(ctx, http.MethodPost, SandboxPath(sandbox, "checkpoints", id, "restore-paths"), api.RestorePathsRequest{Paths: paths}, &r)
	return r, raw, err
}

// Clone makes dir a new managed directory from checkpoint id.
func (c *Client) Clone(ctx context.Context, sandbox, id, dir string) (api.CloneResult, json.RawMessage, error) {
	var r api.CloneResult
	raw, err := c.Call(ctx, http.MethodPost, SandboxPath(sandbox, "checkpoints", id, "clone"), api.PathRequest{Path: &dir}, &r)
	return r, raw, err
}

// Release turns the managed directory dir back into a plain one.
func (c *Client) Release(ctx context.Context, sandbox, dir string) (api.ReleaseResult, json.RawMessage, error) {
	var r api.ReleaseResult
	raw, err := c.Call(ctx, http.MethodPost, SandboxPath(sandbox, "directories", "release"), api.PathRequest{Path: &dir}, &r)
	return r, raw, err
}
