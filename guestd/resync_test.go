package guestd

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"strata/internal/fault"
	"strata/internal/testenv"
)

// resyncCodes are the codes parseResync may fail with, and their kinds.
var resyncCodes = map[string]fault.Kind{
	"invalid_json": fault.Invalid, "unknown_field": fault.Invalid, "invalid_field": fault.Invalid,
	"body_too_large": fault.TooLarge,
}

// seedOf is n bytes 0, 1, 2… in base64, and the bytes.
func seedOf(n int) (string, []byte) {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return base64.StdEncoding.EncodeToString(b), b
}

// TestParseResync names each rule of the resync body, accepted at its
// limit and refused just past it.
func TestParseResync(t *testing.T) {
	seed32, bytes32 := seedOf(32)
	seed31, _ := seedOf(31)
	seed512, bytes512 := seedOf(512)
	seed513, _ := seedOf(513)
	zeros := strings.Repeat("A", 43) + "=" // 32 zero bytes
	label63 := strings.Repeat("a", 63)
	body := func(fields string) string {
		return `{"time_unix_nano":1700000000000000000,"seed":"` + seed32 + `"` + fields + `}`
	}
	tests := []struct {
		name, body string
		code       string // "" when accepted
		field      string
		want       *resyncRequest // when accepted and not nil: the value expected
	}{
		{name: "every field", body: body(`,"hostname":"sb-fork-2"`),
			want: &resyncRequest{TimeUnixNano: 1700000000000000000, Seed: bytes32, Hostname: "sb-fork-2"}},
		{name: "no hostname", body: body(``), want: &resyncRequest{TimeUnixNano: 1700000000000000000, Seed: bytes32}},
		{name: "null hostname is left out", body: body(`,"hostname":null`), want: &resyncRequest{TimeUnixNano: 1700000000000000000, Seed: bytes32}},
		{name: "smallest time", body: `{"time_unix_nano":1,"seed":"` + seed32 + `"}`, want: &resyncRequest{TimeUnixNano: 1, Seed: bytes32}},
		{name: "largest time", body: `{"time_unix_nano":9223372036854775807,"seed":"` + seed32 + `"}`, want: &resyncRequest{TimeUnixNano: 1<<63 - 1, Seed: bytes32}},
		{name: "seed of 512 bytes", body: `{"time_unix_nano":1,"seed":"` + seed512 + `"}`, want: &resyncRequest{TimeUnixNano: 1, Seed: bytes512}},

		{name: "time missing", body: `{"seed":"` + seed32 + `"}`, code: "invalid_field", field: "time_unix_nano"},
		{name: "time null", body: `{"time_unix_nano":null,"seed":"` + seed32 + `"}`, code: "invalid_field", field: "time_unix_nano"},
		{name: "time zero", body: `{"time_unix_nano":0,"seed":"` + seed32 + `"}`, code: "invalid_field", field: "time_unix_nano"},
		{name: "time negative", body: `{"time_unix_nano":-1,"seed":"` + seed32 + `"}`, code: "invalid_field", field: "time_unix_nano"},
		{name: "time with a fraction", body: `{"time_unix_nano":1.5,"seed":"` + seed32 + `"}`, code: "invalid_field", field: "time_unix_nano"},
		{name: "time with an exponent", body: `{"time_unix_nano":1e18,"seed":"` + seed32 + `"}`, code: "invalid_field", field: "time_unix_nano"},
		{name: "time past int64", body: `{"time_unix_nano":9223372036854775808,"seed":"` + seed32 + `"}`, code: "invalid_field", field: "time_unix_nano"},
		{name: "time as a string", body: `{"time_unix_nano":"1","seed":"` + seed32 + `"}`, code: "invalid_field", field: "time_unix_nano"},

		{name: "seed missing", body: `{"time_unix_nano":1}`, code: "invalid_field", field: "seed"},
		{name: "seed null", body: `{"time_unix_nano":1,"seed":null}`, code: "invalid_field", field: "seed"},
		{name: "seed of 31 bytes", body: `{"time_unix_nano":1,"seed":"` + seed31 + `"}`, code: "invalid_field", field: "seed"},
		{name: "seed of 513 bytes", body: `{"time_unix_nano":1,"seed":"` + seed513 + `"}`, code: "invalid_field", field: "seed"},
		{name: "seed empty", body: `{"time_unix_nano":1,"seed":""}`, code: "invalid_field", field: "seed"},
		{name: "seed not base64", body: `{"time_unix_nano":1,"seed":"` + strings.Repeat("!", 44) + `"}`, code: "invalid_field", field: "seed"},
		{name: "seed unpadded", body: `{"time_unix_nano":1,"seed":"` + strings.TrimRight(seed32, "=") + `"}`, code: "invalid_field", field: "seed"},
		{name: "seed with a line break", body: `{"time_unix_nano":1,"seed":"` + seed32[:20] + `\n` + seed32[20:] + `"}`, code: "invalid_field", field: "seed"},
		{name: "seed with stray bits", body: `{"time_unix_nano":1,"seed":"` + zeros[:42] + `B="}`, code: "invalid_field", field: "seed"},
		{name: "seed in the URL alphabet", body: `{"time_unix_nano":1,"seed":"` + strings.Repeat("_", 43) + `="}`, code: "invalid_field", field: "seed"},
		{name: "seed as bytes", body: `{"time_unix_nano":1,"seed":[1,2,3]}`, code: "invalid_field", field: "seed"},

		{name: "hostname of 63", body: body(`,"hostname":"` + label63 + `"`),
			want: &resyncRequest{TimeUnixNano: 1700000000000000000, Seed: bytes32, Hostname: label63}},
		{name: "hostname of capitals and a first digit", body: body(`,"hostname":"0SB-a"`),
			want: &resyncRequest{TimeUnixNano: 1700000000000000000, Seed: bytes32, Hostname: "0SB-a"}},
		{name: "hostname of 64", body: body(`,"hostname":"` + label63 + `a"`), code: "invalid_field", field: "hostname"},
		{name: "hostname empty", body: body(`,"hostname":""`), code: "invalid_field", field: "hostname"},
		{name: "hostname first hyphen", body: body(`,"hostname":"-a"`), code: "invalid_field", field: "hostname"},
		{name: "hostname last hyphen", body: body(`,"hostname":"a-"`), code: "invalid_field", field: "hostname"},
		{name: "hostname with a dot", body: body(`,"hostname":"sb.local"`), code: "invalid_field", field: "hostname"},
		{name: "hostname with an underscore", body: body(`,"hostname":"a_b"`), code: "invalid_field", field: "hostname"},
		{name: "hostname not ASCII", body: body(`,"hostname":"caf\u00e9"`), code: "invalid_field", field: "hostname"},
		{name: "hostname with a NUL", body: body(`,"hostname":"a\u0000b"`), code: "invalid_field", field: "hostname"},
		{name: "hostname as a number", body: body(`,"hostname":1`), code: "invalid_field", field: "hostname"},

		{name: "unknown field", body: body(`,"clock":"now"`), code: "unknown_field"},
		{name: "a key in other case", body: body(`,"Seed":"x"`), code: "unknown_field"},
		{name: "a key twice", body: body(`,"seed":"` + seed32 + `"`), code: "invalid_json"},
		{name: "empty body", body: ``, code: "invalid_json"},
		{name: "not an object", body: `[1]`, code: "invalid_json"},
		{name: "trailing data", body: body(``) + ` {}`, code: "invalid_json"},
		{name: "too large", body: body(``) + strings.Repeat(" ", 16<<10), code: "body_too_large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := parseResync([]byte(tc.body))
			if tc.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if tc.want != nil && !reflect.DeepEqual(req, *tc.want) {
					t.Fatalf("got %+v, want %+v", req, *tc.want)
				}
				return
			}
			fe := fault.As(err)
			if fe == nil || fe.Code != tc.code {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
			if tc.field != "" && fe.Fields["field"] != tc.field {
				t.Fatalf("field %v, want %s (%v)", fe.Fields["field"], tc.field, err)
			}
		})
	}
}

