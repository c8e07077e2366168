package vmm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadLine(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		max      int
		want     []string
		end      error
	}{
		{name: "lines", in: "{\"a\":1}\n{}\n", max: 100, want: []string{"{\"a\":1}\n", "{}\n"}},
		{name: "exactly the limit", in: "12345\n", max: 6, want: []string{"12345\n"}},
		{name: "one past the limit", in: "123456\n", max: 6, end: ErrQMPLineTooLong},
		{name: "endless line", in: strings.Repeat("x", 1<<16), max: 1000, end: ErrQMPLineTooLong},
		{name: "unterminated", in: "abc", max: 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A small buffer: lines longer than it take several reads.
			r := bufio.NewReaderSize(strings.NewReader(tc.in), 16)
			var got []string
			var err error
			for {
				var line []byte
				if line, err = readLine(r, tc.max); err != nil {
					break
				}
				got = append(got, string(line))
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("lines %q, want %q", got, tc.want)
			}
			if tc.end != nil && !errors.Is(err, tc.end) {
				t.Errorf("ended with %v, want %v", err, tc.end)
			}
		})
	}
}

// FuzzReadLine: readLine never returns more than its limit, every line it
// returns ends the first '\n' it saw, and the lines it returns are the
// input's own, in order.
func FuzzReadLine(f *testing.F) {
	f.Add([]byte("{\"return\": {}, \"id\": \"1\"}\n{\"event\":\"STOP\"}\n"), 8)
	f.Add(bytes.Repeat([]byte("x"), 100), 10)
	f.Fuzz(func(t *testing.T, in []byte, max int) {
		if max <= 0 || max > 1<<16 {
			return
		}
		r := bufio.NewReaderSize(bytes.NewReader(in), 16)
		var seen []byte
		for {
			line, err := readLine(r, max)
			if err != nil {
				break
			}
			if len(line) > max || len(line) == 0 || line[len(line)-1] != '\n' || bytes.IndexByte(line, '\n') != len(line)-1 {
				t.Fatalf("line %q (max %d)", line, max)
			}
			seen = append(seen, line...)
		}
		if !bytes.HasPrefix(in, seen) {
			t.Fatalf("lines %q are not the input's prefix", seen)
		}
	})
}

// FuzzParseMessage: any line either is skipped or gives a message; a
// reply's id, when there is one, is what the line said.
func FuzzParseMessage(f *testing.F) {
	f.Add([]byte(`{"return": {"running": true}, "id": "7"}`))
	f.Add([]byte(`{"error": {"class": "GenericError", "desc": "no"}, "id": "8"}`))
	f.Add([]byte(`{"event": "STOP", "data": {}, "timestamp": {"seconds": 1}}`))
	f.Add([]byte(`{"QMP": {"version": {}}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		m, ok := parseMessage(line)
		if !ok && (m.ID != nil || m.Event != "" || m.Error != nil) {
			t.Fatalf("a skipped line gave %+v", m)
		}
	})
}

// fakeMonitor serves a QMP greeting on a unix socket, then runs serve
// on the connection.
func fakeMonitor(t *testing.T, serve func(c net.Conn, r *bufio.Reader)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {"qemu": {"micro": 2, "minor": 0, "major": 10}}, "capabilities": []}}` + "\n"))
		r := bufio.NewReader(c)
		r.ReadBytes('\n') // qmp_capabilities
		c.Write([]byte(`{"return": {}, "id": "1"}` + "\n"))
		serve(c, r)
	}()
	return path
}

// TestQMPLineLimit: a monitor that sends an endless line is closed with
// ErrQMPLineTooLong once it passes MaxQMPLine; the waiting command ends
// with it rather than the line growing without bound.
func TestQMPLineLimit(t *testing.T) {
	path := fakeMonitor(t, func(c net.Conn, r *bufio.Reader) {
		r.ReadBytes('\n')
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for i := 0; i < 2*MaxQMPLine/len(chunk); i++ {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := DialQMP(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	_, err = q.Execute(ctx, "query-status", nil)
	if !errors.Is(err, ErrQMPLineTooLong) || !errors.Is(err, ErrQMPClosed) {
		t.Fatalf("Execute against an endless line: %v, want ErrQMPLineTooLong", err)
	}
	<-q.Done()
}

// TestQMPDefaultDeadline: a command whose ctx has no deadline gets
// QMPTimeout; one with a deadline keeps its own (a wedged monitor ends
// each call, never holds it forever).
func TestQMPDefaultDeadline(t *testing.T) {
	wedged := make(chan struct{})
	path := fakeMonitor(t, func(c net.Conn, r *bufio.Reader) { <-wedged })
	defer close(wedged)
	q, err := DialQMP(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx, cancel := withDefaultTimeout(context.Background())
	dl, ok := ctx.Deadline()
	cancel()
	if !ok || time.Until(dl) > QMPTimeout {
		t.Fatalf("default deadline %v, %v; want within %v", dl, ok, QMPTimeout)
	}
	own, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := q.Execute(own, "stop", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wedged monitor: %v, want the deadline", err)
	}
}
