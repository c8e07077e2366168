package policy

import (
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/net/idna"

	"strata/internal/fault"
)

// Limits of a network setting.
const (
	// MaxRules is the most rules an allow or a deny list may hold.
	MaxRules = 256
	// MaxName bounds a host name, in bytes, without the trailing dot (the
	// most a DNS name can spell).
	MaxName = 253
	// MaxLabel bounds one label of a host name, in bytes.
	MaxLabel = 63
	// maxRuleText bounds a rule as written, before IDNA, so that a rule
	// of megabytes costs nothing to refuse.
	maxRuleText = 1024
)

// Rule is one entry of an allow or a deny list: a host name, a wildcard,
// or a CIDR. The zero Rule matches nothing.
type Rule struct {
	// Name is a name rule's host name (lower case A-labels, no trailing
	// dot); for a wildcard, the name below "*.".
	Name string
	// Wildcard makes the rule match every name below Name, at any depth,
	// and not Name itself.
	Wildcard bool
	// Prefix is a CIDR rule's range, masked; invalid for a name rule.
	Prefix netip.Prefix
}

// ParseRule reads one rule: a host name ("pypi.org"), a wildcard
// ("*.github.com") or a CIDR ("10.1.0.0/16", "2001:db8::/32", a bare
// address as its /32 or /128). A broken rule is invalid_field "rule".
func ParseRule(s string) (Rule, error) {
	r, reason := parseRule(s)
	if reason != "" {
		return Rule{}, fault.New(fault.Invalid, CodeInvalidField, reason).With("field", "rule")
	}
	return r, nil
}

// String is the rule's canonical form, which ParseRule reads back to the
// same rule: a single address is written bare.
func (r Rule) String() string {
	switch {
	case r.Prefix.IsValid():
		if r.Prefix.IsSingleIP() {
			return r.Prefix.Addr().String()
		}
		return r.Prefix.String()
	case r.Wildcard:
		return "*." + r.Name
	}
	return r.Name
}

// matchName tells whether the rule matches name, a name normalised by
// checkName.
func (r Rule) matchName(name string) bool {
	if r.Prefix.IsValid() || r.Name == "" {
		return false
	}
	if !r.Wildcard {
		return name == r.Name
	}
	n := len(name) - len(r.Name)
	return n > 1 && name[n-1] == '.' && name[n:] == r.Name
}

// matchAddr tells whether the rule matches a, an unmapped address.
func (r Rule) matchAddr(a netip.Addr) bool {
	return r.Prefix.IsValid() && r.Prefix.Contains(a)
}

// parseRule is ParseRule with the reason a rule is refused, "" when it is
// not.
func parseRule(s string) (Rule, string) {
	switch {
	case s == "":
		return Rule{}, "a rule is a host name, *.name or a CIDR; got the empty string"
	case len(s) > maxRuleText:
		return Rule{}, fmt.Sprintf("%q is longer than a host name can be (%d bytes)", truncate(s), MaxName)
	case strings.Contains(s, "://"):
		return Rule{}, fmt.Sprintf("%q is a URL: a rule is a host name, *.name or a CIDR", truncate(s))
	case strings.Contains(s, "%"):
		return Rule{}, fmt.Sprintf("%q has a zone (%%…): a rule's address cannot name an interface", truncate(s))
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Rule{}, fmt.Sprintf("%q is not a CIDR: want an address, '/' and a prefix length, as 10.1.0.0/16 or 2001:db8::/32", truncate(s))
		}
		if p.Addr().Is4In6() {
			return Rule{}, fmt.Sprintf("%s is an IPv4-mapped IPv6 range: write IPv4 ranges as IPv4", s)
		}
		if m := p.Masked(); m != p {
			return Rule{}, fmt.Sprintf("%s has host bits set: did you mean %s?", s, m)
		}
		return Rule{Prefix: p}, ""
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Is4In6() {
			return Rule{}, fmt.Sprintf("%s is an IPv4-mapped IPv6 address: write it as %s", s, a.Unmap())
		}
		return Rule{Prefix: netip.PrefixFrom(a, a.BitLen())}, ""
	}
	if strings.Contains(s, ":") {
		return Rule{}, fmt.Sprintf("%q is not an IPv6 address, and a host name holds no ':' (a rule carries no port)", truncate(s))
	}
	name, wildcard := strings.CutPrefix(s, "*.")
	if strings.Contains(name, "*") || name == "" {
		return Rule{}, fmt.Sprintf("%q: '*' may only be the whole first label, followed by a name, as in *.github.com", truncate(s))
	}
	name, reason := ruleName(name)
	if reason != "" {
		return Rule{}, fmt.Sprintf("%q: %s", truncate(s), reason)
	}
	if wildcard && len(name)+2 > MaxName {
		return Rule{}, fmt.Sprintf("%q: no name below %s is at most %d bytes", truncate(s), truncate(name), MaxName)
	}
	return Rule{Name: name, Wildcard: wildcard}, ""
}

// ruleName normalises a rule's host name: IDNA to A-labels when it is not
// ASCII, lower case, one trailing dot dropped; then checks it as
// checkName with strict LDH labels.
func ruleName(s string) (string, string) {
	if !isASCII(s) {
		a, err := idna.Lookup.ToASCII(s)
		if err != nil {
			return "", "not a valid internationalised host name (IDNA)"
		}
		s = a
	}
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if reason := checkName(s, true); reason != "" {
		return "", reason
	}
	return s, ""
}

// normalName normalises a name met at run time (a DNS question, an SNI, an
// HTTP Host without its port): lower case ASCII, one trailing dot dropped.
// It is checked as checkName with lenient labels: '_' anywhere and '-' at
// either end, as names in the wild have. ok is false for a name that is
// not one (non-ASCII too: DNS and SNI carry A-labels).
func normalName(s string) (string, bool) {
	if len(s) > MaxName+1 || !isASCII(s) {
		return "", false
	}
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	return s, checkName(s, false) == ""
}

// checkName returns why s, lower case and without the trailing dot, is not
// a host name, "" when it is. strict labels are LDH: letters, digits and
// hyphens, not at either end; lenient labels may also hold '_' and start
// or end with '-'.
func checkName(s string, strict bool) string {
	switch {
	case s == "":
		return "the name is empty"
	case len(s) > MaxName:
		return fmt.Sprintf("the name is longer than %d bytes", MaxName)
	}
	last := ""
	for label := range strings.SplitSeq(s, ".") {
		switch {
		case label == "":
			return "the name has an empty label (two dots in a row, or a dot at the start)"
		case len(label) > MaxLabel:
			return fmt.Sprintf("a label is longer than %d bytes", MaxLabel)
		case strict && (label[0] == '-' || label[len(label)-1] == '-'):
			return "a label starts or ends with '-'"
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || !strict && c == '_') {
				return fmt.Sprintf("%q is not allowed in a host name (letters, digits, '-' and '.')", rune(c))
			}
		}
		last = label
	}
	if strings.Trim(last, "0123456789") == "" {
		return "the last label is all digits: write an address as an address or a CIDR"
	}
	return ""
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// truncate is s cut to 64 bytes for a message that quotes what the
// client sent (%q escapes what is not text).
func truncate(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64] + "…"
}
