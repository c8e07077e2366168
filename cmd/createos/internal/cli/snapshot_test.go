package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"strata/internal/api"
	"strata/internal/fault"
)

// The VM snapshot routes of the fake API, as API.md's "VM snapshots and
// forks" states them: ids v1, v2… per sandbox and auto-1… for the ones a
// restore keeps, limits per kind with retention, pins, and forks.

// fakeSnapshots are one sandbox's snapshots, oldest first, and the last
// numbers given (ids are never reused).
type fakeSnapshots struct {
	list            []*Snapshot
	lastV, lastAuto int
}

// fakeAutoKept is how many automatic snapshots a sandbox keeps.
const fakeAutoKept = 5

var (
	errNoSnapshot = fault.New(fault.NotFound, "snapshot_not_found", "no snapshot of this sandbox has this id")
	errWrongVerb  = fault.New(fault.MethodNotAllowed, "method_not_allowed", "this route does not take this method")
)

func (f *fakeAPI) snapshotsOf(sandbox string) *fakeSnapshots {
	ss := f.snaps[sandbox]
	if ss == nil {
		ss = &fakeSnapshots{}
		f.snaps[sandbox] = ss
	}
	return ss
}

// addSnapshot puts a snapshot in the fake's records as the test gives it;
// new ids continue after its number.
func (f *fakeAPI) addSnapshot(s Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ss := f.snapshotsOf(s.Sandbox)
	ss.list = append(ss.list, &s)
	if n, ok := strings.CutPrefix(s.ID, "auto-"); ok {
		k, _ := strconv.Atoi(n)
		ss.lastAuto = max(ss.lastAuto, k)
	} else if n, ok := strings.CutPrefix(s.ID, "v"); ok {
		k, _ := strconv.Atoi(n)
		ss.lastV = max(ss.lastV, k)
	}
}

// find returns the index and record of a snapshot, or -1 and nil.
func (f *fakeAPI) find(sandbox, id string) (int, *Snapshot) {
	for i, s := range f.snapshotsOf(sandbox).list {
		if s.ID == id {
			return i, s
		}
	}
	return -1, nil
}

// snapshotOf returns the sandbox a fork is made from, once its snapshot
// is known to exist.
func (f *fakeAPI) snapshotOf(sandbox, id string) (*api.Sandbox, error) {
	sb := f.sandboxes[sandbox]
	if sb == nil {
		return nil, errNoSandbox.With("sandbox_id", sandbox)
	}
	if _, s := f.find(sandbox, id); s == nil {
		return nil, errNoSnapshot.With("snapshot_id", id)
	}
	return sb, nil
}

// fork boots a sandbox from a snapshot of src, with src's resources.
func (f *fakeAPI) fork(src *api.Sandbox, snapshot string, name *string) api.Sandbox {
	return f.boot(api.Sandbox{MemoryMiB: src.MemoryMiB, VCPUs: src.VCPUs, DiskGiB: src.DiskGiB, Labels: map[string]string{},
		From: &api.SandboxFrom{Sandbox: src.ID, Snapshot: snapshot}}, name)
}

// newSnapshot records a snapshot of sb made now.
func (f *fakeAPI) newSnapshot(sb *api.Sandbox, memory, auto bool, comment string) *Snapshot {
	ss := f.snapshotsOf(sb.ID)
	s := &Snapshot{Sandbox: sb.ID, Comment: comment, Memory: memory, Auto: auto, Status: f.snapStatus,
		SizeBytes: 12_345_678, CreatedAt: "2026-11-05T10:00:00.000Z"}
	if memory {
		s.SizeBytes = 79_901_491
	}
	if f.snapStatus != SnapshotReady {
		s.SizeBytes = 0
	}
	if auto {
		ss.lastAuto++
		s.ID = fmt.Sprintf("auto-%d", ss.lastAuto)
	} else {
		ss.lastV++
		s.ID = fmt.Sprintf("v%d", ss.lastV)
	}
	ss.list = append(ss.list, s)
	return s
}

func (f *fakeAPI) snapshotRoute(r *http.Request, sb *api.Sandbox, rest []string, body []byte) (any, int, error) {
	ss := f.snapshotsOf(sb.ID)
	if len(rest) == 0 {
		switch r.Method {
		case http.MethodGet:
			list := []Snapshot{}
			for _, s := range ss.list {
				list = append(list, *s)
			}
			return list, 0, nil
		case http.MethodPost:
			return f.createSnapshot(sb, body)
		}
		return nil, 0, errWrongVerb
	}
	i, s := f.find(sb.ID, rest[0])
	if s == nil {
		return nil, 0, errNoSnapshot.With("snapshot_id", rest[0])
	}
	switch {
	case len(rest) == 1 && r.Method == http.MethodGet:
		return *s, 0, nil
	case len(rest) == 1 && r.Method == http.MethodDelete:
		ss.list = append(ss.list[:i], ss.list[i+1:]...)
		return map[string]any{}, 0, nil
	case len(rest) == 2 && r.Method == http.MethodPost && (rest[1] == "pin" || rest[1] == "unpin"):
		s.Pinned = rest[1] == "pin"
		return *s, 0, nil
	case len(rest) == 2 && r.Method == http.MethodPost && rest[1] == "restore":
		req, err := api.ParseSnapshotRestore(body)
		if err != nil {
			return nil, 0, err
		}
		if s.Memory && !req.DiskOnly && f.incompatible {
			return nil, 0, fault.New(fault.Conflict, "snapshot_incompatible", "this host's QEMU cannot restore the snapshot's memory; restore its disk only").
				With("differs", "qemu_version")
		}
		auto := f.newSnapshot(sb, sb.State != api.SandboxStopped, true, "before restoring "+s.ID)
		autos := 0
		for j := len(ss.list) - 1; j >= 0; j-- {
			if ss.list[j].Auto {
				if autos++; autos > fakeAutoKept {
					ss.list = append(ss.list[:j], ss.list[j+1:]...)
				}
			}
		}
		sb.State = api.SandboxRunning
		return SnapshotRestored{SnapshotID: s.ID, AutoID: auto.ID, State: sb.State}, 0, nil
	case len(rest) == 2 && r.Method == http.MethodPost && rest[1] == "fork":
		req, err := api.ParseFork(body)
		if err != nil {
			return nil, 0, err
		}
		out := Forks{Sandboxes: []Sandbox{}}
		for n := 1; n <= req.Count; n++ {
			var name *string
			if req.NamePrefix != nil {
				v := api.ForkName(*req.NamePrefix, n)
				name = &v
			}
			out.Sandboxes = append(out.Sandboxes, f.fork(sb, s.ID, name))
		}
		return out, http.StatusAccepted, nil
	}
	return nil, 0, errWrongVerb
}

