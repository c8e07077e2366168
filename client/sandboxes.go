package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
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

// CreateSandbox asks for a new sandbox (or, with req.From, a fork); the
// record comes back in state creating (or running, taken from the host's
// pool or from the forks made ahead).
func (c *Client) CreateSandbox(ctx context.Context, req api.SandboxCreateRequest, opts ...CallOption) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &sb, opts)
	return sb, err
}

// Fork makes a new sandbox named name ("": none) from a VM snapshot
// (its id, name or ref) of sandbox (its id or name; "" when snapshot is
// a ref, which names it on the whole deployment): loam's c.Fork. The
// record comes back on its way to running (WaitSandbox). Env, labels and
// the access setting are a fork's own: CreateSandbox with From sets them.
func (c *Client) Fork(ctx context.Context, sandbox, snapshot, name string, opts ...CallOption) (Sandbox, error) {
	req := api.SandboxCreateRequest{From: &api.SandboxFrom{Sandbox: sandbox, Snapshot: snapshot}}
	if name != "" {
		req.Name = &name
	}
	return c.CreateSandbox(ctx, req, opts...)
}

// SetAccess replaces the sandbox's access setting (what the key its guest
// is handed may do; api.Access{None: true}: no key) and returns its
// record. It holds from the next call on.
func (c *Client) SetAccess(ctx context.Context, id string, access api.Access, opts ...CallOption) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPut, SandboxPath(id, "access"), nil, access, &sb, opts)
	return sb, err
}

// SetLabels replaces the sandbox's labels (none: every label goes) and
// returns its record.
func (c *Client) SetLabels(ctx context.Context, id string, labels map[string]string, opts ...CallOption) (Sandbox, error) {
	if labels == nil {
		labels = map[string]string{}
	}
	var sb Sandbox
	err := c.call(ctx, http.MethodPut, SandboxPath(id, "labels"), nil, labels, &sb, opts)
	return sb, err
}

// GetNetwork returns the sandbox's network setting, with its usage while
// its machine runs.
func (c *Client) GetNetwork(ctx context.Context, id string, opts ...CallOption) (Network, error) {
	var n Network
	err := c.call(ctx, http.MethodGet, SandboxPath(id, "network"), nil, nil, &n, opts)
	return n, err
}

// SetNetwork replaces the sandbox's network setting, for the connections
// and DNS questions after it, and returns it as GetNetwork does.
func (c *Client) SetNetwork(ctx context.Context, id string, setting NetworkSetting, opts ...CallOption) (Network, error) {
	var n Network
	err := c.call(ctx, http.MethodPut, SandboxPath(id, "network"), nil, setting, &n, opts)
	return n, err
}

// GetSandbox returns the sandbox's record (id: its id or its name).
func (c *Client) GetSandbox(ctx context.Context, id string, opts ...CallOption) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodGet, SandboxPath(id), nil, nil, &sb, opts)
	return sb, err
}

// WaitSandbox is GetSandbox with wait_s: a sandbox on its way to a state
// is answered once it has left it, or after wait (whole seconds, 1 to
// MaxWait).
func (c *Client) WaitSandbox(ctx context.Context, id string, wait time.Duration, opts ...CallOption) (Sandbox, error) {
	var sb Sandbox
	secs := min(max(int(wait/time.Second), 1), int(MaxWait/time.Second))
	err := c.call(ctx, http.MethodGet, SandboxPath(id)+"?wait_s="+strconv.Itoa(secs), nil, nil, &sb, opts)
	return sb, err
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

// ListOptions are a list's page and filter: Limit and Offset are sent
// when not nil (the API's defaults: 50, 0); Labels, when not empty, keep
// the sandboxes that have every one of them.
type ListOptions struct {
	Limit, Offset *int
	Labels        map[string]string
}

// ListSandboxes returns one page of the account's sandboxes, oldest
// first, their records without env.
func (c *Client) ListSandboxes(ctx context.Context, o ListOptions, opts ...CallOption) (api.SandboxList, error) {
	q := url.Values{}
	if o.Limit != nil {
		q.Set("limit", strconv.Itoa(*o.Limit))
	}
	if o.Offset != nil {
		q.Set("offset", strconv.Itoa(*o.Offset))
	}
	keys := make([]string, 0, len(o.Labels))
	for k := range o.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+o.Labels[k])
	}
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var list api.SandboxList
	err := c.call(ctx, http.MethodGet, path, nil, nil, &list, opts)
	return list, err
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
func (c *Client) SandboxOp(ctx context.Context, op, id string, opts ...CallOption) (SandboxState, error) {
	o, ok := sandboxOps[op]
	if !ok {
		return SandboxState{}, fmt.Errorf("unknown sandbox operation %q", op)
	}
	path := SandboxPath(id)
	if o.suffix != "" {
		path = SandboxPath(id, o.suffix)
	}
	var st SandboxState
	err := c.call(ctx, o.method, path, nil, nil, &st, opts)
	return st, err
}

// Exec runs a command in the sandbox and returns its result (a non-zero
// exit is a result, not an error).
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest, opts ...CallOption) (ExecResult, error) {
	var res ExecResult
	err := c.call(ctx, http.MethodPost, SandboxPath(id, "exec"), nil, req, &res, opts)
	return res, err
}
