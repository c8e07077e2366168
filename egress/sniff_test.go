package egress

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"os"
	"testing"
)

// clientHello is the first flight of a TLS client to serverName.
func clientHello(t testing.TB, serverName string) []byte {
	a, b := net.Pipe()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
		c.Handshake()
	}()
	var buf bytes.Buffer
	tmp := make([]byte, 16<<10)
	k, _ := b.Read(tmp)
	buf.Write(tmp[:k])
	a.Close()
	b.Close()
	return buf.Bytes()
}

func TestSniff(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		err            bool
	}{
		{name: "http", in: "GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", want: "pypi.org"},
		{name: "http port", in: "POST /x HTTP/1.1\r\nHost: a.b.c:8080\r\nContent-Length: 3\r\n\r\nabc", want: "a.b.c"},
		{name: "http trailing dot", in: "GET / HTTP/1.1\r\nHost: pypi.org.\r\n\r\n", want: "pypi.org"},
		{name: "http no host", in: "GET / HTTP/1.0\r\n\r\n", want: ""},
		{name: "http address", in: "GET / HTTP/1.1\r\nHost: 10.1.2.3:80\r\n\r\n", want: "10.1.2.3"},
		{name: "http cut short", in: "GET / HTTP/1.1\r\nHost: pyp", err: true},
		{name: "ssh", in: "SSH-2.0-OpenSSH_9.2\r\n", want: ""},
		{name: "binary", in: "\x00\x01\x02", want: ""},
		{name: "tls", in: string(clientHello(t, "github.com")), want: "github.com"},
		{name: "tls no sni", in: string(clientHello(t, "")), want: ""},
		{name: "tls cut short", in: string(clientHello(t, "github.com")[:40]), err: true},
		{name: "empty", in: "", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, read, err := Sniff(bytes.NewReader([]byte(tc.in)))
			if (err != nil) != tc.err || name != tc.want {
				t.Fatalf("Sniff: %q, %v; want %q, error %v", name, err, tc.want, tc.err)
			}
			if !bytes.HasPrefix([]byte(tc.in), read) {
				t.Fatalf("read %q: not a prefix of the input", read)
			}
		})
	}
}

// TestSniffTimeout: a read's deadline passing halfway through a request
// or a ClientHello is Sniff's error, not "no name".
func TestSniffTimeout(t *testing.T) {
	for name, start := range map[string][]byte{
		"http": []byte("GET / HTTP/1.1\r\nHo"),
		"tls":  clientHello(t, "github.com")[:40],
	} {
		_, _, err := Sniff(io.MultiReader(bytes.NewReader(start), stalled{}))
		if !timeout(err) {
			t.Errorf("%s cut short by a deadline: %v, want the time-out", name, err)
		}
	}
}

// stalled is a reader whose deadline has passed.
type stalled struct{}

func (stalled) Read([]byte) (int, error) { return 0, os.ErrDeadlineExceeded }

// TestSniffBound: a stream that never ends is read no further than
// SniffBytes.
func TestSniffBound(t *testing.T) {
	head := "GET / HTTP/1.1\r\nX: "
	r := io.MultiReader(bytes.NewReader([]byte(head)), infinite{})
	name, read, _ := Sniff(r)
	if name != "" || len(read) > SniffBytes {
		t.Fatalf("Sniff of an endless head: %q, %d bytes read", name, len(read))
	}
}

type infinite struct{}

func (infinite) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = 'a'
	}
	return len(b), nil
}

func FuzzSniff(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n"))
	f.Add(clientHello(f, "github.com"))
	f.Add([]byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		name, read, _ := Sniff(bytes.NewReader(b))
		if !bytes.HasPrefix(b, read) || len(read) > SniffBytes {
			t.Fatalf("read %d bytes, not a bounded prefix of the input", len(read))
		}
		if len(name) > len(b) {
			t.Fatalf("name %q longer than the input", name)
		}
	})
}
