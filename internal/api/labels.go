package api

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"strata/internal/fault"
	"strata/internal/jsend"
)

// A sandbox's env and labels (API.md, "Names, keys, env and labels").
//
// env is the environment every exec and session of the sandbox starts
// with, under the call's own env (MergeEnv); hostproxy adds it to each
// exec and session body it forwards, so that guestd, and the rules it
// checks a body by (ParseExec), stay as they are. That is why an entry
// of a sandbox's env keeps exec's rule too: its name and value together
// at most MaxExecEnvEntry bytes, and a call's env and the sandbox's
// together at most MaxExecEnv entries.
//
// labels are the sandbox's own key=value tags: a create or a fork gives
// them, PUT …/labels replaces them, and GET /v1/sandboxes?label=k=v
// finds sandboxes by them (LabelSelector).

// Limits of a sandbox's env and labels.
const (
	// MaxSandboxEnv is the most entries a sandbox's env may hold: exec's.
	MaxSandboxEnv = MaxExecEnv
	// MaxEnvValue bounds one value of a sandbox's env, in bytes; the name
	// and value together are bounded by MaxExecEnvEntry as well.
	MaxEnvValue = 4 << 10
	// MaxLabels is the most labels a sandbox may hold.
	MaxLabels = 32
	// MaxLabelKey bounds a label's key, in bytes (all ASCII).
	MaxLabelKey = 63
	// MaxLabelValue bounds a label's value, in bytes of UTF-8.
	MaxLabelValue = 256
	// MaxLabelSelectors is the most label= parameters a list takes: a
	// sandbox holds at most MaxLabels labels, so more could match
	// nothing that fewer could not.
	MaxLabelSelectors = MaxLabels
	// MaxLabelsBody bounds the body of PUT …/labels: the most labels,
	// each key and value written the longest way JSON allows (every
	// byte escaped as \u00XX, six bytes), with their quotes, colon and
	// comma.
	MaxLabelsBody = 64 << 10
	// MaxCreateBody bounds the body of a sandbox create (and of a fork
	// of many), in place of jsend.MaxBody: the largest env (MaxSandboxEnv
	// entries of MaxExecEnvEntry bytes, every byte escaped: about 1.5 MiB),
	// MaxLabelsBody, and the other fields.
	MaxCreateBody = 2 << 20
)

// ErrCreateBodyTooLarge is body_too_large for a create or fork body over
// MaxCreateBody; ErrLabelsBodyTooLarge for a labels body over
// MaxLabelsBody.
var (
	ErrCreateBodyTooLarge = fault.New(fault.TooLarge, "body_too_large", "the request body is larger than 2 MiB").With("limit", MaxCreateBody)
	ErrLabelsBodyTooLarge = fault.New(fault.TooLarge, "body_too_large", "the request body is larger than 64 KiB").With("limit", MaxLabelsBody)
)

// ValidEnvName reports whether s may name an entry of a sandbox's env:
// [A-Za-z_][A-Za-z0-9_]*, the names a POSIX shell can read back.
func ValidEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', lower(c), upper(c):
		case i > 0 && digit(c):
		default:
			return false
		}
	}
	return true
}

// ValidateSandboxEnv checks a sandbox's env as field says (a create's
// "env"): at most MaxSandboxEnv entries; each name ValidEnvName; each
// value at most MaxEnvValue bytes of UTF-8 without NUL (JSON carries
// text, and the kernel cannot pass a NUL), and name and value
// together at most MaxExecEnvEntry bytes, exec's rule, so that every
// entry can go to every exec. A broken rule is invalid_field naming
// field, with "name" the entry's when one is at fault.
func ValidateSandboxEnv(field string, env map[string]string) error {
	if len(env) > MaxSandboxEnv {
		return jsend.InvalidField(field, fmt.Sprintf("%s must hold at most %d entries", field, MaxSandboxEnv)).With("limit", MaxSandboxEnv)
	}
	for _, k := range sortedKeys(env) {
		v := env[k]
		switch {
		case !ValidEnvName(k):
			return jsend.InvalidField(field, fmt.Sprintf("%s name %q: want a letter or '_', then letters, digits and '_'", field, truncate(k, 64))).With("name", truncate(k, 64))
		case strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v):
			return jsend.InvalidField(field, fmt.Sprintf("the value of %s %s is not text: it holds a NUL byte, or is not UTF-8", field, k)).With("name", k)
		case len(v) > MaxEnvValue:
			return jsend.InvalidField(field, fmt.Sprintf("the value of %s %s is over 4 KiB", field, k)).With("name", k).With("limit", MaxEnvValue)
		case len(k)+len(v) > MaxExecEnvEntry:
			return jsend.InvalidField(field, fmt.Sprintf("%s %s is over 4 KiB, name and value together (exec's rule for an env entry)", field, k)).With("name", k).With("limit", MaxExecEnvEntry)
		}
	}
	return nil
}

// MergeEnv is the env an exec or a session of a sandbox runs with: the
// sandbox's env (base), each entry replaced by the call's own (call) of
// the same name. Both were checked already (ValidateSandboxEnv,
// ParseExec); the merge must keep exec's rule of at most MaxExecEnv
// entries, or it is invalid_field "env" naming the limit and how many
// the sandbox gives, since guestd would refuse it. Neither map is
// changed; nil when both are empty.
func MergeEnv(base, call map[string]string) (map[string]string, error) {
	if len(base) == 0 {
		return call, nil
	}
	n := len(call)
	for k := range base {
		if _, ok := call[k]; !ok {
			n++
		}
	}
	if n > MaxExecEnv {
		return nil, jsend.InvalidField("env", fmt.Sprintf("the sandbox's env and this call's hold %d entries together; at most %d (the sandbox's has %d)", n, MaxExecEnv, len(base))).
			With("limit", MaxExecEnv).With("sandbox_env", len(base))
	}
	out := make(map[string]string, n)
	for k, v := range base {
		out[k] = v
	}
	for k, v := range call {
		out[k] = v
	}
	return out, nil
}

