// Command hostileguest is the attacker of the hostile-guest suite
// (integration/vm_hostile_test.go): copied into a sandbox and run there as
// root, it takes the channel's port from guestd (it kills guestd and opens
// the port before guestinit starts guestd again) and speaks to the host
// as a guest that wants to hurt it:
//
//	hostileguest ping SECONDS      yamux pings, as fast as the port takes them
//	hostileguest garbage SECONDS   random bytes, no handshake
//	hostileguest reopen SECONDS    the port opened and closed in a loop
//	hostileguest headers SECONDS   a guestd whose every answer is an endless header
//	hostileguest body SECONDS      a guestd whose every answer claims 1 GiB and sends it
//
// After SECONDS it exits and guestd gets its port back. It waits a second
// before it starts, so that the exec that started it is answered first.
// It is a test's tool: it is built by the test and never shipped.
package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"strata/channel"
	"strata/vmm"
)

// begun is when the attacker started: every line it prints says the
// seconds since, to be read beside the host's log.
var begun = time.Now()

// read and hellos count what the handshake saw of the host, for the line
// that says why an attack never got its session.
var read, hellos atomic.Int64

// say prints one line of the attacker's log.
func say(a ...any) {
	fmt.Printf("%.3fs %s\n", time.Since(begun).Seconds(), strings.TrimSuffix(fmt.Sprintln(a...), "\n"))
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: hostileguest ping|garbage|reopen|headers|body SECONDS")
		os.Exit(2)
	}
	secs, err := strconv.Atoi(os.Args[2])
	if err != nil || secs < 1 {
		fmt.Fprintln(os.Stderr, "SECONDS: a positive number")
		os.Exit(2)
	}
	deadline := time.Now().Add(time.Second + time.Duration(secs)*time.Second)
	time.Sleep(time.Second)
	// Whatever it waits for, the attack ends: guestd gets its port back.
	time.AfterFunc(time.Until(deadline)+2*time.Second, func() {
		say("deadline passed; the handshake read", read.Load(), "bytes,", hellos.Load(), "hellos")
		os.Exit(3)
	})
	if err := run(os.Args[1], deadline); err != nil {
		say("error:", err)
		os.Exit(1)
	}
	say("done")
}

func run(mode string, deadline time.Time) error {
	port, err := takePort()
	if err != nil {
		return err
	}
	defer port.Close()
	say("port taken")
	switch mode {
	case "garbage":
		buf := make([]byte, 64<<10)
		var n int64
		for time.Now().Before(deadline) {
			rand.Read(buf)
			w, err := port.Write(buf)
			n += int64(w)
			if err != nil {
				return err
			}
		}
		say("garbage bytes", n)
		return nil
	case "reopen":
		port.Close()
		opens := 0
		for time.Now().Before(deadline) {
			p, err := channel.OpenPort(vmm.ChannelPort)
			if err != nil {
				continue
			}
			p.Write([]byte("x"))
			p.Close()
			opens++
		}
		say("opens", opens)
		return nil
	}
	// The others speak after a handshake: the host's heartbeat notices
	// guestd's death and says HELLO again.
	conn, err := handshake(port, deadline)
	if err != nil {
		return err
	}
	switch mode {
	case "ping":
		// The host's own pings are answered, so that its heartbeat
		// keeps the session up; everything else it sends is dropped.
		var mu sync.Mutex
		go func() {
			hdr := make([]byte, 12)
			for {
				if _, err := io.ReadFull(conn, hdr); err != nil {
					return
				}
				length := binary.BigEndian.Uint32(hdr[8:])
				switch {
				case hdr[1] == 2 && binary.BigEndian.Uint16(hdr[2:])&1 != 0: // ping SYN
					mu.Lock()
					port.Write([]byte{0, 2, 0, 2, 0, 0, 0, 0, hdr[8], hdr[9], hdr[10], hdr[11]})
					mu.Unlock()
				case hdr[1] == 0: // data: its payload follows
					io.CopyN(io.Discard, conn, int64(length))
				}
			}
		}()
		var frames bytes.Buffer
		for i := 0; i < 4096; i++ {
			// yamux header: version 0, type ping (2), flags SYN (1),
			// stream 0, length = the ping's opaque id.
			frames.Write([]byte{0, 2, 0, 1, 0, 0, 0, 0, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)})
		}
		var pings int64
		for time.Now().Before(deadline) {
			mu.Lock()
			_, err := port.Write(frames.Bytes())
			mu.Unlock()
			if err != nil {
				return err
			}
			pings += 4096
		}
		say("pings", pings)
		return nil
	case "headers", "body":
		cfg := yamux.DefaultConfig()
		cfg.EnableKeepAlive = false
		cfg.LogOutput = io.Discard
		sess, err := yamux.Server(conn, cfg)
		if err != nil {
			return err
		}
		defer sess.Close()
		time.AfterFunc(time.Until(deadline), func() { sess.Close() })
		answers := 0
		for {
			s, err := sess.Accept()
			if err != nil {
				say("answers", answers)
				return nil
			}
			answers++
			go answer(s, mode)
		}
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// answer reads a request's head and answers it without end.
func answer(s io.ReadWriteCloser, mode string) {
	defer s.Close()
	r := bufio.NewReader(s)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if line == "\r\n" {
			break
		}
	}
	go io.Copy(io.Discard, r)
	head := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Endless: "
	if mode == "body" {
		head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n"
	}
	if _, err := io.WriteString(s, head); err != nil {
		return
	}
	chunk := bytes.Repeat([]byte("a"), 32<<10)
	for {
		if _, err := s.Write(chunk); err != nil {
			return
		}
	}
}