// createSnapshot is POST …/snapshots: at the limit of its kind it fails
// with snapshot_limit, unless retention lets the oldest unpinned snapshot
// of that kind go (as many as keep at most max_count with the new one).
func (f *fakeAPI) createSnapshot(sb *api.Sandbox, body []byte) (any, int, error) {
	req, err := api.ParseSnapshotCreate(body)
	if err != nil {
		return nil, 0, err
	}
	memory := *req.Memory
	comment := ""
	if req.Comment != nil {
		comment = *req.Comment
	}
	limit := f.snapLimit[memory]
	keep := limit
	if req.Retention != nil {
		keep = min(keep, req.Retention.MaxCount)
	}
	ss := f.snapshotsOf(sb.ID)
	var kept []*Snapshot // the list once retention has done its work
	count := 0
	for _, s := range ss.list {
		if s.Memory == memory && !s.Auto {
			count++
		}
	}
	for _, s := range ss.list {
		if count >= keep && req.Retention != nil && s.Memory == memory && !s.Auto && !s.Pinned {
			count-- // the oldest eligible goes
			continue
		}
		kept = append(kept, s)
	}
	if count >= keep {
		return nil, 0, fault.New(fault.Conflict, "snapshot_limit", "the sandbox has as many snapshots of this kind as it may keep").
			With("limit", limit).With("memory", memory)
	}
	ss.list = kept
	made := f.newSnapshot(sb, memory, false, comment)
	if req.Name != nil {
		made.Name = *req.Name
	}
	return *made, 0, nil
}

// seedSnapshots gives f sandbox sb-a1 (running, named web) with four
// snapshots of every kind and status, and sb-a2 with none.
func seedSnapshots(f *fakeAPI) {
	f.add(api.Sandbox{ID: "sb-a1", Name: "web", State: "running", MemoryMiB: 1024, VCPUs: 2, DiskGiB: 8, CreatedAt: "2026-11-01T08:00:00Z"})
	f.add(api.Sandbox{ID: "sb-a2", State: "stopped", MemoryMiB: 512, VCPUs: 1, DiskGiB: 4, CreatedAt: "2026-11-01T08:00:00Z"})
	for _, s := range []Snapshot{
		{ID: "v1", Comment: "before the upgrade", Memory: true, Status: "ready", SizeBytes: 79_901_491, CreatedAt: "2026-11-01T08:00:00Z"},
		{ID: "v2", Pinned: true, Status: "ready", SizeBytes: 1_288_490_189, CreatedAt: "2026-11-05T08:00:00Z"},
		{ID: "auto-1", Comment: "before restoring v1", Memory: true, Auto: true, Status: "ready", SizeBytes: 80_000_000, CreatedAt: "2026-11-05T09:57:00Z"},
		{ID: "v3", Comment: "tab\there", Status: "processing", CreatedAt: "2026-11-05T09:59:30Z"},
	} {
		s.Sandbox = "sb-a1"
		f.addSnapshot(s)
	}
}

// lastRequest is the last request the fake got and its body.
func (f *fakeAPI) lastRequest() (string, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		return "", ""
	}
	return f.requests[len(f.requests)-1], f.bodies[len(f.bodies)-1]
}

