package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"strata/internal/api"
)

// Client calls the public API with one key. HTTP is the client of the
// calls that answer at once (nil: http.DefaultClient); files and
// attachments use their own, without a timeout.
type Client struct {
	BaseURL string
	Key     string
	HTTP    *http.Client
	// Bearer sends the key as Authorization: Bearer instead of X-Api-Key
	// (the API takes either), for a proxy that passes only the former.
	Bearer bool
}

// setKey puts the client's key on a request's headers.
func (c *Client) setKey(h http.Header) {
	if c.Bearer {
		h.Set("Authorization", "Bearer "+c.Key)
		return
	}
	h.Set("X-Api-Key", c.Key)
}

// Checkpoint is a checkpoint record of the API.
type Checkpoint = api.Checkpoint

// Restored is the answer of a restore.
type Restored = api.RestoreResult

// Token is a sandbox access token as issued or shown, with its scopes.
type Token struct {
	Token     string      `json:"token,omitempty"`
	Enabled   *bool       `json:"enabled,omitempty"`
	Hint      string      `json:"hint,omitempty"`
	CreatedAt string      `json:"created_at,omitempty"`
	Scopes    []api.Scope `json:"scopes,omitempty"`
}

// Error is a JSend fail or error answer.
type Error struct {
	Status    int
	Code      string // the stable code; empty for an unclassified 5xx
	Message   string
	Fields    map[string]json.RawMessage
	RequestID string
	// Body is the answer as sent, for -o json.
	Body []byte
}

func (e *Error) Error() string {
	switch {
	case e.Status >= 500 && e.Code != "":
		return fmt.Sprintf("server error %d: %s: %s", e.Status, e.Code, e.Message)
	case e.Status >= 500:
		return fmt.Sprintf("server error %d: %s", e.Status, e.Message)
	}
	return e.Code + ": " + e.Message
}

// CallOption changes one call of the client's methods.
type CallOption func(*callConfig)

type callConfig struct {
	raw *json.RawMessage
}

// Raw keeps the data of a call's answer, as the server sent it, in *dst:
// for a caller that prints the answer whole (createos -o json) or reads
// a field this package's types do not have. A call that fails leaves
// *dst alone: its *Error has the answer in Body.
func Raw(dst *json.RawMessage) CallOption {
	return func(c *callConfig) { c.raw = dst }
}

// call is Do for the methods: out decoded, the raw data where opts ask.
func (c *Client) call(ctx context.Context, method, path string, header http.Header, body, out any, opts []CallOption) error {
	raw, err := c.Do(ctx, method, path, header, body, out)
	if err != nil {
		return err
	}
	var cfg callConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.raw != nil {
		*cfg.raw = raw
	}
	return nil
}

// Call sends one request; on success it decodes data into out (when not
// nil) and returns the raw data too: the level below the methods, for a
// route they do not cover.
func (c *Client) Call(ctx context.Context, method, path string, body any, out any) (json.RawMessage, error) {
	return c.Do(ctx, method, path, nil, body, out)
}

