package hostproxy

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/jsend"
	"strata/pathpolicy"
)

func (s *Server) health(c echo.Context) (any, error) {
	if err := jsend.RejectQuery(c.Request()); err != nil {
		return nil, err
	}
	return map[string]string{"status": "ok"}, nil
}

// checkpointRoute does the checks shared by the four operations, in the
// order of doc.go, after authorize's and up to the sandbox state.
func (s *Server) checkpointRoute(c echo.Context, body func(r *http.Request) error) (Sandbox, error) {
	return s.checkpointRouteQuery(c, jsend.RejectQuery, body)
}

// checkpointRouteQuery is checkpointRoute for a route that takes a query
// (changes): query checks it where the four refuse any.
func (s *Server) checkpointRouteQuery(c echo.Context, query, body func(r *http.Request) error) (Sandbox, error) {
	sb := sandboxOf(c)
	r := c.Request()
	if err := query(r); err != nil {
		return sb, err
	}
	if err := body(r); err != nil {
		return sb, err
	}
	if sb.State != StateRunning {
		return sb, errSandboxNotRunning.With("state", string(sb.State))
	}
	return sb, nil
}

func (s *Server) createCheckpoint(c echo.Context) (any, error) {
	var req CreateRequest
	var key string
	sb, err := s.checkpointRoute(c, func(r *http.Request) (err error) {
		if req, err = decodeCreate(r); err != nil {
			return err
		}
		key, err = api.IdempotencyKey(r.Header.Values(api.HeaderIdempotencyKey))
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.guestCall(c, "create", func() (*GuestData, error) {
		return s.guests.CreateCheckpoint(c.Request().Context(), sb.Guest, req, key)
	})
}

// listDirectories is an extension: the managed directories of the
// sandbox and the checkpoint each live directory continues from.
func (s *Server) listDirectories(c echo.Context) (any, error) {
	sb, err := s.checkpointRoute(c, jsend.RejectBody)
	if err != nil {
		return nil, err
	}
	return s.guestCall(c, "directories", func() (*GuestData, error) {
		return s.guests.ListDirectories(c.Request().Context(), sb.Guest)
	})
}

func (s *Server) listCheckpoints(c echo.Context) (any, error) {
	sb, err := s.checkpointRoute(c, jsend.RejectBody)
	if err != nil {
		return nil, err
	}
	return s.guestCall(c, "list", func() (*GuestData, error) {
		return s.guests.ListCheckpoints(c.Request().Context(), sb.Guest)
	})
}

func (s *Server) restoreCheckpoint(c echo.Context) (any, error) {
	var key string
	sb, err := s.checkpointRoute(c, func(r *http.Request) (err error) {
		if err := jsend.RejectBody(r); err != nil {
			return err
		}
		key, err = api.IdempotencyKey(r.Header.Values(api.HeaderIdempotencyKey))
		return err
	})
	if err != nil {
		return nil, err
	}
	id, err := checkpointID(c)
	if err != nil {
		return nil, err
	}
	return s.guestCall(c, "restore", func() (*GuestData, error) {
		return s.guests.RestoreCheckpoint(c.Request().Context(), sb.Guest, id, key)
	})
}

func (s *Server) deleteCheckpoint(c echo.Context) (any, error) {
	sb, err := s.checkpointRoute(c, jsend.RejectBody)
	if err != nil {
		return nil, err
	}
	id, err := checkpointID(c)
	if err != nil {
		return nil, err
	}
	return s.guestCall(c, "delete", func() (*GuestData, error) {
		return s.guests.DeleteCheckpoint(c.Request().Context(), sb.Guest, id)
	})
}

// checkpointID returns the {checkpoint} segment if it has the shape of a
// checkpoint id (cp_ and 22 base64url characters); anything else cannot
// name a checkpoint and is answered here, as guestd would.
func checkpointID(c echo.Context) (string, error) {
	id := c.Param("checkpoint")
	if !api.ValidCheckpointID(id) {
		return "", errCheckpointNotFound.With("checkpoint_id", id)
	}
	return id, nil
}

// guestCall times one guest call for the metrics. Its data is held until
// written (Server.data releases it).
func (s *Server) guestCall(c echo.Context, op string, call func() (*GuestData, error)) (any, error) {
	start := time.Now()
	data, err := call()
	outcome := "ok"
	switch {
	case err == nil:
	case fault.As(err) != nil && jsend.Status(fault.KindOf(err)) < 500:
		outcome = "fail"
	default:
		outcome = "error"
	}
	s.metrics.guest.WithLabelValues(op, outcome).Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, err
	}
	return data, nil
}

// decodeCreate reads and checks the create body with the rules guestd
// applies to it, so that a body guestd would refuse never reaches it: one
// JSON object of at most 16 KiB (jsend.DecodeObject), the fields of
// api.CreateRequest, and the path rules that need no filesystem
// (pathpolicy.CheckSyntax: absolute, clean, not protected). The rules that
// need the guest's filesystem are the guest's to check.
func decodeCreate(r *http.Request) (CreateRequest, error) {
	var body api.CreateRequest
	if err := jsend.DecodeObject(r, &body); err != nil {
		return CreateRequest{}, err
	}
	p, _, err := body.Validate()
	if err != nil {
		return CreateRequest{}, err
	}
	if err := pathpolicy.CheckSyntax(p, nil); err != nil {
		return CreateRequest{}, err
	}
	return CreateRequest{Path: p, Name: body.Name, Retention: body.Retention}, nil
}

// Access-token management: account keys only (authz.go), any sandbox
// state.

func (s *Server) tokenRoute(c echo.Context) (Sandbox, error) {
	sb := sandboxOf(c)
	if err := jsend.RejectQuery(c.Request()); err != nil {
		return sb, err
	}
	return sb, jsend.RejectBody(c.Request())
}

// issuedToken is the only answer that ever holds a token in plain text.
type issuedToken struct {
	Token     string     `json:"token"`
	Hint      string     `json:"hint"`
	CreatedAt time.Time  `json:"created_at"`
	Scopes    api.Scopes `json:"scopes"`
}

// errHostScopes refuses exec and files to a configured sandbox's tokens.
var errHostScopes = jsend.InvalidField("scopes", "a configured sandbox's guest daemon may run on the host itself, as root (make run-local): its tokens cannot have the exec or files scope")

func (s *Server) newToken() (string, error) {
	s.randMu.Lock()
	defer s.randMu.Unlock()
	return NewSecret(s.rand, TokenPrefix)
}

// issueToken is POST …/access-token: the body, optional, names the
// token's scopes ({"scopes":[…]}; api.DefaultScopes without). A
// configured sandbox's token cannot have exec or files: hostproxy does
// not confine its guest daemon, which make run-local runs on the host as
// root, and a token must never be root on the host.
func (s *Server) issueToken(c echo.Context) (any, error) {
	sb := sandboxOf(c)
	r := c.Request()
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	body, err := jsend.ReadBody(r, jsend.MaxBody, jsend.ErrBodyTooLarge)
	if err != nil {
		return nil, err
	}
	scopes, err := api.ParseTokenRequest(body)
	if err != nil {
		return nil, err
	}
	if sb.Machine == nil && (scopes.Has(api.ScopeExec) || scopes.Has(api.ScopeFiles)) {
		return nil, errHostScopes
	}
	return s.putToken(c, sb, scopes, false)
}

// rotateToken is POST …/access-token/rotate: a new token with the old
// one's scopes.
func (s *Server) rotateToken(c echo.Context) (any, error) {
	sb, err := s.tokenRoute(c)
	if err != nil {
		return nil, err
	}
	return s.putToken(c, sb, nil, true)
}

func (s *Server) putToken(c echo.Context, sb Sandbox, scopes api.Scopes, rotate bool) (any, error) {
	token, err := s.newToken()
	if err != nil {
		return nil, err
	}
	var info TokenInfo
	if rotate {
		info, err = s.reg.RotateToken(c.Request().Context(), sb.ID, token, s.now())
	} else {
		info, err = s.reg.IssueToken(c.Request().Context(), sb.ID, token, scopes, s.now())
	}
	if err != nil {
		return nil, err
	}
	s.deliverCredentials(c, sb, token)
	return issuedToken{Token: token, Hint: info.Hint, CreatedAt: info.CreatedAt, Scopes: info.Scopes}, nil
}

// deliverCredentials hands a sandbox's guest its API address, id and
// current token ("" after a revoke), so that processes inside find them
// in guestd's root-readable env file. Best effort: the token is valid
// whether or not the guest got it (the caller has it in the response);
// failures are logged. A microVM guest that is not running, or does not
// take it, is owed the token (see credentials.go); a configured sandbox's
// guest gets it only while the sandbox is running.
func (s *Server) deliverCredentials(c echo.Context, sb Sandbox, token string) {
	var err error
	switch {
	case sb.Machine != nil:
		s.owed.set(guestAddress(sb.ID), token)
		if sb.State != StateRunning {
			return
		}
		err = s.sendCredentials(c.Request().Context(), sb.ID, false)
	case sb.State == StateRunning:
		err = s.guests.PutCredentials(c.Request().Context(), sb.Guest, api.Credentials{APIURL: s.publicURL, SandboxID: sb.ID, Token: token})
	}
	if err != nil {
		s.log.Warn("credentials not delivered to the guest", "sandbox", sb.ID, "request_id", c.Response().Header().Get(jsend.HeaderRequestID), "err", err)
	}
}

func (s *Server) showToken(c echo.Context) (any, error) {
	sb, err := s.tokenRoute(c)
	if err != nil {
		return nil, err
	}
	return s.reg.Token(c.Request().Context(), sb.ID)
}

func (s *Server) revokeToken(c echo.Context) (any, error) {
	sb, err := s.tokenRoute(c)
	if err != nil {
		return nil, err
	}
	if err := s.reg.RevokeToken(c.Request().Context(), sb.ID); err != nil {
		return nil, err
	}
	s.deliverCredentials(c, sb, "")
	return struct{}{}, nil
}
