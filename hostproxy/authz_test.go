package hostproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"strata/hostproxy/hostproxytest"
	"strata/internal/api"
	"strata/sandbox"
)

// The contract of who may call what, written out here apart from
// authTable (authz.go), so that a change of the table that the contract
// does not make fails: the routes a sandbox access token or a channel key
// may call, with the scope each needs (every other route needs an account
// key), the routes that need no key, and those never served through a
// sandbox's channel.
var (
	contractScoped = map[string]api.Scope{
		"POST /v1/sandboxes/:id/checkpoints":                     api.ScopeCheckpoints,
		"GET /v1/sandboxes/:id/checkpoints":                      api.ScopeCheckpoints,
		"POST /v1/sandboxes/:id/checkpoints/:checkpoint/restore": api.ScopeCheckpoints,
		"DELETE /v1/sandboxes/:id/checkpoints/:checkpoint":       api.ScopeCheckpoints,
		"GET /v1/sandboxes/:id/directories":                      api.ScopeCheckpoints,
		"GET /v1/sandboxes/:id/checkpoints/:checkpoint/changes":  api.ScopeCheckpoints,
		"GET /v1/sandboxes/:id/checkpoints/:checkpoint/files":    api.ScopeCheckpoints,
		"GET /v1/sandboxes/:id/checkpoints/:checkpoint/files/*":  api.ScopeCheckpoints,
		"POST /v1/sandboxes/:id/snapshots":                       api.ScopeSnapshots,
		"GET /v1/sandboxes/:id/snapshots":                        api.ScopeSnapshots,
		"GET /v1/sandboxes/:id/snapshots/:snapshot":              api.ScopeSnapshots,
		"POST /v1/sandboxes/:id/exec":                            api.ScopeExec,
		"POST /v1/sandboxes/:id/sessions":                        api.ScopeExec,
		"GET /v1/sandboxes/:id/sessions":                         api.ScopeExec,
		"GET /v1/sandboxes/:id/sessions/:sid":                    api.ScopeExec,
		"DELETE /v1/sandboxes/:id/sessions/:sid":                 api.ScopeExec,
		"GET /v1/sandboxes/:id/sessions/:sid/attach":             api.ScopeExec,
		"GET /v1/sandboxes/:id/files":                            api.ScopeFiles,
		"HEAD /v1/sandboxes/:id/files":                           api.ScopeFiles,
		"PUT /v1/sandboxes/:id/files":                            api.ScopeFiles,
		"DELETE /v1/sandboxes/:id/files":                         api.ScopeFiles,
		"GET /v1/sandboxes/:id/files/*":                          api.ScopeFiles,
		"HEAD /v1/sandboxes/:id/files/*":                         api.ScopeFiles,
		"PUT /v1/sandboxes/:id/files/*":                          api.ScopeFiles,
		"DELETE /v1/sandboxes/:id/files/*":                       api.ScopeFiles,
	}
	contractPublic  = []string{"GET /v1/health", "GET /v1/openapi.json"}
	contractOutside = []string{
		"GET /metrics", "POST /v1/sandboxes", "GET /v1/sandboxes",
		"POST /v1/sandboxes/:id/snapshots/:snapshot/restore", "POST /v1/sandboxes/:id/snapshots/:snapshot/fork",
		// A sandbox's network, which an account key inside it would widen.
		"PUT /v1/sandboxes/:id/network",
	}
)

// TestAuthTableCoversRoutes: every route the router serves has its rule
// in the table, and every rule is a route (a route added without a rule
// would not start; a rule left behind would document a route that is
// gone).
func TestAuthTableCoversRoutes(t *testing.T) {
	h := newAuthzHarness(t)
	served := map[string]bool{}
	for _, r := range h.s.router.Routes() {
		k := r.Method + " " + r.Path
		served[k] = true
		if _, ok := rules[k]; !ok {
			t.Errorf("route %s is not in the authorization table", k)
		}
	}
	for _, r := range authTable {
		if !served[r.method+" "+r.path] {
			t.Errorf("the authorization table has %s %s, which no route serves", r.method, r.path)
		}
	}
}

