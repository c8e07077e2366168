package sandbox

import (
	"strings"
	"testing"
	"time"
)

func TestChooseRange(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	claim := func(dir string, base uint32) idClaim {
		return idClaim{Dir: dir, Range: IDRange{Base: base, Size: IDRangeSize}, At: at}
	}
	span := func(first, n uint64, what string) idSpan { return idSpan{First: first, End: first + n, What: what} }
	cases := []struct {
		name   string
		claims []idClaim
		want   uint32
		held   []uint32
		system []idSpan
		base   uint32
		errHas string
	}{
		{name: "first_on_an_empty_host", base: DefaultUIDBase},
		{name: "own_claim_stands", claims: []idClaim{claim("/a", 600000), claim("/me", 1000000)}, base: 1000000},
		{name: "own_claim_with_its_base", claims: []idClaim{claim("/me", 1000000)}, want: 1000000, base: 1000000},
		{name: "own_claim_another_base", claims: []idClaim{claim("/me", 1000000)}, want: 200000, errHas: "holds ids 1000000-1199999"},
		{name: "next_free_after_others", claims: []idClaim{claim("/a", 200000), claim("/b", 400000)}, base: 600000},
		{name: "gap_reused", claims: []idClaim{claim("/a", 400000)}, base: 200000},
		{name: "odd_base_of_another_skipped", claims: []idClaim{claim("/a", 250000)}, base: 600000},
		{name: "explicit_free", claims: []idClaim{claim("/a", 200000)}, want: 5000000, base: 5000000},
		{name: "explicit_held_by_another", claims: []idClaim{claim("/a", 200000)}, want: 300000, errHas: "the deployment at /a holds"},
		{name: "explicit_on_subuid", want: 200000, system: []idSpan{span(231072, 65536, "/etc/subuid entry of bob")}, errHas: "/etc/subuid entry of bob"},
		{name: "explicit_past_the_top", want: maxID - 10, errHas: "past"},
		{name: "subuid_skipped", system: []idSpan{span(100000, 65536, "a"), span(165536, 65536, "b"), span(231072, 65536, "c")}, base: 400000},
		{name: "passwd_user_skipped", system: []idSpan{span(200001, 1, "/etc/passwd entry of x")}, base: 400000},
		{name: "held_ids_keep_their_range", held: []uint32{200003, 300001}, base: 200000},
		{name: "held_ids_in_another_claim", claims: []idClaim{claim("/a", 200000)}, held: []uint32{200003}, errHas: "no range"},
		{name: "held_ids_outside_the_configured", want: 600000, held: []uint32{200003}, errHas: "outside"},
		{name: "host_full", system: []idSpan{span(0, maxID, "everything")}, errHas: "no range"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := chooseRange(tc.claims, "/me", tc.want, tc.held, tc.system)
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("got %+v, %v; want an error with %q", r, err, tc.errHas)
				}
				return
			}
			if err != nil || r.Base != tc.base || r.Size != IDRangeSize {
				t.Fatalf("got %+v, %v; want base %d", r, err, tc.base)
			}
		})
	}
}

// FuzzChooseRange: a chosen range never overlaps another deployment's
// claim or a system span, holds every held id, and stays below 2^31.
func FuzzChooseRange(f *testing.F) {
	f.Add(uint32(0), uint32(200000), uint32(400000), uint64(231072), uint64(65536), uint32(0))
	f.Add(uint32(300000), uint32(200000), uint32(0), uint64(0), uint64(0), uint32(200005))
	f.Fuzz(func(t *testing.T, want, a, b uint32, sFirst, sCount uint64, held uint32) {
		claims := []idClaim{{Dir: "/a", Range: IDRange{Base: a, Size: IDRangeSize}}, {Dir: "/b", Range: IDRange{Base: b, Size: IDRangeSize}}}
		system := []idSpan{{First: sFirst % maxID, End: sFirst%maxID + sCount%maxID, What: "s"}}
		var hs []uint32
		if held != 0 {
			hs = []uint32{held}
		}
		r, err := chooseRange(claims, "/me", want, hs, system)
		if err != nil {
			return
		}
		if want != 0 && r.Base != want {
			t.Fatalf("want %d, chose %+v", want, r)
		}
		for _, c := range claims {
			if r.overlaps(uint64(c.Range.Base), c.Range.end()) {
				t.Fatalf("%+v overlaps %+v", r, c)
			}
		}
		if system[0].End > system[0].First && r.overlaps(system[0].First, system[0].End) {
			t.Fatalf("%+v overlaps %+v", r, system[0])
		}
		if held != 0 && (held < r.Base || uint64(held) >= r.end()) {
			t.Fatalf("%+v does not hold %d", r, held)
		}
		if r.end() > maxID {
			t.Fatalf("%+v past %d", r, maxID)
		}
	})
}

func TestParseIDFile(t *testing.T) {
	cases := []struct {
		name string
		in   string
		sub  bool
		want []idSpan
	}{
		{"passwd", "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\n", false,
			[]idSpan{{0, 1, "f entry of root"}, {65534, 65535, "f entry of nobody"}}},
		{"group", "wheel:x:10:a,b\n", false, []idSpan{{10, 11, "f entry of wheel"}}},
		{"subuid", "alice:100000:65536\nbob:165536:65536\n", true,
			[]idSpan{{100000, 165536, "f entry of alice"}, {165536, 231072, "f entry of bob"}}},
		{"comments_blank_and_junk", "# c\n\nx:y:z\nshort\nok:5:1\nzero:7:0\nneg:-1:3\n", true, []idSpan{{5, 6, "f entry of ok"}}},
		{"numeric_overflow_skipped", "big:x:99999999999:0::/:\n", false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := parseIDFile("f", []byte(tc.in), tc.sub)
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("[%d] got %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// FuzzParseIDFile: every span read is non-empty and within 32-bit ids.
func FuzzParseIDFile(f *testing.F) {
	f.Add([]byte("alice:100000:65536\n"), true)
	f.Add([]byte("root:x:0:0::/:\n"), false)
	f.Fuzz(func(t *testing.T, b []byte, sub bool) {
		for _, s := range parseIDFile("f", b, sub) {
			if s.End <= s.First || s.First > 1<<32 || s.End > 1<<33 {
				t.Fatalf("span %+v", s)
			}
		}
	})
}
