package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"strata/internal/api"
)

// Session is an exec session's record.
type Session = api.Session

// StartSession starts a command as a session.
func (c *Client) StartSession(ctx context.Context, sandbox string, req api.SessionRequest, opts ...CallOption) (Session, error) {
	var se Session
	err := c.call(ctx, http.MethodPost, SandboxPath(sandbox, "sessions"), nil, req, &se, opts)
	return se, err
}

// ListSessions lists a sandbox's sessions, oldest first.
func (c *Client) ListSessions(ctx context.Context, sandbox string, opts ...CallOption) ([]Session, error) {
	var v struct {
		Sessions []Session `json:"sessions"`
	}
	err := c.call(ctx, http.MethodGet, SandboxPath(sandbox, "sessions"), nil, nil, &v, opts)
	return v.Sessions, err
}

// GetSession returns one session's record.
func (c *Client) GetSession(ctx context.Context, sandbox, id string, opts ...CallOption) (Session, error) {
	var se Session
	err := c.call(ctx, http.MethodGet, SandboxPath(sandbox, "sessions", id), nil, nil, &se, opts)
	return se, err
}

// KillSession ends a session (SIGTERM, then SIGKILL 5 s later).
func (c *Client) KillSession(ctx context.Context, sandbox, id string, opts ...CallOption) (Session, error) {
	var se Session
	err := c.call(ctx, http.MethodDelete, SandboxPath(sandbox, "sessions", id), nil, nil, &se, opts)
	return se, err
}

// Attachment is an open attachment of a session (a WebSocket: read its
// output frames, write stdin and control) and the guest's generation its
// handshake named ("" from a guest daemon that predates generations).
type Attachment struct {
	*websocket.Conn
	Generation string
}

// Attach opens an attachment of a session from output offset since (-1:
// the oldest the session still holds). A non-empty generation is the one
// the caller knew (a record's, or an earlier Attachment's): when it is no
// longer the guest's (the sandbox was restored or forked since,
// and the session is another run's), the attachment is refused with an
// *Error of code api.CodeSessionRestored, rather than joining that run's
// output to what the caller had. A refusal is an *Error.
func (c *Client) Attach(ctx context.Context, sandbox, id string, since int64, generation string) (*Attachment, error) {
	path := SandboxPath(sandbox, "sessions", id, "attach")
	q := url.Values{}
	if since >= 0 {
		q.Set("since", strconv.FormatInt(since, 10))
	}
	if generation != "" {
		q.Set("generation", generation)
	}
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	base := strings.TrimRight(c.BaseURL, "/")
	u := "ws" + strings.TrimPrefix(base, "http") + path
	h := http.Header{}
	c.setKey(h)
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: &http.Client{Transport: c.transport()}, HTTPHeader: h, Subprotocols: []string{"strata.v1"}})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			raw, _ := io.ReadAll(resp.Body)
			if _, perr := parseAnswer(http.MethodGet, path, resp, raw, nil); perr != nil {
				return nil, perr
			}
		}
		return nil, err
	}
	conn.SetReadLimit(api.MaxSessionFrame)
	gen := resp.Header.Get(api.HeaderSessionGeneration)
	if !api.ValidGeneration(gen) {
		gen = ""
	}
	return &Attachment{Conn: conn, Generation: gen}, nil
}