// Do is Call with extra request headers. A success is 200, or 202
// for an operation that goes on after the answer (the sandbox lifecycle).
func (c *Client) Do(ctx context.Context, method, path string, header http.Header, body any, out any) (json.RawMessage, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	base := strings.TrimRight(c.BaseURL, "/")
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	c.setKey(req.Header)
	req.Header.Set("Accept", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	return parseAnswer(method, path, resp, raw, out)
}

// parseAnswer turns a JSend answer into data (decoded into out when not
// nil) or an *Error. A success is 200, 201 for a session started, or
// 202 for an operation that goes on after the answer.
func parseAnswer(method, path string, resp *http.Response, raw []byte, out any) (json.RawMessage, error) {
	var env struct {
		Status  string          `json:"status"`
		Data    json.RawMessage `json:"data"`
		Message string          `json:"message"`
		Code    json.RawMessage `json:"code"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, fmt.Errorf("%s %s: HTTP %d with a body that is not JSON: %.200q", method, path, resp.StatusCode, raw)
	}
	switch env.Status {
	case "success":
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusAccepted {
			break
		}
		if out != nil {
			if err := json.Unmarshal(env.Data, out); err != nil {
				return nil, fmt.Errorf("%s %s: unexpected data: %w", method, path, err)
			}
		}
		return env.Data, nil
	case "fail":
		e := &Error{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id"), Body: raw}
		var data map[string]json.RawMessage
		_ = json.Unmarshal(env.Data, &data)
		_ = json.Unmarshal(data["code"], &e.Code)
		_ = json.Unmarshal(data["message"], &e.Message)
		delete(data, "code")
		delete(data, "message")
		e.Fields = data
		if e.Code == "" {
			e.Code = "unknown"
		}
		return nil, e
	case "error":
		e := &Error{Status: resp.StatusCode, Message: env.Message, RequestID: resp.Header.Get("X-Request-Id"), Body: raw}
		var data struct{ Code string }
		if json.Unmarshal(env.Data, &data) == nil {
			e.Code = data.Code // a classified server error names its code
		}
		return nil, e
	}
	return nil, fmt.Errorf("%s %s: HTTP %d with JSend status %q", method, path, resp.StatusCode, env.Status)
}

// SandboxPath is the API path of a sandbox, and of rest below it (each
// part escaped).
func SandboxPath(sandbox string, rest ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(sandbox)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

// idempotency is the Idempotency-Key header of the calls that take one
// (checkpoint create and restore, the many-forks fork), or none for an
// empty key.
func idempotency(key string) http.Header {
	if key == "" {
		return nil
	}
	return http.Header{api.HeaderIdempotencyKey: {key}}
}

// CreateCheckpoint captures dir; name and retention are sent only when set. A non-empty
// idempotencyKey is sent as the Idempotency-Key header: a retry with the
// same key gets the first answer instead of a second checkpoint.
func (c *Client) CreateCheckpoint(ctx context.Context, sandbox, dir string, name *string, retention *api.Retention, idempotencyKey string, opts ...CallOption) (Checkpoint, error) {
	body := struct {
		Path      string         `json:"path"`
		Name      *string        `json:"name,omitempty"`
		Retention *api.Retention `json:"retention,omitempty"`
	}{dir, name, retention}
	var cp Checkpoint
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "checkpoints"), idempotency(idempotencyKey), body, &cp, opts)
	return cp, err
}

// ListCheckpoints returns every checkpoint of the sandbox, oldest first.
func (c *Client) ListCheckpoints(ctx context.Context, sandbox string, opts ...CallOption) ([]Checkpoint, error) {
	var list []Checkpoint
	err := c.call(ctx, http.MethodGet, SandboxPath(sandbox, "checkpoints"), nil, nil, &list, opts)
	return list, err
}

// ListDirectories returns each managed directory and the checkpoint its
// live content continues from (an extension; older servers answer 404).
func (c *Client) ListDirectories(ctx context.Context, sandbox string, opts ...CallOption) ([]api.Directory, error) {
	var list []api.Directory
	err := c.call(ctx, http.MethodGet, SandboxPath(sandbox, "directories"), nil, nil, &list, opts)
	return list, err
}

// RestoreCheckpoint restores a checkpoint at its path; a non-empty
// idempotencyKey is sent as the Idempotency-Key header.
func (c *Client) RestoreCheckpoint(ctx context.Context, sandbox, id, idempotencyKey string, opts ...CallOption) (Restored, error) {
	var r Restored
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "checkpoints", id, "restore"), idempotency(idempotencyKey), nil, &r, opts)
	return r, err
}

// DeleteCheckpoint removes a checkpoint record.
func (c *Client) DeleteCheckpoint(ctx context.Context, sandbox, id string, opts ...CallOption) error {
	return c.call(ctx, http.MethodDelete, SandboxPath(sandbox, "checkpoints", id), nil, nil, nil, opts)
}

// tokenOps are the access-token operations: method and path suffix.
var tokenOps = map[string]struct{ method, suffix string }{
	"issue":  {http.MethodPost, ""},
	"show":   {http.MethodGet, ""},
	"rotate": {http.MethodPost, "rotate"},
	"revoke": {http.MethodDelete, ""},
}

// IssueToken issues the sandbox's access token with scopes (none: the
// API's default, checkpoints and snapshots).
func (c *Client) IssueToken(ctx context.Context, sandbox string, scopes []api.Scope, opts ...CallOption) (Token, error) {
	var body any
	if len(scopes) > 0 {
		body = map[string][]api.Scope{"scopes": scopes}
	}
	var t Token
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "access-token"), nil, body, &t, opts)
	return t, err
}

// TokenCall runs one access-token operation: issue (with the default
// scopes; IssueToken names others), show, rotate, revoke.
func (c *Client) TokenCall(ctx context.Context, op, sandbox string, opts ...CallOption) (Token, error) {
	o, ok := tokenOps[op]
	if !ok {
		return Token{}, fmt.Errorf("unknown token operation %q", op)
	}
	path := SandboxPath(sandbox, "access-token")
	if o.suffix != "" {
		path += "/" + o.suffix
	}
	var t Token
	err := c.call(ctx, o.method, path, nil, nil, &t, opts)
	return t, err
}

// transport is HTTP's transport (http.DefaultTransport when none), for
// the calls that take their own time: files and attachments.
func (c *Client) transport() http.RoundTripper {
	if c.HTTP != nil && c.HTTP.Transport != nil {
		return c.HTTP.Transport
	}
	return http.DefaultTransport
}

// NewHTTPClient is an HTTP client whose calls end after timeout.
func NewHTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout}
}
