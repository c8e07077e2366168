package api

import (
	"strings"
	"testing"

	"strata/internal/fault"
)

func TestParseSnapshotCreate(t *testing.T) {
	for _, tc := range []struct {
		name, body, field string
		memory            bool
	}{
		{name: "empty body", body: "", memory: true},
		{name: "empty object", body: "{}", memory: true},
		{name: "disk only with a comment", body: `{"memory":false,"comment":"before the migration"}`},
		{name: "retention", body: `{"retention":{"mode":"delete_oldest","max_count":3}}`, memory: true},
		{name: "comment too long", body: `{"comment":"` + strings.Repeat("x", 257) + `"}`, field: "comment"},
		{name: "comment with NUL", body: `{"comment":"a\u0000b"}`, field: "comment"},
		{name: "unknown retention mode", body: `{"retention":{"mode":"keep","max_count":3}}`, field: "retention.mode"},
		{name: "retention of zero", body: `{"retention":{"mode":"delete_oldest","max_count":0}}`, field: "retention.max_count"},
		{name: "retention over the limit", body: `{"retention":{"mode":"delete_oldest","max_count":101}}`, field: "retention.max_count"},
		{name: "a name", body: `{"name":"after-build"}`, memory: true},
		{name: "a name of 64", body: `{"name":"` + strings.Repeat("n", 64) + `"}`, memory: true},
		{name: "a name of 65", body: `{"name":"` + strings.Repeat("n", 65) + `"}`, field: "name"},
		{name: "an empty name", body: `{"name":""}`, field: "name"},
		{name: "a name with a space", body: `{"name":"after build"}`, field: "name"},
		{name: "a name with a slash", body: `{"name":"a/b"}`, field: "name"},
		{name: "a name starting with a dot", body: `{"name":".x"}`, field: "name"},
		{name: "a name of an id's shape", body: `{"name":"v3"}`, field: "name"},
		{name: "a name of an automatic id's shape", body: `{"name":"auto-007"}`, field: "name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := ParseSnapshotCreate([]byte(tc.body))
			if tc.field != "" {
				if fe := fault.As(err); fe == nil || fe.Code != "invalid_field" || fe.Fields["field"] != tc.field {
					t.Fatalf("got %+v, %v; want invalid_field %s", req, err, tc.field)
				}
				return
			}
			if err != nil || req.Memory == nil || *req.Memory != tc.memory {
				t.Fatalf("got %+v, %v; want memory %v", req, err, tc.memory)
			}
		})
	}
	for _, bad := range []string{`[]`, `{"memory":"yes"}`, `{"other":1}`, `{} {}`} {
		if _, err := ParseSnapshotCreate([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func TestParseFork(t *testing.T) {
	for _, tc := range []struct {
		body, field string
	}{
		{body: `{"count":1}`},
		{body: `{"count":100,"name_prefix":"worker"}`},
		{body: `{"count":2,"name_prefix":"` + strings.Repeat("a", 59) + `"}`},
		{body: `{"count":0}`, field: "count"},
		{body: `{}`, field: "count"},
		{body: `{"count":101}`, field: "count"},
		{body: `{"count":2,"name_prefix":"` + strings.Repeat("a", 60) + `"}`, field: "name_prefix"},
		{body: `{"count":2,"name_prefix":"bad name"}`, field: "name_prefix"},
		{body: `{"count":2,"name_prefix":"` + strings.Repeat("a", 63) + `"}`, field: "name_prefix"},
	} {
		_, err := ParseFork([]byte(tc.body))
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.body, err)
			}
			continue
		}
		if fe := fault.As(err); fe == nil || fe.Fields["field"] != tc.field {
			t.Errorf("%s: got %v; want invalid_field %s", tc.body, err, tc.field)
		}
	}
}

func TestParseSnapshotRestore(t *testing.T) {
	if req, err := ParseSnapshotRestore(nil); err != nil || req.DiskOnly {
		t.Fatalf("empty body: %+v, %v", req, err)
	}
	if req, err := ParseSnapshotRestore([]byte(`{"disk_only":true}`)); err != nil || !req.DiskOnly {
		t.Fatalf("disk_only: %+v, %v", req, err)
	}
	if _, err := ParseSnapshotRestore([]byte(`{"disk":true}`)); err == nil {
		t.Fatal("accepted an unknown field")
	}
}

func FuzzParseSnapshotCreate(f *testing.F) {
	f.Add([]byte(`{"comment":"x","memory":false,"retention":{"mode":"delete_oldest","max_count":5}}`))
	f.Add([]byte(``))
	f.Add([]byte(`{"name":"v1x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseSnapshotCreate(b)
		if err != nil {
			return
		}
		if req.Memory == nil {
			t.Fatal("accepted without a memory default")
		}
		if req.Name != nil && (!ValidSnapshotName(*req.Name) || ValidSnapshotID(*req.Name)) {
			t.Fatalf("accepted the name %q", *req.Name)
		}
		if req.Comment != nil && len(*req.Comment) > MaxSnapshotComment {
			t.Fatalf("accepted a comment of %d bytes", len(*req.Comment))
		}
		if r := req.Retention; r != nil && (r.Mode != "delete_oldest" || r.MaxCount < 1 || r.MaxCount > MaxRetentionCount) {
			t.Fatalf("accepted retention %+v", *r)
		}
	})
}

func FuzzParseFork(f *testing.F) {
	f.Add([]byte(`{"count":3,"name_prefix":"w"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseFork(b)
		if err != nil {
			return
		}
		if req.Count < 1 || req.Count > MaxForkCount {
			t.Fatalf("accepted count %d", req.Count)
		}
		if req.NamePrefix != nil && ValidateSandboxName(ForkName(*req.NamePrefix, req.Count)) != nil {
			t.Fatalf("accepted prefix %q that makes a bad name", *req.NamePrefix)
		}
	})
}

// FuzzValidSnapshotName: a name is never an id (so a lookup by either
// never finds two snapshots), and never holds what a path segment or a
// log line could misread.
func FuzzValidSnapshotName(f *testing.F) {
	for _, s := range []string{"after-build", "v1", "v01", "auto-1", "a.b_c-d", "x/y", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !ValidSnapshotName(s) {
			return
		}
		if ValidSnapshotID(s) || len(s) > MaxSnapshotName || strings.ContainsAny(s, "/ %?#\\\x00") {
			t.Fatalf("accepted %q", s)
		}
	})
}
