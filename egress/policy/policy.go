package policy

import (
	"fmt"
	"net/netip"

	"strata/internal/fault"
)

// CodeInvalidField is the code of every error Parse and ParseRule return
// (fault.Invalid, 400), as the rest of the API's body checks.
const CodeInvalidField = "invalid_field"

// Mode is a policy's egress: what it lets out before its lists apply.
type Mode uint8

const (
	// None lets nothing out. It is the zero Mode, so that a Policy nobody
	// filled in refuses everything.
	None Mode = iota
	// All lets out the public internet, less the deny list.
	All
	// List lets out only what the allow list names, less the deny list.
	List
)

var modeNames = [...]string{None: "none", All: "all", List: "list"}

// String is the mode's name in the API: "none", "all" or "list".
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// Spec is the network setting as the API carries it, in a create's
// "network" field and the body of PUT …/network.
type Spec struct {
	Egress string   `json:"egress"`
	Allow  []string `json:"allow,omitempty"`
	Deny   []string `json:"deny,omitempty"`
}

// Policy is a parsed network setting. Rules in Allow and Deny are unique.
type Policy struct {
	Mode  Mode
	Allow []Rule
	Deny  []Rule
}

// Default is the policy of a sandbox created without a network setting:
// the public internet.
func Default() Policy { return Policy{Mode: All} }

