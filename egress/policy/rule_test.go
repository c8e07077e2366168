package policy

import (
	"net/netip"
	"strings"
	"testing"

	"strata/internal/fault"
)

func TestParseRule(t *testing.T) {
	long63 := strings.Repeat("a", 63)
	name253 := strings.Join([]string{long63, long63, long63, strings.Repeat("b", 61)}, ".") // 253 bytes
	tests := []struct {
		name string
		in   string
		want string // canonical form; "" means refused
		err  string // a part of the refusal's message
	}{
		{"name", "pypi.org", "pypi.org", ""},
		{"upper case", "PyPI.Org", "pypi.org", ""},
		{"trailing dot", "pypi.org.", "pypi.org", ""},
		{"two trailing dots", "pypi.org..", "", "empty label"},
		{"single label", "localhost", "localhost", ""},
		{"digits and hyphens", "a-1.x9.example", "a-1.x9.example", ""},
		{"wildcard", "*.github.com", "*.github.com", ""},
		{"wildcard upper, dot", "*.GitHub.com.", "*.github.com", ""},
		{"wildcard tld", "*.com", "*.com", ""},
		{"star alone", "*", "", "'*' may only be"},
		{"star dot", "*.", "", "'*' may only be"},
		{"star inner", "api.*.com", "", "'*' may only be"},
		{"star in label", "*foo.com", "", "'*' may only be"},
		{"two stars", "*.*.com", "", "'*' may only be"},
		{"idna", "bücher.de", "xn--bcher-kva.de", ""},
		{"idna upper", "BÜCHER.de", "xn--bcher-kva.de", ""},
		{"idna wildcard", "*.bücher.de", "*.xn--bcher-kva.de", ""},
		{"idna fullwidth dot", "bücher。de", "xn--bcher-kva.de", ""},
		{"a-label kept", "xn--bcher-kva.de", "xn--bcher-kva.de", ""},
		{"idna invalid", "a\u200d.com", "", "IDNA"},
		{"label 63", long63 + ".com", long63 + ".com", ""},
		{"label 64", long63 + "a.com", "", "longer than 63"},
		{"name 253", name253, name253, ""},
		{"name 253 and dot", name253 + ".", name253, ""},
		{"name 254", name253 + "b", "", "longer than 253"},
		{"wildcard too long", "*." + name253, "", "no name below"},
		{"huge", strings.Repeat("a", 5000), "", "longer than"},
		{"empty", "", "", "empty string"},
		{"dot", ".", "", "empty"},
		{"leading dot", ".pypi.org", "", "empty label"},
		{"inner dots", "pypi..org", "", "empty label"},
		{"leading hyphen", "-a.com", "", "'-'"},
		{"trailing hyphen", "a-.com", "", "'-'"},
		{"underscore", "_srv.example.com", "", "not allowed"},
		{"space", "pypi.org ", "", "not allowed"},
		{"nul", "pypi\x00.org", "", "not allowed"},
		{"numeric tld", "1.2.3", "", "all digits"},
		{"octal-looking address", "010.1.1.1", "", "all digits"},
		{"port", "pypi.org:443", "", "no port"},
		{"url", "https://pypi.org", "", "URL"},
		{"ipv4", "93.184.216.34", "93.184.216.34", ""},
		{"ipv4 /32", "93.184.216.34/32", "93.184.216.34", ""},
		{"ipv4 cidr", "10.1.0.0/16", "10.1.0.0/16", ""},
		{"ipv4 /0", "0.0.0.0/0", "0.0.0.0/0", ""},
		{"ipv4 host bits", "10.1.2.3/16", "", "did you mean 10.1.0.0/16?"},
		{"ipv4 bad length", "10.0.0.0/33", "", "not a CIDR"},
		{"ipv4 no length", "10.0.0.0/", "", "not a CIDR"},
		{"ipv6", "2001:DB8::1", "2001:db8::1", ""},
		{"ipv6 /128", "2001:db8::1/128", "2001:db8::1", ""},
		{"ipv6 cidr", "2001:db8::/32", "2001:db8::/32", ""},
		{"ipv6 cidr upper", "2001:DB8::/32", "2001:db8::/32", ""},
		{"ipv6 host bits", "2001:db8::1/32", "", "did you mean 2001:db8::/32?"},
		{"ipv6 zone", "fe80::1%eth0", "", "zone"},
		{"ipv6 cidr zone", "fe80::%eth0/64", "", "zone"},
		{"mapped address", "::ffff:10.0.0.1", "", "write it as 10.0.0.1"},
		{"mapped cidr", "::ffff:10.0.0.0/104", "", "IPv4-mapped"},
		{"bad ipv6", "2001:db8::g", "", "no port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRule(tt.in)
			if tt.want == "" {
				fe := fault.As(err)
				if fe == nil || fe.Kind != fault.Invalid || fe.Code != CodeInvalidField || fe.Fields["field"] != "rule" {
					t.Fatalf("ParseRule(%q) = %+v, %v; want invalid_field", tt.in, r, err)
				}
				if !strings.Contains(fe.Message, tt.err) {
					t.Fatalf("ParseRule(%q): message %q, want it to say %q", tt.in, fe.Message, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRule(%q): %v", tt.in, err)
			}
			if got := r.String(); got != tt.want {
				t.Fatalf("ParseRule(%q) = %q, want %q", tt.in, got, tt.want)
			}
			back, err := ParseRule(r.String())
			if err != nil || back != r {
				t.Fatalf("ParseRule(%q) = %+v, %v; want %+v", r.String(), back, err, r)
			}
		})
	}
}

func TestRuleMatchName(t *testing.T) {
	tests := []struct {
		rule, name string
		want       bool
	}{
		{"pypi.org", "pypi.org", true},
		{"pypi.org", "files.pypi.org", false},
		{"pypi.org", "xpypi.org", false},
		{"pypi.org", "pypi.org.evil.com", false},
		{"*.github.com", "github.com", false},
		{"*.github.com", "api.github.com", true},
		{"*.github.com", "a.b.c.github.com", true},
		{"*.github.com", "evilgithub.com", false},
		{"*.github.com", ".github.com", false},
		{"*.github.com", "github.com.evil.com", false},
		{"*.com", "github.com", true},
		{"*.com", "com", false},
		{"10.0.0.0/8", "10.0.0.1", false},
	}
	for _, tt := range tests {
		r, err := ParseRule(tt.rule)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.matchName(tt.name); got != tt.want {
			t.Errorf("%s matches %s: %v, want %v", tt.rule, tt.name, got, tt.want)
		}
	}
	if (Rule{}).matchName("") || (Rule{Wildcard: true}).matchName("a.") {
		t.Error("the zero rule matches a name")
	}
}

func TestNormalName(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"PyPI.org", "pypi.org", true},
		{"pypi.org.", "pypi.org", true},
		{"pypi.org..", "", false},
		{"_dmarc.example.com", "_dmarc.example.com", true},
		{"foo-.blogspot.com", "foo-.blogspot.com", true},
		{"bücher.de", "", false},
		{"pypi.org:443", "", false},
		{"", "", false},
		{".", "", false},
		{"1.2.3.4", "", false},
		{strings.Repeat("a.", 126) + "com", "", false},
	}
	for _, tt := range tests {
		got, ok := normalName(tt.in)
		if ok != tt.ok || ok && got != tt.want {
			t.Errorf("normalName(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestRuleMatchAddr(t *testing.T) {
	r, _ := ParseRule("10.1.0.0/16")
	for a, want := range map[string]bool{
		"10.1.0.0": true, "10.1.255.255": true, "10.2.0.0": false, "2001:db8::1": false,
	} {
		if got := r.matchAddr(netip.MustParseAddr(a)); got != want {
			t.Errorf("10.1.0.0/16 matches %s: %v", a, got)
		}
	}
	if (Rule{Name: "pypi.org"}).matchAddr(netip.MustParseAddr("10.0.0.1")) {
		t.Error("a name rule matches an address")
	}
}
