package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"strata/internal/jsend"
)

// Scope names a part of its sandbox that a sandbox access token or a
// channel key may act on (docs/api.md, "Scopes"). An account API key has
// every scope of every sandbox of its account; scopes are for the
// credentials that are handed out, to a program or into the guest.
type Scope string

// The scopes. ports and watch name routes to come: they are valid names
// already, so that a token issued for them now keeps its meaning.
const (
	// ScopeCheckpoints: the seed's four checkpoint operations and the
	// reads beyond them (changes, files of a checkpoint, directories).
	ScopeCheckpoints Scope = "checkpoints"
	// ScopeSnapshots: create, list and read VM snapshots.
	ScopeSnapshots Scope = "snapshots"
	// ScopeExec: the one-shot exec and sessions, attachments included:
	// processes as root inside the sandbox.
	ScopeExec Scope = "exec"
	// ScopeFiles: read and write any file of the sandbox, as root.
	ScopeFiles Scope = "files"
	ScopePorts Scope = "ports"
	ScopeWatch Scope = "watch"
)

// AllScopes are the scopes in their canonical order: the order in which
// Scopes lists them.
var AllScopes = []Scope{ScopeCheckpoints, ScopeSnapshots, ScopeExec, ScopeFiles, ScopePorts, ScopeWatch}

// DefaultScopes are a token's when its issue names none, and a channel
// key's when the sandbox's access names none: what tokens could do before
// scopes existed.
var DefaultScopes = Scopes{ScopeCheckpoints, ScopeSnapshots}

// Known tells whether s is one of AllScopes.
func (s Scope) Known() bool { return slices.Contains(AllScopes, s) }

// Scopes is a set of scopes, in canonical order, each once: what
// ParseScopes returns.
type Scopes []Scope

// Has tells whether s holds scope.
func (s Scopes) Has(scope Scope) bool { return slices.Contains(s, scope) }

// String is the scopes joined by commas ("checkpoints,snapshots"): the
// form ParseScopeList reads, and the command line's.
func (s Scopes) String() string {
	names := make([]string, len(s))
	for i, sc := range s {
		names[i] = string(sc)
	}
	return strings.Join(names, ",")
}

// MarshalJSON writes a set as an array, [] for none (never null).
func (s Scopes) MarshalJSON() ([]byte, error) {
	return json.Marshal([]Scope(append(Scopes{}, s...)))
}

