package hostproxy

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"strata/internal/api"
	"strata/internal/fault"
)

// Authorization: one table (authTable) says, for every route, which kinds
// of credential may call it and which scope a sandbox access token or a
// channel key needs there; one middleware (authorize) checks it before
// any handler runs, and looks up the sandbox the route names. Handlers
// never ask who the caller is: they find the principal and the sandbox
// already checked (principalOf, sandboxOf). openapi.json prints the same
// table (security and x-strata-scope on every operation), and the tests
// hold the table to the router, to the document and to docs/api.md.
//
// The checks, in this order (docs/api.md, "Order of checks"):
//  1. a route that needs no key (health, the OpenAPI document) passes;
//  2. the credential (authenticate, authn.go: 400 for two different
//     keys, 401, also for any call from inside a sandbox whose access is
//     none, 429);
//  3. a call through a sandbox's channel never reaches a route marked
//     outside (an account's list or create, the host's metrics, a
//     restore, which ends the machine that carries the call, a fork,
//     which makes sandboxes), and acts only on that sandbox, whatever key
//     it carries (403);
//  4. the kind of credential (403): an account key, a token, a channel
//     key;
//  5. a token or a channel key acts only on its own sandbox (403), and
//     only within its scopes (403 with data.scope naming the one needed);
//  6. the sandbox the route names ({id}: its id or its name) is the
//     caller's account's: unknown, or of another account, is 404
//     sandbox_not_found (an account learns nothing of other accounts'
//     sandboxes; a token naming anything but its own sandbox was refused
//     at 5, whether that exists or not).
//
// {id} is resolved once, before check 3, among the caller's account's
// sandboxes (Registry.resolveSandbox: an id, else a name), so that checks
// 3 and 5 compare sandboxes, not spellings: a token, or a call through a
// channel, may name its own sandbox by its id or by its name. Handlers
// find the sandbox resolved (sandboxOf); none reads {id} again.
//
// Race: the principal's scopes are read once per request (a channel
// key's from its sandbox's record), and so is the sandbox a name
// resolves to, so a change of a token or of a sandbox's access takes
// effect from the next request on, and a name deleted and given to
// another sandbox while a request is in flight is the first sandbox's
// for that request.

// kinds is a set of credential kinds.
type kinds uint8

const (
	byAccountKey kinds = 1 << iota
	byAccessToken
	byChannelKey
)

// allKinds are the kinds in the order the table and the document list
// them.
var allKinds = []struct {
	bit  kinds
	kind CredentialKind
}{{byAccountKey, KindAccountKey}, {byAccessToken, KindAccessToken}, {byChannelKey, KindChannelKey}}

// has tells whether k holds kind.
func (k kinds) has(kind CredentialKind) bool {
	for _, c := range allKinds {
		if c.kind == kind {
			return k&c.bit != 0
		}
	}
	return false
}

// list is k's kinds, in allKinds's order.
func (k kinds) list() []CredentialKind {
	var out []CredentialKind
	for _, c := range allKinds {
		if k&c.bit != 0 {
			out = append(out, c.kind)
		}
	}
	return out
}

// rule is who may call a route.
type rule struct {
	// kinds may call it; none: the route needs no key.
	kinds kinds
	// scope is what a token or a channel key needs; "" when neither may
	// call the route.
	scope api.Scope
	// outside: never served to a call through a sandbox's channel,
	// whatever key it carries.
	outside bool
}

var (
	// public routes need no key.
	public = rule{}
	// account routes need an account key.
	account = rule{kinds: byAccountKey}
	// accountOutside routes need an account key and never come from
	// inside a sandbox.
	accountOutside = rule{kinds: byAccountKey, outside: true}
)

// scoped routes take an account key, or a token or the channel key of
// their sandbox with scope.
func scoped(scope api.Scope) rule {
	return rule{kinds: byAccountKey | byAccessToken | byChannelKey, scope: scope}
}

// route is one route of the table, as the router has it (echo's
// parameters: ":id", "*").
type route struct {
	method, path string
	rule         rule
}

const (
	sbRoute   = "/v1/sandboxes/:id"
	cpRoute   = sbRoute + "/checkpoints/:checkpoint"
	snapRoute = sbRoute + "/snapshots/:snapshot"
)