// ValidLabelKey reports whether s may be a label's key:
// [a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?, 1 to 63 bytes.
func ValidLabelKey(s string) bool {
	if len(s) == 0 || len(s) > MaxLabelKey {
		return false
	}
	end := func(c byte) bool { return lower(c) || digit(c) }
	if !end(s[0]) || !end(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		if c := s[i]; !end(c) && c != '.' && c != '_' && c != '/' && c != '-' {
			return false
		}
	}
	return true
}

// ValidLabelValue reports whether s may be a label's value: at most
// MaxLabelValue bytes of printable UTF-8 (letters, marks, numbers,
// punctuation, symbols and the ASCII space; no control characters,
// no other spaces). The empty value is a value.
func ValidLabelValue(s string) bool {
	if len(s) > MaxLabelValue || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// ValidateLabels checks a sandbox's labels as field says (a create's
// "labels", a fork's, PUT …/labels' body): at most MaxLabels; each key
// ValidLabelKey, each value ValidLabelValue. A broken rule is
// invalid_field naming field, with "key" the label's when one is at
// fault.
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return jsend.InvalidField(field, fmt.Sprintf("%s must hold at most %d labels", field, MaxLabels)).With("limit", MaxLabels)
	}
	for _, k := range sortedKeys(labels) {
		if !ValidLabelKey(k) {
			return jsend.InvalidField(field, fmt.Sprintf("label key %q: want 1 to 63 lowercase letters, digits, '.', '_', '/' and '-', starting and ending with a letter or digit", truncate(k, 64))).With("key", truncate(k, 64))
		}
		if !ValidLabelValue(labels[k]) {
			return jsend.InvalidField(field, fmt.Sprintf("the value of label %s: want at most %d bytes of printable UTF-8", k, MaxLabelValue)).With("key", k).With("limit", MaxLabelValue)
		}
	}
	return nil
}

// ParseLabelsBody decodes and checks the body of PUT …/labels: exactly
// one JSON object of string values (jsend.DecodeBytes's rules), at most
// MaxLabelsBody bytes, that ValidateLabels accepts as "labels". {} takes
// every label away. The answer is never nil.
func ParseLabelsBody(body []byte) (map[string]string, error) {
	if len(body) > MaxLabelsBody {
		return nil, ErrLabelsBodyTooLarge
	}
	var raw map[string]json.RawMessage
	if err := jsend.DecodeBytes(body, &raw); err != nil {
		return nil, err
	}
	labels := make(map[string]string, len(raw))
	for _, k := range sortedKeys(raw) {
		var v string
		if json.Unmarshal(raw[k], &v) != nil {
			return nil, jsend.InvalidField("labels", fmt.Sprintf("the value of label %q must be a string", truncate(k, 64))).With("key", truncate(k, 64))
		}
		labels[k] = v
	}
	if err := ValidateLabels("labels", labels); err != nil {
		return nil, err
	}
	return labels, nil
}

// LabelMatch is one term of a label selector: the label Key has exactly
// the value Value.
type LabelMatch struct {
	Key, Value string
}

// LabelSelector is the label= parameters of a list: a sandbox matches
// when it matches every term. The empty selector matches every sandbox.
type LabelSelector []LabelMatch

// ParseLabelSelector reads the values of GET /v1/sandboxes' label=
// parameters (url.Values["label"]), each "key=value": the key a label
// key (ValidLabelKey), the value, split at the first '=', a label value
// (ValidLabelValue; it may hold '=' and be empty), at most
// MaxLabelSelectors of them. Two terms of one key with different values
// are kept: together they match nothing, as "all must match" says. A
// broken rule is invalid_field naming "label".
func ParseLabelSelector(values []string) (LabelSelector, error) {
	if len(values) > MaxLabelSelectors {
		return nil, jsend.InvalidField("label", fmt.Sprintf("at most %d label= parameters", MaxLabelSelectors)).With("limit", MaxLabelSelectors)
	}
	var sel LabelSelector
	for _, v := range values {
		k, val, ok := strings.Cut(v, "=")
		switch {
		case !ok:
			return nil, jsend.InvalidField("label", fmt.Sprintf("label=%s: want label=KEY=VALUE", truncate(v, 64)))
		case !ValidLabelKey(k):
			return nil, jsend.InvalidField("label", fmt.Sprintf("label=%s: the key is not a label key (1 to 63 lowercase letters, digits, '.', '_', '/' and '-', starting and ending with a letter or digit)", truncate(v, 64)))
		case !ValidLabelValue(val):
			return nil, jsend.InvalidField("label", fmt.Sprintf("label=%s: the value is not a label value (at most %d bytes of printable UTF-8)", truncate(k, 64), MaxLabelValue))
		}
		sel = append(sel, LabelMatch{k, val})
	}
	return sel, nil
}

// Matches tells whether labels has every term of s.
func (s LabelSelector) Matches(labels map[string]string) bool {
	for _, m := range s {
		if v, ok := labels[m.Key]; !ok || v != m.Value {
			return false
		}
	}
	return true
}

// sortedKeys is m's keys in order: a map's checks report the same entry
// whatever the map's iteration order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// truncate is s cut to at most n bytes at a rune boundary, for a message
// that quotes what the client sent.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
