package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFromEnv: the environment first, then the credentials file.
func TestFromEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), "credentials.env")
	os.WriteFile(file, []byte("CREATEOS_API_URL='http://10.0.0.1:8080'\nCREATEOS_API_KEY='tok_from_file'\nCREATEOS_SANDBOX_ID='sb-x'\n"), 0o600)
	t.Setenv(EnvCredentials, file)
	t.Setenv(EnvAPIURL, "")
	t.Setenv(EnvAPIKey, "")
	c, err := FromEnv()
	if err != nil || c.BaseURL != "http://10.0.0.1:8080" || c.Key != "tok_from_file" {
		t.Fatalf("from the file: %+v, %v", c, err)
	}
	t.Setenv(EnvAPIKey, "sk_env")
	if c, err := FromEnv(); err != nil || c.Key != "sk_env" {
		t.Fatalf("the environment first: %+v, %v", c, err)
	}
	t.Setenv(EnvCredentials, filepath.Join(t.TempDir(), "none"))
	t.Setenv(EnvAPIURL, "")
	if _, err := FromEnv(); err == nil {
		t.Fatal("no address anywhere: no error")
	}
}

// TestErrors: a fail answer is an *Error with its code, message, status
// and fields; an error answer keeps its code when it has one; 201 and 202
// are successes.
func TestErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/fail":
			w.WriteHeader(409)
			w.Write([]byte(`{"status":"fail","data":{"code":"session_limit","message":"too many","limit":64}}`))
		case "/error":
			w.WriteHeader(503)
			w.Write([]byte(`{"status":"error","message":"down","data":{"code":"host_capacity"}}`))
		case "/created":
			w.WriteHeader(201)
			w.Write([]byte(`{"status":"success","data":{"id":"se-1"}}`))
		}
	}))
	defer srv.Close()
	c := New(srv.URL, "k")
	ctx := context.Background()
	_, err := c.Call(ctx, "GET", "/fail", nil, nil)
	var e *Error
	if !errors.As(err, &e) || e.Code != "session_limit" || e.Status != 409 || e.Message != "too many" || string(e.Fields["limit"]) != "64" {
		t.Fatalf("fail: %#v", err)
	}
	if _, err := c.Call(ctx, "GET", "/error", nil, nil); !errors.As(err, &e) || e.Code != "host_capacity" || e.Status != 503 {
		t.Fatalf("error: %#v", err)
	}
	var v struct{ ID string }
	if _, err := c.Call(ctx, "POST", "/created", nil, &v); err != nil || v.ID != "se-1" {
		t.Fatalf("201: %v %+v", err, v)
	}
}

// TestKeyAndBodies: the key goes in X-Api-Key, or as Authorization:
// Bearer with Bearer set, on every kind of call; IssueToken sends its
// scopes (nothing for the default), SetAccess its setting as the body.
func TestKeyAndBodies(t *testing.T) {
	type seen struct{ apiKey, auth, body string }
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, seen{r.Header.Get("X-Api-Key"), r.Header.Get("Authorization"), string(b)})
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"success","data":{}}`))
	}))
	defer srv.Close()
	ctx := context.Background()
	c := New(srv.URL, "sk_k")
	c.IssueToken(ctx, "sb-a", nil)
	c.IssueToken(ctx, "sb-a", []Scope{"exec", "files"})
	c.SetAccess(ctx, "sb-a", Access{None: true})
	c.SetAccess(ctx, "sb-a", Access{Scopes: []Scope{"checkpoints"}})
	c.Bearer = true
	c.GetSandbox(ctx, "sb-a")
	if r, err := c.Stream(ctx, http.MethodGet, FilesPath("sb-a", "/a"), nil, nil, 0); err == nil {
		r.Body.Close()
	}
	want := []seen{
		{"sk_k", "", ""},
		{"sk_k", "", `{"scopes":["exec","files"]}`},
		{"sk_k", "", `"none"`},
		{"sk_k", "", `{"scopes":["checkpoints"]}`},
		{"", "Bearer sk_k", ""},
		{"", "Bearer sk_k", ""},
	}
	if !slices.Equal(got, want) {
		t.Errorf("requests\n got %q\nwant %q", got, want)
	}
}

// TestRawAndShapes: a call returns its value and an error, and Raw(&raw)
// keeps the data as sent (with a field the type lacks); a failed call
// leaves raw alone and carries the answer on the *Error. A list sends its
// labels as label=k=v, sorted; Fork sends from (without the sandbox for
// a ref) and the name; SetLabels sends {} for none.
func TestRawAndShapes(t *testing.T) {
	var requests []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		requests = append(requests, r.Method+" "+r.URL.RequestURI()+" "+string(b))
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.URL.Path, "gone") {
			w.WriteHeader(404)
			w.Write([]byte(`{"status":"fail","data":{"code":"sandbox_not_found","message":"no such sandbox"}}`))
			return
		}
		w.Write([]byte(`{"status":"success","data":{"id":"sb-1","name":"scratch","labels":{},"future":1}}`))
	}))
	defer srv.Close()
	ctx := context.Background()
	c := New(srv.URL, "sk_k")

	var raw json.RawMessage
	sb, err := c.GetSandbox(ctx, "scratch", Raw(&raw))
	if err != nil || sb.ID != "sb-1" || !strings.Contains(string(raw), `"future":1`) {
		t.Fatalf("get: %+v %v %s", sb, err, raw)
	}
	raw = json.RawMessage("untouched")
	_, err = c.GetSandbox(ctx, "gone", Raw(&raw))
	var e *Error
	if !errors.As(err, &e) || e.Code != "sandbox_not_found" || !strings.Contains(string(e.Body), "no such sandbox") || string(raw) != "untouched" {
		t.Fatalf("a refusal: %v, raw %s", err, raw)
	}
	requests = nil
	n := 2
	c.ListSandboxes(ctx, ListOptions{Limit: &n, Labels: map[string]string{"tier": "a b", "owner": "docs"}})
	c.Fork(ctx, "", "sn-0123456789abcdefghijklmn", "")
	c.Fork(ctx, "scratch", "v1", "scratch-2")
	c.SetLabels(ctx, "scratch", nil)
	want := []string{
		"GET /v1/sandboxes?label=owner%3Ddocs&label=tier%3Da+b&limit=2 ",
		`POST /v1/sandboxes {"from":{"snapshot":"sn-0123456789abcdefghijklmn"}}`,
		`POST /v1/sandboxes {"name":"scratch-2","from":{"sandbox":"scratch","snapshot":"v1"}}`,
		`PUT /v1/sandboxes/scratch/labels {}`,
	}
	if !slices.Equal(requests, want) {
		t.Errorf("requests\n got %q\nwant %q", requests, want)
	}
}
