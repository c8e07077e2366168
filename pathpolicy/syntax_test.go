package pathpolicy

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"strata/internal/fault"
)

func TestCheckSyntax(t *testing.T) {
	long := "/" + strings.Repeat("a", MaxPathLen)
	maxOK := "/" + strings.Repeat("a", MaxPathLen-1)
	extra := []string{"/var/lib/strata", "/srv/store/"}
	tests := []struct {
		name      string
		path      string
		code      string // "" means accepted
		offending any    // nil means no "offending" field
	}{
		{name: "project in workspace", path: "/workspace/project"},
		{name: "home directory app", path: "/home/user/app"},
		{name: "root's project", path: "/root/project"},
		{name: "opt app", path: "/opt/app"},
		{name: "tmp descendant", path: "/tmp/project"},
		{name: "var tmp descendant", path: "/var/tmp/project"},
		{name: "sibling of protected prefix", path: "/usrlocal"},
		{name: "var lib sibling of docker", path: "/var/lib/app"},
		{name: "var log", path: "/var/log/app"},
		{name: "dots inside a name", path: "/workspace/a..b/.c"},
		{name: "longest path", path: maxOK},

		{name: "empty", path: "", code: CodeInvalidField},
		{name: "NUL byte", path: "/workspace/a\x00b", code: CodeInvalidField},
		{name: "over 4096 bytes", path: long, code: CodeInvalidField},

		{name: "relative", path: "workspace/project", code: CodePathNotAbsolute},
		{name: "dot relative", path: "./project", code: CodePathNotAbsolute},
		{name: "tilde", path: "~/project", code: CodePathNotAbsolute},

		{name: "trailing slash", path: "/workspace/project/", code: CodePathNotClean},
		{name: "double slash", path: "/workspace//project", code: CodePathNotClean},
		{name: "dot component", path: "/workspace/./project", code: CodePathNotClean},
		{name: "dotdot component", path: "/workspace/../etc", code: CodePathNotClean},
		{name: "trailing dot", path: "/workspace/.", code: CodePathNotClean},
		{name: "root dotdot", path: "/..", code: CodePathNotClean},
		{name: "leading double slash", path: "//workspace", code: CodePathNotClean},

		{name: "root", path: "/", code: CodePathProtected, offending: "/"},
		{name: "tmp itself", path: "/tmp", code: CodePathProtected, offending: "/tmp"},
		{name: "var tmp itself", path: "/var/tmp", code: CodePathProtected, offending: "/var/tmp"},
		{name: "usr descendant", path: "/usr/local/app", code: CodePathProtected, offending: "/usr"},
		{name: "etc itself", path: "/etc", code: CodePathProtected, offending: "/etc"},
		{name: "proc descendant", path: "/proc/self", code: CodePathProtected, offending: "/proc"},
		{name: "run user", path: "/run/user/1000", code: CodePathProtected, offending: "/run"},
		{name: "dev shm", path: "/dev/shm/x", code: CodePathProtected, offending: "/dev"},
		{name: "lost+found", path: "/lost+found", code: CodePathProtected, offending: "/lost+found"},
		{name: "platform overlay", path: "/.fc-overlay/upper", code: CodePathProtected, offending: "/.fc-overlay"},
		{name: "oldroot", path: "/oldroot", code: CodePathProtected, offending: "/oldroot"},
		{name: "docker storage", path: "/var/lib/docker/volumes/x", code: CodePathProtected, offending: "/var/lib/docker"},
		{name: "ancestor of docker", path: "/var/lib", code: CodePathProtected, offending: "/var/lib/docker"},
		{name: "var, ancestor of container storage", path: "/var", code: CodePathProtected, offending: "/var/lib/docker"},
		{name: "extra store itself", path: "/var/lib/strata", code: CodePathProtected, offending: "/var/lib/strata"},
		{name: "extra store descendant", path: "/var/lib/strata/layers/1", code: CodePathProtected, offending: "/var/lib/strata"},
		{name: "extra store ancestor", path: "/srv", code: CodePathProtected, offending: "/srv/store"},
		{name: "extra store uncleaned entry", path: "/srv/store/x", code: CodePathProtected, offending: "/srv/store"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckSyntax(tt.path, extra)
			switch tt.code {
			case "":
				if err != nil {
					t.Fatalf("CheckSyntax(%q) = %v, want nil", tt.path, err)
				}
			case CodeInvalidField:
				wantFault(t, err, fault.Invalid, CodeInvalidField, map[string]any{"field": "path", "path": nil})
			default:
				wantFault(t, err, fault.Unprocessable, tt.code, map[string]any{"path": tt.path, "offending": tt.offending})
			}
		})
	}
}