// authTable is the authorization table: every route of the API and who
// may call it. docs/api.md ("Who may call what") is this table in prose;
// a route missing here refuses to start the server.
var authTable = []route{
	{http.MethodGet, "/v1/health", public},
	{http.MethodGet, "/v1/openapi.json", public},
	// Host-wide activity of every account: the operator's.
	{http.MethodGet, "/metrics", accountOutside},

	// The account's sandboxes as a whole, and making sandboxes.
	{http.MethodPost, "/v1/sandboxes", accountOutside},
	{http.MethodGet, "/v1/sandboxes", accountOutside},

	// A sandbox's lifecycle and its management (its token, its access):
	// a token must not stop, delete or re-key the sandbox it was given
	// to.
	{http.MethodGet, sbRoute, account},
	{http.MethodDelete, sbRoute, account},
	{http.MethodPost, sbRoute + "/pause", account},
	{http.MethodPost, sbRoute + "/resume", account},
	{http.MethodPost, sbRoute + "/start", account},
	{http.MethodPost, sbRoute + "/stop", account},
	{http.MethodPut, sbRoute + "/access", account},
	{http.MethodPut, sbRoute + "/labels", account},
	// The network: a token must not widen its own sandbox's reach, nor
	// an account key from inside the sandbox it would widen.
	{http.MethodGet, sbRoute + "/network", account},
	{http.MethodPut, sbRoute + "/network", accountOutside},
	{http.MethodPost, sbRoute + "/access-token", account},
	{http.MethodGet, sbRoute + "/access-token", account},
	{http.MethodDelete, sbRoute + "/access-token", account},
	{http.MethodPost, sbRoute + "/access-token/rotate", account},

	// Directory checkpoints: the seed's four, and the reads beyond them.
	{http.MethodPost, sbRoute + "/checkpoints", scoped(api.ScopeCheckpoints)},
	{http.MethodGet, sbRoute + "/checkpoints", scoped(api.ScopeCheckpoints)},
	{http.MethodPost, cpRoute + "/restore", scoped(api.ScopeCheckpoints)},
	{http.MethodDelete, cpRoute, scoped(api.ScopeCheckpoints)},
	{http.MethodGet, sbRoute + "/directories", scoped(api.ScopeCheckpoints)},
	{http.MethodGet, cpRoute + "/changes", scoped(api.ScopeCheckpoints)},
	{http.MethodGet, cpRoute + "/files", scoped(api.ScopeCheckpoints)},
	{http.MethodGet, cpRoute + "/files/*", scoped(api.ScopeCheckpoints)},
	// Beyond them, what rewrites the tree: account keys, as before
	// scopes (a token's restore is of a whole directory, with its
	// automatic checkpoint; these make no checkpoint of what they
	// replace, or delete checkpoints).
	{http.MethodPost, cpRoute + "/restore-paths", account},
	{http.MethodPost, cpRoute + "/clone", account},
	{http.MethodPost, sbRoute + "/directories/release", account},

	// VM snapshots: a token may take and read them; what deletes,
	// pins or replaces the machine is the account's.
	{http.MethodPost, sbRoute + "/snapshots", scoped(api.ScopeSnapshots)},
	{http.MethodGet, sbRoute + "/snapshots", scoped(api.ScopeSnapshots)},
	{http.MethodGet, snapRoute, scoped(api.ScopeSnapshots)},
	{http.MethodDelete, snapRoute, account},
	{http.MethodPost, snapRoute + "/pin", account},
	{http.MethodPost, snapRoute + "/unpin", account},
	{http.MethodPost, snapRoute + "/restore", accountOutside},
	{http.MethodPost, snapRoute + "/fork", accountOutside},

	// Processes and files, as root in the guest.
	{http.MethodPost, sbRoute + "/exec", scoped(api.ScopeExec)},
	{http.MethodPost, sbRoute + "/sessions", scoped(api.ScopeExec)},
	{http.MethodGet, sbRoute + "/sessions", scoped(api.ScopeExec)},
	{http.MethodGet, sbRoute + "/sessions/:sid", scoped(api.ScopeExec)},
	{http.MethodDelete, sbRoute + "/sessions/:sid", scoped(api.ScopeExec)},
	{http.MethodGet, sbRoute + "/sessions/:sid/attach", scoped(api.ScopeExec)},
	{http.MethodGet, sbRoute + "/files", scoped(api.ScopeFiles)},
	{http.MethodHead, sbRoute + "/files", scoped(api.ScopeFiles)},
	{http.MethodPut, sbRoute + "/files", scoped(api.ScopeFiles)},
	{http.MethodDelete, sbRoute + "/files", scoped(api.ScopeFiles)},
	{http.MethodGet, sbRoute + "/files/*", scoped(api.ScopeFiles)},
	{http.MethodHead, sbRoute + "/files/*", scoped(api.ScopeFiles)},
	{http.MethodPut, sbRoute + "/files/*", scoped(api.ScopeFiles)},
	{http.MethodDelete, sbRoute + "/files/*", scoped(api.ScopeFiles)},
}

