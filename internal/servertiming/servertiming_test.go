package servertiming

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Metric
	}{
		{"", nil},
		{"total;dur=12.5", []Metric{{"total", 12500 * time.Microsecond}}},
		{"a;dur=1, b;desc=\"x\";dur=2.25 ,c", []Metric{{"a", time.Millisecond}, {"b", 2250 * time.Microsecond}}},
		{"cache;desc=hit", nil},
		{"x;dur=-1, y;dur=NaN, z;dur=1e99, w;dur=abc", nil},
		{"bad name;dur=1, ok.name-1_2;dur=0", []Metric{{"ok.name-1_2", 0}}},
		{"a;dur=1;dur=2", []Metric{{"a", time.Millisecond}}},
		{strings.Repeat("n", MaxName+1) + ";dur=1", nil},
	} {
		got := Parse(tc.in)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("Parse(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestRecorderBoundsAndRoundTrip(t *testing.T) {
	if Add(context.Background(), "x", time.Second); From(context.Background()) != nil {
		t.Fatal("a context without a recorder has one")
	}
	ctx, r := With(context.Background())
	Add(ctx, "capture.prepare", 1234*time.Microsecond)
	Add(ctx, "bad name", time.Millisecond)
	Add(ctx, "neg", -time.Millisecond)
	Add(ctx, "huge", 2*MaxDuration)
	for i := range 2 * MaxMetrics {
		Add(ctx, fmt.Sprintf("m%d", i), time.Duration(i)*time.Microsecond)
	}
	ms := r.Metrics()
	if len(ms) != MaxMetrics || ms[0] != (Metric{"capture.prepare", 1234 * time.Microsecond}) {
		t.Fatalf("kept %d metrics, first %v", len(ms), ms[0])
	}
	h := Format(ms)
	if !strings.HasPrefix(h, "capture.prepare;dur=1.234, m0;dur=0, m1;dur=0.001") {
		t.Fatalf("header %q", h)
	}
	if back := Parse(h); fmt.Sprint(back) != fmt.Sprint(ms) {
		t.Fatalf("round trip: %v, want %v", back, ms)
	}
}

// FuzzParse: Parse never panics, and keeps its bounds whatever a guest
// sends; what it returns formats and parses back to itself.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "total;dur=1.5", "a;dur=1, b;desc=x;dur=2", ";;,,;dur=", "x;dur=1e308"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		ms := Parse(h)
		if len(ms) > MaxMetrics {
			t.Fatalf("%d metrics", len(ms))
		}
		for _, m := range ms {
			if !ValidName(m.Name) || m.Dur < 0 || m.Dur > MaxDuration {
				t.Fatalf("metric %v out of bounds", m)
			}
		}
		// Durations are kept to the microsecond by Format.
		for i := range ms {
			ms[i].Dur = ms[i].Dur.Truncate(time.Microsecond)
		}
		if back := Parse(Format(ms)); fmt.Sprint(back) != fmt.Sprint(ms) {
			t.Fatalf("round trip of %v: %v", ms, back)
		}
	})
}