// TestProtectedTrees checks every protected tree of the seed document
// with itself, a descendant and (where one exists below "/") an ancestor.
func TestProtectedTrees(t *testing.T) {
	if len(Protected) != 22 {
		t.Errorf("Protected has %d trees, the seed document lists 22", len(Protected))
	}
	for _, tree := range Protected {
		cases := []string{tree, tree + "/child/grandchild"}
		for a := filepath.Dir(tree); a != "/"; a = filepath.Dir(a) {
			cases = append(cases, a)
		}
		for _, p := range cases {
			if err := CheckSyntax(p, nil); fault.CodeOf(err) != CodePathProtected {
				t.Errorf("CheckSyntax(%q) = %v, want path_protected", p, err)
			}
		}
	}
	for _, p := range []string{"/tmp/a", "/var/tmp/a", "/tmp/a/b"} {
		if err := CheckSyntax(p, nil); err != nil {
			t.Errorf("CheckSyntax(%q) = %v, want nil: descendants of /tmp and /var/tmp are allowed", p, err)
		}
	}
}

// FuzzCheckSyntax checks the invariants of CheckSyntax on any string: it
// never panics, an accepted path is absolute, clean, short enough and not
// protected, and a refusal is always a *fault.Error with a known code and a
// "path" field (or "field" for invalid_field).
func FuzzCheckSyntax(f *testing.F) {
	for _, s := range []string{
		"", "/", "/tmp", "/tmp/x", "/var/tmp/x", "/var", "/var/lib", "/usr/local",
		"relative", "/a//b", "/a/./b", "/a/../b", "/a/", "/a\x00b", "/workspace/project",
		"/var/lib/strata/x", "/home/ü/δ", "/lib64x",
	} {
		f.Add(s)
	}
	extra := []string{"/var/lib/strata"}
	f.Fuzz(func(t *testing.T, p string) {
		err := CheckSyntax(p, extra)
		if err == nil {
			if p == "" || p[0] != '/' || filepath.Clean(p) != p || len(p) > MaxPathLen || strings.ContainsRune(p, 0) {
				t.Fatalf("accepted %q, which is not absolute, clean and short", p)
			}
			for _, tree := range append(slices.Clone(Protected), extra...) {
				if related(p, tree) {
					t.Fatalf("accepted %q, related to protected %q", p, tree)
				}
			}
			if p == "/" || p == "/tmp" || p == "/var/tmp" {
				t.Fatalf("accepted %q", p)
			}
			return
		}
		fe := fault.As(err)
		if fe == nil {
			t.Fatalf("CheckSyntax(%q) = %v (%T), want *fault.Error", p, err, err)
		}
		switch {
		case fe.Code == CodeInvalidField:
			if fe.Kind != fault.Invalid || fe.Fields["field"] != "path" {
				t.Fatalf("invalid_field error %+v", fe)
			}
		case slices.Contains(ViolationCodes, fe.Code):
			if fe.Kind != fault.Unprocessable || fe.Fields["path"] != p {
				t.Fatalf("violation %+v for %q", fe, p)
			}
			if fe.Code == CodePathProtected {
				o, _ := fe.Fields["offending"].(string)
				if o == "" || !related(p, o) {
					t.Fatalf("path_protected for %q names unrelated %q", p, o)
				}
			}
		default:
			t.Fatalf("CheckSyntax(%q): unknown code %q", p, fe.Code)
		}
	})
}