// TestSnapshotCommands: each snapshot command sends its method, path and
// body, and prints its answer (a table, a sentence, or -o json as the API
// sent it) or the API's error with exit 1.
func TestSnapshotCommands(t *testing.T) {
	pinClock(t, "2026-11-05T10:00:00Z")
	tests := []struct {
		name    string
		setup   func(f *fakeAPI)
		args    []string // after "sandbox snapshot"
		request string   // the last request; "" for none at all
		body    string
		code    int
		stdout  string
		stderr  string
	}{
		{name: "list", args: []string{"list", "sb-a1"}, request: "GET /v1/sandboxes/sb-a1/snapshots",
			stdout: "ID      KIND    AUTO  PINNED  STATUS      SIZE      AGE  COMMENT\n" +
				"v1      memory                ready       76.2 MiB  4d   before the upgrade\n" +
				"v2      disk          yes     ready       1.2 GiB   2h   -\n" +
				"auto-1  memory  yes           ready       76.3 MiB  3m   before restoring v1\n" +
				"v3      disk                  processing  -         30s  \"tab\\there\"\n"},
		{name: "list none", args: []string{"ls", "sb-a2"}, request: "GET /v1/sandboxes/sb-a2/snapshots", stdout: "No snapshots.\n"},
		{name: "list none -o json", args: []string{"list", "sb-a2", "-o", "json"}, request: "GET /v1/sandboxes/sb-a2/snapshots", stdout: "[]\n"},
		{name: "list of an unknown sandbox", args: []string{"list", "sb-zz"}, request: "GET /v1/sandboxes/sb-zz/snapshots", code: 1,
			stderr: "createos: sandbox_not_found: no such sandbox\n  sandbox_id: sb-zz\n"},

		{name: "create", args: []string{"create", "sb-a1"}, request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{}`,
			stdout: "ID  KIND    AUTO  PINNED  STATUS  SIZE      AGE  COMMENT\n" +
				"v4  memory                ready   76.2 MiB  0s   -\n"},
		{name: "create with every flag", args: []string{"create", "sb-a1", "--disk-only", "--comment", "nightly", "--retention-max-count", "3"},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{"comment":"nightly","memory":false,"retention":{"mode":"delete_oldest","max_count":3}}`,
			stdout: "ID  KIND  AUTO  PINNED  STATUS  SIZE      AGE  COMMENT\n" +
				"v4  disk                ready   11.8 MiB  0s   nightly\n"},
		{name: "create with a name", args: []string{"create", "sb-a1", "--name", "after-build"},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{"name":"after-build"}`,
			stdout: "ID  NAME         KIND    AUTO  PINNED  STATUS  SIZE      AGE  COMMENT\n" +
				"v4  after-build  memory                ready   76.2 MiB  0s   -\n"},
		{name: "create with a name of an id's shape", args: []string{"create", "sb-a1", "--name", "v9"},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{"name":"v9"}`, code: 1,
			stderr: "createos: invalid_field: name must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit, not of a snapshot id's shape (v1, auto-1) and not starting with sn- (a snapshot ref's prefix)\n  field: name\n"},
		{name: "create with an empty comment", args: []string{"create", "sb-a1", "--comment", ""},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{"comment":""}`,
			stdout: "ID  KIND    AUTO  PINNED  STATUS  SIZE      AGE  COMMENT\n" +
				"v4  memory                ready   76.2 MiB  0s   -\n"},
		{name: "create while processing", setup: func(f *fakeAPI) { f.snapStatus = SnapshotProcessing }, args: []string{"create", "sb-a1"},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{}`,
			stdout: "ID  KIND    AUTO  PINNED  STATUS      SIZE  AGE  COMMENT\n" +
				"v4  memory                processing  -     0s   -\n"},
		{name: "create -o json", args: []string{"create", "sb-a1", "-o", "json", "--comment", "x"},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{"comment":"x"}`,
			stdout: "{\n  \"id\": \"v4\",\n  \"sandbox\": \"sb-a1\",\n  \"comment\": \"x\",\n  \"memory\": true,\n  \"auto\": false,\n  \"pinned\": false,\n" +
				"  \"status\": \"ready\",\n  \"size_bytes\": 79901491,\n  \"created_at\": \"2026-11-05T10:00:00.000Z\"\n}\n"},
		{name: "create at the limit", setup: func(f *fakeAPI) { f.snapLimit[true] = 1 }, args: []string{"create", "sb-a1"},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{}`, code: 1,
			stderr: "createos: snapshot_limit: the sandbox has as many snapshots of this kind as it may keep\n  limit: 1\n  memory: true\n"},
		{name: "create at the limit -o json", setup: func(f *fakeAPI) { f.snapLimit[true] = 1 }, args: []string{"create", "sb-a1", "-o", "json"},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{}`, code: 1,
			stderr: `{"data":{"code":"snapshot_limit","limit":1,"memory":true,"message":"the sandbox has as many snapshots of this kind as it may keep"},"status":"fail"}` + "\n"},
		{name: "create at the limit with retention", setup: func(f *fakeAPI) { f.snapLimit[true] = 1 },
			args:    []string{"create", "sb-a1", "--retention-max-count", "1", "--comment", "newest"},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{"comment":"newest","retention":{"mode":"delete_oldest","max_count":1}}`,
			stdout: "ID  KIND    AUTO  PINNED  STATUS  SIZE      AGE  COMMENT\n" +
				"v4  memory                ready   76.2 MiB  0s   newest\n"},
		{name: "create at the limit, only pinned ones", setup: func(f *fakeAPI) { f.snapLimit[false] = 2 },
			args: []string{"create", "sb-a1", "--disk-only", "--retention-max-count", "1"}, code: 1,
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{"memory":false,"retention":{"mode":"delete_oldest","max_count":1}}`,
			stderr: "createos: snapshot_limit: the sandbox has as many snapshots of this kind as it may keep\n  limit: 2\n  memory: false\n"},
		{name: "create with a retention the API refuses", args: []string{"create", "sb-a1", "--retention-max-count", "0"}, code: 1,
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{"retention":{"mode":"delete_oldest","max_count":0}}`,
			stderr: "createos: invalid_field: retention.max_count must be 1 to 100\n  field: retention.max_count\n"},

		{name: "get", args: []string{"get", "sb-a1", "v2"}, request: "GET /v1/sandboxes/sb-a1/snapshots/v2",
			stdout: "ID  KIND  AUTO  PINNED  STATUS  SIZE     AGE  COMMENT\n" +
				"v2  disk        yes     ready   1.2 GiB  2h   -\n" +
				"created: 2026-11-05T08:00:00Z\n"},
		{name: "get -o json", args: []string{"get", "sb-a1", "auto-1", "-o", "json"}, request: "GET /v1/sandboxes/sb-a1/snapshots/auto-1",
			stdout: "{\n  \"id\": \"auto-1\",\n  \"sandbox\": \"sb-a1\",\n  \"comment\": \"before restoring v1\",\n  \"memory\": true,\n  \"auto\": true,\n  \"pinned\": false,\n" +
				"  \"status\": \"ready\",\n  \"size_bytes\": 80000000,\n  \"created_at\": \"2026-11-05T09:57:00Z\"\n}\n"},
		{name: "get an unknown snapshot", args: []string{"get", "sb-a1", "v9"}, request: "GET /v1/sandboxes/sb-a1/snapshots/v9", code: 1,
			stderr: "createos: snapshot_not_found: no snapshot of this sandbox has this id\n  snapshot_id: v9\n"},

		{name: "restore", args: []string{"restore", "sb-a1", "v1"}, request: "POST /v1/sandboxes/sb-a1/snapshots/v1/restore",
			stdout: "Restored sb-a1 to v1; it is running\n" +
				"Its state before is kept as auto-2: 'createos sandbox snapshot restore sb-a1 auto-2' undoes this\n"},
		{name: "restore the disk only", args: []string{"restore", "sb-a1", "v1", "--disk-only"},
			request: "POST /v1/sandboxes/sb-a1/snapshots/v1/restore", body: `{"disk_only":true}`,
			stdout: "Restored sb-a1 to the disk of v1 (a fresh boot); it is running\n" +
				"Its state before is kept as auto-2: 'createos sandbox snapshot restore sb-a1 auto-2' undoes this\n"},
		{name: "restore -o json", args: []string{"restore", "sb-a1", "v2", "-o", "json"}, request: "POST /v1/sandboxes/sb-a1/snapshots/v2/restore",
			stdout: "{\n  \"snapshot_id\": \"v2\",\n  \"auto_id\": \"auto-2\",\n  \"state\": \"running\"\n}\n"},
		{name: "restore an incompatible snapshot", setup: func(f *fakeAPI) { f.incompatible = true }, args: []string{"restore", "sb-a1", "v1"}, code: 1,
			request: "POST /v1/sandboxes/sb-a1/snapshots/v1/restore",
			stderr:  "createos: snapshot_incompatible: this host's QEMU cannot restore the snapshot's memory; restore its disk only\n  differs: qemu_version\n"},
		{name: "restore an unknown snapshot", args: []string{"restore", "sb-a1", "v9"}, code: 1, request: "POST /v1/sandboxes/sb-a1/snapshots/v9/restore",
			stderr: "createos: snapshot_not_found: no snapshot of this sandbox has this id\n  snapshot_id: v9\n"},

		{name: "rm", args: []string{"rm", "sb-a1", "v1"}, request: "DELETE /v1/sandboxes/sb-a1/snapshots/v1", stdout: "Deleted snapshot v1 of sb-a1\n"},
		{name: "delete -o json", args: []string{"delete", "sb-a1", "v1", "-o", "json"}, request: "DELETE /v1/sandboxes/sb-a1/snapshots/v1", stdout: "{}\n"},
		{name: "rm an unknown snapshot", args: []string{"rm", "sb-a1", "v9"}, request: "DELETE /v1/sandboxes/sb-a1/snapshots/v9", code: 1,
			stderr: "createos: snapshot_not_found: no snapshot of this sandbox has this id\n  snapshot_id: v9\n"},

		{name: "pin", args: []string{"pin", "sb-a1", "v1"}, request: "POST /v1/sandboxes/sb-a1/snapshots/v1/pin", stdout: "Snapshot v1 of sb-a1 is pinned\n"},
		{name: "unpin", args: []string{"unpin", "sb-a1", "v2"}, request: "POST /v1/sandboxes/sb-a1/snapshots/v2/unpin", stdout: "Snapshot v2 of sb-a1 is not pinned\n"},
		{name: "pin -o json", args: []string{"pin", "sb-a1", "v3", "-o", "json"}, request: "POST /v1/sandboxes/sb-a1/snapshots/v3/pin",
			stdout: "{\n  \"id\": \"v3\",\n  \"sandbox\": \"sb-a1\",\n  \"comment\": \"tab\\there\",\n  \"memory\": false,\n  \"auto\": false,\n  \"pinned\": true,\n" +
				"  \"status\": \"processing\",\n  \"size_bytes\": 0,\n  \"created_at\": \"2026-11-05T09:59:30Z\"\n}\n"},
		{name: "pin in an unknown sandbox", args: []string{"pin", "sb-zz", "v1"}, request: "POST /v1/sandboxes/sb-zz/snapshots/v1/pin", code: 1,
			stderr: "createos: sandbox_not_found: no such sandbox\n  sandbox_id: sb-zz\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakeAPI(t)
			seedSnapshots(f)
			if tc.setup != nil {
				tc.setup(f)
			}
			out, errOut, code := runFake(t, f, append([]string{"sandbox", "snapshot"}, tc.args...)...)
			if code != tc.code || out != tc.stdout || errOut != tc.stderr {
				t.Errorf("exit %d, stdout\n%s\nstderr\n%s\nwant exit %d, stdout\n%s\nstderr\n%s", code, out, errOut, tc.code, tc.stdout, tc.stderr)
			}
			if n := len(f.log()); n != 1 {
				t.Errorf("%d requests, want 1: %q", n, f.log())
			}
			if req, body := f.lastRequest(); req != tc.request || body != tc.body {
				t.Errorf("sent %s %s, want %s %s", req, body, tc.request, tc.body)
			}
		})
	}
}