// TestAuthTableContract holds the table to the contract above, and to
// the table's own rules of form: a route that takes a token or a channel
// key names a scope and takes all three kinds; a route that needs a key
// and may be called from inside a sandbox names one ({id}), so that "a
// call from inside acts only on that sandbox" has a sandbox to hold it
// to.
func TestAuthTableContract(t *testing.T) {
	for _, r := range authTable {
		k := r.method + " " + r.path
		rt := r.rule
		switch {
		case slices.Contains(contractPublic, k):
			if rt != public {
				t.Errorf("%s: %+v, want no key", k, rt)
			}
			continue
		case contractScoped[k] != "":
			if rt != scoped(contractScoped[k]) {
				t.Errorf("%s: %+v, want an account key, or a token or channel key with %s", k, rt, contractScoped[k])
			}
		default:
			if rt.kinds != byAccountKey || rt.scope != "" {
				t.Errorf("%s: %+v, want an account key only", k, rt)
			}
		}
		if rt.outside != slices.Contains(contractOutside, k) {
			t.Errorf("%s: outside %v, want %v", k, rt.outside, !rt.outside)
		}
		if !rt.outside && !strings.HasPrefix(r.path, sbRoute) {
			t.Errorf("%s may be called from inside a sandbox but names none", k)
		}
	}
}

// TestAuthTableOpenAPI: openapi.json prints the table, both ways: each
// operation's security requirements name, for X-Api-Key and for Bearer
// alike, exactly the kinds of credential its rule takes (none: no
// security), x-strata-scope the scope a token or channel key needs, and
// x-strata-from-inside false the routes never served from inside a
// sandbox; and every operation is a route of the table.
func TestAuthTableOpenAPI(t *testing.T) {
	var doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			SecuritySchemes map[string]json.RawMessage `json:"securitySchemes"`
		} `json:"components"`
		Security json.RawMessage `json:"security"`
	}
	if err := json.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Components.SecuritySchemes["apiKey"] == nil || doc.Components.SecuritySchemes["bearer"] == nil {
		t.Errorf("security schemes %v, want apiKey and bearer", doc.Components.SecuritySchemes)
	}
	if doc.Security != nil {
		t.Errorf("a global security requirement: every operation states its own")
	}
	param := regexp.MustCompile(`\{([a-z]+)\}`)
	ops := map[string]bool{}
	for p, item := range doc.Paths {
		route := strings.Replace(param.ReplaceAllString(p, ":$1"), ":path", "*", 1)
		for m, raw := range item {
			var op struct {
				Security   *[]map[string][]string `json:"security"`
				Scope      string                 `json:"x-strata-scope"`
				FromInside *bool                  `json:"x-strata-from-inside"`
			}
			if json.Unmarshal(raw, &op) != nil {
				continue // not an operation (parameters)
			}
			k := strings.ToUpper(m) + " " + route
			ops[k] = true
			rt, ok := rules[k]
			if !ok {
				t.Errorf("openapi.json has %s, which the authorization table lacks", k)
				continue
			}
			if op.Security == nil {
				t.Errorf("%s: no security requirement", k)
				continue
			}
			byScheme := map[string][]string{}
			for _, req := range *op.Security {
				if len(req) != 1 {
					t.Errorf("%s: a requirement of %d schemes at once: %v", k, len(req), req)
				}
				for scheme, roles := range req {
					byScheme[scheme] = append(byScheme[scheme], roles...)
				}
			}
			var want []string
			for _, kind := range rt.kinds.list() {
				want = append(want, string(kind))
			}
			for _, scheme := range []string{"apiKey", "bearer"} {
				got := byScheme[scheme]
				if !slices.Equal(got, want) {
					t.Errorf("%s: %s takes %v, the table %v", k, scheme, got, want)
				}
			}
			if len(byScheme) > 2 || (len(want) == 0) != (len(*op.Security) == 0) {
				t.Errorf("%s: security %v, the table %+v", k, *op.Security, rt)
			}
			if op.Scope != string(rt.scope) {
				t.Errorf("%s: x-strata-scope %q, the table %q", k, op.Scope, rt.scope)
			}
			if fromInside := op.FromInside == nil || *op.FromInside; fromInside == rt.outside {
				t.Errorf("%s: x-strata-from-inside %v, the table's outside %v", k, op.FromInside, rt.outside)
			}
		}
	}
	for _, r := range authTable {
		if !ops[r.method+" "+r.path] {
			t.Errorf("the authorization table has %s %s, which openapi.json lacks", r.method, r.path)
		}
	}
}

