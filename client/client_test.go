package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
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