// labelRE is an RFC 1123 label, written apart from validHostname.
var labelRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

// FuzzParseResync checks parseResync on any body: it never panics; it
// fails only with the codes of a malformed request, an invalid_field
// naming its field; what it accepts is a positive time, a seed of 32 to
// 512 bytes and a hostname that is empty or one RFC 1123 label; and,
// encoded again, it parses to the same value.
func FuzzParseResync(f *testing.F) {
	seed32, _ := seedOf(32)
	for _, s := range []string{
		`{"time_unix_nano":1700000000000000000,"seed":"` + seed32 + `","hostname":"sb-1"}`,
		`{"time_unix_nano":1,"seed":"` + seed32 + `"}`,
		`{"time_unix_nano":0,"seed":"` + seed32 + `"}`,
		`{"time_unix_nano":-5,"seed":"` + seed32 + `"}`,
		`{"time_unix_nano":1.0,"seed":"` + seed32 + `"}`,
		`{"time_unix_nano":1,"seed":"` + seed32[:40] + `"}`,
		`{"time_unix_nano":1,"seed":"` + seed32[:30] + `\r\n` + seed32[30:] + `"}`,
		`{"time_unix_nano":1,"seed":"` + seed32 + `","hostname":"-"}`,
		`{"time_unix_nano":1,"seed":"` + seed32 + `","hostname":"a.b"}`,
		`{"time_unix_nano":1,"seed":"` + seed32 + `","hostname":null}`,
		`{"time_unix_nano":1,"seed":"` + seed32 + `","hostname":"\u0430"}`,
		`{"time_unix_nano":1,"seed":"` + seed32 + `","x":1}`,
		`{}`, `null`, ``, `{"seed":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseResync(body)
		if err != nil {
			fe := fault.As(err)
			if fe == nil {
				t.Fatalf("unclassified error %v", err)
			}
			if kind, ok := resyncCodes[fe.Code]; !ok || kind != fe.Kind {
				t.Fatalf("code %q kind %v", fe.Code, fe.Kind)
			}
			if fe.Code == "invalid_field" && fe.Fields["field"] == nil {
				t.Fatalf("invalid_field names no field: %v", err)
			}
			return
		}
		if req.TimeUnixNano <= 0 {
			t.Fatalf("accepted time_unix_nano %d", req.TimeUnixNano)
		}
		if len(req.Seed) < 32 || len(req.Seed) > 512 {
			t.Fatalf("accepted a seed of %d bytes", len(req.Seed))
		}
		if req.Hostname != "" && !labelRE.MatchString(req.Hostname) {
			t.Fatalf("accepted hostname %q", req.Hostname)
		}
		wire := map[string]any{"time_unix_nano": req.TimeUnixNano, "seed": base64.StdEncoding.EncodeToString(req.Seed)}
		if req.Hostname != "" {
			wire["hostname"] = req.Hostname
		}
		again, err := json.Marshal(wire)
		if err != nil {
			t.Fatal(err)
		}
		round, err := parseResync(again)
		if err != nil {
			t.Fatalf("re-encoded %s refused: %v", again, err)
		}
		if !reflect.DeepEqual(req, round) {
			t.Fatalf("round trip changed %+v into %+v", req, round)
		}
	})
}

// TestRandPoolInfo pins the layout of struct rand_pool_info: two C ints
// (bits credited, then bytes), in the machine's order, then the seed.
func TestRandPoolInfo(t *testing.T) {
	_, seed := seedOf(40)
	b := randPoolInfo(seed)
	if len(b) != 8+40 {
		t.Fatalf("%d bytes, want 48", len(b))
	}
	if got := int32(binary.NativeEndian.Uint32(b[0:4])); got != 320 {
		t.Errorf("entropy_count %d, want 320 bits", got)
	}
	if got := int32(binary.NativeEndian.Uint32(b[4:8])); got != 40 {
		t.Errorf("buf_size %d, want 40 bytes", got)
	}
	if !bytes.Equal(b[8:], seed) {
		t.Errorf("buf %x, want the seed %x", b[8:], seed)
	}
}

// fakeKernel stands in for the guest's kernel: it records each call and
// fails the ones named in fail.
type fakeKernel struct {
	now      int64
	name     string
	calls    []string
	fail     map[string]error
	poolInfo []byte
}

func (k *fakeKernel) call(name string) error {
	k.calls = append(k.calls, name)
	return k.fail[name]
}

func (k *fakeKernel) realtime() (int64, error) { return k.now, k.call("realtime") }

func (k *fakeKernel) setRealtime(ns int64) error {
	if err := k.call("setRealtime"); err != nil {
		return err
	}
	k.now = ns
	return nil
}

func (k *fakeKernel) addEntropy(poolInfo []byte) error {
	k.poolInfo = bytes.Clone(poolInfo)
	return k.call("addEntropy")
}

func (k *fakeKernel) reseed() error { return k.call("reseed") }

func (k *fakeKernel) setHostname(name string) error {
	if err := k.call("setHostname"); err != nil {
		return err
	}
	k.name = name
	return nil
}

func (k *fakeKernel) hostname() (string, error) { return k.name, k.call("hostname") }

// vmServer is a storeless guestd as --vm makes it (PowerOff set), whose
// resyncs go to k.
func vmServer(t *testing.T, logs *bytes.Buffer, k resyncKernel) *Server {
	reg := prometheus.NewRegistry()
	s := &Server{
		log:             slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		reg:             reg,
		metrics:         newMetrics(reg),
		credentialsPath: filepath.Join(t.TempDir(), "credentials.env"),
		powerOff:        func() {},
		kernel:          k,
	}
	s.handler = s.routes()
	return s
}

// TestResync pins POST /v1/resync against a fake kernel: the steps in
// their order, the answer, the kernels that cannot reseed at once, a step
// that fails stopping those after it, and bad requests touching nothing.
func TestResync(t *testing.T) {
	const host = 1_750_000_000_000_000_000
	seed, seedBytes := seedOf(32)
	valid := fmt.Sprintf(`{"time_unix_nano":%d,"seed":%q,"hostname":"sb-fork-2"}`, host, seed)
	ioctlErr := func(op string, errno syscall.Errno) error {
		return &os.PathError{Op: op, Path: "/dev/urandom", Err: errno}
	}
	all := []string{"realtime", "setRealtime", "addEntropy", "reseed", "setHostname", "hostname"}
	tests := []struct {
		name, method, path, body string
		fail                     map[string]error
		status                   int
		answer                   string   // the whole body, when status is 200
		code, field              string   // when status is not 200
		calls                    []string // the kernel's calls, in order
		log                      string   // a regexp the logs must match
	}{
		{name: "every step", body: valid, status: 200,
			answer: `{"data":{"clock_step_ns":5000000000,"reseeded":true,"hostname":"sb-fork-2"},"status":"success"}`, calls: all,
			log: `msg="resync done" duration_ms=[0-9.]+ steps="clock.set=[0-9.]+ rng.seed=[0-9.]+ rng.reseed=[0-9.]+ hostname.set=[0-9.]+" clock_step_ns=5000000000 reseeded=true hostname=sb-fork-2`},
		{name: "hostname kept", body: fmt.Sprintf(`{"time_unix_nano":%d,"seed":%q}`, host, seed), status: 200,
			answer: `{"data":{"clock_step_ns":5000000000,"reseeded":true,"hostname":"vm"},"status":"success"}`,
			calls:  []string{"realtime", "setRealtime", "addEntropy", "reseed", "hostname"}},
		{name: "a kernel without RNDRESEEDCRNG (ENOTTY)", body: valid, fail: map[string]error{"reseed": ioctlErr("ioctl RNDRESEEDCRNG", unix.ENOTTY)}, status: 200,
			answer: `{"data":{"clock_step_ns":5000000000,"reseeded":false,"hostname":"sb-fork-2"},"status":"success"}`, calls: all,
			log: `level=WARN msg="resync: this kernel cannot be made to reseed at once`},
		{name: "a kernel without RNDRESEEDCRNG (EINVAL)", body: valid, fail: map[string]error{"reseed": ioctlErr("ioctl RNDRESEEDCRNG", unix.EINVAL)}, status: 200,
			answer: `{"data":{"clock_step_ns":5000000000,"reseeded":false,"hostname":"sb-fork-2"},"status":"success"}`, calls: all},
		{name: "reseed refused", body: valid, fail: map[string]error{"reseed": ioctlErr("ioctl RNDRESEEDCRNG", unix.EPERM)}, status: 500,
			calls: []string{"realtime", "setRealtime", "addEntropy", "reseed"}, log: `msg="resync failed" .*steps="clock.set=[0-9.]+ rng.seed=[0-9.]+ rng.reseed=[0-9.]+"`},
		{name: "entropy refused", body: valid, fail: map[string]error{"addEntropy": ioctlErr("ioctl RNDADDENTROPY", unix.EPERM)}, status: 500,
			calls: []string{"realtime", "setRealtime", "addEntropy"}},
		{name: "a time the kernel refuses", body: valid, fail: map[string]error{"setRealtime": os.NewSyscallError("clock_settime", unix.EINVAL)}, status: 400,
			code: "invalid_field", field: "time_unix_nano", calls: []string{"realtime", "setRealtime"}},
		{name: "no right to set the clock", body: valid, fail: map[string]error{"setRealtime": os.NewSyscallError("clock_settime", unix.EPERM)}, status: 500,
			calls: []string{"realtime", "setRealtime"}},
		{name: "hostname refused", body: valid, fail: map[string]error{"setHostname": os.NewSyscallError("sethostname", unix.EPERM)}, status: 500,
			calls: all[:5]},
		{name: "bad body", body: `{"time_unix_nano":0,"seed":"` + seed + `"}`, status: 400, code: "invalid_field", field: "time_unix_nano"},
		{name: "no body", status: 400, code: "invalid_json"},
		{name: "query", path: "/v1/resync?now=1", body: valid, status: 400, code: "query_not_allowed"},
		{name: "wrong method", method: "PUT", body: valid, status: 405, code: "method_not_allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := &fakeKernel{now: host - 5_000_000_000, name: "vm", fail: tc.fail}
			logs := &bytes.Buffer{}
			s := vmServer(t, logs, k)
			method, path := cmp.Or(tc.method, "POST"), cmp.Or(tc.path, "/v1/resync")
			r := httptest.NewRequest(method, path, strings.NewReader(tc.body))
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			s.Handler().ServeHTTP(w, r)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s\n%s", w.Code, tc.status, w.Body, logs)
			}
			if tc.status == 200 {
				if got := strings.TrimSpace(w.Body.String()); got != tc.answer {
					t.Errorf("answer\n%s\nwant\n%s", got, tc.answer)
				}
				if k.now != host {
					t.Errorf("clock %d, want the host's %d", k.now, host)
				}
				if !bytes.Equal(k.poolInfo, randPoolInfo(seedBytes)) {
					t.Errorf("rand_pool_info %x", k.poolInfo)
				}
			} else {
				var env struct {
					Status string         `json:"status"`
					Data   map[string]any `json:"data"`
				}
				if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil {
					t.Fatalf("%s: %v", w.Body, err)
				}
				if tc.code != "" && (env.Status != "fail" || env.Data["code"] != tc.code) {
					t.Errorf("answer %s, want a fail with code %s", w.Body, tc.code)
				}
				if tc.field != "" && env.Data["field"] != tc.field {
					t.Errorf("answer %s, want field %s", w.Body, tc.field)
				}
			}
			if !slices.Equal(k.calls, tc.calls) {
				t.Errorf("kernel calls %q, want %q", k.calls, tc.calls)
			}
			if tc.log != "" && !regexp.MustCompile(tc.log).MatchString(logs.String()) {
				t.Errorf("logs\n%s\nwant a match for\n%s", logs, tc.log)
			}
			if strings.Contains(logs.String(), seed[:16]) {
				t.Errorf("the seed is in the logs:\n%s", logs)
			}
		})
	}
}