// authzHarness is a hostproxy without a vms configuration whose registry
// holds microVM sandbox records of account acct-a, all running, all of
// whose vm:// guests are one FakeGuest: enough to call every route with
// every kind of credential.
type authzHarness struct {
	t     *testing.T
	s     *Server
	guest *hostproxytest.FakeGuest
}

func newAuthzHarness(t *testing.T) *authzHarness {
	t.Helper()
	h := &authzHarness{t: t, guest: hostproxytest.StartFakeGuest(t, "sb-any")}
	var d net.Dialer
	dialers := DefaultDialers()
	dialers[sandbox.GuestScheme] = func(ctx context.Context, id string) (net.Conn, error) {
		return d.DialContext(ctx, "unix", h.guest.Socket)
	}
	s, err := New(t.Context(), Options{
		Config: Config{
			DataDir: t.TempDir(),
			Accounts: []AccountConfig{
				{ID: "acct-a", Keys: []KeyConfig{{ID: "key-a", SHA256: hashSecret(testKey)}}},
				{ID: "acct-b", Keys: []KeyConfig{{ID: "key-b", SHA256: hashSecret(testKeyB)}}},
			},
			RateLimit: RateLimit{PerSecond: 1e6, Burst: 1e6},
			Timeouts:  Timeouts{GuestRequest: Duration(5 * time.Second)},
		},
		Logger:  slog.New(slog.DiscardHandler),
		Dialers: dialers,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	h.s = s
	return h
}

const testKeyB = "sk_test_internal_b_0123456789abcd"

// machine records a running microVM sandbox of acct-a with access.
func (h *authzHarness) machine(id, access string) {
	h.t.Helper()
	rec := Sandbox{ID: id, Account: "acct-a", Guest: guestAddress(id), State: sandbox.Running, Machine: &sandbox.Machine{}, Access: access}
	if err := h.s.reg.Insert(h.t.Context(), rec); err != nil {
		h.t.Fatal(err)
	}
}

// call is one request: from the network, or through sandbox via's
// channel, with key ("" for none).
type call struct {
	method, path, key, via, body string
	header                       map[string]string
}

// do sends c through the server's handler, as serveGuest does for a call
// through a channel, and returns the status and the JSend data.
func (h *authzHarness) do(c call) (int, map[string]any) {
	h.t.Helper()
	var body *strings.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	var r *http.Request
	if body != nil {
		r = httptest.NewRequest(c.method, c.path, body)
		r.Header.Set("Content-Type", "application/json")
	} else {
		r = httptest.NewRequest(c.method, c.path, nil)
	}
	if c.key != "" {
		r.Header.Set("X-Api-Key", c.key)
	}
	for k, v := range c.header {
		r.Header.Set(k, v)
	}
	if c.via != "" {
		r = r.WithContext(context.WithValue(r.Context(), channelSandboxKey{}, c.via))
		r.RemoteAddr = "sandbox-" + c.via + ":0"
	}
	w := httptest.NewRecorder()
	h.s.Handler().ServeHTTP(w, r)
	var env struct {
		Data map[string]any `json:"data"`
	}
	json.Unmarshal(w.Body.Bytes(), &env)
	return w.Code, env.Data
}

// token issues sandbox id's token with scopes (none: the default).
func (h *authzHarness) token(id string, scopes ...api.Scope) string {
	h.t.Helper()
	body := ""
	if len(scopes) > 0 {
		b, _ := json.Marshal(map[string]any{"scopes": scopes})
		body = string(b)
	}
	status, data := h.do(call{method: "POST", path: "/v1/sandboxes/" + id + "/access-token", key: testKey, body: body})
	tok, _ := data["token"].(string)
	if status != 200 || tok == "" {
		h.t.Fatalf("issue %s %v: %d %v", id, scopes, status, data)
	}
	return tok
}

// concrete is route r's path with its parameters filled in, on sandbox
// id.
func concrete(path, id string) string {
	r := strings.NewReplacer(":id", id, ":checkpoint", "cp_AAAAAAAAAAAAAAAAAAAAAA", ":snapshot", "v1", ":sid", "se-0123456789abcdef", "*", "a/b")
	return r.Replace(path)
}

// TestAuthorize calls every route of the table with every kind of
// credential, from the network and through a sandbox's channel, with
// every scope that matters, and checks the outcome against the contract
// above (contractScoped, contractPublic, contractOutside): allowed (the
// handler ran: neither 401 nor 403, nor a 404 sandbox_not_found for a
// sandbox that exists), 403 forbidden (with data.scope naming the scope
// when one is lacking) or 401.
func TestAuthorize(t *testing.T) {
	h := newAuthzHarness(t)
	for _, id := range []string{"sb-acct", "sb-tdef", "sb-texec", "sb-tfiles", "sb-tall"} {
		h.machine(id, "")
	}
	h.machine("sb-cdef", "")
	h.machine("sb-cexec", "exec")
	h.machine("sb-cnone", "none")
	all := []api.Scope{api.ScopeCheckpoints, api.ScopeSnapshots, api.ScopeExec, api.ScopeFiles, api.ScopePorts, api.ScopeWatch}
	tokDefault := h.token("sb-tdef")
	tokExec := h.token("sb-texec", api.ScopeExec)
	tokFiles := h.token("sb-tfiles", api.ScopeFiles)
	tokAll := h.token("sb-tall", all...)
	chanDefault, chanExec, chanNone := h.s.reg.ChannelKey("sb-cdef"), h.s.reg.ChannelKey("sb-cexec"), h.s.reg.ChannelKey("sb-cnone")

	type outcome int
	const (
		allowed outcome = iota
		forbidden
		unauthorized
	)
	// scopedAs is the outcome of a token or channel key with scopes on
	// its own sandbox.
	scopedAs := func(k string, scopes ...api.Scope) (outcome, api.Scope) {
		need, ok := contractScoped[k]
		switch {
		case !ok:
			return forbidden, ""
		case slices.Contains(scopes, need):
			return allowed, ""
		}
		return forbidden, need
	}
	credentials := []struct {
		name     string
		key, via string
		on       string // the sandbox its calls name
		expect   func(k string) (outcome, api.Scope)
	}{
		{"account key", testKey, "", "sb-acct", func(string) (outcome, api.Scope) { return allowed, "" }},
		{"account key inside its sandbox", testKey, "sb-acct", "sb-acct", func(k string) (outcome, api.Scope) {
			if slices.Contains(contractOutside, k) {
				return forbidden, ""
			}
			return allowed, ""
		}},
		{"account key inside another sandbox", testKey, "sb-cdef", "sb-acct", func(string) (outcome, api.Scope) { return forbidden, "" }},
		{"account key inside a sandbox of access none", testKey, "sb-cnone", "sb-cnone", func(string) (outcome, api.Scope) { return unauthorized, "" }},
		{"default token", tokDefault, "", "sb-tdef", func(k string) (outcome, api.Scope) {
			return scopedAs(k, api.DefaultScopes...)
		}},
		{"default token inside its sandbox", tokDefault, "sb-tdef", "sb-tdef", func(k string) (outcome, api.Scope) {
			if slices.Contains(contractOutside, k) {
				return forbidden, ""
			}
			return scopedAs(k, api.DefaultScopes...)
		}},
		{"exec token", tokExec, "", "sb-texec", func(k string) (outcome, api.Scope) { return scopedAs(k, api.ScopeExec) }},
		{"files token", tokFiles, "", "sb-tfiles", func(k string) (outcome, api.Scope) { return scopedAs(k, api.ScopeFiles) }},
		{"token of every scope", tokAll, "", "sb-tall", func(k string) (outcome, api.Scope) { return scopedAs(k, all...) }},
		{"token of every scope on another sandbox", tokAll, "", "sb-acct", func(string) (outcome, api.Scope) { return forbidden, "" }},
		{"default channel key", chanDefault, "sb-cdef", "sb-cdef", func(k string) (outcome, api.Scope) {
			if slices.Contains(contractOutside, k) {
				return forbidden, ""
			}
			return scopedAs(k, api.DefaultScopes...)
		}},
		{"channel key of access exec", chanExec, "sb-cexec", "sb-cexec", func(k string) (outcome, api.Scope) {
			if slices.Contains(contractOutside, k) {
				return forbidden, ""
			}
			return scopedAs(k, api.ScopeExec)
		}},
		{"channel key from the network", chanDefault, "", "sb-cdef", func(string) (outcome, api.Scope) { return unauthorized, "" }},
		{"channel key inside another sandbox", chanExec, "sb-cdef", "sb-cdef", func(string) (outcome, api.Scope) { return unauthorized, "" }},
		{"channel key of access none", chanNone, "sb-cnone", "sb-cnone", func(string) (outcome, api.Scope) { return unauthorized, "" }},
		{"no key", "", "", "sb-acct", func(string) (outcome, api.Scope) { return unauthorized, "" }},
	}
	for _, cred := range credentials {
		t.Run(cred.name, func(t *testing.T) {
			for _, r := range authTable {
				k := r.method + " " + r.path
				want, scope := cred.expect(k)
				if slices.Contains(contractPublic, k) {
					want, scope = allowed, ""
				}
				status, data := h.do(call{method: r.method, path: concrete(r.path, cred.on), key: cred.key, via: cred.via})
				got := allowed
				switch status {
				case http.StatusUnauthorized:
					got = unauthorized
				case http.StatusForbidden:
					got = forbidden
				}
				if got != want {
					t.Errorf("%s: %d %v, want outcome %d", k, status, data, want)
					continue
				}
				if got == allowed && data["code"] == "sandbox_not_found" {
					t.Errorf("%s: an allowed call did not find its sandbox: %v", k, data)
				}
				if gotScope, _ := data["scope"].(string); got == forbidden && gotScope != string(scope) {
					t.Errorf("%s: data.scope %q, want %q", k, gotScope, scope)
				}
			}
		})
	}
}

// TestAllowsPrecedence pins rule.allows's order of checks on principals
// that break several at once: the status alone (403) does not tell which
// refused them, each refusal's sentence does.
func TestAllowsPrecedence(t *testing.T) {
	tok := Principal{Kind: KindAccessToken, Sandbox: "sb-a", Scopes: api.DefaultScopes}
	acct := Principal{Kind: KindAccountKey}
	cases := []struct {
		name    string
		rt      rule
		p       Principal
		id, via string
		want    error
	}{
		{"outside, from inside, account key", accountOutside, acct, "", "sb-a", errFromInside},
		{"another sandbox, from inside, account key", account, acct, "sb-b", "sb-a", errViaChannel},
		{"account route, token", account, tok, "sb-a", "", errAccountOnly},
		{"account route, token of another sandbox", account, tok, "sb-b", "", errAccountOnly},
		{"scoped route, token of another sandbox", scoped(api.ScopeCheckpoints), tok, "sb-b", "", errNotItsOwn},
		{"scoped route, token lacking it", scoped(api.ScopeExec), tok, "sb-a", "", nil},
		{"scoped route, token with it", scoped(api.ScopeSnapshots), tok, "sb-a", "", nil},
	}
	for _, tc := range cases {
		err := tc.rt.allows(tc.p, tc.id, tc.via)
		switch {
		case tc.name == "scoped route, token lacking it":
			if err == nil || !strings.Contains(err.Error(), "exec") {
				t.Errorf("%s: %v, want the exec scope refused", tc.name, err)
			}
		case err != tc.want:
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// FuzzAllows holds rule.allows to its invariants over any principal,
// route and channel: a route that needs no key is allowed; from inside a
// sandbox, nothing outside and nothing on another sandbox; an account key
// is allowed only where its kind is and only its kind needs; a token or
// channel key only on its own sandbox, with the rule's scope.
func FuzzAllows(f *testing.F) {
	f.Add(uint8(0), uint8(0), uint8(0), "sb-a", "sb-a", "")
	f.Add(uint8(3), uint8(1), uint8(2), "sb-a", "sb-b", "sb-a")
	f.Fuzz(func(t *testing.T, ruleIdx, kindIdx, scopeBits uint8, sandboxID, id, via string) {
		rt := authTable[int(ruleIdx)%len(authTable)].rule
		kind := allKinds[int(kindIdx)%len(allKinds)].kind
		var scopes api.Scopes
		for i, s := range api.AllScopes {
			if scopeBits&(1<<i) != 0 {
				scopes = append(scopes, s)
			}
		}
		p := Principal{Kind: kind, Sandbox: sandboxID, Scopes: scopes}
		if kind == KindAccountKey {
			p.Sandbox, p.Scopes = "", nil
		}
		err := rt.allows(p, id, via)
		if rt.kinds == 0 {
			if err != nil {
				t.Fatalf("a public route refused: %v", err)
			}
			return
		}
		if err == nil {
			switch {
			case via != "" && rt.outside:
				t.Fatalf("an outside route allowed from inside %q", via)
			case via != "" && id != via:
				t.Fatalf("from inside %q, allowed on %q", via, id)
			case !rt.kinds.has(kind):
				t.Fatalf("%s allowed on a route of %v", kind, rt.kinds.list())
			case kind != KindAccountKey && (id != sandboxID || !scopes.Has(rt.scope)):
				t.Fatalf("%s of %q with %v allowed on %q needing %q", kind, sandboxID, scopes, id, rt.scope)
			}
		}
	})
}

// TestScopedCalls is the contract of issue 30 in calls: a default token
// can checkpoint and list snapshots but cannot exec, start a session,
// read or write a file (403 naming the scope); a token issued with exec
// can start a session; a token's scopes survive its rotation and are
// shown.
func TestScopedCalls(t *testing.T) {
	h := newAuthzHarness(t)
	h.machine("sb-vm", "")
	h.machine("sb-x", "")
	def := h.token("sb-vm")
	exec := h.token("sb-x", api.ScopeExec)
	for _, c := range []struct {
		name   string
		c      call
		status int
		scope  string
	}{
		{"default: checkpoint", call{method: "POST", path: "/v1/sandboxes/sb-vm/checkpoints", key: def, body: `{"path":"/workspace/project"}`}, 200, ""},
		{"default: list snapshots", call{method: "GET", path: "/v1/sandboxes/sb-vm/snapshots", key: def}, 409, ""}, // no machines here: passed authorization
		{"default: exec", call{method: "POST", path: "/v1/sandboxes/sb-vm/exec", key: def, body: `{"cmd":["id"]}`}, 403, "exec"},
		{"default: start a session", call{method: "POST", path: "/v1/sandboxes/sb-vm/sessions", key: def, body: `{"cmd":["sh"]}`}, 403, "exec"},
		{"default: read a file", call{method: "GET", path: "/v1/sandboxes/sb-vm/files/etc/shadow", key: def}, 403, "files"},
		{"default: write a file", call{method: "PUT", path: "/v1/sandboxes/sb-vm/files/root/.ssh/authorized_keys", key: def, body: "x", header: map[string]string{"Content-Type": "application/octet-stream"}}, 403, "files"},
		{"exec: start a session", call{method: "POST", path: "/v1/sandboxes/sb-x/sessions", key: exec, body: `{"cmd":["sh"]}`}, 201, ""},
		{"exec: checkpoint", call{method: "GET", path: "/v1/sandboxes/sb-x/checkpoints", key: exec}, 403, "checkpoints"},
		{"exec: as Bearer", call{method: "POST", path: "/v1/sandboxes/sb-x/sessions", body: `{"cmd":["sh"]}`, header: map[string]string{"Authorization": "Bearer " + exec}}, 201, ""},
	} {
		status, data := h.do(c.c)
		if status != c.status || c.scope != "" && data["scope"] != c.scope {
			t.Errorf("%s: %d %v, want %d (scope %q)", c.name, status, data, c.status, c.scope)
		}
	}
	var rotated struct {
		Token  string
		Scopes []string
	}
	status, data := h.do(call{method: "POST", path: "/v1/sandboxes/sb-x/access-token/rotate", key: testKey})
	b, _ := json.Marshal(data)
	json.Unmarshal(b, &rotated)
	if status != 200 || !slices.Equal(rotated.Scopes, []string{"exec"}) {
		t.Fatalf("rotate: %d %v", status, data)
	}
	if status, _ := h.do(call{method: "POST", path: "/v1/sandboxes/sb-x/sessions", key: rotated.Token, body: `{"cmd":["sh"]}`}); status != 201 {
		t.Errorf("the rotated token: %d, want 201", status)
	}
	if status, data := h.do(call{method: "GET", path: "/v1/sandboxes/sb-x/access-token", key: testKey}); status != 200 || fmt.Sprint(data["scopes"]) != "[exec]" {
		t.Errorf("show: %d %v", status, data)
	}
}
