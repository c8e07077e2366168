package hostproxy

import (
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/jsend"
)

// Files of a sandbox (api's files routes): the request and guestd's answer
// are streamed through, a buffer of fileBuffer bytes at a time, so a file
// of any size costs hostproxy that buffer; a guest's refusal (4xx) is
// read up to jsend.MaxFailBody and relayed as the same JSend fail when it
// is one of guestd's (guestFail), a 5xx is answered without the guest's
// text. The guest does not choose the answer's type: a file is always
// application/octet-stream, and every answer is sent with
// X-Content-Type-Options: nosniff (fileMedia), so that no file of a
// sandbox is ever taken for a page of the API's origin. A sandbox has at
// most maxTransfers under way at once, an account maxAccountTransfers;
// each holds a place of its guest's exec pool (holdStream) while it
// lasts.

const (
	fileBuffer          = 32 << 10
	maxTransfers        = 8
	maxAccountTransfers = 256
)

var (
	errTransferLimit        = fault.New(fault.Conflict, "transfer_limit", "the sandbox has as many file transfers under way as it may; wait for one to end").With("limit", maxTransfers)
	errAccountTransferLimit = fault.New(fault.Conflict, "transfer_limit", "the account has as many file transfers under way as it may; wait for one to end").With("limit", maxAccountTransfers)
)

// transfers counts the file transfers under way, by sandbox and by
// account.
type transfers struct {
	mu        sync.Mutex
	n         map[string]int
	byAccount map[string]int
}

func (t *transfers) take(account, id string) (func(), error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == nil {
		t.n, t.byAccount = map[string]int{}, map[string]int{}
	}
	switch {
	case t.n[id] >= maxTransfers:
		return nil, errTransferLimit
	case t.byAccount[account] >= maxAccountTransfers:
		return nil, errAccountTransferLimit
	}
	t.n[id]++
	t.byAccount[account]++
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.n[id]--; t.n[id] <= 0 {
			delete(t.n, id)
		}
		if t.byAccount[account]--; t.byAccount[account] <= 0 {
			delete(t.byAccount, account)
		}
	}, nil
}

// fileHeaders are the request headers passed on to guestd, and the
// answer headers passed back.
var (
	fileRequestHeaders = []string{"Content-Type", "Content-Length", api.HeaderFileMode, api.HeaderFileMtime, "Accept", "Range", "If-Range", "If-Modified-Since", "If-None-Match"}
	fileAnswerHeaders  = []string{"Content-Length", api.HeaderFileMode, api.HeaderFileMtime, "Last-Modified", "Accept-Ranges", "Content-Range"}
)

// fileMedia is the Content-Type of a files answer, of a fixed few
// whatever the guest says: a directory's listing and the answers of a
// write or a delete are JSend (application/json), a directory's tree is
// application/x-tar when the client asked for one (Accept), and anything
// else, a file's bytes first, is application/octet-stream.
func fileMedia(guestType string, r *http.Request) string {
	mt, _, _ := mime.ParseMediaType(guestType)
	switch {
	case mt == "application/json":
		return "application/json"
	case mt == api.MediaTar && r.Method != http.MethodPut && strings.Contains(r.Header.Get("Accept"), api.MediaTar):
		return api.MediaTar
	default:
		return api.MediaOctetStream
	}
}

// fileStatuses are the statuses of a files answer relayed from the guest
// below 400 (a file, a range of it, not modified, a range past its
// end); any other is errGuestAnswer.
var fileStatuses = map[int]bool{
	http.StatusOK: true, http.StatusPartialContent: true,
	http.StatusNotModified: true, http.StatusRequestedRangeNotSatisfiable: true,
}

// fileQuery is the query each method of the files route takes.
var fileQuery = map[string]string{http.MethodPut: "parents", http.MethodDelete: "recursive"}

