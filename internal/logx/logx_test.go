package logx

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"
)

// at is a fixed time in a zone other than UTC, with more precision than a
// line shows.
var at = time.Date(2026, 12, 1, 12, 18, 33, 873456789, time.FixedZone("CET", 3600))

// line logs one record at a fixed time through daemon's logger and returns
// what it wrote.
func line(t *testing.T, daemon string, o Options, level slog.Level, msg string, attrs ...any) string {
	t.Helper()
	var buf bytes.Buffer
	l, err := New(&buf, daemon, o)
	if err != nil {
		t.Fatal(err)
	}
	r := slog.NewRecord(at, level, msg, 0)
	r.Add(attrs...)
	if err := l.Handler().Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestTextLine pins the text format byte for byte: time in UTC to the
// millisecond, slog's level name, the message, daemon=NAME, then the
// caller's keys in order.
func TestTextLine(t *testing.T) {
	got := line(t, "guestd", Options{}, slog.LevelInfo, "request", "request_id", "r1", "status", 200, "duration_ms", 1.5)
	want := "time=2026-12-01T11:18:33.873Z level=INFO msg=request daemon=guestd request_id=r1 status=200 duration_ms=1.5\n"
	if got != want {
		t.Errorf("text line\n got %q\nwant %q", got, want)
	}
}

// TestJSONLine pins that --log-format json writes the same keys and values
// as text, the time included (slog's JSON default would be nanoseconds in
// the local zone).
func TestJSONLine(t *testing.T) {
	got := line(t, "hostproxy", Options{Format: FormatJSON}, slog.LevelWarn, "request", "status", 502)
	want := `{"time":"2026-12-01T11:18:33.873Z","level":"WARN","msg":"request","daemon":"hostproxy","status":502}` + "\n"
	if got != want {
		t.Errorf("json line\n got %q\nwant %q", got, want)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(got), &m); err != nil {
		t.Errorf("not JSON: %v", err)
	}
}

// TestDaemonsAlike pins the point of the package: the same record from
// guestd and from hostproxy differs only in the daemon's name.
func TestDaemonsAlike(t *testing.T) {
	for _, format := range []string{FormatText, FormatJSON} {
		g := line(t, "guestd", Options{Format: format}, slog.LevelInfo, "listening", "addr", "x")
		h := line(t, "hostproxy", Options{Format: format}, slog.LevelInfo, "listening", "addr", "x")
		if strings.Replace(g, "guestd", "hostproxy", 1) != h {
			t.Errorf("%s: lines differ beyond the daemon:\n%s%s", format, g, h)
		}
	}
}

// TestLevels pins which levels each setting shows: debug lines only with
// Debug, everything from info up always, under slog's own level names.
func TestLevels(t *testing.T) {
	logAll := func(l *slog.Logger) {
		l.Debug("d")
		l.Info("i")
		l.Warn("w")
		l.Error("e")
	}
	cases := map[string]struct {
		debug bool
		want  []string
	}{
		"default": {false, []string{"INFO i", "WARN w", "ERROR e"}},
		"debug":   {true, []string{"DEBUG d", "INFO i", "WARN w", "ERROR e"}},
	}
	re := regexp.MustCompile(`(?m)^time=\S+ level=(\w+) msg=(\w+) daemon=guestd$`)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			l, err := New(&buf, "guestd", Options{Debug: tc.debug})
			if err != nil {
				t.Fatal(err)
			}
			logAll(l)
			var got []string
			for _, m := range re.FindAllStringSubmatch(buf.String(), -1) {
				got = append(got, m[1]+" "+m[2])
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("lines %q, want %q; log:\n%s", got, tc.want, buf.String())
			}
		})
	}
}

// TestFlags pins the flags both daemons share: their names, their
// defaults (text, info) and that they reach New.
func TestFlags(t *testing.T) {
	cases := map[string]struct {
		args []string
		want Options
	}{
		"defaults": {nil, Options{Format: FormatText}},
		"debug":    {[]string{"--debug"}, Options{Format: FormatText, Debug: true}},
		"json":     {[]string{"--log-format", "json"}, Options{Format: FormatJSON}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("d", flag.ContinueOnError)
			var o Options
			o.AddFlags(fs, "more")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if o != tc.want {
				t.Errorf("options %+v, want %+v", o, tc.want)
			}
		})
	}
}

// TestUnknownFormat pins that a format other than text or json is refused
// with a message naming the flag, not silently logged as text.
func TestUnknownFormat(t *testing.T) {
	_, err := New(io.Discard, "guestd", Options{Format: "xml"})
	if err == nil || !strings.Contains(err.Error(), `--log-format "xml": want text or json`) {
		t.Errorf("New with format xml: %v", err)
	}
}