var scopeNames = func() string {
	names := make([]string, len(AllScopes))
	for i, s := range AllScopes {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}()

// ParseScopes checks a list of scope names, as a request sends it: at
// least one, each a known scope, none twice. It answers them in canonical
// order; a broken rule is invalid_field naming field.
func ParseScopes(field string, names []string) (Scopes, error) {
	if len(names) == 0 {
		return nil, jsend.InvalidField(field, field+" must name at least one scope: "+scopeNames)
	}
	seen := map[Scope]bool{}
	for _, n := range names {
		s := Scope(n)
		if !s.Known() {
			return nil, jsend.InvalidField(field, fmt.Sprintf("%s: unknown scope %q; the scopes are %s", field, n, scopeNames))
		}
		if seen[s] {
			return nil, jsend.InvalidField(field, fmt.Sprintf("%s names %q twice", field, n))
		}
		seen[s] = true
	}
	var out Scopes
	for _, s := range AllScopes {
		if seen[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

// ParseScopeList is ParseScopes of a comma-separated list
// ("exec,files"), as the command line and the registry write it.
func ParseScopeList(field, list string) (Scopes, error) {
	if list == "" {
		return ParseScopes(field, nil)
	}
	return ParseScopes(field, strings.Split(list, ","))
}

// ScopesRequest is the optional body of POST …/access-token (the scopes
// of the token to issue; DefaultScopes when left out), and the object
// form of PUT …/access's.
type ScopesRequest struct {
	Scopes []string `json:"scopes,omitempty"`
}

// ParseTokenRequest decodes and checks an issue's body: none, {} or
// {"scopes":[…]} (ParseScopes).
func ParseTokenRequest(body []byte) (Scopes, error) {
	var req ScopesRequest
	if err := decodeOptional(body, &req); err != nil {
		return nil, err
	}
	if req.Scopes == nil {
		return DefaultScopes, nil
	}
	return ParseScopes("scopes", req.Scopes)
}

// AccessNone is the access setting that gives the guest no key.
const AccessNone = "none"

// Access is a sandbox's access setting: what the processes inside it may
// do through the API with the key it hands them (its channel key). On the
// wire it is "none" (the guest gets no key, and every call from inside the
// sandbox is refused) or {"scopes":[…]} (the channel key's scopes).
type Access struct {
	None   bool
	Scopes Scopes
}

// DefaultAccess is a sandbox's access when its create names none.
func DefaultAccess() Access { return Access{Scopes: DefaultScopes} }

// String is "none" or the scopes joined by commas: the form
// ParseAccessString reads, the command line's and the registry's.
func (a Access) String() string {
	if a.None {
		return AccessNone
	}
	return a.Scopes.String()
}

// MarshalJSON writes "none" or {"scopes":[…]}.
func (a Access) MarshalJSON() ([]byte, error) {
	if a.None {
		return json.Marshal(AccessNone)
	}
	return json.Marshal(struct {
		Scopes Scopes `json:"scopes"`
	}{a.Scopes})
}

// UnmarshalJSON reads what MarshalJSON writes, leniently (a client
// reading a newer server's answer): scopes it does not know are kept.
func (a *Access) UnmarshalJSON(b []byte) error {
	var none string
	if json.Unmarshal(b, &none) == nil {
		if none != AccessNone {
			return fmt.Errorf("access: %q is not %q", none, AccessNone)
		}
		*a = Access{None: true}
		return nil
	}
	var v struct {
		Scopes []Scope `json:"scopes"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*a = Access{Scopes: v.Scopes}
	return nil
}

// ParseAccess checks an access setting as a request sends it (the create
// field, the body of PUT …/access): "none" or {"scopes":[…]} with only
// that field and ParseScopes's rules. null or nothing is DefaultAccess. A
// broken rule is invalid_field naming field (or field.scopes).
func ParseAccess(field string, raw json.RawMessage) (Access, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return DefaultAccess(), nil
	}
	bad := jsend.InvalidField(field, field+` must be "none" or {"scopes":[…]}`)
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil || s != AccessNone {
			return Access{}, bad
		}
		return Access{None: true}, nil
	case '{':
		// Keys matched exactly (encoding/json alone would take "Scopes").
		var m map[string]json.RawMessage
		var names []string
		if json.Unmarshal(raw, &m) != nil || len(m) != 1 || m["scopes"] == nil ||
			json.Unmarshal(m["scopes"], &names) != nil || names == nil {
			return Access{}, bad
		}
		scopes, err := ParseScopes(field+".scopes", names)
		if err != nil {
			return Access{}, err
		}
		return Access{Scopes: scopes}, nil
	}
	return Access{}, bad
}

// ParseAccessBody decodes and checks the body of PUT …/access: "none",
// or one object {"scopes":[…]} with jsend.DecodeBytes's rules and
// ParseScopes's.
func ParseAccessBody(body []byte) (Access, error) {
	if len(body) > jsend.MaxBody {
		return Access{}, jsend.ErrBodyTooLarge
	}
	if t := bytes.TrimSpace(body); len(t) > 0 && t[0] == '"' {
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return Access{}, jsend.ErrInvalidJSON
		}
		if s != AccessNone {
			return Access{}, jsend.InvalidField("access", `the access is "none" or {"scopes":[…]}`)
		}
		return Access{None: true}, nil
	}
	var req ScopesRequest
	if err := jsend.DecodeBytes(body, &req); err != nil {
		return Access{}, err
	}
	scopes, err := ParseScopes("scopes", req.Scopes)
	if err != nil {
		return Access{}, err
	}
	return Access{Scopes: scopes}, nil
}

// ParseAccessString reads Access.String's form: "none", or scopes joined
// by commas (ParseScopeList). An empty string is DefaultAccess (a record
// written before sandboxes had an access setting).
func ParseAccessString(field, s string) (Access, error) {
	switch s {
	case "":
		return DefaultAccess(), nil
	case AccessNone:
		return Access{None: true}, nil
	}
	scopes, err := ParseScopeList(field, s)
	if err != nil {
		return Access{}, err
	}
	return Access{Scopes: scopes}, nil
}
