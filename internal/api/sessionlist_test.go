package api

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

// record is a session's record as guestd writes it, with edit applied to
// its fields first.
func record(edit func(m map[string]any)) string {
	m := map[string]any{
		"id": "se-0123456789abcdef", "cmd": []string{"sh"}, "tty": false, "detachable": false,
		"state": "running", "attached": 0, "created_at": "2026-11-05T10:00:00Z", "output_bytes": 0,
	}
	if edit != nil {
		edit(m)
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// TestParseSessionRecord pins the bounds of a record hostproxy takes
// from a guest (issue 30: hostproxy decoded whatever a guest listed).
func TestParseSessionRecord(t *testing.T) {
	exited := func(m map[string]any) {
		m["state"], m["exit_code"], m["ended_at"] = "exited", 0, "2026-11-05T10:01:00Z"
	}
	cases := []struct {
		name, record string
		ok           bool
	}{
		{"running", record(nil), true},
		{"exited", record(exited), true},
		{"timed out", record(func(m map[string]any) { exited(m); m["timed_out"] = true; m["exit_code"] = -1 }), true},
		{"the longest cmd, escaped", record(func(m map[string]any) { m["cmd"] = []string{strings.Repeat("<", MaxExecCmdBytes)} }), true},
		{"empty", `{}`, false},
		{"a sandbox of the guest's", record(func(m map[string]any) { m["sandbox"] = "sb-other" }), false},
		{"an unknown field", record(func(m map[string]any) { m["extra"] = 1 }), false},
		{"no created_at", record(func(m map[string]any) { delete(m, "created_at") }), false},
		{"a bad id", record(func(m map[string]any) { m["id"] = "se-x" }), false},
		{"no cmd", record(func(m map[string]any) { m["cmd"] = []string{} }), false},
		{"too many args", record(func(m map[string]any) { m["cmd"] = make([]string, MaxExecArgs+1) }), false},
		{"too long a cmd", record(func(m map[string]any) { m["cmd"] = []string{strings.Repeat("x", MaxExecCmdBytes+1)} }), false},
		{"another state", record(func(m map[string]any) { m["state"] = "zombie" }), false},
		{"running with an exit code", record(func(m map[string]any) { m["exit_code"] = 0 }), false},
		{"exited without an end", record(func(m map[string]any) { exited(m); delete(m, "ended_at") }), false},
		{"negative output", record(func(m map[string]any) { m["output_bytes"] = -1 }), false},
		{"over MaxSessionRecord", record(func(m map[string]any) { m["cmd"] = []string{"sh" + strings.Repeat(" ", MaxSessionRecord)} }), false},
		{"a list", `[` + record(nil) + `]`, false},
		{"a generation", record(func(m map[string]any) { m["generation"] = "0123456789abcdef" }), true},
		{"a generation of another shape", record(func(m map[string]any) { m["generation"] = "0123456789ABCDEF" }), false},
		{"an empty generation", record(func(m map[string]any) { m["generation"] = "" }), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := ParseSessionRecord([]byte(tc.record))
			if (err == nil) != tc.ok {
				t.Fatalf("ParseSessionRecord: %v, want ok %v", err, tc.ok)
			}
			if err == nil && (rec.ID != "se-0123456789abcdef" || rec.CreatedAt.IsZero()) {
				t.Fatalf("%+v", rec)
			}
		})
	}
}

// TestEachSession pins issue 30's session list: hostproxy decoded a
// guest's list into []Session whole; a 15 MiB list of {} grew hostproxy
// to 8.6 GiB over four calls. A list of more than MaxSessionsListed
// records is refused before any is decoded.
func TestEachSession(t *testing.T) {
	list := func(n int, rec string) string {
		return `{"sessions":[` + strings.TrimSuffix(strings.Repeat(rec+",", n), ",") + `]}`
	}
	cases := []struct {
		name, data string
		n          int // records taken; -1: refused before any
	}{
		{"none", `{"sessions":[]}`, 0},
		{"one", list(1, record(nil)), 1},
		{"MaxSessionsListed", list(MaxSessionsListed, record(nil)), MaxSessionsListed},
		{"one more", list(MaxSessionsListed+1, record(nil)), -1},
		{"16 MiB of {}", list((16<<20)/3, `{}`), -1},
		{"no sessions", `{}`, -1},
		{"another member", `{"sessions":[],"more":[]}`, -1},
		{"sessions twice", `{"sessions":[],"sessions":[]}`, -1},
		{"not a list", `{"sessions":{}}`, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.data)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			n := 0
			err := EachSession(data, func([]byte, Session) error { n++; return nil })
			runtime.ReadMemStats(&after)
			if tc.n < 0 {
				if err == nil {
					t.Fatalf("took %d records", n)
				}
				if n > 0 {
					t.Fatalf("%d records decoded before the list was refused", n)
				}
			} else if err != nil || n != tc.n {
				t.Fatalf("%d records, %v; want %d", n, err, tc.n)
			}
			// Beyond the data's own bytes, a list costs its records one
			// at a time, and a list refused for its length nothing.
			if grew := after.TotalAlloc - before.TotalAlloc; grew > uint64(max(tc.n, 0)+1)*16<<10 {
				t.Fatalf("%d bytes allocated for %d records", grew, n)
			}
		})
	}
}