// TestSnapshotUsage: wrong arguments and flags are usage errors (exit 2)
// that reach no API. $CREATEOS_SANDBOX_ID is unset here, so a create, list
// or get that leaves SANDBOX out is one too.
func TestSnapshotUsage(t *testing.T) {
	f := startFakeAPI(t)
	seedSnapshots(f)
	for _, args := range [][]string{
		{"snapshot", "create"},
		{"snapshot", "create", "sb-a1", "v1"},
		{"snapshot", "create", "sb-a1", "--retention-max-count", "many"},
		{"snapshot", "list"},
		{"snapshot", "get", "sb-a1"},
		{"snapshot", "restore", "sb-a1"},
		{"snapshot", "rm", "sb-a1", "v1", "v2"},
		{"snapshot", "pin", "sb-a1"},
		{"snapshot", "unpin"},
		{"snapshot", "bogus", "sb-a1"},
		{"snapshot", "create", "sb-a1", "--memory"},
		{"fork", "sb-a1"},
		{"fork", "sb-a1", "v1", "a", "b"},
		{"fork", "sb-a1", "v1", "Web_2"},
		{"fork", "sb-a1", "v1", "--count", "x"},
	} {
		if _, errOut, code := runFake(t, f, append([]string{"sandbox"}, args...)...); code != 2 {
			t.Errorf("%q: exit %d, want 2: %s", args, code, errOut)
		}
	}
	if n := len(f.log()); n != 0 {
		t.Errorf("a usage error reached the API: %q", f.log())
	}
	if out := okFake(t, f, "sandbox", "snapshot"); !strings.Contains(out, "Available Commands:") || !strings.Contains(out, "unpin") {
		t.Errorf("snapshot alone printed %q, want its help", out)
	}
}

