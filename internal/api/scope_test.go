package api

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"strata/internal/fault"
)

func TestParseScopes(t *testing.T) {
	cases := []struct {
		name  string
		in    []string
		want  string // the canonical list, "" when refused
		field string // the field a refusal names
	}{
		{"one", []string{"exec"}, "exec", ""},
		{"canonical order", []string{"watch", "exec", "checkpoints"}, "checkpoints,exec,watch", ""},
		{"every scope", []string{"checkpoints", "snapshots", "exec", "files", "ports", "watch"}, "checkpoints,snapshots,exec,files,ports,watch", ""},
		{"none", []string{}, "", "scopes"},
		{"nil", nil, "", "scopes"},
		{"unknown", []string{"exec", "root"}, "", "scopes"},
		{"case matters", []string{"Exec"}, "", "scopes"},
		{"twice", []string{"exec", "files", "exec"}, "", "scopes"},
		{"empty name", []string{""}, "", "scopes"},
		{"spaces", []string{" exec"}, "", "scopes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseScopes("scopes", tc.in)
			if tc.want == "" {
				if fault.CodeOf(err) != "invalid_field" || fault.As(err).Fields["field"] != tc.field {
					t.Fatalf("ParseScopes(%q) = %v, %v; want invalid_field naming %s", tc.in, got, err, tc.field)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Fatalf("ParseScopes(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParseAccess(t *testing.T) {
	cases := []struct {
		name, raw string
		want      string // Access.String(), "" when refused
		field     string
	}{
		{"left out", ``, "checkpoints,snapshots", ""},
		{"null", `null`, "checkpoints,snapshots", ""},
		{"none", `"none"`, "none", ""},
		{"scopes", `{"scopes":["files","exec"]}`, "exec,files", ""},
		{"the default, named", `{"scopes":["snapshots","checkpoints"]}`, "checkpoints,snapshots", ""},
		{"another string", `"all"`, "", "access"},
		{"None", `"None"`, "", "access"},
		{"no scopes field", `{}`, "", "access"},
		{"scopes null", `{"scopes":null}`, "", "access"},
		{"empty scopes", `{"scopes":[]}`, "", "access.scopes"},
		{"unknown scope", `{"scopes":["root"]}`, "", "access.scopes"},
		{"a scope twice", `{"scopes":["exec","exec"]}`, "", "access.scopes"},
		{"another field", `{"scopes":["exec"],"none":true}`, "", "access"},
		{"field case", `{"Scopes":["exec"]}`, "", "access"},
		{"scopes not strings", `{"scopes":[1]}`, "", "access"},
		{"an array", `["exec"]`, "", "access"},
		{"a bool", `false`, "", "access"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAccess("access", json.RawMessage(tc.raw))
			if tc.want == "" {
				if fault.CodeOf(err) != "invalid_field" || fault.As(err).Fields["field"] != tc.field {
					t.Fatalf("ParseAccess(%s) = %v, %v; want invalid_field naming %s", tc.raw, got, err, tc.field)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Fatalf("ParseAccess(%s) = %v, %v; want %s", tc.raw, got, err, tc.want)
			}
			// What it writes reads back the same.
			b, _ := json.Marshal(got)
			again, err := ParseAccess("access", b)
			if err != nil || again.String() != got.String() {
				t.Fatalf("%s written as %s reads back %v, %v", tc.raw, b, again, err)
			}
		})
	}
}

func TestParseAccessBody(t *testing.T) {
	cases := []struct {
		name, body string
		want       string
		code       string
	}{
		{"none", `"none"`, "none", ""},
		{"scopes", `{"scopes":["exec"]}`, "exec", ""},
		{"another string", `"some"`, "", "invalid_field"},
		{"no scopes", `{}`, "", "invalid_field"},
		{"unknown field", `{"scope":["exec"]}`, "", "unknown_field"},
		{"trailing data", `"none" x`, "", "invalid_json"},
		{"empty", ``, "", "invalid_json"},
		{"a scope twice", `{"scopes":["exec","exec"]}`, "", "invalid_field"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAccessBody([]byte(tc.body))
			if tc.code != "" {
				if fault.CodeOf(err) != tc.code {
					t.Fatalf("ParseAccessBody(%s) = %v, %v; want %s", tc.body, got, err, tc.code)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Fatalf("ParseAccessBody(%s) = %v, %v; want %s", tc.body, got, err, tc.want)
			}
		})
	}
}

// TestCreateAccessCanonical: a create's access is rewritten in its
// canonical form, and the default is left out, so that the
// Idempotency-Key's request hash sees equal settings as equal.
func TestCreateAccessCanonical(t *testing.T) {
	for body, want := range map[string]string{
		`{}`:              ``,
		`{"access":null}`: ``,
		`{"access":{"scopes":["snapshots","checkpoints"]}}`: ``,
		`{"access":{"scopes":["files","exec"]}}`:            `{"scopes":["exec","files"]}`,
		`{"access":"none"}`:                                 `"none"`,
	} {
		req, err := ParseSandboxCreate([]byte(body))
		if err != nil || string(req.Access) != want {
			t.Errorf("%s: access %s, %v; want %s", body, req.Access, err, want)
		}
	}
}

// FuzzParseScopeList holds the scope list parser to its invariant: what
// it accepts is a non-empty set of known scopes, each once, in canonical
// order, that its String reads back as itself; what it refuses is
// invalid_field naming the field.
func FuzzParseScopeList(f *testing.F) {
	for _, s := range []string{"exec", "checkpoints,snapshots", "watch,exec,exec", "", ",", "exec,", "files,ports,watch,checkpoints,snapshots,exec", "EXEC", "exec,root"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		got, err := ParseScopeList("scopes", list)
		if err != nil {
			if fault.CodeOf(err) != "invalid_field" || fault.As(err).Fields["field"] != "scopes" {
				t.Fatalf("%q: %v, want invalid_field naming scopes", list, err)
			}
			return
		}
		if len(got) == 0 {
			t.Fatalf("%q: accepted as no scope", list)
		}
		last := -1
		for _, s := range got {
			i := slices.Index(AllScopes, s)
			if i <= last {
				t.Fatalf("%q: %v is not a set of known scopes in canonical order", list, got)
			}
			last = i
		}
		names := strings.Split(list, ",")
		if len(names) != len(got) {
			t.Fatalf("%q: %d names, %d scopes", list, len(names), len(got))
		}
		again, err := ParseScopeList("scopes", got.String())
		if err != nil || again.String() != got.String() {
			t.Fatalf("%q: %q reads back as %q, %v", list, got, again, err)
		}
		acc, err := ParseAccessString("access", got.String())
		if err != nil || acc.None || acc.Scopes.String() != got.String() {
			t.Fatalf("%q: as an access setting: %v, %v", list, acc, err)
		}
	})
}

// FuzzParseAccess: an access setting that ParseAccess accepts is written
// (MarshalJSON) as a body ParseAccess and ParseAccessBody read back as
// the same setting, and as a string (String) ParseAccessString reads back
// as it too; anything refused is invalid_field.
func FuzzParseAccess(f *testing.F) {
	for _, s := range []string{`"none"`, `{"scopes":["exec"]}`, `{"scopes":[]}`, `null`, `{"scopes":["exec","exec"]}`, `"\u006eone"`, `{"scopes":["exec"],"x":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := ParseAccess("access", raw)
		if err != nil {
			if fault.CodeOf(err) != "invalid_field" {
				t.Fatalf("%q: %v, want invalid_field", raw, err)
			}
			return
		}
		b, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		for what, parse := range map[string]func([]byte) (Access, error){
			"ParseAccess":     func(b []byte) (Access, error) { return ParseAccess("access", b) },
			"ParseAccessBody": ParseAccessBody,
		} {
			again, err := parse(b)
			if err != nil || again.String() != got.String() {
				t.Fatalf("%q: written %s, %s reads %v, %v", raw, b, what, again, err)
			}
		}
		again, err := ParseAccessString("access", got.String())
		if err != nil || again.String() != got.String() {
			t.Fatalf("%q: as a string %q reads %v, %v", raw, got.String(), again, err)
		}
	})
}
