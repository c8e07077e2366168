package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"strata/guestd"
	"strata/internal/logx"
)

// TestParseCredentials pins where guestd writes the sandbox's credentials:
// /run/strata/credentials.env by default (what createos reads inside a real
// sandbox), and the file --credentials names otherwise (make run puts it
// under its STATE, not in the machine's /run).
func TestParseCredentials(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"default": {nil, "/run/strata/credentials.env"},
		"flag":    {[]string{"--credentials", "/var/tmp/state/credentials.env"}, "/var/tmp/state/credentials.env"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o, err := parse(tc.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if o.config.Credentials != tc.want {
				t.Errorf("credentials %q, want %q", o.config.Credentials, tc.want)
			}
		})
	}
	if guestd.DefaultCredentials != "/run/strata/credentials.env" {
		t.Errorf("guestd.DefaultCredentials = %q: a real guest's createos looks in /run/strata", guestd.DefaultCredentials)
	}
}

// TestParseLog pins that guestd takes the log flags both daemons share.
func TestParseLog(t *testing.T) {
	o, err := parse([]string{"--debug", "--log-format", "json"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (logx.Options{Format: logx.FormatJSON, Debug: true}); o.log != want {
		t.Errorf("log options %+v, want %+v", o.log, want)
	}
}

// TestRunRefuses pins that a bad command line stops guestd before it opens
// (or creates) its store, with a message that says what is wrong.
func TestRunRefuses(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"bad log format":    {[]string{"--log-format", "xml"}, `--log-format "xml": want text or json`},
		"empty credentials": {[]string{"--credentials", ""}, "--credentials: want a file path"},
		"stray argument":    {[]string{"serve"}, "unexpected arguments"},
		"unknown flag":      {[]string{"--credentials-path", "x"}, "flag provided but not defined"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			store := filepath.Join(t.TempDir(), "store")
			args := append([]string{"--store", store, "--listen", "unix://" + filepath.Join(t.TempDir(), "s.sock")}, tc.args...)
			err := run(context.Background(), args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run %v: %v, want an error saying %q", tc.args, err, tc.want)
			}
			if _, err := os.Stat(store); !os.IsNotExist(err) {
				t.Errorf("store %s touched by a refused start: %v", store, err)
			}
		})
	}
}

// TestParseAutoCheckpoints pins --auto-checkpoints: 5 unless told, 0
// turns them off, a negative count is refused.
func TestParseAutoCheckpoints(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
		ok   bool
	}{
		{nil, 5, true},
		{[]string{"--auto-checkpoints", "0"}, 0, true},
		{[]string{"--auto-checkpoints", "12"}, 12, true},
		{[]string{"--auto-checkpoints", "-1"}, 0, false},
	} {
		o, err := parse(tc.args, &bytes.Buffer{})
		if (err == nil) != tc.ok || (tc.ok && o.config.AutoCheckpoints != tc.want) {
			t.Errorf("%q: %d, %v; want %d, ok %v", tc.args, o.config.AutoCheckpoints, err, tc.want, tc.ok)
		}
	}
}

// TestExportRequest pins guestd export's command line: one of
// --checkpoint and --path, and --to.
func TestExportRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
	}{
		{"checkpoint", []string{"--store", "/s", "--checkpoint", "cp_x", "--to", "/out"}, true},
		{"live", []string{"--store", "/s", "--path", "/w", "--to", "/out"}, true},
		{"both", []string{"--checkpoint", "cp_x", "--path", "/w", "--to", "/out"}, false},
		{"neither", []string{"--to", "/out"}, false},
		{"no to", []string{"--checkpoint", "cp_x"}, false},
		{"extra", []string{"--checkpoint", "cp_x", "--to", "/out", "more"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := exportRequest(tc.args, &bytes.Buffer{})
			if (err == nil) != tc.ok {
				t.Errorf("err %v, want ok %v", err, tc.ok)
			}
		})
	}
}
