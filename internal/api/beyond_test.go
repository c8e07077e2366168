package api

import (
	"net/url"
	"path"
	"strings"
	"testing"

	"strata/internal/fault"
	"strata/internal/jsend"
)

// wantField checks that err is invalid_field naming field ("" for no
// error expected).
func wantField(t *testing.T, err error, field string) {
	t.Helper()
	if field == "" {
		if err != nil {
			t.Fatalf("unexpected error %v", err)
		}
		return
	}
	fe := fault.As(err)
	if fe == nil || fe.Code != "invalid_field" || fe.Fields["field"] != field {
		t.Fatalf("got %v, want invalid_field naming %q", err, field)
	}
}

func TestCreateRetention(t *testing.T) {
	for _, tc := range []struct {
		name, body, field string
		count             int
	}{
		{"none", `{"path":"/w"}`, "", 0},
		{"null", `{"path":"/w","retention":null}`, "", 0},
		{"one", `{"path":"/w","retention":{"mode":"delete_oldest","max_count":1}}`, "", 1},
		{"most", `{"path":"/w","retention":{"mode":"delete_oldest","max_count":10000}}`, "", 10000},
		{"zero", `{"path":"/w","retention":{"mode":"delete_oldest","max_count":0}}`, "retention.max_count", 0},
		{"over", `{"path":"/w","retention":{"mode":"delete_oldest","max_count":10001}}`, "retention.max_count", 0},
		{"missing count", `{"path":"/w","retention":{"mode":"delete_oldest"}}`, "retention.max_count", 0},
		{"other mode", `{"path":"/w","retention":{"mode":"delete_newest","max_count":3}}`, "retention.mode", 0},
		{"no mode", `{"path":"/w","retention":{"max_count":3}}`, "retention.mode", 0},
		{"wrong type", `{"path":"/w","retention":3}`, "retention", 0},
		{"count as string", `{"path":"/w","retention":{"mode":"delete_oldest","max_count":"3"}}`, "retention.max_count", 0},
		{"path first", `{"path":"","retention":{"mode":"x","max_count":0}}`, "path", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req CreateRequest
			err := jsend.DecodeBytes([]byte(tc.body), &req)
			if err == nil {
				_, _, err = req.Validate()
			}
			wantField(t, err, tc.field)
			if err == nil && req.RetentionCount() != tc.count {
				t.Fatalf("count %d, want %d", req.RetentionCount(), tc.count)
			}
		})
	}
	var req CreateRequest
	err := jsend.DecodeBytes([]byte(`{"path":"/w","retention":{"mode":"delete_oldest","max_count":2,"x":1}}`), &req)
	if fault.CodeOf(err) != "unknown_field" {
		t.Fatalf("unknown field in retention: %v", err)
	}
}

func TestParseChangesQuery(t *testing.T) {
	const cp = "cp_AAAAAAAAAAAAAAAAAAAAAA"
	for _, tc := range []struct {
		name, query, want, code string
	}{
		{"parent", "", "", ""},
		{"live", "against=live", "live", ""},
		{"checkpoint", "against=" + cp, cp, ""},
		{"empty", "against=", "", "invalid_field"},
		{"twice", "against=live&against=live", "", "invalid_field"},
		{"bad id", "against=cp_short", "", "invalid_field"},
		{"Live", "against=LIVE", "", "invalid_field"},
		{"other parameter", "limit=3", "", "query_not_allowed"},
		{"other beside against", "against=live&x=1", "", "query_not_allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := url.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseChangesQuery(q)
			if fault.CodeOf(err) != tc.code || got != tc.want {
				t.Fatalf("got %q, %v; want %q, code %q", got, err, tc.want, tc.code)
			}
		})
	}
}

// FuzzParseChangesQuery checks that an accepted query names nothing but
// one against that is "live" or a checkpoint id.
func FuzzParseChangesQuery(f *testing.F) {
	for _, s := range []string{"", "against=live", "against=cp_AAAAAAAAAAAAAAAAAAAAAA", "against=", "a=b", "against=live&against=x", "%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		got, err := ParseChangesQuery(q)
		if err != nil {
			if c := fault.CodeOf(err); c != "invalid_field" && c != "query_not_allowed" {
				t.Fatalf("%q: code %q", raw, c)
			}
			return
		}
		if len(q) > 1 || (len(q) == 1 && len(q["against"]) != 1) {
			t.Fatalf("%q accepted", raw)
		}
		if got != "" && got != AgainstLive && !ValidCheckpointID(got) {
			t.Fatalf("%q gave %q", raw, got)
		}
	})
}

func TestValidateRelPath(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		ok         bool
	}{
		{"file", "a.txt", true},
		{"deep", "src/pkg/main.go", true},
		{"dotfile", ".env", true},
		{"dots in name", "a..b/..c", true},
		{"unicode", "répertoire/日本", true},
		{"empty", "", false},
		{"root", ".", false},
		{"absolute", "/etc/passwd", false},
		{"parent", "..", false},
		{"up and out", "../x", false},
		{"up inside", "a/../b", false},
		{"trailing up", "a/..", false},
		{"dot element", "a/./b", false},
		{"leading dot", "./a", false},
		{"double slash", "a//b", false},
		{"trailing slash", "a/", false},
		{"newline", "a\nb", false},
		{"bidi", "a\u202eb", false},
		{"nul", "a\x00b", false},
		{"invalid utf-8", "a\xffb", false},
		{"too long", strings.Repeat("a", MaxRelPath+1), false},
		{"longest", strings.Repeat("a", MaxRelPath), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateRelPath("paths", tc.path)
			if tc.ok {
				wantField(t, err, "")
			} else {
				wantField(t, err, "paths")
			}
		})
	}
}

