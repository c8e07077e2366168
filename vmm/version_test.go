package vmm

import (
	"errors"
	"strings"
	"testing"
)

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Version
		wantErr  bool
	}{
		{name: "debian backports", in: "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\nCopyright (c) 2003-2025 Fabrice Bellard and the QEMU Project developers\n", want: Version{10, 0, 2}},
		{name: "bookworm", in: "QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u16)", want: Version{7, 2, 19}},
		{name: "upstream", in: "QEMU emulator version 9.2.0", want: Version{9, 2, 0}},
		{name: "no micro", in: "QEMU emulator version 8.2", want: Version{8, 2, 0}},
		{name: "query-version", in: `{"qemu": {"micro": 2, "minor": 0, "major": 10}, "package": "Debian 1:10.0.2+ds-2+deb13u1~bpo12+1"}`, want: Version{10, 0, 2}},
		{name: "query-version without micro", in: `{"qemu": {"minor": 0, "major": 10}}`, wantErr: true},
		{name: "query-version negative", in: `{"qemu": {"micro": -1, "minor": 0, "major": 10}}`, wantErr: true},
		{name: "query-version huge", in: `{"qemu": {"micro": 0, "minor": 0, "major": 100000}}`, wantErr: true},
		{name: "empty", in: "", wantErr: true},
		{name: "another program", in: "qemu-img version 10.0.2", wantErr: true},
		{name: "letters", in: "QEMU emulator version 10.x.2", wantErr: true},
		{name: "one number", in: "QEMU emulator version 10", wantErr: true},
		{name: "four numbers", in: "QEMU emulator version 10.0.2.1", wantErr: true},
		{name: "huge number", in: "QEMU emulator version 99999999999999999999.0.0", wantErr: true},
		{name: "version on the second line only", in: "hello\nQEMU emulator version 10.0.2", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := ParseVersion(tc.in)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("ParseVersion(%q) = %v, want an error", tc.in, v)
				}
				return
			}
			if err != nil || v != tc.want {
				t.Fatalf("ParseVersion(%q) = %v, %v; want %v", tc.in, v, err, tc.want)
			}
		})
	}
}

// TestCheckVersion: hostproxy refuses a QEMU older than 10.0, and says
// which it found and which it needs.
func TestCheckVersion(t *testing.T) {
	for _, tc := range []struct {
		in  string
		old bool
	}{
		{"QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)", false},
		{"QEMU emulator version 10.1.0", false},
		{"QEMU emulator version 11.0.0", false},
		{"QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u16)", true},
		{"QEMU emulator version 9.2.4", true},
	} {
		_, err := CheckVersion(tc.in)
		if !tc.old {
			if err != nil {
				t.Errorf("CheckVersion(%q): %v", tc.in, err)
			}
			continue
		}
		if !errors.Is(err, ErrOldQEMU) {
			t.Errorf("CheckVersion(%q) = %v, want ErrOldQEMU", tc.in, err)
			continue
		}
		found, _ := ParseVersion(tc.in)
		if msg := err.Error(); !strings.Contains(msg, "found QEMU "+found.String()) || !strings.Contains(msg, "needs QEMU 10.0 or later") {
			t.Errorf("CheckVersion(%q): %q does not name the version found and the one needed", tc.in, msg)
		}
	}
	if _, err := CheckVersion("no qemu here"); err == nil || errors.Is(err, ErrOldQEMU) {
		t.Errorf("CheckVersion of garbage: %v, want a parse error", err)
	}
}

// FuzzParseVersion: whatever the text, a version parsed from it prints
// as one that parses back to itself, and its numbers are in range.
func FuzzParseVersion(f *testing.F) {
	f.Add("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)")
	f.Add(`{"qemu": {"micro": 2, "minor": 0, "major": 10}, "package": ""}`)
	f.Add("QEMU emulator version 8.2")
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseVersion(s)
		if err != nil {
			return
		}
		for _, n := range []int{v.Major, v.Minor, v.Micro} {
			if n < 0 || n > maxVersionPart {
				t.Fatalf("ParseVersion(%q) = %v: out of range", s, v)
			}
		}
		back, err := ParseVersion("QEMU emulator version " + v.String())
		if err != nil || back != v {
			t.Fatalf("%v prints as %q, which parses as %v, %v", v, v.String(), back, err)
		}
		if v.Less(v) || (v.Less(MinVersion) && MinVersion.Less(v)) {
			t.Fatalf("Less is not an order at %v", v)
		}
	})
}
