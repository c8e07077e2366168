package channel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"time"
)

// The handshake that starts every session. A virtio-serial port does not
// always tell the guest that its host end changed: after a memory
// snapshot is loaded into a new QEMU, the guest's session is the one it
// had with the old host, mid-stream, and a new host's yamux frames would
// land in it (a stream id it still has open ends it only when that id
// comes up). So the host first sends HELLO lines with a fresh nonce until
// the guest answers READY with that nonce, then GO; the guest starts its
// yamux server only after GO, the host its client only after READY.
// Anything else either end reads before (a stale session's frames, extra
// HELLOs) is skipped; a stale guest session that reads a HELLO fails
// yamux's framing, ends, and its port is opened again.
const (
	helloLine = "STRATA-CHANNEL HELLO "
	readyLine = "STRATA-CHANNEL READY "
	goLine    = "STRATA-CHANNEL GO "
	// helloEvery is how often the host says HELLO until it is answered:
	// the first one may land in a stale session, which it ends, and the
	// guest's next session starts from the next one.
	helloEvery = 25 * time.Millisecond
	// maxLine bounds a handshake line; longer runs of bytes are skipped.
	maxLine = 128
)

func newNonce() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// hostHandshake runs the host's side on conn and returns the conn for the
// session (with any bytes read past READY still to be read).
func hostHandshake(ctx context.Context, conn net.Conn) (io.ReadWriteCloser, error) {
	nonce := newNonce()
	hello := []byte(helloLine + nonce + "\n")
	ready := []byte(readyLine + nonce + "\n")
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	var seen []byte
	buf := make([]byte, 4096)
	for {
		// A guest whose port is closed reads nothing: HELLOs wait in the
		// socket, and a full socket is no error, only a wait.
		conn.SetWriteDeadline(time.Now().Add(helloEvery))
		if _, err := conn.Write(hello); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, err
		}
		conn.SetReadDeadline(time.Now().Add(helloEvery))
		for {
			n, err := conn.Read(buf)
			seen = append(seen, buf[:n]...)
			if i := bytes.Index(seen, ready); i >= 0 {
				conn.SetDeadline(time.Time{})
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				if _, err := conn.Write([]byte(goLine + nonce + "\n")); err != nil {
					return nil, err
				}
				return &prefixed{Reader: io.MultiReader(bytes.NewReader(seen[i+len(ready):]), conn), conn: conn}, nil
			}
			if len(seen) > len(ready) {
				seen = seen[len(seen)-len(ready):]
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				break
			}
			if err != nil {
				return nil, err
			}
		}
	}
}

// guestHandshake runs the guest's side on the port: it waits for a HELLO,
// answers READY, and waits for the GO of the same nonce (a new HELLO
// meanwhile, from a host that dialled again, starts over with it).
func guestHandshake(port io.ReadWriteCloser) (io.ReadWriteCloser, error) {
	r := bufio.NewReaderSize(port, 4096)
	nonce := ""
	for {
		line, err := readLine(r)
		if err != nil {
			return nil, err
		}
		if n, ok := bytes.CutPrefix(line, []byte(helloLine)); ok && validNonce(n) {
			// Once per nonce: the host reads no further than the first
			// READY, and what follows it is the session's.
			if string(n) != nonce {
				nonce = string(n)
				if _, err := port.Write([]byte(readyLine + nonce + "\n")); err != nil {
					return nil, err
				}
			}
			continue
		}
		if n, ok := bytes.CutPrefix(line, []byte(goLine)); ok && nonce != "" && string(n) == nonce {
			return &prefixed{Reader: r, conn: port}, nil
		}
	}
}

// readLine returns the next line without its newline, skipping lines
// longer than maxLine.
func readLine(r *bufio.Reader) ([]byte, error) {
	long := false
	for {
		line, err := r.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			long = true
			continue
		case err != nil:
			return nil, err
		case long || len(line) > maxLine:
			long = false
			continue
		}
		return bytes.TrimSuffix(line, []byte("\n")), nil
	}
}

func validNonce(b []byte) bool {
	if len(b) != 16 {
		return false
	}
	_, err := hex.DecodeString(string(b))
	return err == nil
}

// prefixed is a connection whose first bytes were already read into
// Reader.
type prefixed struct {
	io.Reader
	conn io.ReadWriteCloser
}

func (p *prefixed) Write(b []byte) (int, error) { return p.conn.Write(b) }
func (p *prefixed) Close() error                { return p.conn.Close() }