// FuzzEachSession checks the session list's bounds on any data: it never
// panics; it takes at most MaxSessionsListed records, each of a
// session's shape, each a slice of the data that parses alone to the
// same record; so relayed as sent, with a sandbox's id added as
// hostproxy adds it, the records are no longer than the data and 64
// bytes a record.
func FuzzEachSession(f *testing.F) {
	exited := record(func(m map[string]any) {
		m["state"], m["exit_code"], m["ended_at"], m["cmd"] = "exited", 1, "2026-11-05T10:01:00Z", []string{"<a&b>", "\u2028"}
	})
	for _, s := range []string{`{"sessions":[]}`, `{"sessions":[` + record(nil) + `,` + exited + `]}`, `{"sessions":[{}]}`, `{"sessions":[` + record(nil) + `] }`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, out := 0, 0
		err := EachSession(data, func(raw []byte, rec Session) error {
			n++
			if !ValidSessionID(rec.ID) || len(rec.Cmd) == 0 || len(rec.Cmd) > MaxExecArgs || rec.Attached < 0 || rec.OutputBytes < 0 ||
				(rec.State != SessionRunning && rec.State != SessionExited) || (rec.State == SessionExited) != (rec.ExitCode != nil) {
				t.Fatalf("record %+v", rec)
			}
			again, err := ParseSessionRecord(raw)
			if err != nil || again.ID != rec.ID || len(again.Cmd) != len(rec.Cmd) || !again.CreatedAt.Equal(rec.CreatedAt) {
				t.Fatalf("record %q parsed alone: %+v, %v", raw, again, err)
			}
			out += len(raw) + len(`"sandbox":"sb-abcdefghijklmnopqrstuvwxyz",`) + 1
			return nil
		})
		if n > MaxSessionsListed {
			t.Fatalf("%d records", n)
		}
		if err == nil && out > len(data)+64*n {
			t.Fatalf("%d bytes of data relayed as %d", len(data), out)
		}
	})
}

// TestEachSessionBadRecord: a list is refused at its first bad record
// (the records before it have been taken: hostproxy checks a list whole
// before it writes any of it).
func TestEachSessionBadRecord(t *testing.T) {
	data := `{"sessions":[` + record(nil) + `,` + record(nil) + `,{}]}`
	n := 0
	if err := EachSession([]byte(data), func([]byte, Session) error { n++; return nil }); err == nil || n != 2 {
		t.Fatalf("%d records, %v", n, err)
	}
}