// TestSnapshotSandboxFromEnv: snapshot create, list and get take SANDBOX
// from $CREATEOS_SANDBOX_ID (or the credentials file) when it is left out,
// as the checkpoint commands do, and get tells one argument (the snapshot)
// from two as they do; with neither, a left-out SANDBOX is a usage error
// that reaches no API. restore, rm, pin, unpin and fork never default it.
func TestSnapshotSandboxFromEnv(t *testing.T) {
	const noSandbox = "createos: no sandbox: give SANDBOX or set CREATEOS_SANDBOX_ID ("
	tests := []struct {
		name    string
		env     string // $CREATEOS_SANDBOX_ID; "" for unset
		file    string // the credentials file's contents; "" for no file
		args    []string
		request string // the one request sent; "" for none
		body    string
		code    int
		stderr  string // what stderr starts with
	}{
		{name: "create", env: "sb-a1", args: []string{"snapshot", "create"},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{}`},
		{name: "create with flags", env: "sb-a1", args: []string{"snapshot", "create", "--disk-only", "--comment", "nightly"},
			request: "POST /v1/sandboxes/sb-a1/snapshots", body: `{"comment":"nightly","memory":false}`},
		{name: "create, SANDBOX given over the env", env: "sb-a1", args: []string{"snapshot", "create", "sb-a2"},
			request: "POST /v1/sandboxes/sb-a2/snapshots", body: `{}`},
		{name: "list", env: "sb-a1", args: []string{"snapshot", "list"}, request: "GET /v1/sandboxes/sb-a1/snapshots"},
		{name: "ls -o json", env: "sb-a2", args: []string{"snapshot", "ls", "-o", "json"}, request: "GET /v1/sandboxes/sb-a2/snapshots"},
		{name: "list, SANDBOX from the credentials file", file: "CREATEOS_SANDBOX_ID='sb-a1'\n", args: []string{"snapshot", "list"},
			request: "GET /v1/sandboxes/sb-a1/snapshots"},
		{name: "get, one argument is the snapshot", env: "sb-a1", args: []string{"snapshot", "get", "v2"},
			request: "GET /v1/sandboxes/sb-a1/snapshots/v2"},
		{name: "get, two are SANDBOX SNAPSHOT", env: "sb-a2", args: []string{"snapshot", "get", "sb-a1", "v1"},
			request: "GET /v1/sandboxes/sb-a1/snapshots/v1"},
		{name: "get of an unknown snapshot", env: "sb-a1", args: []string{"snapshot", "get", "v9"},
			request: "GET /v1/sandboxes/sb-a1/snapshots/v9", code: 1, stderr: "createos: snapshot_not_found: "},

		{name: "create, no env", args: []string{"snapshot", "create"}, code: 2, stderr: noSandbox},
		{name: "create with flags, no env", args: []string{"snapshot", "create", "--comment", "x"}, code: 2, stderr: noSandbox},
		{name: "list, no env", args: []string{"snapshot", "list"}, code: 2, stderr: noSandbox},
		{name: "get, no env", args: []string{"snapshot", "get", "v2"}, code: 2, stderr: noSandbox},
		{name: "get, no arguments", env: "sb-a1", args: []string{"snapshot", "get"}, code: 2,
			stderr: "createos: accepts between 1 and 2 arg(s), received 0\n"},
		{name: "get, three arguments", env: "sb-a1", args: []string{"snapshot", "get", "sb-a1", "v1", "v2"}, code: 2,
			stderr: "createos: accepts between 1 and 2 arg(s), received 3\n"},
		{name: "list, two arguments", env: "sb-a1", args: []string{"snapshot", "list", "sb-a1", "sb-a2"}, code: 2,
			stderr: "createos: accepts at most 1 arg(s), received 2\n"},

		{name: "restore needs SANDBOX", env: "sb-a1", args: []string{"snapshot", "restore", "v1"}, code: 2,
			stderr: "createos: accepts 2 arg(s), received 1\n"},
		{name: "rm needs SANDBOX", env: "sb-a1", args: []string{"snapshot", "rm", "v1"}, code: 2,
			stderr: "createos: accepts 2 arg(s), received 1\n"},
		{name: "pin needs SANDBOX", env: "sb-a1", args: []string{"snapshot", "pin", "v1"}, code: 2,
			stderr: "createos: accepts 2 arg(s), received 1\n"},
		{name: "unpin needs SANDBOX", env: "sb-a1", args: []string{"snapshot", "unpin", "v1"}, code: 2,
			stderr: "createos: accepts 2 arg(s), received 1\n"},
		{name: "fork needs SANDBOX", env: "sb-a1", args: []string{"fork", "v1"}, code: 2,
			stderr: "createos: accepts between 2 and 3 arg(s), received 1\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakeAPI(t)
			seedSnapshots(f)
			vars := map[string]string{}
			if tc.env != "" {
				vars[EnvSandboxID] = tc.env
			}
			if tc.file != "" {
				path := filepath.Join(t.TempDir(), "credentials.env")
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				vars[EnvCredentials] = path
			}
			_, errOut, code := runFakeEnv(t, f, vars, append([]string{"sandbox"}, tc.args...)...)
			if code != tc.code || !strings.HasPrefix(errOut, tc.stderr) || (tc.stderr == "") != (errOut == "") {
				t.Errorf("exit %d, stderr\n%s\nwant exit %d, stderr starting\n%s", code, errOut, tc.code, tc.stderr)
			}
			var want []string
			if tc.request != "" {
				want = []string{tc.request}
			}
			if got := f.log(); !slices.Equal(got, want) {
				t.Fatalf("sent %q, want %q", got, want)
			}
			if _, body := f.lastRequest(); body != tc.body {
				t.Errorf("sent body %s, want %s", body, tc.body)
			}
		})
	}
}

// TestSandboxFork: fork without --count is a create with from (and the
// name given), waited for as create is; with --count it is the fork route
// with count and name_prefix, every fork waited for and printed, and the
// command fails when any fork did not come to run.
func TestSandboxFork(t *testing.T) {
	pinClock(t, "2026-11-05T10:00:00Z")
	const header = "ID    NAME  STATE     MEMORY    VCPUS  DISK   AGE\n"
	tests := []struct {
		name     string
		args     []string // after "sandbox fork"
		requests []string
		body     string // of the first request
		code     int
		stdout   string
		stderr   string
	}{
		{name: "one, named", args: []string{"sb-a1", "v1", "web-2"},
			requests: []string{"POST /v1/sandboxes", "GET /v1/sandboxes/sb-3?wait_s=20"},
			body:     `{"name":"web-2","from":{"sandbox":"sb-a1","snapshot":"v1"}}`,
			stdout: "ID    NAME   STATE    MEMORY    VCPUS  DISK   AGE\n" +
				"sb-3  web-2  running  1024 MiB  2      8 GiB  0s\n"},
		{name: "one, no wait", args: []string{"sb-a1", "auto-1", "--no-wait"},
			requests: []string{"POST /v1/sandboxes"}, body: `{"from":{"sandbox":"sb-a1","snapshot":"auto-1"}}`,
			stdout: "ID    NAME  STATE     MEMORY    VCPUS  DISK   AGE\n" +
				"sb-3  -     creating  1024 MiB  2      8 GiB  0s\n"},
		{name: "one, -o json", args: []string{"sb-a1", "v1", "--no-wait", "-o", "json"},
			requests: []string{"POST /v1/sandboxes"}, body: `{"from":{"sandbox":"sb-a1","snapshot":"v1"}}`,
			stdout: "{\n  \"id\": \"sb-3\",\n  \"name\": \"\",\n  \"state\": \"creating\",\n  \"memory_mib\": 1024,\n  \"vcpus\": 2,\n  \"disk_gib\": 8,\n" +
				"  \"created_at\": \"2026-11-05T10:00:00.000Z\",\n  \"from\": {\n    \"sandbox\": \"sb-a1\",\n    \"snapshot\": \"v1\"\n  },\n  \"labels\": {}\n}\n"},
		{name: "one of a sandbox's name, with env and labels", args: []string{"sb-a1", "v1", "copy", "--env", "CI=1", "--label", "owner=docs", "--no-wait"},
			requests: []string{"POST /v1/sandboxes"}, body: `{"name":"copy","from":{"sandbox":"sb-a1","snapshot":"v1"},"env":{"CI":"1"},"labels":{"owner":"docs"}}`,
			stdout: "ID    NAME  STATE     MEMORY    VCPUS  DISK   AGE  LABELS\n" +
				"sb-3  copy  creating  1024 MiB  2      8 GiB  0s   owner=docs\n"},
		{name: "one of a ref alone", args: []string{"-", "sn-0123456789abcdefghijklmn", "--no-wait"},
			requests: []string{"POST /v1/sandboxes"}, body: `{"from":{"snapshot":"sn-0123456789abcdefghijklmn"}}`, code: 1,
			stderr: "createos: snapshot_not_found: no snapshot of this sandbox has this id\n  snapshot_id: sn-0123456789abcdefghijklmn\n"},
		{name: "one that fails to boot", args: []string{"sb-a1", "v1", "broken"},
			requests: []string{"POST /v1/sandboxes", "GET /v1/sandboxes/sb-3?wait_s=20"}, body: `{"name":"broken","from":{"sandbox":"sb-a1","snapshot":"v1"}}`, code: 1,
			stderr: "createos: sandbox sb-3 went to state error: the guest did not answer within 120 s of boot\n"},
		{name: "one of an unknown snapshot", args: []string{"sb-a1", "v9"},
			requests: []string{"POST /v1/sandboxes"}, body: `{"from":{"sandbox":"sb-a1","snapshot":"v9"}}`, code: 1,
			stderr: "createos: snapshot_not_found: no snapshot of this sandbox has this id\n  snapshot_id: v9\n"},

		{name: "many", args: []string{"sb-a1", "v1", "w", "--count", "3"},
			requests: []string{"POST /v1/sandboxes/sb-a1/snapshots/v1/fork", "GET /v1/sandboxes/sb-3?wait_s=20", "GET /v1/sandboxes/sb-4?wait_s=20", "GET /v1/sandboxes/sb-5?wait_s=20"},
			body:     `{"count":3,"name_prefix":"w"}`,
			stdout: "ID    NAME  STATE    MEMORY    VCPUS  DISK   AGE\n" +
				"sb-3  w-1   running  1024 MiB  2      8 GiB  0s\n" +
				"sb-4  w-2   running  1024 MiB  2      8 GiB  0s\n" +
				"sb-5  w-3   running  1024 MiB  2      8 GiB  0s\n"},
		{name: "--count 1 is the fork route", args: []string{"sb-a1", "v2", "--count", "1", "--no-wait"},
			requests: []string{"POST /v1/sandboxes/sb-a1/snapshots/v2/fork"}, body: `{"count":1}`,
			stdout: header + "sb-3  -     creating  1024 MiB  2      8 GiB  0s\n"},
		{name: "many, -o json", args: []string{"sb-a1", "v1", "--count", "2", "-o", "json"},
			requests: []string{"POST /v1/sandboxes/sb-a1/snapshots/v1/fork", "GET /v1/sandboxes/sb-3?wait_s=20", "GET /v1/sandboxes/sb-4?wait_s=20"},
			body:     `{"count":2}`,
			stdout: `{
  "sandboxes": [
    {
      "id": "sb-3",
      "name": "",
      "state": "running",
      "memory_mib": 1024,
      "vcpus": 2,
      "disk_gib": 8,
      "created_at": "2026-11-05T10:00:00.000Z",
      "from": {
        "sandbox": "sb-a1",
        "snapshot": "v1"
      },
      "labels": {}
    },
    {
      "id": "sb-4",
      "name": "",
      "state": "running",
      "memory_mib": 1024,
      "vcpus": 2,
      "disk_gib": 8,
      "created_at": "2026-11-05T10:00:00.000Z",
      "from": {
        "sandbox": "sb-a1",
        "snapshot": "v1"
      },
      "labels": {}
    }
  ]
}
`},
		{name: "many, no wait, -o json", args: []string{"sb-a1", "v2", "--count", "1", "--no-wait", "-o", "json"},
			requests: []string{"POST /v1/sandboxes/sb-a1/snapshots/v2/fork"}, body: `{"count":1}`,
			stdout: "{\n  \"sandboxes\": [\n    {\n      \"id\": \"sb-3\",\n      \"name\": \"\",\n      \"state\": \"creating\",\n" +
				"      \"memory_mib\": 1024,\n      \"vcpus\": 2,\n      \"disk_gib\": 8,\n      \"created_at\": \"2026-11-05T10:00:00.000Z\",\n" +
				"      \"from\": {\n        \"sandbox\": \"sb-a1\",\n        \"snapshot\": \"v2\"\n      },\n      \"labels\": {}\n    }\n  ]\n}\n"},
		{name: "many that fail", args: []string{"sb-a1", "v1", "broken", "--count", "2"},
			requests: []string{"POST /v1/sandboxes/sb-a1/snapshots/v1/fork", "GET /v1/sandboxes/sb-3?wait_s=20", "GET /v1/sandboxes/sb-4?wait_s=20"},
			body:     `{"count":2,"name_prefix":"broken"}`, code: 1,
			stdout: "ID    NAME      STATE  MEMORY    VCPUS  DISK   AGE\n" +
				"sb-3  broken-1  error  1024 MiB  2      8 GiB  0s\n" +
				"sb-4  broken-2  error  1024 MiB  2      8 GiB  0s\n",
			stderr: "createos: sandbox sb-3 went to state error: the guest did not answer within 120 s of boot\n" +
				"createos: sandbox sb-4 went to state error: the guest did not answer within 120 s of boot\n" +
				"createos: 2 of 2 forks did not come to run\n"},
		{name: "too many", args: []string{"sb-a1", "v1", "--count", "101"},
			requests: []string{"POST /v1/sandboxes/sb-a1/snapshots/v1/fork"}, body: `{"count":101}`, code: 1,
			stderr: "createos: invalid_field: count must be 1 to 100\n  field: count\n"},
		{name: "many of an unknown snapshot", args: []string{"sb-a1", "v9", "--count", "2"},
			requests: []string{"POST /v1/sandboxes/sb-a1/snapshots/v9/fork"}, body: `{"count":2}`, code: 1,
			stderr: "createos: snapshot_not_found: no snapshot of this sandbox has this id\n  snapshot_id: v9\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakeAPI(t)
			f.polls = 0
			seedSnapshots(f)
			out, errOut, code := runFake(t, f, append([]string{"sandbox", "fork"}, tc.args...)...)
			if code != tc.code || out != tc.stdout || errOut != tc.stderr {
				t.Errorf("exit %d, stdout\n%s\nstderr\n%s\nwant exit %d, stdout\n%s\nstderr\n%s", code, out, errOut, tc.code, tc.stdout, tc.stderr)
			}
			if got := f.log(); strings.Join(got, "\n") != strings.Join(tc.requests, "\n") {
				t.Errorf("requests\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.requests, "\n"))
			}
			if body := f.lastBody(tc.requests[0]); body != tc.body {
				t.Errorf("sent %s, want %s", body, tc.body)
			}
		})
	}
}

// TestForkWaitTimeout: --wait-timeout bounds the wait for a whole batch,
// and a fork still on its way when it passes fails the command, after
// every fork is printed.
func TestForkWaitTimeout(t *testing.T) {
	f := startFakeAPI(t)
	f.polls = 1000
	seedSnapshots(f)
	out, errOut, code := runFake(t, f, "sandbox", "fork", "sb-a1", "v1", "--count", "2", "--wait-timeout", "500ms")
	if code != 1 || strings.Count(out, "creating") != 2 ||
		!strings.Contains(errOut, "sandbox sb-3 is still creating, not running, after 500ms") ||
		!strings.Contains(errOut, "sandbox sb-4 is still") || !strings.Contains(errOut, "2 of 2 forks did not come to run") {
		t.Errorf("exit %d, stdout\n%s\nstderr\n%s", code, out, errOut)
	}
}

// TestHumanSize: SIZE in binary units with one decimal, never "1024.0".
func TestHumanSize(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 1048575: "1.0 MiB", 79_901_491: "76.2 MiB",
		1_288_490_189: "1.2 GiB", 5 << 40: "5.0 TiB", 1<<63 - 1: "8.0 EiB", -1: "-",
	} {
		if got := humanSize(n); got != want {
			t.Errorf("humanSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestSnapshotCompletion: get, restore, fork and the others complete
// snapshot ids of the sandbox given, newest first, with kind and comment;
// get, whose SANDBOX may be left out, completes those of
// $CREATEOS_SANDBOX_ID as its first argument, and the others do not.
func TestSnapshotCompletion(t *testing.T) {
	f := startFakeAPI(t)
	seedSnapshots(f)
	const want = "v3\tdisk \"tab\\there\"\nauto-1\tmemory before restoring v1\nv2\tdisk\nv1\tmemory before the upgrade\n"
	for _, cmd := range [][]string{{"snapshot", "get"}, {"snapshot", "restore"}, {"snapshot", "rm"}, {"snapshot", "pin"}, {"fork"}} {
		args := append(append([]string{"__complete", "sandbox"}, cmd...), "sb-a1", "")
		out := okFake(t, f, args...)
		if !strings.HasPrefix(out, want) {
			t.Errorf("%q completed\n%s\nwant\n%s", cmd, out, want)
		}
	}
	env := map[string]string{EnvSandboxID: "sb-a1"}
	for _, tc := range []struct {
		cmd  []string
		want string
	}{
		{[]string{"snapshot", "get"}, want},
		{[]string{"snapshot", "restore"}, ""},
		{[]string{"fork"}, ""},
	} {
		args := append(append([]string{"__complete", "sandbox"}, tc.cmd...), "")
		out, errOut, code := runFakeEnv(t, f, env, args...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errOut)
		}
		if ids, _, _ := strings.Cut(out, ":"); ids != tc.want {
			t.Errorf("%q with %s set completed\n%s\nwant\n%s", tc.cmd, EnvSandboxID, out, tc.want)
		}
	}
	var list []Snapshot
	if err := json.Unmarshal([]byte(okFake(t, f, "sandbox", "snapshot", "list", "sb-a1", "-o", "json")), &list); err != nil || len(list) != 4 {
		t.Errorf("list -o json: %v %+v", err, list)
	}
}

// TestForkAnsweredInError: each fork of a batch is made or refused on its
// own; a fork refused (in "failed") or answered in state error is named
// with its reason on stderr, every fork made is printed, and createos
// exits 1, also with --no-wait. With -o json the answer keeps "failed".
func TestForkAnsweredInError(t *testing.T) {
	answer := map[string]any{
		"sandboxes": []Sandbox{
			{ID: "sb-7", Name: "w-1", State: "running", MemoryMiB: 512, VCPUs: 1, DiskGiB: 4},
			{ID: "sb-8", Name: "w-2", State: "error", Error: "the guest did not answer within 120 s of boot", MemoryMiB: 512, VCPUs: 1, DiskGiB: 4},
		},
		"failed": []ForkRefusal{{Code: "host_capacity", Message: "the host cannot fit this sandbox now"}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": answer})
	}))
	defer srv.Close()
	wantErr := "createos: a fork was not made: host_capacity: the host cannot fit this sandbox now\n" +
		"createos: sandbox sb-8 is in state error: the guest did not answer within 120 s of boot\n" +
		"createos: 2 of 3 forks did not come to run\n"
	out, errOut, code := runFake(t, &fakeAPI{url: srv.URL}, "sandbox", "fork", "sb-a1", "v1", "w", "--count", "3")
	want := "ID    NAME  STATE    MEMORY   VCPUS  DISK   AGE\n" +
		"sb-7  w-1   running  512 MiB  1      4 GiB  -\n" +
		"sb-8  w-2   error    512 MiB  1      4 GiB  -\n"
	if code != 1 || out != want || errOut != wantErr {
		t.Errorf("exit %d, stdout\n%s\nstderr\n%s", code, out, errOut)
	}
	for _, noWait := range []string{"--no-wait=false", "--no-wait"} {
		out, errOut, code = runFake(t, &fakeAPI{url: srv.URL}, "sandbox", "fork", "sb-a1", "v1", "--count", "3", "-o", "json", noWait)
		var got struct {
			Sandboxes []Sandbox
			Failed    []ForkRefusal
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil || code != 1 || errOut != wantErr || len(got.Sandboxes) != 2 || len(got.Failed) != 1 {
			t.Errorf("-o json %s: exit %d (%v), stdout\n%s\nstderr\n%s", noWait, code, err, out, errOut)
		}
	}
}