// TestResyncSteps checks that each step of a resync is timed in
// strata_guestd_step_seconds under op "resync".
func TestResyncSteps(t *testing.T) {
	seed, _ := seedOf(32)
	s := vmServer(t, &bytes.Buffer{}, &fakeKernel{now: 1, name: "vm"})
	r := httptest.NewRequest("POST", "/v1/resync", strings.NewReader(fmt.Sprintf(`{"time_unix_nano":2,"seed":%q,"hostname":"a"}`, seed)))
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	s.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	for _, step := range []string{"clock.set", "rng.seed", "rng.reseed", "hostname.set"} {
		want := `strata_guestd_step_seconds_count{op="resync",step="` + step + `"} 1`
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestResyncOnlyInVM checks that a guestd outside a microVM (no PowerOff)
// has no /v1/resync: only the host of a VM may step its clock.
func TestResyncOnlyInVM(t *testing.T) {
	s := storelessServer(t, &bytes.Buffer{})
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, httptest.NewRequest("POST", "/v1/resync", strings.NewReader(`{}`)))
	if w.Code != 404 {
		t.Fatalf("status %d, want 404: %s", w.Code, w.Body)
	}
}

// resyncChildEnv, set, makes TestResyncKernel the child it starts in a
// UTS namespace of its own; its value is the parent's namespace.
const resyncChildEnv = "STRATA_TEST_RESYNC_CHILD"

// TestResyncKernel runs a resync's real system calls, as root, in a child
// process with a UTS namespace of its own, so that the hostname it sets
// is not the machine's. The clock is not namespaced: the child sets it to
// the time read just before (the machine's clock steps back by the
// microseconds the request took) and checks that the step answered is
// that small. The seed it mixes into the machine's RNG is fresh
// randomness, which does no harm.
func TestResyncKernel(t *testing.T) {
	if parentNS := os.Getenv(resyncChildEnv); parentNS != "" {
		resyncKernelChild(t, parentNS)
		return
	}
	testenv.RequiresRoot(t)
	ns, err := os.Readlink("/proc/self/ns/uts")
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestResyncKernel$", "-test.v", "-test.count=1", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), resyncChildEnv+"="+ns)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWUTS}
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: TestResyncKernel") {
		t.Fatal("the child ran no resync")
	}
	if after, _ := os.Hostname(); after != before {
		t.Fatalf("the machine's hostname changed from %q to %q", before, after)
	}
}

