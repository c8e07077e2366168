package hostproxy

import (
	"context"

	"github.com/labstack/echo/v4"

	"strata/egress/policy"
	"strata/internal/api"
	"strata/internal/jsend"
	"strata/sandbox"
)

// A microVM sandbox's access setting: what the processes inside it may do
// through the API with the key their guest is handed (its channel key,
// channelkey.go). It lives in the sandbox's record (sandbox.Record.Access,
// api.Access's string form; empty is the default), is read at every call
// that comes through the sandbox's channel, and is changed by PUT
// /v1/sandboxes/{id}/access (account keys only):
//   - {"scopes":[…]}: the channel key has those scopes;
//   - "none": the guest is handed no key, neither its channel key nor the
//     sandbox's access token, and every call through its channel is 401,
//     whatever key it carries.
//
// A change takes effect from the next call on, for the key already in the
// guest too (nothing of the setting is in the key); the guest's
// credentials file is put again at once when it runs, and otherwise at its
// next boot (credentials.go). A fork takes its own setting (its create's,
// or the default), never its source's.

// accessOf is sb's access setting. A record whose setting cannot be read
// is none: the guest gets nothing rather than too much.
func accessOf(sb Sandbox) api.Access {
	a, err := api.ParseAccessString("access", sb.Access)
	if err != nil {
		return api.Access{None: true}
	}
	return a
}

// recordAccess is how a request's access setting (checked already) is
// kept in a record: left out when the request left it out (a create's
// default is, too: api.SandboxCreateRequest.Validate), anything else as
// its string.
func recordAccess(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	a, err := api.ParseAccess("access", raw)
	if err != nil {
		return api.AccessNone
	}
	return a.String()
}

// takeKey is the context key of what a create or a fork gives its
// sandbox that package sandbox does not copy (taken), for Registry.Take:
// a sandbox taken from the pool or from the forks made ahead gets its
// record's other fields from package sandbox, which leaves these to the
// registry.
type takeKey struct{}

// taken is a record's access setting, env and labels.
type taken struct {
	access      string
	env, labels map[string]string
	network     *policy.Spec
}

// withTaken carries rec's access setting, env and labels to
// Registry.Take.
func withTaken(ctx context.Context, rec Sandbox) context.Context {
	return context.WithValue(ctx, takeKey{}, taken{access: rec.Access, env: rec.Env, labels: rec.Labels, network: rec.Network})
}

// setAccess is PUT /v1/sandboxes/{id}/access: the body is the new setting
// ("none" or {"scopes":[…]}); the answer is the sandbox's record.
func (s *Server) setAccess(c echo.Context) (any, error) {
	sb := sandboxOf(c)
	r := c.Request()
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	body, err := jsend.ReadBody(r, jsend.MaxBody, jsend.ErrBodyTooLarge)
	if err != nil {
		return nil, err
	}
	access, err := api.ParseAccessBody(body)
	if err != nil {
		return nil, err
	}
	if sb.Machine == nil {
		// A configured sandbox has no channel, and no key to set.
		return nil, sandbox.ErrNotAMachine
	}
	rec, err := s.reg.Update(r.Context(), sb.ID, func(rec *Sandbox) error {
		rec.Access = access.String()
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.refreshCredentials(c, rec)
	return sandboxView(rec), nil
}

// refreshCredentials puts a microVM guest's credentials again after its
// access setting changed: at once when it runs, else at its next boot or
// the first request that finds it running (credentials.go). Best effort,
// as for a token: the setting is in force whether or not the guest's file
// says so.
func (s *Server) refreshCredentials(c echo.Context, sb Sandbox) {
	s.owed.touch(guestAddress(sb.ID))
	if sb.State != StateRunning {
		return
	}
	if err := s.sendCredentials(c.Request().Context(), sb.ID, false); err != nil {
		s.log.Warn("credentials not delivered to the guest; the next request that finds the sandbox running retries", "sandbox", sb.ID, "err", err)
	}
}

// setLabels is PUT /v1/sandboxes/{id}/labels: the body is the new labels,
// an object of strings (api.ParseLabelsBody; {} takes them all away); the
// answer is the sandbox's record. A configured sandbox has none: its
// record is the configuration's, written again at every start.
func (s *Server) setLabels(c echo.Context) (any, error) {
	sb := sandboxOf(c)
	r := c.Request()
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	body, err := jsend.ReadBody(r, api.MaxLabelsBody, api.ErrLabelsBodyTooLarge)
	if err != nil {
		return nil, err
	}
	labels, err := api.ParseLabelsBody(body)
	if err != nil {
		return nil, err
	}
	if sb.Machine == nil {
		return nil, sandbox.ErrNotAMachine
	}
	if len(labels) == 0 {
		labels = nil
	}
	rec, err := s.reg.Update(r.Context(), sb.ID, func(rec *Sandbox) error {
		rec.Labels = labels
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sandboxView(rec), nil
}

// getNetwork is GET /v1/sandboxes/{id}/network: the sandbox's network
// setting, with its usage while its machine runs.
func (s *Server) getNetwork(c echo.Context) (any, error) {
	sb := sandboxOf(c)
	r := c.Request()
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	if err := jsend.RejectBody(r); err != nil {
		return nil, err
	}
	if sb.Machine == nil {
		return nil, sandbox.ErrNotAMachine
	}
	return s.withUsage(sandboxView(sb)).Network, nil
}

// setNetwork is PUT /v1/sandboxes/{id}/network: the body is the new
// setting (api.ParseNetworkBody), which replaces the sandbox's for the
// connections and DNS questions after it (a running machine's network
// takes it at once; open connections keep theirs); the answer is the
// setting as GET shows it.
func (s *Server) setNetwork(c echo.Context) (any, error) {
	sb := sandboxOf(c)
	r := c.Request()
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	body, err := jsend.ReadBody(r, api.MaxNetworkBody, api.ErrNetworkBodyTooLarge)
	if err != nil {
		return nil, err
	}
	spec, err := api.ParseNetworkBody(body)
	if err != nil {
		return nil, err
	}
	if sb.Machine == nil {
		return nil, sandbox.ErrNotAMachine
	}
	rec, err := s.reg.Update(r.Context(), sb.ID, func(rec *Sandbox) error {
		rec.Network = &spec
		return nil
	})
	if err != nil {
		return nil, err
	}
	if s.machines != nil {
		s.machines.RefreshNetwork(rec.ID)
	}
	return s.withUsage(sandboxView(rec)).Network, nil
}
