package api

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"strata/internal/fault"
)

// nameRule is the sandbox name rule written apart from the code: an RFC
// 1123 label of lowercase letters, digits and '-', starting with a letter,
// and not an id's prefix (validName).
var nameRule = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`)

// validName is nameRule, and no "sb-" in front: a name never looks like
// an id.
func validName(s string) bool { return nameRule.MatchString(s) && !strings.HasPrefix(s, "sb-") }

// checkCreateLimits fails unless req keeps every rule: a valid name when
// there is one; for a new sandbox, resources within range and never nil;
// for a fork, no resources and a well-formed source.
func checkCreateLimits(t *testing.T, req SandboxCreateRequest) {
	t.Helper()
	if req.Name != nil && !validName(*req.Name) {
		t.Fatalf("accepted name %q", *req.Name)
	}
	if ValidateSandboxEnv("env", req.Env) != nil || ValidateLabels("labels", req.Labels) != nil {
		t.Fatalf("accepted env %v labels %v", req.Env, req.Labels)
	}
	if req.Env != nil && len(req.Env) == 0 || req.Labels != nil && len(req.Labels) == 0 {
		t.Fatalf("an empty env or labels kept: %+v", req)
	}
	if req.From != nil {
		if req.MemoryMiB != nil || req.VCPUs != nil || req.DiskGiB != nil {
			t.Fatalf("accepted a fork with resources: %+v", req)
		}
		ref := ValidSnapshotRef(req.From.Snapshot)
		if req.From.Sandbox == "" && !ref || req.From.Sandbox != "" && !ValidSandboxID(req.From.Sandbox) ||
			!ref && !ValidSnapshotID(req.From.Snapshot) && !ValidSnapshotName(req.From.Snapshot) {
			t.Fatalf("accepted from %+v", *req.From)
		}
		return
	}
	if req.MemoryMiB == nil || req.VCPUs == nil || req.DiskGiB == nil {
		t.Fatalf("defaults not filled in: %+v", req)
	}
	if m := *req.MemoryMiB; m < 128 || m > 8192 {
		t.Fatalf("accepted memory_mib %d", m)
	}
	if v := *req.VCPUs; v < 1 || v > 4 {
		t.Fatalf("accepted vcpus %d", v)
	}
	if d := *req.DiskGiB; d < 1 || d > 64 {
		t.Fatalf("accepted disk_gib %d", d)
	}
}

// FuzzParseSandboxCreate checks ParseSandboxCreate on any body: it never
// panics; it fails only with the codes of a malformed request; what it
// accepts keeps every rule, and, marshalled again, parses to the same
// value.
func FuzzParseSandboxCreate(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"name":"web-1"}`, `{"name":"web-1","memory_mib":1024,"vcpus":2,"disk_gib":10}`,
		`{"name":"Web"}`, `{"name":"1web"}`, `{"name":"web-"}`, `{"name":""}`, `{"name":"a.b"}`,
		`{"memory_mib":127}`, `{"memory_mib":8193}`, `{"vcpus":0}`, `{"vcpus":5}`, `{"disk_gib":0}`, `{"disk_gib":65}`,
		`{"memory_mib":"512"}`, `{"memory_mib":512.5}`, `{"memory_mib":null}`,
		`{"from":{"sandbox":"sb-a1","snapshot":"v1"}}`, `{"name":"fork","from":{"sandbox":"sb-x","snapshot":"auto-2"}}`,
		`{"from":{"sandbox":"sb-a1","snapshot":"v1"},"vcpus":2}`, `{"from":{"sandbox":"sb-a1"}}`, `{"from":{"snapshot":"v1"}}`,
		`{"from":{"sandbox":"sb-a1","snapshot":"v01"}}`, `{"from":{"sandbox":"../x","snapshot":"v1"}}`,
		`{"from":{"sandbox":"sb-a1","snapshot":"v1","extra":1}}`, `{"from":null}`, `{"from":"sb-a1/v1"}`,
		`{"size":"large"}`, `{"name":"a","name":"b"}`, `{} []`,
		`{"name":"sb-x"}`, `{"env":{"A":"1","_b2":""}}`, `{"env":{"1A":"x"}}`, `{"env":{}}`, `{"labels":{"owner":"docs"}}`,
		`{"labels":{"Owner":"x"}}`, `{"labels":{"a":"\u0007"}}`, `{"from":{"snapshot":"sn-0123456789abcdefghijklmn"}}`,
		`{"from":{"sandbox":"scratch","snapshot":"sn-0123456789abcdefghijklmn"}}`, `{"from":{"snapshot":"sn-x"}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseSandboxCreate(body)
		if err != nil {
			fe := fault.As(err)
			if fe == nil {
				t.Fatalf("unclassified error %v", err)
			}
			if kind, ok := execCodes[fe.Code]; !ok || kind != fe.Kind {
				t.Fatalf("code %q kind %v", fe.Code, fe.Kind)
			}
			if fe.Code == "invalid_field" && fe.Fields["field"] == nil {
				t.Fatalf("invalid_field names no field: %v", err)
			}
			return
		}
		checkCreateLimits(t, req)
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		round, err := ParseSandboxCreate(again)
		if err != nil {
			t.Fatalf("re-encoded %s refused: %v", again, err)
		}
		if !reflect.DeepEqual(req, round) {
			t.Fatalf("round trip changed %s into %+v", again, round)
		}
	})
}

// TestParseSandboxCreate names each rule of the create body.
func TestParseSandboxCreate(t *testing.T) {
	n := func(i int) *int { return &i }
	s := func(v string) *string { return &v }
	tests := []struct {
		name, body string
		code       string // "" when accepted
		field      string
		want       *SandboxCreateRequest
	}{
		{name: "defaults", body: `{}`, want: &SandboxCreateRequest{MemoryMiB: n(512), VCPUs: n(1), DiskGiB: n(4)}},
		{name: "every resource", body: `{"name":"web-1","memory_mib":1024,"vcpus":2,"disk_gib":10}`,
			want: &SandboxCreateRequest{Name: s("web-1"), MemoryMiB: n(1024), VCPUs: n(2), DiskGiB: n(10)}},
		{name: "nulls are left out", body: `{"name":null,"memory_mib":null,"vcpus":null,"disk_gib":null,"from":null}`,
			want: &SandboxCreateRequest{MemoryMiB: n(512), VCPUs: n(1), DiskGiB: n(4)}},
		{name: "lowest resources", body: `{"memory_mib":128,"vcpus":1,"disk_gib":1}`},
		{name: "highest resources", body: `{"memory_mib":8192,"vcpus":4,"disk_gib":64}`},
		{name: "memory 127", body: `{"memory_mib":127}`, code: "invalid_field", field: "memory_mib"},
		{name: "memory 8193", body: `{"memory_mib":8193}`, code: "invalid_field", field: "memory_mib"},
		{name: "memory a string", body: `{"memory_mib":"512"}`, code: "invalid_field", field: "memory_mib"},
		{name: "memory fractional", body: `{"memory_mib":512.5}`, code: "invalid_field", field: "memory_mib"},
		{name: "vcpus 0", body: `{"vcpus":0}`, code: "invalid_field", field: "vcpus"},
		{name: "vcpus 5", body: `{"vcpus":5}`, code: "invalid_field", field: "vcpus"},
		{name: "disk 0", body: `{"disk_gib":0}`, code: "invalid_field", field: "disk_gib"},
		{name: "disk 65", body: `{"disk_gib":65}`, code: "invalid_field", field: "disk_gib"},
		{name: "disk negative", body: `{"disk_gib":-1}`, code: "invalid_field", field: "disk_gib"},

		{name: "name of one letter", body: `{"name":"a"}`},
		{name: "name of 63", body: `{"name":"a` + strings.Repeat("0", 62) + `"}`},
		{name: "name of 64", body: `{"name":"a` + strings.Repeat("0", 63) + `"}`, code: "invalid_field", field: "name"},
		{name: "name empty", body: `{"name":""}`, code: "invalid_field", field: "name"},
		{name: "name uppercase", body: `{"name":"Web"}`, code: "invalid_field", field: "name"},
		{name: "name starting with a digit", body: `{"name":"1web"}`, code: "invalid_field", field: "name"},
		{name: "name starting with '-'", body: `{"name":"-web"}`, code: "invalid_field", field: "name"},
		{name: "name ending with '-'", body: `{"name":"web-"}`, code: "invalid_field", field: "name"},
		{name: "name with a dot", body: `{"name":"web.1"}`, code: "invalid_field", field: "name"},
		{name: "name with an underscore", body: `{"name":"web_1"}`, code: "invalid_field", field: "name"},
		{name: "name with a space", body: `{"name":"web 1"}`, code: "invalid_field", field: "name"},
		{name: "name not ASCII", body: `{"name":"wéb"}`, code: "invalid_field", field: "name"},
		{name: "name a number", body: `{"name":1}`, code: "invalid_field", field: "name"},
		{name: "name like an id", body: `{"name":"sb-web"}`, code: "invalid_field", field: "name"},
		{name: "name like a minted id", body: `{"name":"sb-0123456789abcdefghijklmn"}`, code: "invalid_field", field: "name"},
		{name: "name starting with sb", body: `{"name":"sbx"}`},

		{name: "env and labels", body: `{"env":{"CI":"1","_X9":""},"labels":{"owner":"docs","team.io/tier":"a b=c"}}`,
			want: &SandboxCreateRequest{MemoryMiB: n(512), VCPUs: n(1), DiskGiB: n(4), Env: map[string]string{"CI": "1", "_X9": ""}, Labels: map[string]string{"owner": "docs", "team.io/tier": "a b=c"}}},
		{name: "empty env and labels are left out", body: `{"env":{},"labels":{}}`, want: &SandboxCreateRequest{MemoryMiB: n(512), VCPUs: n(1), DiskGiB: n(4)}},
		{name: "env name with a digit first", body: `{"env":{"1A":"x"}}`, code: "invalid_field", field: "env"},
		{name: "env name with a dash", body: `{"env":{"A-B":"x"}}`, code: "invalid_field", field: "env"},
		{name: "env value not a string", body: `{"env":{"A":1}}`, code: "invalid_field", field: "env"},
		{name: "env value of 4 KiB", body: `{"env":{"A":"` + strings.Repeat("v", 4<<10) + `"}}`, code: "invalid_field", field: "env"},
		{name: "env entry of 4 KiB", body: `{"env":{"A":"` + strings.Repeat("v", 4<<10-1) + `"}}`},
		{name: "env of 65 entries", body: `{"env":{` + entries(65, "E", "1") + `}}`, code: "invalid_field", field: "env"},
		{name: "env of 64 entries", body: `{"env":{` + entries(64, "E", "1") + `}}`},
		{name: "label key upper", body: `{"labels":{"Owner":"x"}}`, code: "invalid_field", field: "labels"},
		{name: "label key ending with a dot", body: `{"labels":{"a.":"x"}}`, code: "invalid_field", field: "labels"},
		{name: "label value with a newline", body: `{"labels":{"a":"x\ny"}}`, code: "invalid_field", field: "labels"},
		{name: "label value of 257 bytes", body: `{"labels":{"a":"` + strings.Repeat("v", 257) + `"}}`, code: "invalid_field", field: "labels"},
		{name: "33 labels", body: `{"labels":{` + entries(33, "l", "x") + `}}`, code: "invalid_field", field: "labels"},
		// The largest env written the longest way, with the most labels so
		// written too: within MaxCreateBody.
		{name: "the largest create", body: `{"env":{` + entries(64, "\\u0045", strings.Repeat("\\u0041", 4093)) + `},"labels":{` +
			entries(32, strings.Repeat("\\u0061", 61), strings.Repeat("\\u0061", 256)) + `},"name":"` + strings.Repeat("\\u0061", 63) + `"}`},

		{name: "fork", body: `{"name":"fork-1","from":{"sandbox":"sb-a1","snapshot":"v1"}}`,
			want: &SandboxCreateRequest{Name: s("fork-1"), From: &SandboxFrom{Sandbox: "sb-a1", Snapshot: "v1"}}},
		{name: "fork of an automatic snapshot", body: `{"from":{"sandbox":"sb-0123456789abcdef","snapshot":"auto-3"}}`},
		{name: "fork with memory", body: `{"from":{"sandbox":"sb-a1","snapshot":"v1"},"memory_mib":512}`, code: "invalid_field", field: "memory_mib"},
		{name: "fork with vcpus", body: `{"vcpus":1,"from":{"sandbox":"sb-a1","snapshot":"v1"}}`, code: "invalid_field", field: "vcpus"},
		{name: "fork with disk", body: `{"from":{"sandbox":"sb-a1","snapshot":"v1"},"disk_gib":4}`, code: "invalid_field", field: "disk_gib"},
		{name: "fork without sandbox", body: `{"from":{"snapshot":"v1"}}`, code: "invalid_field", field: "from.sandbox"},
		{name: "fork of a ref alone", body: `{"from":{"snapshot":"sn-0123456789abcdefghijklmn"}}`,
			want: &SandboxCreateRequest{From: &SandboxFrom{Snapshot: "sn-0123456789abcdefghijklmn"}}},
		{name: "fork of a ref of a named sandbox", body: `{"from":{"sandbox":"scratch","snapshot":"sn-0123456789abcdefghijklmn"}}`},
		{name: "fork of a sandbox's name", body: `{"from":{"sandbox":"scratch","snapshot":"v1"}}`},
		{name: "fork of a short ref", body: `{"from":{"snapshot":"sn-0123"}}`, code: "invalid_field", field: "from.snapshot"},
		{name: "fork with env and labels", body: `{"from":{"sandbox":"sb-a1","snapshot":"v1"},"env":{"A":"1"},"labels":{"owner":"docs"}}`,
			want: &SandboxCreateRequest{From: &SandboxFrom{Sandbox: "sb-a1", Snapshot: "v1"}, Env: map[string]string{"A": "1"}, Labels: map[string]string{"owner": "docs"}}},
		{name: "fork of a bad sandbox id", body: `{"from":{"sandbox":"../sb","snapshot":"v1"}}`, code: "invalid_field", field: "from.sandbox"},
		{name: "fork without snapshot", body: `{"from":{"sandbox":"sb-a1"}}`, code: "invalid_field", field: "from.snapshot"},
		{name: "fork of v0", body: `{"from":{"sandbox":"sb-a1","snapshot":"v0"}}`, code: "invalid_field", field: "from.snapshot"},
		{name: "fork of a checkpoint path", body: `{"from":{"sandbox":"sb-a1","snapshot":"cp/AAAAAAAAAAAAAAAAAAAAAA"}}`, code: "invalid_field", field: "from.snapshot"},
		{name: "fork of an id-shaped name", body: `{"from":{"sandbox":"sb-a1","snapshot":"auto-01"}}`, code: "invalid_field", field: "from.snapshot"},
		{name: "from with an unknown field", body: `{"from":{"sandbox":"sb-a1","snapshot":"v1","memory":true}}`, code: "unknown_field", field: "memory"},
		{name: "from a string", body: `{"from":"sb-a1/v1"}`, code: "invalid_field", field: "from"},

		{name: "unknown field", body: `{"size":"large"}`, code: "unknown_field", field: "size"},
		{name: "field twice", body: `{"name":"a","name":"b"}`, code: "invalid_json"},
		{name: "trailing data", body: `{} []`, code: "invalid_json"},
		{name: "over 16 KiB", body: `{}` + strings.Repeat(" ", 16<<10)},
		{name: "over 2 MiB", body: `{}` + strings.Repeat(" ", 2<<20), code: "body_too_large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := ParseSandboxCreate([]byte(tc.body))
			if tc.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				checkCreateLimits(t, req)
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

// entries is n JSON members "<prefix><i>":"<value>", comma-separated.
func entries(n int, prefix, value string) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"%s%d":"%s"`, prefix, i, value)
	}
	return b.String()
}

