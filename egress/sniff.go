package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// SniffBytes is the most Sniff reads for a name: a TLS ClientHello with
// large extensions (post-quantum key shares) fits, and so does an HTTP
// request head of ordinary size.
const SniffBytes = 16 << 10

// SniffTimeout is how long a connection that needs a name may take to
// send the bytes that carry it. A read that passes its deadline is an
// error of Sniff's, never "no name": a guest that sends a request's
// first bytes and waits is refused, not carried without its name.
const SniffTimeout = 10 * time.Second

// Sniff reads the start of a connection for the name it carries: the
// server name (SNI) of a TLS ClientHello, or the host of an HTTP
// request's Host header without its port. It returns the name ("" when
// the connection carries none: another protocol, TLS without SNI) and the
// bytes it read, which the caller sends on before anything else. It
// reads at most SniffBytes; an error is one of reading.
func Sniff(r io.Reader) (name string, read []byte, err error) {
	var buf bytes.Buffer
	tee := io.TeeReader(io.LimitReader(r, SniffBytes), &buf)
	first := make([]byte, 1)
	if _, err := io.ReadFull(tee, first); err != nil {
		return "", buf.Bytes(), err
	}
	rest := io.MultiReader(bytes.NewReader(first), tee)
	switch c := first[0]; {
	case c == 0x16: // a TLS handshake record
		name, err = sniffTLS(rest)
	case c >= 'A' && c <= 'Z': // an HTTP method
		name, err = sniffHTTP(rest)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) && buf.Len() >= SniffBytes {
		err = nil // too long to carry a name we read: none
	}
	return name, buf.Bytes(), err
}

// sniffHTTP reads an HTTP request head from r and returns its host.
func sniffHTTP(r io.Reader) (string, error) {
	// net/textproto reports a line cut short by a failed read as a
	// malformed header: the read's own error is kept apart.
	er := &errReader{r: r}
	req, err := http.ReadRequest(bufio.NewReaderSize(er, 4096))
	if err != nil {
		if er.err != nil {
			err = er.err
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || timeout(err) {
			return "", err
		}
		return "", nil // not HTTP: no name
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(host, "."), nil
}

// errReader is a reader that keeps its first error.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(b []byte) (int, error) {
	n, err := e.r.Read(b)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// errSniffed ends a handshake once the ClientHello is read.
var errSniffed = errors.New("egress: client hello read")

// sniffTLS reads a TLS ClientHello from r and returns its server name.
// crypto/tls parses it: the server side of a handshake that ends as soon
// as the hello is in.
func sniffTLS(r io.Reader) (string, error) {
	var name string
	conn := tls.Server(readOnlyConn{r}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name = h.ServerName
			return nil, errSniffed
		},
	})
	err := conn.Handshake()
	switch {
	case errors.Is(err, errSniffed):
		return name, nil
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "", io.ErrUnexpectedEOF
	case timeout(err):
		return "", err
	}
	return "", nil // not a ClientHello crypto/tls reads: no name
}

// readOnlyConn is a net.Conn that reads from a reader and writes nothing
// (a handshake's alerts are dropped).
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(b []byte) (int, error)     { return c.r.Read(b) }
func (readOnlyConn) Write(b []byte) (int, error)      { return len(b), nil }
func (readOnlyConn) Close() error                     { return nil }
func (readOnlyConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (readOnlyConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (readOnlyConn) SetWriteDeadline(time.Time) error { return nil }
