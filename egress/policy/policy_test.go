package policy

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"strata/internal/fault"
)

func TestParse(t *testing.T) {
	many := make([]string, MaxRules+1)
	for i := range many {
		many[i] = fmt.Sprintf("h%d.example.com", i)
	}
	tests := []struct {
		name  string
		in    Spec
		want  Spec   // canonical; ignored when field is set
		field string // the refusal's field; "" means accepted
		index any    // the refusal's index, nil for none
	}{
		{"default", Spec{}, Spec{Egress: "all"}, "", nil},
		{"all", Spec{Egress: "all"}, Spec{Egress: "all"}, "", nil},
		{"none", Spec{Egress: "none"}, Spec{Egress: "none"}, "", nil},
		{"list empty", Spec{Egress: "list"}, Spec{Egress: "list"}, "", nil},
		{"list", Spec{Egress: "list", Allow: []string{"PyPI.org.", "*.github.com", "10.1.0.0/16", "2001:db8::1"}, Deny: []string{"gist.github.com"}},
			Spec{Egress: "list", Allow: []string{"pypi.org", "*.github.com", "10.1.0.0/16", "2001:db8::1"}, Deny: []string{"gist.github.com"}}, "", nil},
		{"all with deny", Spec{Egress: "all", Deny: []string{"evil.com", "203.0.113.0/24"}}, Spec{Egress: "all", Deny: []string{"evil.com", "203.0.113.0/24"}}, "", nil},
		{"default with deny", Spec{Deny: []string{"evil.com"}}, Spec{Egress: "all", Deny: []string{"evil.com"}}, "", nil},
		{"duplicates dropped", Spec{Egress: "list", Allow: []string{"pypi.org", "PYPI.ORG", "pypi.org.", "1.2.3.4", "1.2.3.4/32"}},
			Spec{Egress: "list", Allow: []string{"pypi.org", "1.2.3.4"}}, "", nil},
		{"empty lists", Spec{Egress: "list", Allow: []string{}, Deny: []string{}}, Spec{Egress: "list"}, "", nil},
		{"max rules", Spec{Egress: "list", Allow: many[:MaxRules], Deny: many[:MaxRules]}, Spec{Egress: "list", Allow: many[:MaxRules], Deny: many[:MaxRules]}, "", nil},
		{"unknown egress", Spec{Egress: "some"}, Spec{}, "network.egress", nil},
		{"egress upper", Spec{Egress: "ALL"}, Spec{}, "network.egress", nil},
		{"allow with all", Spec{Egress: "all", Allow: []string{"pypi.org"}}, Spec{}, "network.allow", nil},
		{"allow with default", Spec{Allow: []string{"pypi.org"}}, Spec{}, "network.allow", nil},
		{"allow with none", Spec{Egress: "none", Allow: []string{"pypi.org"}}, Spec{}, "network.allow", nil},
		{"deny with none", Spec{Egress: "none", Deny: []string{"pypi.org"}}, Spec{}, "network.deny", nil},
		{"too many allow", Spec{Egress: "list", Allow: many}, Spec{}, "network.allow", nil},
		{"too many deny", Spec{Egress: "all", Deny: many}, Spec{}, "network.deny", nil},
		{"bad allow rule", Spec{Egress: "list", Allow: []string{"pypi.org", "10.1.2.3/16"}}, Spec{}, "network.allow", 1},
		{"bad deny rule", Spec{Egress: "list", Deny: []string{"*"}}, Spec{}, "network.deny", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse(tt.in)
			if tt.field != "" {
				fe := fault.As(err)
				if fe == nil || fe.Kind != fault.Invalid || fe.Code != CodeInvalidField {
					t.Fatalf("Parse(%+v) = %+v, %v; want invalid_field", tt.in, p, err)
				}
				if fe.Fields["field"] != tt.field || fe.Fields["index"] != tt.index {
					t.Fatalf("Parse(%+v): fields %v, want field %s index %v", tt.in, fe.Fields, tt.field, tt.index)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%+v): %v", tt.in, err)
			}
			if got := p.Spec(); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Parse(%+v).Spec() = %+v, want %+v", tt.in, got, tt.want)
			}
			back, err := Parse(p.Spec())
			if err != nil || !reflect.DeepEqual(back, p) {
				t.Fatalf("Parse(%+v) = %+v, %v; want %+v", p.Spec(), back, err, p)
			}
		})
	}
}

