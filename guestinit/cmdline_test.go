package guestinit

import (
	"slices"
	"strings"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	tests := []struct {
		name     string
		cmdline  string
		want     Params
		warnings int
	}{
		{"empty", "", Params{Hostname: "sandbox", Root: "/dev/vda"}, 0},
		{"a real line", "console=ttyS0 quiet panic=-1 reboot=t tsc_early_khz=2445404 strata.hostname=sb-42\n",
			Params{Hostname: "sb-42", Root: "/dev/vda"}, 0},
		{"last one wins", "strata.hostname=a strata.hostname=b", Params{Hostname: "b", Root: "/dev/vda"}, 0},
		{"quoted value", `strata.hostname="sb-1" x="a b"`, Params{Hostname: "sb-1", Root: "/dev/vda"}, 0},
		{"quoted whole word", `"strata.hostname=sb-2"`, Params{Hostname: "sb-2", Root: "/dev/vda"}, 0},
		{"tabs and newlines", "\tstrata.hostname=x\n\nstrata.root=/dev/vdb\n", Params{Hostname: "x", Root: "/dev/vdb"}, 0},
		{"invalid hostname falls back", "strata.hostname=-bad", Params{Hostname: "sandbox", Root: "/dev/vda"}, 1},
		{"hostname with a space", `strata.hostname="a b"`, Params{Hostname: "sandbox", Root: "/dev/vda"}, 1},
		{"hostname too long", "strata.hostname=" + strings.Repeat("a", 64), Params{Hostname: "sandbox", Root: "/dev/vda"}, 1},
		{"empty hostname", "strata.hostname=", Params{Hostname: "sandbox", Root: "/dev/vda"}, 1},
		{"root outside /dev", "strata.root=/etc/passwd", Params{Hostname: "sandbox", Root: "/dev/vda"}, 1},
		{"root escaping /dev", "strata.root=/dev/../etc/x", Params{Hostname: "sandbox", Root: "/dev/vda"}, 1},
		{"check", "strata.check=1", Params{Hostname: "sandbox", Root: "/dev/vda", Check: CheckRun}, 0},
		{"check shutdown", "strata.check=shutdown", Params{Hostname: "sandbox", Root: "/dev/vda", Check: CheckShutdown}, 0},
		{"check unknown", "strata.check=maybe", Params{Hostname: "sandbox", Root: "/dev/vda"}, 1},
		{"prefix is not the parameter", "xstrata.hostname=x strata.hostnamex=y", Params{Hostname: "sandbox", Root: "/dev/vda"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseCmdline(tt.cmdline)
			if len(got.Warnings) != tt.warnings {
				t.Errorf("warnings = %q, want %d", got.Warnings, tt.warnings)
			}
			got.Warnings = nil
			if got.Hostname != tt.want.Hostname || got.Root != tt.want.Root || got.Check != tt.want.Check {
				t.Errorf("ParseCmdline(%q) = %+v, want %+v", tt.cmdline, got, tt.want)
			}
		})
	}
}

func TestSplitCmdline(t *testing.T) {
	got := splitCmdline(`a  b="c d" "e f" g"h i"j`)
	want := []string{"a", "b=c d", "e f", "gh ij"}
	if !slices.Equal(got, want) {
		t.Errorf("splitCmdline = %q, want %q", got, want)
	}
}

// FuzzParseCmdline checks the parser's invariants on any input: it never
// panics, the hostname it returns is always one sethostname and resolvers
// accept, the root is always under /dev, and a valid hostname given as the
// last word is the one returned.
func FuzzParseCmdline(f *testing.F) {
	f.Add("console=ttyS0 strata.hostname=sb-1 strata.root=/dev/vda")
	f.Add(`strata.hostname="a b`)
	f.Add("strata.hostname=\x00")
	f.Add("strata.check=shutdown")
	f.Fuzz(func(t *testing.T, cmdline string) {
		p := ParseCmdline(cmdline)
		if err := validHostname(p.Hostname); err != nil {
			t.Fatalf("hostname %q: %v", p.Hostname, err)
		}
		if !strings.HasPrefix(p.Root, "/dev/") || strings.Contains(p.Root, "..") {
			t.Fatalf("root %q", p.Root)
		}
		if !strings.Contains(cmdline, `"`) {
			if h := "sb-fuzz"; !strings.Contains(cmdline, "strata.hostname=") {
				if q := ParseCmdline(cmdline + " strata.hostname=" + h); q.Hostname != h {
					t.Fatalf("appended hostname lost: %q", q.Hostname)
				}
			}
		}
	})
}
