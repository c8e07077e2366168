package servertiming

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Header is the name of the header the metrics travel in.
const Header = "Server-Timing"

// The bounds of what a Recorder keeps and Parse reads.
const (
	MaxMetrics  = 48
	MaxName     = 64
	MaxDuration = time.Hour
	MaxHeader   = 8 << 10
)

// Metric is one named duration.
type Metric struct {
	Name string
	Dur  time.Duration
}

// Recorder collects the metrics of one request; safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	metrics []Metric
}

type recorderKey struct{}

// With returns ctx carrying a fresh Recorder, and that Recorder.
func With(ctx context.Context) (context.Context, *Recorder) {
	r := &Recorder{}
	return context.WithValue(ctx, recorderKey{}, r), r
}

// From is the Recorder in ctx, or nil.
func From(ctx context.Context) *Recorder {
	r, _ := ctx.Value(recorderKey{}).(*Recorder)
	return r
}

// Add records a metric in ctx's Recorder, if it has one.
func Add(ctx context.Context, name string, d time.Duration) {
	From(ctx).Add(name, d)
}

// Add records a metric; an invalid one, or one beyond MaxMetrics, is
// dropped. r may be nil.
func (r *Recorder) Add(name string, d time.Duration) {
	if r == nil || !ValidName(name) || d < 0 || d > MaxDuration {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.metrics) < MaxMetrics {
		r.metrics = append(r.metrics, Metric{name, d})
	}
}

// Metrics is a copy of what r holds, in the order added.
func (r *Recorder) Metrics() []Metric {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Metric(nil), r.metrics...)
}

// Format is the header value of ms: "name;dur=1.234" (milliseconds, to
// the microsecond), comma-separated.
func Format(ms []Metric) string {
	var b strings.Builder
	for i, m := range ms {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(m.Name)
		b.WriteString(";dur=")
		b.WriteString(strconv.FormatFloat(float64(m.Dur.Microseconds())/1000, 'f', -1, 64))
	}
	return b.String()
}

// ValidName reports whether name may be a metric's name here.
func ValidName(name string) bool {
	if name == "" || len(name) > MaxName {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// Parse reads the metrics of a Server-Timing header value that have a
// valid name and a valid dur; the rest is skipped. At most MaxMetrics
// are read from the first MaxHeader bytes.
func Parse(h string) []Metric {
	if len(h) > MaxHeader {
		h = h[:MaxHeader]
	}
	var out []Metric
	for entry := range strings.SplitSeq(h, ",") {
		if len(out) == MaxMetrics {
			break
		}
		name, params, _ := strings.Cut(entry, ";")
		name = strings.TrimSpace(name)
		if !ValidName(name) {
			continue
		}
		for p := range strings.SplitSeq(params, ";") {
			k, v, ok := strings.Cut(p, "=")
			if !ok || strings.TrimSpace(k) != "dur" {
				continue
			}
			ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || ms != ms || ms < 0 || ms > float64(MaxDuration/time.Millisecond) {
				break
			}
			out = append(out, Metric{name, time.Duration(ms * float64(time.Millisecond))})
			break
		}
	}
	return out
}
