package hostproxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"path"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/pathpolicy"
	"strata/sandbox"
)

// FuzzCreateBody checks the edge's create validation on any body: it
// never panics, fails only with the codes of a malformed request or of the
// two path rules it owns, and what it accepts is a request a guest can
// take: an absolute, clean, unprotected path and a short name, both valid
// UTF-8 without control, format (zero-width, bidi) or line/paragraph
// separator characters.
func FuzzCreateBody(f *testing.F) {
	for _, seed := range []string{
		`{"path":"/etc"}`, `{"path":"/var"}`, `{"path":"/tmp"}`, `{"path":"/tmp/project"}`,
		`{"path":"/workspace/project","name":"before-update"}`,
		`{"path":"/workspace/project/"}`, `{"path":"workspace"}`, `{"path":"/a/../b"}`,
		`{"path":""}`, `{"path":null,"name":null}`, `{"name":"x"}`, `{"path":"/a","name":"\u0007"}`,
		`{"path":"/a","name":"` + strings.Repeat("é", 70) + `"}`, `{"path":"/\u0000"}`, `{"path":"//a"}`,
		`{"path":"/a","name":"\u202e"}`, `{"path":"/a\u2028b"}`, `{"PATH":"/a"}`, "{\"path\":\"/a\xff\"}",
	} {
		f.Add([]byte(seed))
	}
	allowed := map[string]bool{
		"invalid_json": true, "unknown_field": true, "invalid_field": true, "body_too_large": true,
		"path_not_absolute": true, "path_not_clean": true, "path_protected": true,
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		req, err := decodeCreate(r)
		if err != nil {
			if code := fault.CodeOf(err); !allowed[code] {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if !path.IsAbs(req.Path) || path.Clean(req.Path) != req.Path || len(req.Path) > pathpolicy.MaxPathLen ||
			strings.ContainsRune(req.Path, 0) || pathpolicy.CheckSyntax(req.Path, nil) != nil {
			t.Fatalf("accepted path %q", req.Path)
		}
		if strings.ContainsFunc(req.Path, hidden) || !utf8.ValidString(req.Path) {
			t.Fatalf("accepted path %+q", req.Path)
		}
		if req.Name != nil && (len(*req.Name) > api.MaxNameBytes || strings.ContainsFunc(*req.Name, hidden) || !utf8.ValidString(*req.Name)) {
			t.Fatalf("accepted name %+q", *req.Name)
		}
	})
}

// hidden is the character rule of names and paths as the contract states
// it, apart from api.HiddenRune: categories Cc, Cf, Zl and Zp.
func hidden(r rune) bool { return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) }

func TestParseGuestAddress(t *testing.T) {
	cases := []struct {
		in, scheme, addr string
		ok               bool
	}{
		{"unix:///var/lib/strata/guestd.sock", "unix", "/var/lib/strata/guestd.sock", true},
		{"tcp://127.0.0.1:7070", "tcp", "127.0.0.1:7070", true},
		{"tcp://[::1]:7070", "tcp", "[::1]:7070", true},
		{"vsock://3:1024", "vsock", "3:1024", true},
		{"unix://relative.sock", "", "", false},
		{"tcp://127.0.0.1", "", "", false},
		{"/var/lib/strata/guestd.sock", "", "", false},
		{"unix://", "", "", false},
		{"", "", "", false},
	}
	for _, tc := range cases {
		scheme, addr, err := ParseGuestAddress(tc.in)
		if (err == nil) != tc.ok || scheme != tc.scheme || addr != tc.addr {
			t.Errorf("ParseGuestAddress(%q) = %q, %q, %v", tc.in, scheme, addr, err)
		}
	}
}

func TestParseConfig(t *testing.T) {
	good := `{
	  "listen": "127.0.0.1:8080",
	  "data_dir": "/var/lib/strata/hostproxy",
	  "accounts": [{"id": "acct-local", "keys": [{"id": "key-local", "env": "CREATEOS_API_KEY"}]}],
	  "sandboxes": [{"id": "sb-local", "account": "acct-local", "guest": "unix:///var/lib/strata/guestd.sock", "state": "running"}],
	  "rate_limit": {"per_second": 5, "burst": 10},
	  "timeouts": {"guest_dial": "1s", "guest_request": "45s"}
	}`
	c, err := ParseConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(c.Timeouts.GuestRequest) != 45*time.Second || c.RateLimit.Burst != 10 {
		t.Errorf("parsed %+v", c)
	}
	s, err := c.resolve(func(k string) string {
		if k == "CREATEOS_API_KEY" {
			return "sk_0123456789abcdefghij"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.keys) != 1 || s.keys[0].Hash != hashSecret("sk_0123456789abcdefghij") || s.sandboxes[0].State != StateRunning {
		t.Errorf("resolved %+v", s)
	}
	if _, err := c.resolve(func(string) string { return "short" }); err == nil || !strings.Contains(err.Error(), "shorter than 16") {
		t.Errorf("a short key: %v", err)
	}
	for name, bad := range map[string]string{
		"unknown field":  `{"listen":"x","acounts":[]}`,
		"bad duration":   `{"timeouts":{"read":"soon"}}`,
		"number timeout": `{"timeouts":{"read":5}}`,
		"trailing":       `{} {}`,
	} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("%s: accepted %s", name, bad)
		}
	}
}

