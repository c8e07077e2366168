package hostproxy

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"

	"strata/internal/api"
	"strata/internal/jsend"
	"strata/pathpolicy"
)

// The checkpoint routes beyond the seed's four (issue 8). Who may call
// which is the authorization table's (authz.go): changes, files and the
// directories' list read the sandbox's own checkpoints and take a token
// with the checkpoints scope (issue 19: createos checkpoint diff from
// inside); restore-paths, clone and release need an account key. Each
// makes the checks of the four (checkpointRoute: query, body, state),
// validates at the edge what needs no filesystem, and forwards.

func (s *Server) checkpointChanges(c echo.Context) (any, error) {
	var against string
	sb, err := s.checkpointRouteQuery(c, func(r *http.Request) (err error) {
		against, err = api.ParseChangesQuery(r.URL.Query())
		return err
	}, jsend.RejectBody)
	if err != nil {
		return nil, err
	}
	id, err := checkpointID(c)
	if err != nil {
		return nil, err
	}
	return s.guestCall(c, "changes", func() (*GuestData, error) {
		return s.guests.Changes(c.Request().Context(), sb.Guest, id, against)
	})
}

func (s *Server) checkpointFile(c echo.Context) (any, error) {
	sb, err := s.checkpointRoute(c, jsend.RejectBody)
	if err != nil {
		return nil, err
	}
	id, err := checkpointID(c)
	if err != nil {
		return nil, err
	}
	rel, err := entryPath(c)
	if err != nil {
		return nil, err
	}
	return s.guestCall(c, "files", func() (*GuestData, error) {
		return s.guests.ReadEntry(c.Request().Context(), sb.Guest, id, rel)
	})
}

// entryPath is the {path…} of the files route, unescaped once: echo
// gives the wildcard as the request's escaped path has it when that
// differs from the default escaping (a "%2F", a "%3F").
func entryPath(c echo.Context) (string, error) {
	raw := c.Param("*")
	if c.Request().URL.RawPath != "" {
		p, err := url.PathUnescape(raw)
		if err != nil {
			return "", jsend.InvalidField("path", "path must be a valid escaped URL path")
		}
		raw = p
	}
	return api.ParseEntryPath(raw)
}

func (s *Server) restorePaths(c echo.Context) (any, error) {
	var req api.RestorePathsRequest
	sb, err := s.checkpointRoute(c, func(r *http.Request) error {
		if err := jsend.DecodeObject(r, &req); err != nil {
			return err
		}
		return req.Validate()
	})
	if err != nil {
		return nil, err
	}
	id, err := checkpointID(c)
	if err != nil {
		return nil, err
	}
	return s.guestCall(c, "restore_paths", func() (*GuestData, error) {
		return s.guests.RestorePaths(c.Request().Context(), sb.Guest, id, req)
	})
}

// decodePath reads the body of clone and release: {"path"}, with the
// path rules that need no filesystem (as decodeCreate).
func decodePath(r *http.Request) (string, error) {
	var body api.PathRequest
	if err := jsend.DecodeObject(r, &body); err != nil {
		return "", err
	}
	p, err := body.Validate()
	if err != nil {
		return "", err
	}
	if err := pathpolicy.CheckSyntax(p, nil); err != nil {
		return "", err
	}
	return p, nil
}

func (s *Server) cloneCheckpoint(c echo.Context) (any, error) {
	var path string
	sb, err := s.checkpointRoute(c, func(r *http.Request) (err error) {
		path, err = decodePath(r)
		return err
	})
	if err != nil {
		return nil, err
	}
	id, err := checkpointID(c)
	if err != nil {
		return nil, err
	}
	return s.guestCall(c, "clone", func() (*GuestData, error) {
		return s.guests.Clone(c.Request().Context(), sb.Guest, id, path)
	})
}

func (s *Server) releaseDirectory(c echo.Context) (any, error) {
	var path string
	sb, err := s.checkpointRoute(c, func(r *http.Request) (err error) {
		path, err = decodePath(r)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.guestCall(c, "release", func() (*GuestData, error) {
		return s.guests.Release(c.Request().Context(), sb.Guest, path)
	})
}

// Changes asks what checkpoint id changed: against its parent (""), the
// live directory (api.AgainstLive) or another checkpoint.
func (g *GuestClient) Changes(ctx context.Context, guest, id, against string) (*GuestData, error) {
	p := "/v1/checkpoints/" + url.PathEscape(id) + "/changes"
	if against != "" {
		p += "?" + url.Values{"against": {against}}.Encode()
	}
	return g.call(ctx, guest, http.MethodGet, p, nil, "")
}

// ReadEntry reads the entry at rel (relative, already checked; "" is the
// root) as it is in checkpoint id.
func (g *GuestClient) ReadEntry(ctx context.Context, guest, id, rel string) (*GuestData, error) {
	segs := strings.Split(rel, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return g.call(ctx, guest, http.MethodGet, "/v1/checkpoints/"+url.PathEscape(id)+"/files/"+strings.Join(segs, "/"), nil, "")
}

// RestorePaths restores the named paths of checkpoint id's directory.
func (g *GuestClient) RestorePaths(ctx context.Context, guest, id string, req api.RestorePathsRequest) (*GuestData, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	return g.call(ctx, guest, http.MethodPost, "/v1/checkpoints/"+url.PathEscape(id)+"/restore-paths", body, "")
}

// Clone makes path a new managed directory from checkpoint id.
func (g *GuestClient) Clone(ctx context.Context, guest, id, path string) (*GuestData, error) {
	body, err := json.Marshal(api.PathRequest{Path: &path})
	if err != nil {
		return nil, err
	}
	return g.call(ctx, guest, http.MethodPost, "/v1/checkpoints/"+url.PathEscape(id)+"/clone", body, "")
}

// Release turns the managed directory at path back into a plain one.
func (g *GuestClient) Release(ctx context.Context, guest, path string) (*GuestData, error) {
	body, err := json.Marshal(api.PathRequest{Path: &path})
	if err != nil {
		return nil, err
	}
	return g.call(ctx, guest, http.MethodPost, "/v1/directories/release", body, "")
}
