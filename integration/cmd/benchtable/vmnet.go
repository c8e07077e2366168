package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

var vmNetOnly = flag.Bool("vm-net-only", false, "measure only a sandbox's network (egress) against a test host in a network namespace")

// netHost is the bench's test host: a network namespace with a veth pair
// to the host, an HTTP server (a blob of blobBytes, and a small answer)
// and a DNS server naming every *.bench name with its address. Nothing
// else is reached: the sandboxes' setting lists its address alone.
type netHost struct {
	addr, side, ns, veth string
	port                 int
	srv                  *http.Server
	dns                  *dns.Server
}

const blobBytes = 64 << 20

func startNetHost() (*netHost, error) {
	h := &netHost{addr: "10.214.0.2", side: "10.214.0.1", ns: fmt.Sprintf("strata-bench-%d", os.Getpid()), veth: "stbench0", port: 8080}
	for _, args := range [][]string{
		{"netns", "add", h.ns},
		{"link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns},
		{"addr", "add", h.side + "/24", "dev", h.veth},
		{"link", "set", h.veth, "up"},
		{"-n", h.ns, "addr", "add", h.addr + "/24", "dev", "eth0"},
		{"-n", h.ns, "link", "set", "eth0", "up"},
		{"-n", h.ns, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			h.close()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	var ln net.Listener
	var pc net.PacketConn
	errs := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the namespace
		f, err := os.Open("/run/netns/" + h.ns)
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		if err == nil {
			ln, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", h.addr, h.port))
		}
		if err == nil {
			pc, err = net.ListenPacket("udp4", h.addr+":53")
		}
		errs <- err
	}()
	if err := <-errs; err != nil {
		h.close()
		return nil, err
	}
	blob := make([]byte, 1<<20)
	for i := range blob {
		blob[i] = byte(i * 7)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(blobBytes))
		for range blobBytes / len(blob) {
			if _, err := w.Write(blob); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	h.srv = &http.Server{Handler: mux}
	go h.srv.Serve(ln)
	h.dns = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg)
		r.SetReply(q)
		if name := strings.ToLower(q.Question[0].Name); !strings.HasSuffix(name, ".bench.") {
			r.Rcode = dns.RcodeNameError
		} else if q.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(name + " 5 IN A " + h.addr)
			r.Answer = append(r.Answer, rr)
		}
		w.WriteMsg(r)
	})}
	go h.dns.ActivateAndServe()
	return h, nil
}

func (h *netHost) close() {
	if h.srv != nil {
		h.srv.Close()
	}
	if h.dns != nil {
		h.dns.Shutdown()
	}
	exec.Command("ip", "link", "del", h.veth).Run()
	exec.Command("ip", "netns", "del", h.ns).Run()
}

// egress is hostproxy's vms.egress for a bench with this test host.
func (h *netHost) egress() map[string]any {
	return map[string]any{"resolver": h.addr, "allow_private": []string{h.addr + "/32"}}
}

// netRows measures a sandbox's network against the test host: a 64 MiB
// download over HTTP by name (curl in the guest) against the same from
// the host, TCP connection set-up (Python's create_connection, closed at
// once, one after another) and DNS answers (getaddrinfo of names never
// asked before, so no cache answers).
func (b *vmBench) netRows(ctx context.Context) ([]row, error) {
	if b.net == nil {
		return nil, nil
	}
	h := b.net
	fmt.Fprintf(os.Stderr, "network: a sandbox against the test host…\n")
	id, _, _, err := b.createWith(`{"name":"bench-net"}`)
	if err != nil {
		return nil, err
	}
	defer b.call("DELETE", "/v1/sandboxes/"+id, "")
	url := fmt.Sprintf("http://blob.bench:%d/blob", h.port)
	hostRate := func() (float64, error) {
		t0 := time.Now()
		resp, err := http.Get(fmt.Sprintf("http://%s:%d/blob", h.addr, h.port))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		return float64(n) / time.Since(t0).Seconds(), err
	}
	var guest, host []float64
	for range 3 {
		d, err := b.exec(id, "curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}", url)
		if err != nil {
			return nil, err
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(d["stdout"].(string)), 64)
		if err != nil {
			return nil, fmt.Errorf("curl's speed: %q", d["stdout"])
		}
		guest = append(guest, v)
		r, err := hostRate()
		if err != nil {
			return nil, err
		}
		host = append(host, r)
	}
	g, hr := medianF(guest), medianF(host)
	const probe = `
import json, socket, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn, names = [], []
t_all = time.perf_counter()
for i in range(n):
    t0 = time.perf_counter()
    socket.create_connection((addr, port), timeout=30).close()
    conn.append(time.perf_counter() - t0)
total = time.perf_counter() - t_all
for i in range(n):
    t0 = time.perf_counter()
    socket.getaddrinfo("n%d-%d.bench" % (i, int(time.time())), port, socket.AF_INET)
    names.append(time.perf_counter() - t0)
print(json.dumps({"conn": conn, "total": total, "names": names}))
`
	const n = 200
	d, err := b.exec(id, "python3", "-c", probe, h.addr, strconv.Itoa(h.port), strconv.Itoa(n))
	if err != nil {
		return nil, err
	}
	var res struct {
		Conn, Names []float64
		Total       float64
	}
	if err := json.Unmarshal([]byte(d["stdout"].(string)), &res); err != nil {
		return nil, fmt.Errorf("the probe's answer: %v: %q", err, d["stdout"])
	}
	secs := func(v []float64) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, s := range v {
			out[i] = time.Duration(s * float64(time.Second))
		}
		return out
	}
	conn, names := secs(res.Conn), secs(res.Names)
	return []row{
		{"egress download, 64 MiB over HTTP by name, in a sandbox", fmt.Sprintf("%.1f MB/s", g/1e6), "",
			fmt.Sprintf("curl in the guest, 3 runs, through the guest's virtio-net and the host's stack (egress) to a test host in a network namespace; the same download by the host: %.0f MB/s; ratio %.3f (TCG: the guest's kernel and curl are emulated)", hr/1e6, g/hr), "", ""},
		{"egress connection set-up, in a sandbox", dur(median(conn)), dur(p99(conn)),
			fmt.Sprintf("%d TCP connections to the test host one after another (Python's create_connection, closed at once): the guest's SYN to the host's stack, the policy, the host's dial, the handshake back; %.0f connections per second", n, float64(n)/res.Total), "", ""},
		{"DNS answer time, in a sandbox", dur(median(names)), dur(p99(names)),
			fmt.Sprintf("%d getaddrinfo calls of names never asked before (glibc, through 10.0.2.3: the policy, then the host's resolver, the test host's DNS server)", n), "", ""},
	}, nil
}

func medianF(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