// file serves GET, HEAD, PUT and DELETE of …/files/{path…}.
func (s *Server) file(c echo.Context) error {
	// Every answer of the route, a refusal too.
	c.Response().Header().Set("X-Content-Type-Options", "nosniff")
	sb, err := s.sessionRoute(c)
	if err != nil {
		return err
	}
	r := c.Request()
	// The path as the client meant it: decoded, whatever the router
	// matched on.
	rest := strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"+sb.ID+"/files")
	p, err := api.ParseEntryPath(strings.TrimPrefix(rest, "/"))
	if err != nil {
		return err
	}
	for k, v := range r.URL.Query() {
		if k != fileQuery[r.Method] || len(v) != 1 || (v[0] != "true" && v[0] != "false") {
			return jsend.InvalidField(k, "no such query parameter on this method (PUT takes parents=true, DELETE recursive=true)")
		}
	}
	release, err := s.transfers.take(sb.Account, sb.ID)
	if err != nil {
		return err
	}
	defer release()
	releaseStream, err := s.guests.holdStream(sb.Guest)
	if err != nil {
		return err
	}
	defer releaseStream()
	// A file may take longer to send, either way, than the server's
	// timeouts.
	rc := http.NewResponseController(c.Response().Writer)
	rc.SetReadDeadline(time.Time{})
	rc.SetWriteDeadline(time.Time{})

	segs := strings.Split(p, "/")
	for i, seg := range segs {
		segs[i] = url.PathEscape(seg)
	}
	guestPath := "/v1/files/" + strings.Join(segs, "/")
	if r.URL.RawQuery != "" {
		guestPath += "?" + r.URL.Query().Encode()
	}
	h := http.Header{}
	for _, k := range fileRequestHeaders {
		if v := r.Header.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	var body io.Reader
	if r.Method == http.MethodPut {
		body = r.Body
	}
	resp, err := s.guests.Stream(r.Context(), sb.Guest, r.Method, guestPath, h, body, r.ContentLength)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotModified || resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
		// A conditional GET's, or a range past the end: status and
		// headers (Content-Range: bytes */size).
		for _, k := range fileAnswerHeaders {
			if v := resp.Header.Get(k); v != "" && k != "Content-Length" {
				c.Response().Header().Set(k, v)
			}
		}
		c.Response().WriteHeader(resp.StatusCode)
		return nil
	}
	if resp.StatusCode >= 400 && r.Method == http.MethodHead {
		// A HEAD's refusal is its status alone: one that a fail of
		// guestd's has.
		status := http.StatusBadGateway
		switch k, ok := jsend.KindForStatus(resp.StatusCode); {
		case resp.StatusCode >= 500:
			status = http.StatusInternalServerError
		case ok && guestFailKinds[k]:
			status = resp.StatusCode
		}
		c.Response().WriteHeader(status)
		return nil
	}
	if resp.StatusCode >= 400 && resp.StatusCode < 500 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, jsend.MaxFailBody+1))
		return guestFail(sb.Guest, resp.StatusCode, raw)
	}
	if resp.StatusCode >= 500 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, jsend.MaxFailBody))
		cause := fmt.Errorf("guest %s answered %d to a files call: %q", sb.Guest, resp.StatusCode, head(raw, 500))
		if fe := guest5xx[resp.StatusCode]; fe != nil {
			return fe.Wrap(cause)
		}
		return cause
	}
	if !fileStatuses[resp.StatusCode] {
		return errGuestAnswer.Wrap(fmt.Errorf("guest %s answered %d to a files call", sb.Guest, resp.StatusCode))
	}
	out := c.Response()
	for _, k := range fileAnswerHeaders {
		if v := resp.Header.Get(k); v != "" {
			out.Header().Set(k, v)
		}
	}
	out.Header().Set("Content-Type", fileMedia(resp.Header.Get("Content-Type"), r))
	out.WriteHeader(resp.StatusCode)
	if r.Method == http.MethodHead {
		return nil
	}
	if _, err := io.CopyBuffer(out, resp.Body, make([]byte, fileBuffer)); err != nil {
		// Cut: the client must see a broken answer, not a short one
		// that ends cleanly (a tar ends cleanly at any entry).
		panic(http.ErrAbortHandler)
	}
	return nil
}

// Stream sends one request to guestd whose body and answer are streamed
// (a file): through the guest's exec client, the answer's header bounded
// as every call's and due within the request timeout of the request's end
// (503 guest_timeout), the body the caller's to read and close. It ends
// with ctx.
func (g *GuestClient) Stream(ctx context.Context, guest, method, path string, h http.Header, body io.Reader, length int64) (*http.Response, error) {
	c, err := g.client(guest, poolExec)
	if err != nil {
		return nil, fmt.Errorf("guest %s: %w", guest, err)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://guestd"+path, body)
	if err != nil {
		return nil, err
	}
	req.Header = h
	if body != nil {
		req.ContentLength = length
		if length < 0 {
			req.ContentLength = -1
		}
	}
	if id, ok := ctx.Value(requestIDKey{}).(string); ok {
		req.Header.Set(jsend.HeaderRequestID, id)
	}
	resp, err := c.StreamClient(g.requestTimeout).Do(req)
	if err != nil {
		return nil, g.transportError(ctx, guest, err)
	}
	return resp, nil
}