func resyncKernelChild(t *testing.T, parentNS string) {
	ns, err := os.Readlink("/proc/self/ns/uts")
	if err != nil {
		t.Fatal(err)
	}
	if ns == parentNS {
		t.Fatalf("the child is in its parent's UTS namespace %s: it would rename the machine", ns)
	}
	seed := make([]byte, 64)
	rand.Read(seed)
	logs := &bytes.Buffer{}
	s := vmServer(t, logs, linuxKernel{})
	const name = "strata-resync-test"
	// Read the clock last, so that the step is only the request's time.
	body := func() string {
		return fmt.Sprintf(`{"time_unix_nano":%d,"seed":%q,"hostname":%q}`, time.Now().UnixNano(), base64.StdEncoding.EncodeToString(seed), name)
	}
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, httptest.NewRequest("POST", "/v1/resync", strings.NewReader(body())))
	if w.Code != 200 {
		t.Fatalf("status %d: %s\n%s", w.Code, w.Body, logs)
	}
	var env struct {
		Data resyncResult `json:"data"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil {
		t.Fatal(err)
	}
	t.Logf("answer %s", w.Body)
	if step := time.Duration(env.Data.ClockStepNS); step > 0 || step < -time.Second {
		t.Errorf("clock step %v: setting the clock to the time just read should step it back by less than a second", step)
	}
	if !env.Data.Reseeded {
		t.Errorf("not reseeded on a kernel of 4.17 or later:\n%s", logs)
	}
	if env.Data.Hostname != name {
		t.Errorf("answered hostname %q, want %q", env.Data.Hostname, name)
	}
	if got, err := os.Hostname(); err != nil || got != name {
		t.Errorf("hostname %q (%v), want %q", got, err, name)
	}
}
