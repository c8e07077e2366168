package logx

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// TimeFormat is the format of the time of every line: RFC 3339 in UTC with
// milliseconds, the precision of the durations the daemons log.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// DaemonKey is the key that names the daemon on every line.
const DaemonKey = "daemon"

// Formats of Options.Format.
const (
	FormatText = "text"
	FormatJSON = "json"
)

// Options choose the format and the level of a daemon's log.
type Options struct {
	// Format is FormatText (also when empty) or FormatJSON.
	Format string
	// Debug shows debug lines too.
	Debug bool
}

// AddFlags registers --log-format and --debug on fs, writing to o.
// debugHelp says what --debug adds for this daemon.
func (o *Options) AddFlags(fs *flag.FlagSet, debugHelp string) {
	fs.StringVar(&o.Format, "log-format", FormatText, "log `format` on stderr: text or json")
	fs.BoolVar(&o.Debug, "debug", false, debugHelp)
}

// New returns the logger of daemon, writing to w in the format and at the
// level o chooses. An unknown format is an error that names the flag.
func New(w io.Writer, daemon string, o Options) (*slog.Logger, error) {
	level := slog.LevelInfo
	if o.Debug {
		level = slog.LevelDebug
	}
	ho := &slog.HandlerOptions{Level: level, ReplaceAttr: replaceTime}
	var h slog.Handler
	switch o.Format {
	case FormatText, "":
		h = slog.NewTextHandler(w, ho)
	case FormatJSON:
		h = slog.NewJSONHandler(w, ho)
	default:
		return nil, fmt.Errorf("--log-format %q: want %s or %s", o.Format, FormatText, FormatJSON)
	}
	return slog.New(h).With(DaemonKey, daemon), nil
}

// replaceTime writes the record's time in TimeFormat, whatever the local
// zone and the handler's own default (text and JSON differ).
func replaceTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey && a.Value.Kind() == slog.KindTime {
		a.Value = slog.StringValue(a.Value.Time().UTC().Format(TimeFormat))
	}
	return a
}
