package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"strata/internal/api"
)

// FilesPath is the API path of guest path p (absolute) in sandbox: the
// files route itself for the root.
func FilesPath(sandbox, p string) string {
	if strings.Trim(p, "/") == "" {
		return SandboxPath(sandbox, "files")
	}
	segs := strings.Split(strings.Trim(p, "/"), "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return SandboxPath(sandbox, "files") + "/" + strings.Join(segs, "/")
}

// Stream sends one request whose body and answer stream (the files
// routes): the answer when it is a success, the caller's to close; a
// refusal is an *Error. It has no timeout of its own: ctx ends it.
func (c *Client) Stream(ctx context.Context, method, p string, h http.Header, body io.Reader, length int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.BaseURL, "/")+p, body)
	if err != nil {
		return nil, err
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	c.setKey(req.Header)
	if body != nil {
		req.ContentLength = length
	}
	// No timeout: a file takes what it takes; ctx ends it.
	resp, err := (&http.Client{Transport: c.transport()}).Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 && method == http.MethodHead {
		resp.Body.Close()
		return nil, &Error{Status: resp.StatusCode, Code: "unknown", Message: fmt.Sprintf("HEAD %s: HTTP %d", p, resp.StatusCode)}
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_, err := parseAnswer(method, p, resp, raw, nil)
		if err == nil {
			err = fmt.Errorf("%s %s: HTTP %d", method, p, resp.StatusCode)
		}
		return nil, err
	}
	return resp, nil
}

// Stat is what guest path p is: "file", "dir", or "" when it does not
// exist.
func (c *Client) Stat(ctx context.Context, sandbox, p string) (string, error) {
	resp, err := c.Stream(ctx, http.MethodHead, FilesPath(sandbox, p), nil, nil, 0)
	if err != nil {
		var apiErr *Error
		if errors.As(err, &apiErr) && apiErr.Code == api.CodeFileNotFound {
			return "", nil
		}
		if errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound && apiErr.Code == "unknown" {
			return "", nil // a HEAD's refusal has no body
		}
		return "", err
	}
	resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), api.MediaOctetStream) {
		return "file", nil
	}
	return "dir", nil
}

// FileOptions are the optional parts of WriteFile: the mode (0644 when
// zero), the modification time (the write's when zero), and whether
// missing parent directories are made.
type FileOptions struct {
	Mode    fs.FileMode
	Mtime   time.Time
	Parents bool
}

// WriteFile streams r (size bytes, or -1 when unknown) into the file at
// guest path p, created or replaced whole.
func (c *Client) WriteFile(ctx context.Context, sandbox, p string, r io.Reader, size int64, o FileOptions) (api.FileWritten, error) {
	h := http.Header{"Content-Type": {api.MediaOctetStream}}
	if o.Mode != 0 {
		h.Set(api.HeaderFileMode, api.FormatFileMode(uint32(o.Mode.Perm())))
	}
	if !o.Mtime.IsZero() {
		h.Set(api.HeaderFileMtime, o.Mtime.UTC().Format(time.RFC3339Nano))
	}
	path := FilesPath(sandbox, p)
	if o.Parents {
		path += "?parents=true"
	}
	return c.writeBody(ctx, path, h, r, size)
}

// WriteTar streams the tar r into the directory at guest path dir.
func (c *Client) WriteTar(ctx context.Context, sandbox, dir string, r io.Reader, parents bool) (api.FileWritten, error) {
	path := FilesPath(sandbox, dir)
	if parents {
		path += "?parents=true"
	}
	return c.writeBody(ctx, path, http.Header{"Content-Type": {api.MediaTar}}, r, -1)
}

func (c *Client) writeBody(ctx context.Context, path string, h http.Header, r io.Reader, size int64) (api.FileWritten, error) {
	resp, err := c.Stream(ctx, http.MethodPut, path, h, r, size)
	if err != nil {
		return api.FileWritten{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return api.FileWritten{}, err
	}
	var w api.FileWritten
	_, err = parseAnswer(http.MethodPut, path, resp, raw, &w)
	return w, err
}

// ReadFile streams the file at guest path p: its bytes, to close, with
// its mode and modification time.
func (c *Client) ReadFile(ctx context.Context, sandbox, p string) (io.ReadCloser, fs.FileMode, time.Time, error) {
	resp, err := c.Stream(ctx, http.MethodGet, FilesPath(sandbox, p), nil, nil, 0)
	if err != nil {
		return nil, 0, time.Time{}, err
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), api.MediaOctetStream) {
		resp.Body.Close()
		return nil, 0, time.Time{}, api.ErrNotAFile.With("path", p)
	}
	mode, _ := api.ParseFileMode(resp.Header.Get(api.HeaderFileMode), 0o644)
	mtime, _ := api.ParseFileMtime(resp.Header.Get(api.HeaderFileMtime))
	return resp.Body, fs.FileMode(mode & 0o777), mtime, nil
}

// ReadTar streams the tree under the guest directory dir as a tar, to
// close.
func (c *Client) ReadTar(ctx context.Context, sandbox, dir string) (io.ReadCloser, error) {
	resp, err := c.Stream(ctx, http.MethodGet, FilesPath(sandbox, dir), http.Header{"Accept": {api.MediaTar}}, nil, 0)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ListDir lists the guest directory dir.
func (c *Client) ListDir(ctx context.Context, sandbox, dir string, opts ...CallOption) (api.FileListing, error) {
	var l api.FileListing
	err := c.call(ctx, http.MethodGet, FilesPath(sandbox, dir), nil, nil, &l, opts)
	return l, err
}

// RemoveFile removes a file or an empty directory; with recursive a
// whole tree.
func (c *Client) RemoveFile(ctx context.Context, sandbox, p string, recursive bool) error {
	path := FilesPath(sandbox, p)
	if recursive {
		path += "?recursive=true"
	}
	_, err := c.Call(ctx, http.MethodDelete, path, nil, nil)
	return err
}