// rules is authTable by "METHOD path".
var rules = func() map[string]rule {
	m := map[string]rule{}
	for _, r := range authTable {
		k := r.method + " " + r.path
		if _, dup := m[k]; dup {
			panic("hostproxy: " + k + " is twice in the authorization table")
		}
		m[k] = r.rule
	}
	return m
}()

// The refusals of the table: one sentence for each check.
var (
	errFromInside  = fault.New(fault.Forbidden, "forbidden", "this call is never served from inside a sandbox")
	errViaChannel  = fault.New(fault.Forbidden, "forbidden", "a call from inside a sandbox acts only on that sandbox")
	errAccountOnly = fault.New(fault.Forbidden, "forbidden", "this call needs an account API key")
	errNotItsOwn   = fault.New(fault.Forbidden, "forbidden", "this access token acts only on its own sandbox")
)

// errScope refuses a token or a channel key without scope.
func errScope(scope api.Scope) *fault.Error {
	return fault.Newf(fault.Forbidden, "forbidden", "this credential lacks the %s scope, which this call needs", scope).With("scope", string(scope))
}

// allows tells whether p may call a route of rule rt on sandbox id (""
// for a route that names none), from inside sandbox via ("" for a call
// from the network): checks 3 to 5 of the list above.
func (rt rule) allows(p Principal, id, via string) error {
	switch {
	case rt.kinds == 0:
		return nil
	case via != "" && rt.outside:
		return errFromInside
	case via != "" && id != via:
		return errViaChannel
	case !rt.kinds.has(p.Kind):
		return errAccountOnly
	case p.Kind == KindAccountKey:
		return nil
	case id != p.Sandbox:
		return errNotItsOwn
	case rt.scope == "" || !p.Scopes.Has(rt.scope):
		return errScope(rt.scope)
	}
	return nil
}

// Echo context keys of what authorize found.
const (
	keyPrincipal = "strata.principal"
	keySandbox   = "strata.sandbox"
)

// authorize is the middleware of the route method path: it checks the
// table's rule and looks up the sandbox the route names. It panics when
// the table has no rule for the route: a route added without one must not
// start.
func (s *Server) authorize(method, path string) echo.MiddlewareFunc {
	rt, ok := rules[method+" "+path]
	if !ok {
		panic(fmt.Sprintf("hostproxy: route %s %s has no rule in the authorization table (authz.go)", method, path))
	}
	names := strings.HasPrefix(path, sbRoute)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		if rt.kinds == 0 {
			return next
		}
		return func(c echo.Context) error {
			p, err := s.authenticate(c)
			if err != nil {
				return err
			}
			c.Set(keyPrincipal, p)
			id, found := "", false
			var sb Sandbox
			if names {
				if sb, found, err = s.reg.resolveSandbox(c.Request().Context(), p.Account, c.Param("id")); err != nil {
					return err
				}
				id = c.Param("id")
				if found {
					id = sb.ID
				}
			}
			if err := rt.allows(p, id, channelSandbox(c.Request().Context())); err != nil {
				return err
			}
			if names {
				if !found {
					return errSandboxNotFound
				}
				s.deliverOwed(sb)
				c.Set(keySandbox, sb)
			}
			return next(c)
		}
	}
}

// authorizeAs checks the request's principal against the rule of another
// route: a call that does, by a field of its body, what that route does
// (a snapshot's retention deletes snapshots).
func (s *Server) authorizeAs(c echo.Context, method, path string) error {
	rt, ok := rules[method+" "+path]
	if !ok {
		return fmt.Errorf("hostproxy: no rule for %s %s", method, path)
	}
	return rt.allows(principalOf(c), sandboxOf(c).ID, channelSandbox(c.Request().Context()))
}

// principalOf is who the request acts as (authorize found it).
func principalOf(c echo.Context) Principal {
	p, _ := c.Get(keyPrincipal).(Principal)
	return p
}

// sandboxOf is the sandbox the route names, by its id or its name, as
// authorize found it (a running microVM sandbox was handed the
// credentials it is owed then: credentials.go).
func sandboxOf(c echo.Context) Sandbox {
	sb, _ := c.Get(keySandbox).(Sandbox)
	return sb
}
