package hostproxy_test

import (
	"bytes"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"strata/hostproxy"
	"strata/internal/openapicheck"
)

var (
	specOnce sync.Once
	spec     *openapicheck.Doc
	specErr  error
)

// loadSpec is openapi.json, loaded once.
func loadSpec(t *testing.T) *openapicheck.Doc {
	t.Helper()
	specOnce.Do(func() { spec, specErr = openapicheck.Load(hostproxy.OpenAPI) })
	if specErr != nil {
		t.Fatalf("openapi.json: %v", specErr)
	}
	return spec
}

// checkOpenAPI holds one exchange of a test to openapi.json.
func checkOpenAPI(t *testing.T, req *http.Request, reqBody []byte, rep reply) {
	t.Helper()
	if err := loadSpec(t).Check(req, reqBody, rep.status, rep.header, rep.body); err != nil {
		t.Errorf("openapi.json: %v", err)
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
	ops := doc.Operations()
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