// TestSandboxIDs: the {id} check accepts the ids the API makes and the
// ids of hostproxy's configuration file (sb-local, sb-a1, acct.x_1), as
// hostproxy's own check did before it; MintedSandboxID only the first.
func TestSandboxIDs(t *testing.T) {
	tests := []struct {
		id            string
		valid, minted bool
	}{
		{"sb-local", true, true},
		{"sb-a1", true, true},
		{"sb-0123456789abcdefghij0123456789abcdefghij", true, true}, // 40 after the prefix
		{"sb-0123456789abcdefghij0123456789abcdefghijk", true, false},
		{"sb-dead", true, true},
		{"sb-", true, false},
		{"sb-A1", true, false},
		{"sb-a-1", true, false},
		{"Sandbox.one_1", true, false},
		{"1", true, false},
		{strings.Repeat("a", 64), true, false},
		{strings.Repeat("a", 65), false, false},
		{"", false, false},
		{"-sb", false, false},
		{".sb", false, false},
		{"sb/1", false, false},
		{"sb 1", false, false},
		{"sb-é", false, false},
	}
	for _, tc := range tests {
		if got := ValidSandboxID(tc.id); got != tc.valid {
			t.Errorf("ValidSandboxID(%q) = %v", tc.id, got)
		}
		if got := MintedSandboxID(tc.id); got != tc.minted {
			t.Errorf("MintedSandboxID(%q) = %v", tc.id, got)
		}
	}
}

