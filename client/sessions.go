package client

import (
	"context"
	"encoding/json"
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
func (c *Client) StartSession(ctx context.Context, sandbox string, req api.SessionRequest) (Session, json.RawMessage, error) {
	var se Session
	raw, err := c.Call(ctx, http.MethodPost, SandboxPath(sandbox, "sessions"), req, &se)
	return se, raw, err
}

// ListSessions lists a sandbox's sessions, oldest first.
func (c *Client) ListSessions(ctx context.Context, sandbox string) ([]Session, json.RawMessage, error) {
	var v struct {
		Sessions []Session `json:"sessions"`
	}
	raw, err := c.Call(ctx, http.MethodGet, SandboxPath(sandbox, "sessions"), nil, &v)
	return v.Sessions, raw, err
}

// GetSession returns one session's record.
func (c *Client) GetSession(ctx context.Context, sandbox, id string) (Session, json.RawMessage, error) {
	var se Session
	raw, err := c.Call(ctx, http.MethodGet, SandboxPath(sandbox, "sessions", id), nil, &se)
	return se, raw, err
}

// KillSession ends a session (SIGTERM, then SIGKILL 5 s later).
func (c *Client) KillSession(ctx context.Context, sandbox, id string) (Session, json.RawMessage, error) {
	var se Session
	raw, err := c.Call(ctx, http.MethodDelete, SandboxPath(sandbox, "sessions", id), nil, &se)
	return se, raw, err
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