// Parse checks a network setting and reads it into a Policy (see the
// package documentation for the rules). A broken setting is
// invalid_field with "field" network.egress, network.allow or
// network.deny, and "index" the offending rule's position.
func Parse(s Spec) (Policy, error) {
	var p Policy
	switch s.Egress {
	case "all", "":
		p.Mode = All
	case "none":
		p.Mode = None
	case "list":
		p.Mode = List
	default:
		return Policy{}, invalid("network.egress", fmt.Sprintf(`egress %q: want "all", "none" or "list"`, truncate(s.Egress)))
	}
	switch {
	case len(s.Allow) > 0 && p.Mode != List:
		return Policy{}, invalid("network.allow", fmt.Sprintf(`allow applies only with egress "list" (egress is %q; "all" when not given)`, p.Mode))
	case len(s.Deny) > 0 && p.Mode == None:
		return Policy{}, invalid("network.deny", `deny means nothing with egress "none", which lets nothing out`)
	}
	var err error
	if p.Allow, err = parseRules("network.allow", s.Allow); err != nil {
		return Policy{}, err
	}
	if p.Deny, err = parseRules("network.deny", s.Deny); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// parseRules reads one list, dropping duplicates. An empty list is nil.
func parseRules(field string, list []string) ([]Rule, error) {
	if len(list) > MaxRules {
		return nil, invalid(field, fmt.Sprintf("%s holds %d rules; at most %d", field, len(list), MaxRules)).With("limit", MaxRules)
	}
	var rules []Rule
	seen := make(map[Rule]bool, len(list))
	for i, s := range list {
		r, reason := parseRule(s)
		if reason != "" {
			return nil, invalid(field, fmt.Sprintf("%s[%d]: %s", field, i, reason)).With("index", i)
		}
		if !seen[r] {
			seen[r] = true
			rules = append(rules, r)
		}
	}
	return rules, nil
}

func invalid(field, message string) *fault.Error {
	return fault.New(fault.Invalid, CodeInvalidField, message).With("field", field)
}

// Spec is the policy's canonical setting, for records and GET: Parse
// reads it back to the same policy.
func (p Policy) Spec() Spec {
	s := Spec{Egress: p.Mode.String()}
	for _, r := range p.Allow {
		s.Allow = append(s.Allow, r.String())
	}
	for _, r := range p.Deny {
		s.Deny = append(s.Deny, r.String())
	}
	return s
}

// Name tells whether the sandbox may resolve and reach name (a DNS
// question, an SNI, an HTTP Host without its port): under None never,
// under All unless a deny rule matches it, under List when an allow rule
// matches it and no deny rule does. A name that is not one (see
// normalName) is refused under every mode.
func (p Policy) Name(name string) bool {
	n, ok := normalName(name)
	if !ok {
		return false
	}
	switch p.Mode {
	case All:
		return !matchName(p.Deny, n)
	case List:
		return matchName(p.Allow, n) && !matchName(p.Deny, n)
	}
	return false
}

// Conn is one TCP connection a sandbox opens.
type Conn struct {
	// Dst is the address and port the guest connected to.
	Dst netip.AddrPort
	// Name is the name the connection carries, from its HTTP Host or its
	// TLS SNI, without a port; "" when it carries none (raw TCP, TLS
	// without SNI). An address literal (curl http://10.1.2.3/) counts as
	// no name.
	Name string
}

// Reason is a decision's stable code, for logs, metrics and the refused
// connection's record.
type Reason string

// The reasons of Decide.
const (
	// ReasonAllowed is the reason of every allowed connection.
	ReasonAllowed Reason = "allowed"
	// ReasonPrivateAddress: Gate refuses the destination.
	ReasonPrivateAddress Reason = "private_address"
	// ReasonEgressNone: the policy's egress is none.
	ReasonEgressNone Reason = "egress_none"
	// ReasonDeniedAddress: a deny CIDR matches the destination.
	ReasonDeniedAddress Reason = "denied_address"
	// ReasonInvalidName: the connection's name is not a host name.
	ReasonInvalidName Reason = "invalid_name"
	// ReasonDeniedName: a deny name rule matches the connection's name.
	ReasonDeniedName Reason = "denied_name"
	// ReasonNotAllowed: under list, no allow rule matches the name.
	ReasonNotAllowed Reason = "not_allowed"
	// ReasonNoName: under list, a connection without a name whose
	// destination no allow CIDR matches.
	ReasonNoName Reason = "no_name"
)

// Reasons lists every reason Decide can give.
var Reasons = []Reason{
	ReasonAllowed, ReasonPrivateAddress, ReasonEgressNone, ReasonDeniedAddress,
	ReasonInvalidName, ReasonDeniedName, ReasonNotAllowed, ReasonNoName,
}

// Decision is Decide's answer.
type Decision struct {
	Allow  bool
	Reason Reason
}

// Decide decides one TCP connection, in this order, the first refusal
// winning: Gate on the destination (private_address); egress none
// (egress_none); a deny CIDR on the destination (denied_address); a name
// that is not one (invalid_name); a deny name rule (denied_name). Then
// All allows; List allows a connection with a name when an allow name
// rule matches it (else not_allowed), and one without when an allow CIDR
// matches its destination (else no_name).
//
// Under List the caller dials an allowed name only at addresses it
// resolved itself for that name (see the package documentation).
func (p Policy) Decide(c Conn, s Site) Decision {
	a := c.Dst.Addr().Unmap()
	if !Gate(a, s) {
		return refuse(ReasonPrivateAddress)
	}
	if p.Mode != All && p.Mode != List {
		return refuse(ReasonEgressNone)
	}
	if matchAddr(p.Deny, a) {
		return refuse(ReasonDeniedAddress)
	}
	name, ok := connName(c.Name)
	switch {
	case !ok:
		return refuse(ReasonInvalidName)
	case name != "" && matchName(p.Deny, name):
		return refuse(ReasonDeniedName)
	case p.Mode == All:
		return Decision{Allow: true, Reason: ReasonAllowed}
	case name == "" && !matchAddr(p.Allow, a):
		return refuse(ReasonNoName)
	case name != "" && !matchName(p.Allow, name):
		return refuse(ReasonNotAllowed)
	}
	return Decision{Allow: true, Reason: ReasonAllowed}
}

func refuse(r Reason) Decision { return Decision{Reason: r} }

// connName normalises a connection's name: "" for none or an address
// literal (bracketed or not), ok false for a name that is not one.
func connName(s string) (string, bool) {
	if s == "" {
		return "", true
	}
	lit := s
	if len(lit) > 2 && lit[0] == '[' && lit[len(lit)-1] == ']' {
		lit = lit[1 : len(lit)-1]
	}
	if a, err := netip.ParseAddr(lit); err == nil && a.Zone() == "" {
		return "", true
	}
	return normalName(s)
}

func matchName(rules []Rule, name string) bool {
	for _, r := range rules {
		if r.matchName(name) {
			return true
		}
	}
	return false
}

func matchAddr(rules []Rule, a netip.Addr) bool {
	for _, r := range rules {
		if r.matchAddr(a) {
			return true
		}
	}
	return false
}