// TestSnapshotIDs: "v" or "auto-" and a positive number.
func TestSnapshotIDs(t *testing.T) {
	for id, want := range map[string]bool{
		"v1": true, "v12": true, "auto-1": true, "auto-100": true, "v999999999": true,
		"v": false, "v0": false, "v01": false, "auto-": false, "auto-0": false, "V1": false,
		"v1a": false, "v-1": false, "auto1": false, "v1000000000": false, "": false, "cp_x": false,
	} {
		if got := ValidSnapshotID(id); got != want {
			t.Errorf("ValidSnapshotID(%q) = %v", id, got)
		}
	}
}

// FuzzValidateSandboxName checks the name rule against nameRule on any
// string.
func FuzzValidateSandboxName(f *testing.F) {
	for _, seed := range []string{"", "a", "web-1", "Web", "1a", "a-", "-a", "a--b", strings.Repeat("a", 63), strings.Repeat("a", 64), "wéb", "sb-1", "sb-", "sb"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := ValidateSandboxName(name)
		if (err == nil) != validName(name) {
			t.Fatalf("ValidateSandboxName(%q) = %v", name, err)
		}
		if fe := fault.As(err); err != nil && (fe == nil || fe.Code != "invalid_field" || fe.Fields["field"] != "name") {
			t.Fatalf("error %v, want invalid_field naming name", err)
		}
	})
}

// TestSandboxTransient: the states a waiting client polls through.
func TestSandboxTransient(t *testing.T) {
	for state, want := range map[string]bool{
		SandboxCreating: true, SandboxUnresponsive: true, SandboxPausing: true, SandboxResuming: true, SandboxStopping: true, SandboxDestroying: true,
		SandboxRunning: false, SandboxPaused: false, SandboxStopped: false, SandboxError: false, SandboxDestroyed: false, "": false,
	} {
		if got := SandboxTransient(state); got != want {
			t.Errorf("SandboxTransient(%q) = %v", state, got)
		}
	}
}
