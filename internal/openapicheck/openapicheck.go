// Package openapicheck holds HTTP exchanges to an OpenAPI document, for
// tests: hostproxy's (every request and answer its tests make) and the
// integration tests' (the routes that need a real guest: exec, sessions,
// files). It finds the operation of a request itself ({path} takes the
// rest of the URL, slashes included, which no OpenAPI router does) and
// validates with kin-openapi's openapi3filter.
package openapicheck

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
)

// Doc is a loaded, valid document and its operations.
type Doc struct {
	T   *openapi3.T
	ops []op
}

type op struct {
	re     *regexp.Regexp
	names  []string
	path   string
	method string
	item   *openapi3.PathItem
	op     *openapi3.Operation
}

// Load loads and validates an OpenAPI document.
func Load(data []byte) (*Doc, error) {
	t, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		return nil, err
	}
	if err := t.Validate(context.Background()); err != nil {
		return nil, err
	}
	d := &Doc{T: t}
	for path, item := range t.Paths.Map() {
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
		re := regexp.MustCompile("^" + strings.Join(segs, "/") + "$")
		for method, o := range item.Operations() {
			d.ops = append(d.ops, op{re: re, names: names, path: path, method: method, item: item, op: o})
		}
	}
	return d, nil
}

// Operations are the document's operations, as "METHOD /path".
func (d *Doc) Operations() []string {
	var out []string
	for _, o := range d.ops {
		out = append(out, o.method+" "+o.path)
	}
	return out
}

// Check holds one exchange to the document: the request, when it was
// answered as a success (a refused one may have been meant to be wrong),
// and the answer. A request no operation matches must have been answered
// 404 or 405 (the edge's answers to unknown routes and methods).
func (d *Doc) Check(req *http.Request, reqBody []byte, status int, header http.Header, body []byte) error {
	path := req.URL.Path
	// ".../files/" is the root, as ".../files" is.
	if strings.HasSuffix(path, "/files/") {
		path = strings.TrimSuffix(path, "/")
	}
	var match *op
	var params map[string]string
	for i := range d.ops {
		o := &d.ops[i]
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
		if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			return fmt.Errorf("no operation for %s %s, answered %d", req.Method, path, status)
		}
		return nil
	}
	r := req.Clone(context.Background())
	r.Body = io.NopCloser(bytes.NewReader(reqBody))
	in := &openapi3filter.RequestValidationInput{
		Request: r, PathParams: params,
		Route:   &routers.Route{Spec: d.T, Path: match.path, PathItem: match.item, Method: match.method, Operation: match.op},
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
	}
	if status < 400 {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			return fmt.Errorf("the request %s %s (answered %d) does not match %s: %w", req.Method, req.URL, status, match.path, err)
		}
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: status, Header: header,
		Body:    io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		return fmt.Errorf("the answer to %s %s (%d %.300s) does not match %s: %w", req.Method, req.URL, status, body, match.path, err)
	}
	return nil
}

// Transport checks every exchange it carries (bodies read whole: for
// tests) and reports each mismatch to fail.
type Transport struct {
	Doc  *Doc
	Base http.RoundTripper
	Fail func(error)
}

func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		reqBody = b
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(req)
	if err != nil || resp.StatusCode == http.StatusSwitchingProtocols {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err := t.Doc.Check(req, reqBody, resp.StatusCode, resp.Header, body); err != nil {
		t.Fail(err)
	}
	return resp, nil
}

// Match names the operation a request of method to path is, as
// "METHOD /template", or reports none.
func (d *Doc) Match(method, path string) (string, bool) {
	for _, o := range d.ops {
		if o.method == method && o.re.MatchString(path) {
			return o.method + " " + o.path, true
		}
	}
	return "", false
}