func TestLimiters(t *testing.T) {
	l := newLimiters(2, 3)
	now := time.Unix(1000, 0)
	for i := range 3 {
		if ok, _ := l.allow("k", now); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	ok, wait := l.allow("k", now)
	if ok || wait != 500*time.Millisecond || retryAfterSeconds(wait) != 1 {
		t.Errorf("over the burst: ok=%v wait=%v", ok, wait)
	}
	if ok, _ := l.allow("other", now); !ok {
		t.Errorf("another key shares the bucket")
	}
	if ok, _ := l.allow("k", now.Add(500*time.Millisecond)); !ok {
		t.Errorf("refused after refill")
	}
	// Idle buckets are swept once the map is large.
	for i := range limiterSweepAt {
		l.allow(string(rune('a'+i%26))+strings.Repeat("x", i/26), now)
	}
	l.allow("late", now.Add(time.Hour))
	if n := len(l.buckets); n > 2 {
		t.Errorf("%d buckets after a sweep", n)
	}

	// A flood of new keys past the threshold sweeps at most once per
	// limiterSweepEvery, not once per key.
	l = newLimiters(2, 3)
	for i := range 3 * limiterSweepAt {
		l.allow(fmt.Sprintf("addr:%d", i), now)
	}
	if l.sweeps != 1 {
		t.Errorf("%d sweeps for one instant's flood, want 1", l.sweeps)
	}
	l.allow("later", now.Add(limiterSweepEvery))
	if l.sweeps != 2 {
		t.Errorf("%d sweeps after limiterSweepEvery, want 2", l.sweeps)
	}
}

// TestExampleConfig keeps docs/hostproxy.example.json valid.
func TestExampleConfig(t *testing.T) {
	c, err := LoadConfig("../docs/hostproxy.example.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.resolve(func(string) string { return "sk_0123456789abcdefghij" })
	if err != nil {
		t.Fatal(err)
	}
	if len(s.keys) != 2 || len(s.sandboxes) != 3 {
		t.Errorf("resolved %+v", s)
	}
}

// TestVMsConfigAdmissionKeys: the vms keys of identities and admission
// parse into their fields (unknown ones are still refused).
func TestVMsConfigAdmissionKeys(t *testing.T) {
	c, err := ParseConfig([]byte(`{"vms": {"dir": "/v", "image": "/i", "uid_base": 600000, "id_claims": "/run/ids.json",
	  "store_reserve_mib": 2048, "snapshot_quota_gib": 20, "memory_reserve_mib": 1024, "memory_overcommit": 1.5, "disk_overcommit": 2,
	  "egress": {"resolver": "10.1.2.3", "allow_private": ["10.213.0.0/16", "192.168.1.5"], "max_connections": 64, "bytes_per_second": 1000000}}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := VMsConfig{Dir: "/v", Image: "/i", UIDBase: 600000, IDClaims: "/run/ids.json", StoreReserveMiB: 2048, SnapshotQuotaGiB: 20, MemoryReserveMiB: 1024, MemoryOvercommit: 1.5, DiskOvercommit: 2,
		Egress: EgressConfig{Resolver: "10.1.2.3", AllowPrivate: []string{"10.213.0.0/16", "192.168.1.5"}, MaxConnections: 64, BytesPerSecond: 1000000}}
	if c.VMs == nil || !reflect.DeepEqual(*c.VMs, want) {
		t.Errorf("parsed %+v, want %+v", c.VMs, want)
	}
	if _, err := ParseConfig([]byte(`{"vms": {"dir": "/v", "store_reserve": 1}}`)); err == nil {
		t.Error("an unknown vms key was accepted")
	}
	eg, err := egressConfig(c.VMs.Egress)
	if err != nil {
		t.Fatal(err)
	}
	if eg.Resolver != "10.1.2.3:53" || len(eg.Site.AllowPrivate) != 2 || eg.Site.AllowPrivate[1].String() != "192.168.1.5/32" || eg.MaxConns != 64 || len(eg.Site.HostAddrs) == 0 {
		t.Errorf("egress configuration %+v", eg)
	}
	for _, bad := range []EgressConfig{{Resolver: "resolver.example"}, {AllowPrivate: []string{"10.0.0.0/33"}}, {MaxConnections: -1}} {
		if _, err := egressConfig(bad); err == nil {
			t.Errorf("egress configuration %+v accepted", bad)
		}
	}
}

// TestVMsConfigUnresponsiveLimit: vms.unresponsive_limit parses into
// the limit the manager is given.
func TestVMsConfigUnresponsiveLimit(t *testing.T) {
	c, err := ParseConfig([]byte(`{"vms": {"dir": "/v", "image": "/i", "unresponsive_limit": "90s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.VMs == nil || time.Duration(c.VMs.UnresponsiveLimit) != 90*time.Second {
		t.Errorf("parsed %+v", c.VMs)
	}
}

// TestSandboxViewLastError: a record's last_error (a pause whose save
// failed after its 202) is shown by GET, with its time as created_at is.
func TestSandboxViewLastError(t *testing.T) {
	at := time.Date(2026, 12, 2, 13, 44, 22, 0, time.UTC)
	v := sandboxView(Sandbox{ID: "sb-1", State: "running", LastError: &sandbox.OpError{Operation: "pause", Code: "insufficient_storage", Message: "not enough free space", At: at}})
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	want := `"last_error":{"operation":"pause","code":"insufficient_storage","message":"not enough free space","at":"` + api.FormatTime(at) + `"}`
	if !strings.Contains(string(b), want) {
		t.Errorf("view %s, want %s in it", b, want)
	}
	if b, _ := json.Marshal(sandboxView(Sandbox{ID: "sb-1"})); strings.Contains(string(b), "last_error") {
		t.Errorf("view %s shows a last_error it has not", b)
	}
}
