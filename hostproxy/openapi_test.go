package hostproxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"strata/hostproxy"
)

// The OpenAPI document, loaded once, and its operations as regular
// expressions of their paths ({path} takes the rest, slashes included).
var (
	specOnce sync.Once
	spec     *openapi3.T
	specErr  error
	specOps  []specOp
)

type specOp struct {
	re     *regexp.Regexp
	names  []string
	path   string
	method string
	item   *openapi3.PathItem
	op     *openapi3.Operation
}

func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	specOnce.Do(func() {
		l := openapi3.NewLoader()
		spec, specErr = l.LoadFromData(hostproxy.OpenAPI)
		if specErr != nil {
			return
		}
		if specErr = spec.Validate(context.Background()); specErr != nil {
			return
		}
		for path, item := range spec.Paths.Map() {
			var names []string
			segs := strings.Split(path, "/")
			for i, seg := range segs {
				switch {
				case seg == "{path}":
					names, segs[i] = append(names, "path"), "(.+)"
				case strings.HasPrefix(seg, "{"):
					names, segs[i] = append(names, strings.Trim(seg, "{}")), "([^/]+)"
				default:
					segs[i] = regexp.QuoteMeta(seg)
				}
			}
			pat := strings.Join(segs, "/")
			for method, op := range item.Operations() {
				specOps = append(specOps, specOp{re: regexp.MustCompile("^" + pat + "$"), names: names, path: path, method: method, item: item, op: op})
			}
		}
	})
	if specErr != nil {
		t.Fatalf("openapi.json: %v", specErr)
	}
	return spec
}

// checkOpenAPI holds one exchange of a test to the document: the request
// (when it was answered as a success: a refused one was meant to be
// wrong) and the answer, status, headers and body.
func checkOpenAPI(t *testing.T, req *http.Request, reqBody []byte, rep reply) {
	t.Helper()
	doc := loadSpec(t)
	// ".../files/" is the root, as ".../files" is.
	path := req.URL.Path
	if strings.HasSuffix(path, "/files/") {
		path = strings.TrimSuffix(path, "/")
	}
	var match *specOp
	var params map[string]string
	for i := range specOps {
		o := &specOps[i]
		if o.method != req.Method {
			continue
		}
		if m := o.re.FindStringSubmatch(path); m != nil {
			if match != nil && len(o.names) >= len(match.names) {
				continue // the most literal path wins
			}
			match, params = o, map[string]string{}
			for j, n := range o.names {
				params[n] = m[j+1]
			}
		}
	}
	if match == nil {
		// No operation: the edge's own answers to unknown routes and
		// methods.
		if rep.status != http.StatusNotFound && rep.status != http.StatusMethodNotAllowed {
			t.Errorf("openapi.json has no operation for %s %s, answered %d", req.Method, path, rep.status)
		}
		return
	}
	r := req.Clone(context.Background())
	r.Body = io.NopCloser(bytes.NewReader(reqBody))
	in := &openapi3filter.RequestValidationInput{
		Request: r, PathParams: params,
		Route:   &routers.Route{Spec: doc, Path: match.path, PathItem: match.item, Method: match.method, Operation: match.op},
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
	}
	if rep.status < 400 {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			t.Errorf("openapi.json: the request %s %s (answered %d) does not match %s: %v", req.Method, req.URL, rep.status, match.path, err)
		}
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: rep.status, Header: rep.header,
		Body:    io.NopCloser(bytes.NewReader(rep.body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Errorf("openapi.json: the answer to %s %s (%d %.300s) does not match %s: %v", req.Method, req.URL, rep.status, rep.body, match.path, err)
	}
}

// TestOpenAPIRoutes: every route of the router is an operation of the
// document, and every operation a route; the document is served at
// /v1/openapi.json with no key.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadSpec(t)
	s := startStack(t, nil)
	var routes []string
	for _, r := range s.srv.Routes() {
		p := regexp.MustCompile(`:([a-z]+)`).ReplaceAllString(r, "{$1}")
		p = strings.Replace(p, "*", "{path}", 1)
		routes = append(routes, p)
	}
	var ops []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			ops = append(ops, method+" "+path)
		}
	}
	slices.Sort(routes)
	routes = slices.Compact(routes)
	slices.Sort(ops)
	for _, r := range routes {
		if !slices.Contains(ops, r) {
			t.Errorf("route %s is not in openapi.json", r)
		}
	}
	for _, o := range ops {
		if !slices.Contains(routes, o) {
			t.Errorf("openapi.json has %s, which no route serves", o)
		}
	}
	rep := s.do(request{method: "GET", path: "/v1/openapi.json"})
	if rep.status != 200 || !bytes.Equal(rep.body, hostproxy.OpenAPI) {
		t.Fatalf("GET /v1/openapi.json: %d, %d bytes", rep.status, len(rep.body))
	}
}