// FuzzValidateRelPath checks the invariant every caller relies on: an
// accepted path, joined under a root, stays under it, and is the same
// path once cleaned.
func FuzzValidateRelPath(f *testing.F) {
	for _, s := range []string{"a", "a/b", "..", "../a", "a/../..", "/a", ".", "", "a//b", "a/", ".x", "..x", "a\u2028b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := ValidateRelPath("path", p)
		if err != nil {
			wantField(t, err, "path")
			return
		}
		joined := path.Join("/root", p)
		if !strings.HasPrefix(joined, "/root/") || joined != "/root/"+p {
			t.Fatalf("%q accepted but joins to %q", p, joined)
		}
		for _, r := range p {
			if HiddenRune(r) {
				t.Fatalf("%q accepted with %U", p, r)
			}
		}
	})
}

func TestRestorePathsValidate(t *testing.T) {
	many := make([]string, MaxRestorePaths+1)
	for i := range many {
		many[i] = "f" + strings.Repeat("x", i)
	}
	for _, tc := range []struct {
		name  string
		paths []string
		ok    bool
		index any
	}{
		{"one", []string{"a"}, true, nil},
		{"several", []string{"a", "b/c", "b/d"}, true, nil},
		{"most", many[:MaxRestorePaths], true, nil},
		{"none", nil, false, nil},
		{"empty list", []string{}, false, nil},
		{"too many", many, false, nil},
		{"bad second", []string{"a", "/b"}, false, 1},
		{"twice", []string{"a", "b", "a"}, false, 2},
		{"nested", []string{"a/b", "a"}, false, 0},
		{"prefix is not nesting", []string{"a", "ab"}, true, nil},
		{"empty element", []string{""}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := RestorePathsRequest{Paths: tc.paths}.Validate()
			if tc.ok {
				wantField(t, err, "")
				return
			}
			wantField(t, err, "paths")
			if got := fault.As(err).Fields["index"]; got != tc.index {
				t.Fatalf("index %v, want %v", got, tc.index)
			}
		})
	}
}

// FuzzParseRestorePaths decodes any body as a restore-paths request: an
// accepted one names 1 to 100 distinct valid paths, none inside another.
func FuzzParseRestorePaths(f *testing.F) {
	for _, s := range []string{`{"paths":["a"]}`, `{"paths":[]}`, `{"paths":["a","a/b"]}`, `{"paths":["../x"]}`, `{"paths":null}`, `{"paths":[1]}`, `{}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var req RestorePathsRequest
		if err := jsend.DecodeBytes([]byte(body), &req); err != nil {
			return
		}
		if err := req.Validate(); err != nil {
			wantField(t, err, "paths")
			return
		}
		if len(req.Paths) < 1 || len(req.Paths) > MaxRestorePaths {
			t.Fatalf("accepted %d paths", len(req.Paths))
		}
		seen := map[string]bool{}
		for _, p := range req.Paths {
			if ValidateRelPath("paths", p) != nil || seen[p] {
				t.Fatalf("accepted %q", p)
			}
			seen[p] = true
		}
		for _, p := range req.Paths {
			for q := range seen {
				if strings.HasPrefix(p, q+"/") {
					t.Fatalf("accepted %q inside %q", p, q)
				}
			}
		}
	})
}

func TestParseEntryPath(t *testing.T) {
	if p, err := ParseEntryPath(""); p != "" || err != nil {
		t.Fatalf("root: %q %v", p, err)
	}
	if p, err := ParseEntryPath("a/b"); p != "a/b" || err != nil {
		t.Fatalf("a/b: %q %v", p, err)
	}
	_, err := ParseEntryPath("a/../../etc")
	wantField(t, err, "path")
}

func TestPathRequest(t *testing.T) {
	s := func(v string) *string { return &v }
	for _, tc := range []struct {
		name  string
		path  *string
		field string
	}{
		{"ok", s("/workspace/copy"), ""},
		{"missing", nil, "path"},
		{"empty", s(""), "path"},
		{"control", s("/a\x1bb"), "path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := PathRequest{Path: tc.path}.Validate()
			wantField(t, err, tc.field)
		})
	}
}

func TestFormatMode(t *testing.T) {
	for m, want := range map[uint32]string{0o644: "0644", 0o4755: "4755", 0o1777: "1777", 0: "0000", 0o100644: "0644"} {
		if got := FormatMode(m); got != want {
			t.Errorf("FormatMode(%o) = %q, want %q", m, got, want)
		}
	}
}

// FuzzParseCreateRetention decodes any body as a create request: an
// accepted one has no retention, or mode delete_oldest with max_count 1
// to MaxCheckpoints, and RetentionCount says which.
func FuzzParseCreateRetention(f *testing.F) {
	for _, s := range []string{
		`{"path":"/w"}`, `{"path":"/w","retention":null}`, `{"path":"/w","retention":{"mode":"delete_oldest","max_count":5}}`,
		`{"path":"/w","retention":{"mode":"delete_oldest","max_count":0}}`, `{"path":"/w","retention":{"mode":"x","max_count":5}}`,
		`{"path":"/w","retention":{"mode":"delete_oldest","max_count":1e4}}`, `{"path":"/w","retention":{"mode":"delete_oldest","max_count":-1}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var req CreateRequest
		if err := jsend.DecodeBytes([]byte(body), &req); err != nil {
			return
		}
		if _, _, err := req.Validate(); err != nil {
			return
		}
		n := req.RetentionCount()
		switch r := req.Retention; {
		case r == nil && n != 0:
			t.Fatalf("no retention but count %d", n)
		case r != nil && (r.Mode != RetentionDeleteOldest || r.MaxCount < 1 || r.MaxCount > MaxCheckpoints || n != r.MaxCount):
			t.Fatalf("accepted retention %+v (count %d)", *r, n)
		}
	})
}
