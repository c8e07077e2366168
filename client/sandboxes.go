package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"strata/internal/api"
)

// Sandbox is a sandbox record of the API.
type Sandbox = api.Sandbox

// SandboxState is the answer of rm, pause, resume, stop and start.
type SandboxState struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// ExecResult is the answer of exec.
type ExecResult = api.ExecResult

// Waiting for a sandbox that is on its way to a state: each ask is
// GET …?wait_s (the server waits, at most MaxWait here; it takes 30), and
// asks come no more often than every MinPoll. X-Poll-After is not read:
// the server's wait replaces it.
const (
	MinPoll = 200 * time.Millisecond
	MaxWait = 20 * time.Second
)

// CreateSandbox asks for a new sandbox; the record comes back in state
// creating (or running, taken from the host's pool).
func (c *Client) CreateSandbox(ctx context.Context, req api.SandboxCreateRequest) (Sandbox, json.RawMessage, error) {
	var sb Sandbox
	raw, err := c.Call(ctx, http.MethodPost, "/v1/sandboxes", req, &sb)
	return sb, raw, err
}

// SetAccess replaces the sandbox's access setting (what the key its guest
// is handed may do; api.Access{None: true}: no key) and returns its
// record. It holds from the next call on.
func (c *Client) SetAccess(ctx context.Context, id string, access api.Access) (Sandbox, json.RawMessage, error) {
	var sb Sandbox
	raw, err := c.Call(ctx, http.MethodPut, SandboxPath(id, "access"), access, &sb)
	return sb, raw, err
}

// GetSandbox returns the sandbox's record.
func (c *Client) GetSandbox(ctx context.Context, id string) (Sandbox, json.RawMessage, error) {
	var sb Sandbox
	raw, err := c.Call(ctx, http.MethodGet, SandboxPath(id), nil, &sb)
	return sb, raw, err
}

// WaitSandbox is GetSandbox with wait_s: a sandbox on its way to a state
// is answered once it has left it, or after wait (whole seconds, 1 to
// MaxWait).
func (c *Client) WaitSandbox(ctx context.Context, id string, wait time.Duration) (Sandbox, json.RawMessage, error) {
	var sb Sandbox
	secs := min(max(int(wait/time.Second), 1), int(MaxWait/time.Second))
	raw, err := c.Call(ctx, http.MethodGet, SandboxPath(id)+"?wait_s="+strconv.Itoa(secs), nil, &sb)
	return sb, raw, err
}

// LongPoll is the wait of the next WaitSandbox: MaxWait, less when the
// HTTP client's timeout or ctx's deadline comes sooner.
func (c *Client) LongPoll(ctx context.Context) time.Duration {
	d := MaxWait
	if c.HTTP != nil && c.HTTP.Timeout > 0 {
		d = min(d, c.HTTP.Timeout/2)
	}
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	return d
}

// ListSandboxes returns one page of the account's sandboxes; limit and
// offset are sent when not nil.
func (c *Client) ListSandboxes(ctx context.Context, limit, offset *int) (api.SandboxList, json.RawMessage, error) {
	q := url.Values{}
	if limit != nil {
		q.Set("limit", strconv.Itoa(*limit))
	}
	if offset != nil {
		q.Set("offset", strconv.Itoa(*offset))
	}
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var list api.SandboxList
	raw, err := c.Call(ctx, http.MethodGet, path, nil, &list)
	return list, raw, err
}

// sandboxOps are the operations on one sandbox that answer its state:
// method and path suffix.
var sandboxOps = map[string]struct{ method, suffix string }{
	"rm":     {http.MethodDelete, ""},
	"pause":  {http.MethodPost, "pause"},
	"resume": {http.MethodPost, "resume"},
	"stop":   {http.MethodPost, "stop"},
	"start":  {http.MethodPost, "start"},
}

// SandboxOp runs rm, pause, resume, stop or start on a sandbox and returns
// the state it answers with.
func (c *Client) SandboxOp(ctx context.Context, op, id string) (SandboxState, json.RawMessage, error) {
	o, ok := sandboxOps[op]
	if !ok {
		return SandboxState{}, nil, fmt.Errorf("unknown sandbox operation %q", op)
	}
	path := SandboxPath(id)
	if o.suffix != "" {
		path = SandboxPath(id, o.suffix)
	}
	var st SandboxState
	raw, err := c.Call(ctx, o.method, path, nil, &st)
	return st, raw, err
}

// Exec runs a command in the sandbox and returns its result.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest) (ExecResult, json.RawMessage, error) {
	var res ExecResult
	raw, err := c.Call(ctx, http.MethodPost, SandboxPath(id, "exec"), req, &res)
	return res, raw, err
}