// takePort kills guestd and opens the channel's port before guestd is
// started again.
func takePort() (*os.File, error) {
	pids, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, p := range pids {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == "guestd" {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			say("killing guestd", pid, syscall.Kill(pid, syscall.SIGKILL))
		}
	}
	dev, err := channel.FindPort("/sys/class/virtio-ports", vmm.ChannelPort)
	if err != nil {
		return nil, err
	}
	end := time.Now().Add(5 * time.Second)
	for tries := 1; ; tries++ {
		f, err := os.OpenFile(filepath.Join("/dev", dev), os.O_RDWR, 0)
		if err == nil {
			say("opened", dev, "after", tries, "tries")
			return f, nil
		}
		if time.Now().After(end) {
			return nil, fmt.Errorf("open the port: %w", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// handshake answers the host's HELLO with READY and waits for its GO;
// the returned reader holds what came after.
func handshake(port *os.File, deadline time.Time) (io.ReadWriteCloser, error) {
	r := bufio.NewReader(patient{port, deadline})
	nonce := ""
	skipped := 0
	for time.Now().Before(deadline) {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("handshake: %w (%d lines skipped)", err, skipped)
		}
		// What the host sent before (its pings to a dead guestd) may
		// precede a HELLO on its line.
		if i := strings.Index(line, "STRATA-CHANNEL "); i > 0 {
			line = line[i:]
		}
		line = strings.TrimSpace(line)
		if n, ok := strings.CutPrefix(line, "STRATA-CHANNEL HELLO "); ok {
			hellos.Add(1)
			if n != nonce {
				nonce = n
				if _, err := fmt.Fprintf(port, "STRATA-CHANNEL READY %s\n", nonce); err != nil {
					return nil, err
				}
			}
			continue
		}
		if n, ok := strings.CutPrefix(line, "STRATA-CHANNEL GO "); ok && n == nonce {
			say("handshake done")
			return session{r, port}, nil
		}
		skipped++
	}
	return nil, fmt.Errorf("no handshake before the deadline (%d lines skipped)", skipped)
}

// patient reads the port through the moments no host is connected to
// it, when a virtio-serial port reads EOF (the host's end dialling again).
type patient struct {
	port     *os.File
	deadline time.Time
}

func (p patient) Read(b []byte) (int, error) {
	for {
		n, err := p.port.Read(b)
		read.Add(int64(n))
		if n > 0 || err != io.EOF || time.Now().After(p.deadline) {
			return n, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// session is the port with what its handshake read ahead.
type session struct {
	r    *bufio.Reader
	port *os.File
}

func (s session) Read(b []byte) (int, error)  { return s.r.Read(b) }
func (s session) Write(b []byte) (int, error) { return s.port.Write(b) }
func (s session) Close() error                { return s.port.Close() }