func TestParseMessages(t *testing.T) {
	tests := []struct {
		in   Spec
		want string
	}{
		{Spec{Egress: "some"}, `egress "some": want "all", "none" or "list"`},
		{Spec{Allow: []string{"x.com"}}, `allow applies only with egress "list" (egress is "all"; "all" when not given)`},
		{Spec{Egress: "list", Allow: []string{"a.com", "10.1.2.3/16"}}, "network.allow[1]: 10.1.2.3/16 has host bits set: did you mean 10.1.0.0/16?"},
		{Spec{Egress: "list", Allow: make([]string, MaxRules+1)}, "network.allow holds 257 rules; at most 256"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.in)
		if fe := fault.As(err); fe == nil || fe.Message != tt.want {
			t.Errorf("Parse(%+v) = %v, want the message %q", tt.in, err, tt.want)
		}
	}
}

func TestDefault(t *testing.T) {
	p, err := Parse(Spec{})
	if err != nil || !reflect.DeepEqual(p, Default()) {
		t.Fatalf("Parse({}) = %+v, %v; want Default()", p, err)
	}
	if (Policy{}).Mode != None {
		t.Fatal("the zero Policy lets traffic out")
	}
}

func mustParse(t testing.TB, s Spec) Policy {
	t.Helper()
	p, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestName(t *testing.T) {
	all := mustParse(t, Spec{Egress: "all", Deny: []string{"evil.com", "*.tracker.net", "10.0.0.0/8"}})
	none := mustParse(t, Spec{Egress: "none"})
	list := mustParse(t, Spec{Egress: "list",
		Allow: []string{"pypi.org", "*.github.com", "93.184.216.0/24"},
		Deny:  []string{"gist.github.com", "*.evil.github.com"}})
	tests := []struct {
		name   string
		p      Policy
		host   string
		wanted bool
	}{
		{"all: any name", all, "example.com", true},
		{"all: denied name", all, "evil.com", false},
		{"all: denied name, case and dot", all, "EVIL.com.", false},
		{"all: subdomain of a denied name", all, "www.evil.com", true},
		{"all: denied wildcard", all, "a.b.tracker.net", false},
		{"all: wildcard's own name", all, "tracker.net", true},
		{"all: invalid name", all, "exa mple.com", false},
		{"all: non-ASCII", all, "bücher.de", false},
		{"none", none, "pypi.org", false},
		{"zero policy", Policy{}, "pypi.org", false},
		{"list: exact", list, "pypi.org", true},
		{"list: exact upper", list, "PYPI.ORG.", true},
		{"list: exact's subdomain", list, "files.pypi.org", false},
		{"list: wildcard", list, "api.github.com", true},
		{"list: wildcard deep", list, "a.b.c.github.com", true},
		{"list: wildcard's own name", list, "github.com", false},
		{"list: deny wins exact", list, "gist.github.com", false},
		{"list: deny wins wildcard", list, "x.evil.github.com", false},
		{"list: deny wildcard's own name", list, "evil.github.com", true},
		{"list: not named", list, "example.com", false},
		{"list: a CIDR names no name", list, "93.184.216.34", false},
		{"list: empty", list, "", false},
		{"list: too long", list, strings.Repeat("a.", 126) + "github.com", false},
	}
	for _, tt := range tests {
		if got := tt.p.Name(tt.host); got != tt.wanted {
			t.Errorf("%s: Name(%q) = %v, want %v", tt.name, tt.host, got, tt.wanted)
		}
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestDecide(t *testing.T) {
	site := Site{
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16"), netip.MustParsePrefix("fd00:99::/32")},
		HostAddrs:    []netip.Prefix{netip.MustParsePrefix("198.51.99.7/32"), netip.MustParsePrefix("2a01:4f8::7/128"), netip.MustParsePrefix("10.99.0.1/32")},
	}
	all := mustParse(t, Spec{Egress: "all", Deny: []string{"evil.com", "*.tracker.net", "93.184.0.0/16", "2a00:1450::/32", "10.99.5.0/24"}})
	none := mustParse(t, Spec{Egress: "none"})
	list := mustParse(t, Spec{Egress: "list",
		Allow: []string{"pypi.org", "*.github.com", "140.82.112.0/20", "2606:50c0::/32", "10.99.0.0/16"},
		Deny:  []string{"gist.github.com", "140.82.121.0/24"}})
	tests := []struct {
		name string
		p    Policy
		dst  string
		host string
		want Reason
	}{
		// the gate, before anything else
		{"all: loopback", all, "127.0.0.1:80", "", ReasonPrivateAddress},
		{"all: loopback with a name", all, "127.0.0.1:80", "example.com", ReasonPrivateAddress},
		{"all: metadata", all, "169.254.169.254:80", "", ReasonPrivateAddress},
		{"all: mapped loopback", all, "[::ffff:127.0.0.1]:80", "", ReasonPrivateAddress},
		{"all: ipv6 loopback", all, "[::1]:80", "", ReasonPrivateAddress},
		{"all: zone", all, "[fe80::1%eth0]:80", "", ReasonPrivateAddress},
		{"all: host's address", all, "198.51.99.7:22", "", ReasonPrivateAddress},
		{"all: host's ipv6 address", all, "[2a01:4f8::7]:22", "", ReasonPrivateAddress},
		{"list: allowed name at a private address", list, "192.168.1.1:443", "pypi.org", ReasonPrivateAddress},
		{"list: allow CIDR in a private range", list, "10.1.0.1:22", "", ReasonPrivateAddress},
		{"none: private", none, "10.0.0.1:80", "", ReasonPrivateAddress},
		// allow_private
		{"all: allow_private", all, "10.99.1.1:80", "", ReasonAllowed},
		{"all: allow_private, mapped", all, "[::ffff:10.99.1.1]:80", "", ReasonAllowed},
		{"all: allow_private over the host", all, "10.99.0.1:80", "", ReasonAllowed},
		{"all: allow_private ipv6", all, "[fd00:99::1]:80", "", ReasonAllowed},
		{"all: deny inside allow_private", all, "10.99.5.5:80", "", ReasonDeniedAddress},
		{"list: allow_private and allow CIDR", list, "10.99.1.1:22", "", ReasonAllowed},
		// none
		{"none: public", none, "93.184.216.34:80", "", ReasonEgressNone},
		{"none: public with a name", none, "93.184.216.34:443", "example.com", ReasonEgressNone},
		{"zero policy", Policy{}, "93.184.216.34:443", "example.com", ReasonEgressNone},
		{"unknown mode", Policy{Mode: 9}, "93.184.216.34:443", "example.com", ReasonEgressNone},
		// all
		{"all: raw tcp", all, "1.1.1.1:22", "", ReasonAllowed},
		{"all: a name", all, "1.1.1.1:443", "example.com", ReasonAllowed},
		{"all: ipv6", all, "[2606:4700::1111]:443", "", ReasonAllowed},
		{"all: mapped public", all, "[::ffff:1.1.1.1]:443", "", ReasonAllowed},
		{"all: denied name", all, "1.1.1.1:443", "evil.com", ReasonDeniedName},
		{"all: denied name, upper, dot", all, "1.1.1.1:443", "EVIL.COM.", ReasonDeniedName},
		{"all: denied wildcard", all, "1.1.1.1:443", "x.y.tracker.net", ReasonDeniedName},
		{"all: wildcard's own name", all, "1.1.1.1:443", "tracker.net", ReasonAllowed},
		{"all: denied CIDR", all, "93.184.216.34:80", "", ReasonDeniedAddress},
		{"all: denied CIDR with a name", all, "93.184.216.34:443", "example.com", ReasonDeniedAddress},
		{"all: denied CIDR, mapped", all, "[::ffff:93.184.216.34]:80", "", ReasonDeniedAddress},
		{"all: denied ipv6 CIDR", all, "[2a00:1450::1]:443", "", ReasonDeniedAddress},
		{"all: invalid name", all, "1.1.1.1:80", "exa mple.com", ReasonInvalidName},
		{"all: non-ASCII name", all, "1.1.1.1:80", "bücher.de", ReasonInvalidName},
		{"all: address literal", all, "1.1.1.1:80", "1.1.1.1", ReasonAllowed},
		{"all: zoned literal", all, "1.1.1.1:80", "fe80::1%eth0", ReasonInvalidName},
		// list, with a name
		{"list: exact", list, "151.101.0.223:443", "pypi.org", ReasonAllowed},
		{"list: exact, case and dot", list, "151.101.0.223:443", "PyPI.org.", ReasonAllowed},
		{"list: exact's subdomain", list, "151.101.0.223:443", "files.pypi.org", ReasonNotAllowed},
		{"list: wildcard", list, "140.82.114.4:443", "api.github.com", ReasonAllowed},
		{"list: wildcard deep", list, "185.199.108.133:443", "raw.a.b.github.com", ReasonAllowed},
		{"list: wildcard's own name", list, "140.82.114.4:443", "github.com", ReasonNotAllowed},
		{"list: deny name wins", list, "140.82.114.4:443", "gist.github.com", ReasonDeniedName},
		{"list: deny CIDR wins over a name", list, "140.82.121.3:443", "api.github.com", ReasonDeniedAddress},
		{"list: a name not named", list, "140.82.114.4:443", "example.com", ReasonNotAllowed},
		{"list: ipv6 with a name", list, "[2a04:4e42::223]:443", "pypi.org", ReasonAllowed},
		{"list: invalid name", list, "140.82.114.4:443", "*.github.com", ReasonInvalidName},
		// list, without a name: by address
		{"list: raw tcp to an allow CIDR", list, "140.82.114.4:22", "", ReasonAllowed},
		{"list: raw tcp to an allow CIDR, mapped", list, "[::ffff:140.82.114.4]:22", "", ReasonAllowed},
		{"list: raw tcp to an allow ipv6 CIDR", list, "[2606:50c0::1]:22", "", ReasonAllowed},
		{"list: raw tcp elsewhere", list, "151.101.0.223:443", "", ReasonNoName},
		{"list: raw tcp to a deny CIDR", list, "140.82.121.3:22", "", ReasonDeniedAddress},
		{"list: address literal in an allow CIDR", list, "140.82.114.4:80", "140.82.114.4", ReasonAllowed},
		{"list: address literal elsewhere", list, "151.101.0.223:80", "151.101.0.223", ReasonNoName},
		{"list: bracketed literal", list, "[2606:50c0::1]:80", "[2606:50c0::1]", ReasonAllowed},
		{"list: bracketed literal elsewhere", list, "[2a04:4e42::223]:80", "[2a04:4e42::223]", ReasonNoName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.p.Decide(Conn{Dst: ap(tt.dst), Name: tt.host}, site)
			want := Decision{Allow: tt.want == ReasonAllowed, Reason: tt.want}
			if got != want {
				t.Fatalf("Decide(%s, %q) = %+v, want %+v", tt.dst, tt.host, got, want)
			}
		})
	}
}

func TestModeString(t *testing.T) {
	for m, want := range map[Mode]string{None: "none", All: "all", List: "list", 7: "mode(7)"} {
		if got := m.String(); got != want {
			t.Errorf("Mode(%d).String() = %q, want %q", m, got, want)
		}
	}
}

// BenchmarkDecide decides connections under a list policy of MaxRules
// allow and MaxRules-1 deny rules (names, wildcards, CIDRs), the allow
// rule that matches last and no deny rule matching: the worst case of the
// linear scans.
func BenchmarkDecide(b *testing.B) {
	var allow, deny []string
	for i := range MaxRules - 2 {
		switch i % 3 {
		case 0:
			allow = append(allow, fmt.Sprintf("host%d.example.com", i))
			deny = append(deny, fmt.Sprintf("bad%d.example.com", i))
		case 1:
			allow = append(allow, fmt.Sprintf("*.zone%d.example.org", i))
			deny = append(deny, fmt.Sprintf("*.bad%d.example.org", i))
		case 2:
			allow = append(allow, fmt.Sprintf("100.%d.%d.0/24", 128+i/256, i%256))
			deny = append(deny, fmt.Sprintf("2001:4860:%x::/48", i))
		}
	}
	allow = append(allow, "*.github.com", "140.82.112.0/20")
	deny = append(deny, "gist.github.com")
	p := mustParse(b, Spec{Egress: "list", Allow: allow, Deny: deny})
	site := Site{
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")},
		HostAddrs:    []netip.Prefix{netip.MustParsePrefix("198.51.99.7/32"), netip.MustParsePrefix("2a01:4f8::7/128")},
	}
	for _, c := range []struct {
		name string
		conn Conn
	}{
		{"name", Conn{Dst: ap("140.82.114.4:443"), Name: "api.github.com"}},
		{"address", Conn{Dst: ap("140.82.114.4:22")}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if !p.Decide(c.conn, site).Allow {
					b.Fatal("refused")
				}
			}
		})
	}
}
