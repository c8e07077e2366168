package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"strata/hostproxy"
	"strata/sandbox"
	"strata/vmm"
)

// counterLine starts a process that counts in memory (/dev/shm, a tmpfs:
// only a memory snapshot keeps it), ten times a second, in a session of
// its own so that the exec that starts it does not end it.
const counterLine = `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /dev/shm/counter; sleep 0.1; done' </dev/null >/dev/null 2>&1 &`

// counter reads the counter of a sandbox; -1 when there is none.
func (s *vmStack) counter(id string) int {
	s.t.Helper()
	res := s.exec(id, "cat", "/dev/shm/counter")
	// The counter rewrites its file (truncate, then write): a read in
	// between finds it empty.
	for i := 0; res.ExitCode == 0 && strings.TrimSpace(res.Stdout) == "" && i < 20; i++ {
		time.Sleep(20 * time.Millisecond)
		res = s.exec(id, "cat", "/dev/shm/counter")
	}
	if res.ExitCode != 0 {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if err != nil {
		s.t.Fatalf("counter of %s: %q", id, res.Stdout)
	}
	return n
}

// counting checks that a sandbox's counter runs: it grows within a few
// seconds. It returns the first value read.
func (s *vmStack) counting(id string) int {
	s.t.Helper()
	first := s.counter(id)
	for wait := time.Now().Add(5 * time.Second); first < 0 && time.Now().Before(wait); first = s.counter(id) {
		time.Sleep(100 * time.Millisecond)
	}
	if first < 0 {
		res := s.exec(id, "sh", "-c", "ls -la /dev/shm; command -v setsid; ps -ef")
		s.t.Fatalf("%s has no counter: %+v", id, res)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.counter(id) <= first {
		if time.Now().After(deadline) {
			s.t.Fatalf("the counter of %s stays at %d", id, first)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return first
}

// checkStore stops hostproxy, compares the host's store with the records
// its registry keeps (no orphan, nothing missing, no snapshot still
// processing), and starts it again.
func (s *vmStack) checkStore() {
	s.t.Helper()
	s.whileStopped(func(recs []sandbox.Record) {
		rep, err := sandbox.CheckStore(sandbox.StoreDir(s.machines), recs)
		if err != nil {
			s.t.Fatal(err)
		}
		if !rep.Clean() {
			s.t.Fatalf("the host's store does not match the records: %+v", rep)
		}
		s.t.Logf("store: %d files, clean", rep.Files)
	})
}

// whileStopped stops hostproxy, calls fn with the records its registry
// keeps, and starts it again.
func (s *vmStack) whileStopped(fn func([]sandbox.Record)) {
	s.t.Helper()
	s.stop()
	defer s.start()
	reg, err := hostproxy.OpenRegistry(context.Background(), s.data)
	if err != nil {
		s.t.Fatal(err)
	}
	defer reg.Close()
	recs, err := reg.List(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	fn(recs)
}

// TestVMSnapshots drives VM snapshots through the public API: a memory
// snapshot keeps a running process, its restore brings back that moment
// (processes, files and the guest's directory checkpoints) and keeps the
// moment before as auto-1, which restores too; a disk-only restore boots
// fresh; forks run the source's processes, are isolated from it and from
// each other, and outlive the source and the snapshot; pause frees the
// host's memory and resume brings the processes back.
func TestVMSnapshots(t *testing.T) {
	s := startVMStack(t, "60s")
	id := s.create(s.key, `{"name":"snap"}`)
	snaps := "/v1/sandboxes/" + id + "/snapshots"
	cps := "/v1/sandboxes/" + id + "/checkpoints"

	s.sh(id, counterLine)
	s.counting(id)
	s.sh(id, "mkdir -p /workspace/p && echo one > /workspace/p/f")
	cp1 := s.must(200, "POST", cps, `{"path":"/workspace/p","name":"one"}`).data()["id"].(string)

	// A memory snapshot: the sandbox runs on, the counter too.
	t0 := time.Now()
	v1 := s.must(200, "POST", snaps, `{"comment":"counter running","name":"counter-on"}`).data()
	t.Logf("memory snapshot: %v", time.Since(t0))
	if v1["id"] != "v1" || v1["name"] != "counter-on" || v1["memory"] != true || v1["auto"] != false || v1["status"] != "ready" || v1["comment"] != "counter running" || v1["size_bytes"].(float64) <= 0 || v1["sandbox"] != id {
		t.Fatalf("snapshot record: %v", v1)
	}
	atSnapshot := s.counting(id)
	// Its name is taken, and stands for its id.
	if r := s.call(s.key, "POST", snaps, `{"name":"counter-on","memory":false}`); r.Status != 409 || r.code() != "name_taken" {
		t.Fatalf("a second snapshot named counter-on: %d %s", r.Status, r.Raw)
	}
	if got := s.must(200, "GET", snaps+"/counter-on", "").data(); got["id"] != "v1" {
		t.Fatalf("GET by name: %v", got)
	}
	if st := s.must(200, "GET", "/v1/sandboxes/"+id, "").data()["state"]; st != "running" {
		t.Fatalf("state after a snapshot: %v", st)
	}

	// Later: a new file and a second directory checkpoint.
	s.sh(id, "echo two > /workspace/p/after")
	cp2 := s.must(200, "POST", cps, `{"path":"/workspace/p","name":"two"}`).data()["id"].(string)
	time.Sleep(2 * time.Second)
	beforeRestore := s.counter(id)

	// Restore v1: the counter runs again from about the snapshot's
	// value, the later file and checkpoint are gone.
	t0 = time.Now()
	res := s.must(200, "POST", snaps+"/counter-on/restore", "").data()
	t.Logf("memory restore: %v", time.Since(t0))
	if res["snapshot_id"] != "v1" || res["auto_id"] != "auto-1" || res["state"] != "running" {
		t.Fatalf("restore: %v", res)
	}
	back := s.counting(id)
	if back >= beforeRestore || back < atSnapshot-50 {
		t.Fatalf("counter after the restore: %d; at the snapshot about %d, before the restore %d", back, atSnapshot, beforeRestore)
	}
	if r := s.exec(id, "test", "-e", "/workspace/p/after"); r.ExitCode == 0 {
		t.Fatal("a file written after the snapshot is there after its restore")
	}
	list := s.must(200, "GET", cps, "").Body["data"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["id"] != cp1 {
		t.Fatalf("directory checkpoints after the restore: %v, want only %s", list, cp1)
	}
	s.sh(id, "echo scratch > /workspace/p/f")
	s.must(200, "POST", cps+"/"+cp1+"/restore", "")
	if out := s.sh(id, "cat /workspace/p/f"); out != "one\n" {
		t.Fatalf("directory restore after the VM restore: %q", out)
	}

	// auto-1 is the moment before the restore: the file, the second
	// checkpoint and the counter's value are back.
	auto := s.waitSnapshot(snaps + "/auto-1")
	if auto["auto"] != true || auto["memory"] != true || auto["status"] != "ready" {
		t.Fatalf("auto-1: %v", auto)
	}
	s.must(200, "POST", snaps+"/auto-1/restore", "")
	if out := s.sh(id, "cat /workspace/p/after"); out != "two\n" {
		t.Fatalf("after restoring auto-1: %q", out)
	}
	if n := s.counting(id); n < beforeRestore {
		t.Fatalf("counter after restoring auto-1: %d, want at least %d", n, beforeRestore)
	}
	ids := map[string]bool{}
	for _, c := range s.must(200, "GET", cps, "").Body["data"].([]any) {
		ids[c.(map[string]any)["id"].(string)] = true
	}
	if !ids[cp1] || !ids[cp2] {
		t.Fatalf("directory checkpoints after restoring auto-1: %v", ids)
	}

	// A disk-only snapshot restores as a fresh boot: files, no counter.
	v2 := s.must(200, "POST", snaps, `{"memory":false}`).data()
	if v2["id"] != "v2" || v2["memory"] != false || v2["status"] != "ready" {
		t.Fatalf("disk-only snapshot: %v", v2)
	}
	t0 = time.Now()
	s.must(200, "POST", snaps+"/v2/restore", "")
	t.Logf("disk-only restore (a cold boot): %v", time.Since(t0))
	if n := s.counter(id); n != -1 {
		t.Fatalf("a counter runs after a disk-only restore: %d", n)
	}
	if out := s.sh(id, "cat /workspace/p/after"); out != "two\n" {
		t.Fatalf("files after a disk-only restore: %q", out)
	}
	list = s.must(200, "GET", snaps, "").Body["data"].([]any)
	var got []string
	for _, v := range list {
		got = append(got, v.(map[string]any)["id"].(string))
	}
	if strings.Join(got, ",") != "v1,auto-1,auto-2,v2,auto-3" {
		t.Fatalf("snapshots: %v", got)
	}

	// Forks of a memory snapshot: the counter runs in each; writes stay
	// in their own sandbox; they outlive the source and the snapshot.
	s.sh(id, counterLine)
	s.counting(id)
	s.must(200, "POST", snaps, `{"comment":"for forks","name":"for-forks"}`)
	// A fork takes its own access setting, never its source's.
	s.must(200, "PUT", "/v1/sandboxes/"+id+"/access", `{"scopes":["checkpoints","snapshots","files"]}`)
	t0 = time.Now()
	f1 := s.call(s.key, "POST", "/v1/sandboxes", `{"name":"fork-one","from":{"sandbox":"`+id+`","snapshot":"for-forks"}}`)
	if f1.Status != 202 || f1.data()["from"] == nil || f1.data()["from"].(map[string]any)["snapshot"] != "v3" {
		t.Fatalf("fork: %d %s", f1.Status, f1.Raw)
	}
	fork1 := f1.data()["id"].(string)
	s.waitState(s.key, fork1, "running", 2*time.Minute)
	t.Logf("fork to running: %v", time.Since(t0))
	many := s.call(s.key, "POST", snaps+"/v3/fork", `{"count":2,"name_prefix":"many","access":"none"}`)
	if many.Status != 202 {
		t.Fatalf("fork count 2: %d %s", many.Status, many.Raw)
	}
	var forks []string
	for _, f := range many.data()["sandboxes"].([]any) {
		forks = append(forks, f.(map[string]any)["id"].(string))
	}
	if len(forks) != 2 {
		t.Fatalf("fork count 2 made %v", forks)
	}
	accessOf := func(sb string) string {
		return fmt.Sprint(s.must(200, "GET", "/v1/sandboxes/"+sb, "").data()["access"])
	}
	if got := accessOf(fork1); got != "map[scopes:[checkpoints snapshots]]" {
		t.Fatalf("a fork without access: %s, want the default", got)
	}
	for _, f := range forks {
		if got := accessOf(f); got != "none" {
			t.Fatalf("a fork with access none: %s", got)
		}
	}
	forks = append(forks, fork1)
	for _, f := range forks {
		s.waitState(s.key, f, "running", 2*time.Minute)
		s.counting(f)
		if out := s.sh(f, "hostname"); strings.TrimSpace(out) == "snap" {
			t.Fatalf("fork %s kept the source's hostname", f)
		}
		s.sh(f, "echo "+f+" > /workspace/p/mine")
	}
	for _, sb := range append([]string{id}, forks...) {
		out := s.exec(sb, "cat", "/workspace/p/mine")
		if sb == id && out.ExitCode == 0 || sb != id && out.Stdout != sb+"\n" {
			t.Fatalf("%s sees /workspace/p/mine as %q", sb, out.Stdout)
		}
	}
	// Each fork has its own channel key (the source's, which its memory
	// held, was replaced at its resync), which acts on the fork from
	// inside it; the source's key opens nothing there.
	keyOf := func(sb string) string {
		return strings.TrimSpace(s.sh(sb, ". /run/strata/credentials.env; echo $CREATEOS_API_KEY"))
	}
	srcKey, forkKey := keyOf(id), keyOf(fork1)
	if !strings.HasPrefix(srcKey, "sbc_") || !strings.HasPrefix(forkKey, "sbc_") || srcKey == forkKey {
		t.Fatalf("channel keys of the source %q and of a fork %q", srcKey, forkKey)
	}
	for key, want := range map[string]string{forkKey: "200", srcKey: "401"} {
		line := `curl -sS -o /dev/null -w '%{http_code}' -H 'X-Api-Key: ` + key + `' "$CREATEOS_API_URL/v1/sandboxes/` + fork1 + `/checkpoints"`
		if out := s.sh(fork1, ". /run/strata/credentials.env; "+line); out != want {
			t.Fatalf("a channel key (the fork's: %v) from inside the fork: %q, want %s", key == forkKey, out, want)
		}
	}
	// A token of the source, as the fork's memory holds it, does not act
	// on the source from inside the fork.
	tok := s.must(200, "POST", "/v1/sandboxes/"+id+"/access-token", "").data()["token"].(string)
	line := `curl -sS -o /dev/null -w '%{http_code}' -H 'X-Api-Key: ` + tok + `' "$CREATEOS_API_URL/v1/sandboxes/` + id + `/checkpoints"`
	if out := s.sh(fork1, ". /run/strata/credentials.env; "+line); out != "403" {
		t.Fatalf("the source's token from inside a fork: %q, want 403", out)
	}
	// A fork of access none was handed no key, and nothing from inside it
	// opens the API: not the source's channel key its memory held, not
	// the source's token, not the account key.
	none := forks[0]
	if out := s.sh(none, "grep -c CREATEOS_API_KEY /run/strata/credentials.env || true"); strings.TrimSpace(out) != "0" {
		t.Fatalf("a fork of access none has a key: %q", out)
	}
	for _, key := range []string{srcKey, tok, s.key} {
		line := `curl -sS -o /dev/null -w '%{http_code}' -H 'X-Api-Key: ` + key + `' "$CREATEOS_API_URL/v1/sandboxes/` + none + `/checkpoints"`
		if out := s.sh(none, ". /run/strata/credentials.env; "+line); out != "401" {
			t.Fatalf("from inside a fork of access none: %q, want 401", out)
		}
	}

	// The forks map the snapshot's own state privately, read-only,
	// from its RAM's pages (no RAM file is written for them); a fork's
	// own memory snapshot is a whole one, and restores.
	for _, f := range forks {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.qemuPid(f)))
		if l := string(cmdline); !strings.Contains(l, "memory-backend-file,id=microvm.ram") || !strings.Contains(l, ".state,offset=") || !strings.Contains(l, "share=off,readonly=on") {
			t.Fatalf("fork %s does not map its snapshot's state: %q", f, strings.ReplaceAll(l, "\x00", " "))
		}
	}
	fs := "/v1/sandboxes/" + fork1 + "/snapshots"
	s.must(200, "POST", fs, "")
	s.sh(fork1, "echo later > /workspace/p/later")
	s.must(200, "POST", fs+"/v1/restore", "")
	s.counting(fork1)
	if r := s.exec(fork1, "test", "-e", "/workspace/p/later"); r.ExitCode == 0 {
		t.Fatal("a fork's restore kept a file written after its snapshot")
	}

	// A token may create, list and read its own sandbox's snapshots, and
	// nothing more: not retention (it deletes), delete, restore, pin or
	// fork, and nothing of another sandbox.
	ftok := s.must(200, "POST", "/v1/sandboxes/"+fork1+"/access-token", "").data()["token"].(string)
	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{"POST", fs, `{"memory":false,"comment":"by the token"}`, 200},
		{"GET", fs, "", 200},
		{"GET", fs + "/v2", "", 200},
		{"POST", fs, `{"memory":false,"retention":{"mode":"delete_oldest","max_count":1}}`, 403},
		{"DELETE", fs + "/v2", "", 403},
		{"POST", fs + "/v2/restore", "", 403},
		{"POST", fs + "/v2/pin", "", 403},
		{"POST", fs + "/v2/fork", `{"count":1}`, 403},
		{"GET", "/v1/sandboxes/" + forks[0] + "/snapshots", "", 403},
		{"GET", fs + "/v9", "", 404},
	} {
		if r := s.call(ftok, c.method, c.path, c.body); r.Status != c.status {
			t.Fatalf("token: %s %s: %d %s, want %d", c.method, c.path, r.Status, r.Raw, c.status)
		}
	}

	s.must(200, "DELETE", snaps+"/v3", "")
	if r := s.call(s.key, "GET", snaps+"/v3", ""); r.Status != 404 || r.code() != "snapshot_not_found" {
		t.Fatalf("get of a deleted snapshot: %d %s", r.Status, r.Raw)
	}
	s.must(200, "DELETE", "/v1/sandboxes/"+id, "")
	for _, f := range forks {
		s.counting(f)
		if out := s.sh(f, "cat /workspace/p/mine /workspace/p/after"); out != f+"\ntwo\n" {
			t.Fatalf("fork %s after its source's delete: %q", f, out)
		}
	}

	// Pause frees the host's memory (QEMU ends); resume brings the
	// counter back where it was.
	f := forks[0]
	s.call(s.key, "POST", "/v1/sandboxes/"+f+"/pause", "")
	s.waitState(s.key, f, "paused", time.Minute)
	if pid := s.findQEMU(f); pid != 0 {
		t.Fatalf("a paused sandbox's QEMU still runs (pid %d)", pid)
	}
	if r := s.call(s.key, "GET", "/v1/sandboxes/"+f+"/snapshots", ""); r.Status != 200 {
		t.Fatalf("snapshots of a paused sandbox: %d %s", r.Status, r.Raw)
	}
	if st := s.must(200, "GET", "/v1/sandboxes/"+f, "").data()["state"]; st != "paused" {
		t.Fatalf("listing snapshots woke a paused sandbox: %v", st)
	}
	// Its state made a template in the background: the resume maps the
	// state's RAM and loads the devices alone.
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(s.plog.String(), `msg="pause template made" daemon=hostproxy sandbox=`+f); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no pause template for %s 2 minutes after its pause", f)
		}
	}
	s.call(s.key, "POST", "/v1/sandboxes/"+f+"/resume", "")
	s.waitState(s.key, f, "running", time.Minute)
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.findQEMU(f))); !bytes.Contains(cmdline, []byte(",offset=")) || !bytes.Contains(cmdline, []byte("readonly=on")) {
		t.Fatalf("the resumed QEMU does not map the paused state: %q", cmdline)
	}
	s.counting(f)

	// Every disk-only snapshot synced the guest first.
	if log := s.plog.String(); strings.Contains(log, "guest not synced") || strings.Contains(log, "not resynced") {
		t.Fatal("a guest was not synced before a disk-only snapshot, or not resynced after a load (hostproxy's log)")
	}
	s.checkStore()
}

// TestVMSnapshotFaults kills hostproxy right after each step of a
// snapshot (memory and disk-only), a restore, a fork and a pause. After
// each restart: no sandbox is lost and each runs its processes on, no
// snapshot is left processing (an interrupted one is failed, never
// ready, unless it is a restore's automatic one: the state the restore
// replaced is kept, disk-only when its memory was not written, and
// restores), and the host's store holds exactly what the records name.
func TestVMSnapshotFaults(t *testing.T) {
	s := startVMStack(t, "60s")
	id := s.create(s.key, `{"name":"faults"}`)
	snaps := "/v1/sandboxes/" + id + "/snapshots"
	s.sh(id, counterLine)
	s.counting(id)
	s.must(200, "POST", snaps, `{"comment":"base"}`)

	type op struct {
		name, method, path, body string
		points                   []string
		answered                 int  // what it answers before the kill: 202, or 200 for work after the answer
		paused                   bool // the sandbox is paused once it is done
	}
	ops := []op{
		{"memory snapshot", "POST", snaps, `{}`, []string{sandbox.FailpointSnapshotRecorded, vmm.FailpointSwitchover, sandbox.FailpointSnapshotSaved}, 202, false},
		// The snapshot's template, made after the snapshot answered.
		{"template made ahead", "POST", snaps, `{}`, []string{sandbox.FailpointTemplateFilled, sandbox.FailpointTemplateShared}, 200, false},
		{"disk-only snapshot", "POST", snaps, `{"memory":false}`, []string{sandbox.FailpointSnapshotRecorded, sandbox.FailpointSnapshotSaved}, 202, false},
		// The last point is the background write of auto-N's memory,
		// done but not recorded.
		{"restore", "POST", snaps + "/v1/restore", "", []string{sandbox.FailpointRestoreAuto, sandbox.FailpointRestoreRecorded, sandbox.FailpointRestoreEnded, sandbox.FailpointBootLoaded, sandbox.FailpointRestoreAutoSaving, sandbox.FailpointSnapshotSaved}, 200, false},
		{"fork", "POST", "/v1/sandboxes", `{"from":{"sandbox":"` + id + `","snapshot":"v1"}}`, []string{sandbox.FailpointForkRecorded, sandbox.FailpointBootLoaded}, 202, false},
		{"pause", "POST", "/v1/sandboxes/" + id + "/pause", "", []string{sandbox.FailpointPauseSaved}, 202, false},
		// The paused state's template, made after the pause.
		{"pause template", "POST", "/v1/sandboxes/" + id + "/pause", "", []string{sandbox.FailpointPauseTemplateFilled}, 202, true},
	}
	for _, o := range ops {
		for _, point := range o.points {
			t.Logf("%s, killed at %s", o.name, point)
			before := map[string]bool{}
			for _, sb := range s.sandboxes("acct-a") {
				before[sb] = true
			}
			if o.name == "restore" {
				// What the restore replaces, on the guest's disk: after
				// the kill it is either still the sandbox's or in auto-N.
				s.sh(id, "echo "+point+" > /workspace/marker; sync")
			}
			s.stop()
			s.env = []string{"STRATA_FAILPOINTS=" + point}
			s.start()
			r, err := s.send(s.key, o.method, o.path, o.body, nil)
			if err == nil && r.Status != o.answered {
				t.Fatalf("%s: answered %d %s although hostproxy was to die at %s", o.name, r.Status, r.Raw, point)
			}
			// A 202 comes before the background work dies: wait for
			// the kill.
			deadline := time.Now().Add(time.Minute)
			for s.alive() && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if s.alive() {
				t.Fatalf("%s: hostproxy did not reach %s", o.name, point)
			}
			s.stop()
			s.env = nil
			s.start()
			if o.paused {
				// Paused before the kill, paused after: its template was
				// dropped, and the resume loads the whole state.
				if st := s.waitSettled(id); st != "paused" {
					t.Fatalf("%s killed at %s: sandbox %s is %s", o.name, point, id, st)
				}
				s.checkStore()
				s.call(s.key, "POST", "/v1/sandboxes/"+id+"/resume", "")
				s.waitState(s.key, id, "running", time.Minute)
			}
			for _, sb := range s.sandboxes("acct-a") {
				// Running, whatever was cut: a save the crash interrupted
				// lets its guest run on, an interrupted pause too.
				st := s.waitSettled(sb)
				if st != "running" {
					t.Fatalf("%s killed at %s: sandbox %s is %s", o.name, point, sb, st)
				}
				if sb == id || !before[sb] {
					s.counting(sb)
				}
				// The guest's file system is whole: no memory was loaded
				// over a disk that had moved on.
				if out := s.sh(sb, `sync; echo x > /workspace/probe && cat /workspace/probe; dmesg | grep -ciE 'corrupt|metadata i/o error|shutting down filesystem' || true`); out != "x\n0\n" {
					t.Fatalf("%s killed at %s: the file system of %s: %q", o.name, point, sb, out)
				}
				for _, sn := range s.must(200, "GET", "/v1/sandboxes/"+sb+"/snapshots", "").Body["data"].([]any) {
					if st := sn.(map[string]any)["status"]; st == "processing" {
						t.Fatalf("%s killed at %s: snapshot %v of %s still processing", o.name, point, sn, sb)
					}
				}
			}
			if !slices.Contains(s.sandboxes("acct-a"), id) {
				t.Fatalf("%s killed at %s: the sandbox is gone", o.name, point)
			}
			if o.name == "restore" {
				s.undoKeeps(id, point)
			}
			if left, _ := filepath.Glob(filepath.Join(s.machines, "*+template")); len(left) > 0 {
				t.Fatalf("%s killed at %s: template directories left: %v", o.name, point, left)
			}
			s.checkStore()
		}
	}
}

// undoKeeps checks, after a restore killed at point, that the state it
// replaced (the marker point on the guest's disk) is not lost: either the
// restore never replaced it (the sandbox still has it) or the newest
// automatic snapshot is ready, with or without its memory, and a restore
// of it brings the marker back.
func (s *vmStack) undoKeeps(id, point string) {
	s.t.Helper()
	if s.exec(id, "cat", "/workspace/marker").Stdout == point+"\n" {
		return
	}
	var auto map[string]any
	for _, sn := range s.must(200, "GET", "/v1/sandboxes/"+id+"/snapshots", "").Body["data"].([]any) {
		if m := sn.(map[string]any); m["auto"] == true {
			auto = m
		}
	}
	if auto == nil || auto["status"] != "ready" {
		s.t.Fatalf("restore killed at %s: the state it replaced is lost: newest automatic snapshot %v", point, auto)
	}
	s.t.Logf("restore killed at %s: %s is ready (memory %v) %v", point, auto["id"], auto["memory"], auto["memory_lost"])
	s.must(200, "POST", "/v1/sandboxes/"+id+"/snapshots/"+auto["id"].(string)+"/restore", "")
	if got := s.exec(id, "cat", "/workspace/marker").Stdout; got != point+"\n" {
		s.t.Fatalf("restore killed at %s: %s restored the marker %q", point, auto["id"], got)
	}
	if s.counter(id) < 0 { // a disk-only undo is a fresh boot
		s.sh(id, counterLine)
	}
	s.counting(id)
}

// alive tells whether the hostproxy process still runs.
func (s *vmStack) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proxy == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// waitSettled waits until a sandbox is in a state no operation is taking
// it out of, and returns it.
func (s *vmStack) waitSettled(id string) string {
	s.t.Helper()
	deadline := time.Now().Add(4 * time.Minute)
	for {
		st, _ := s.call(s.key, "GET", "/v1/sandboxes/"+id, "").data()["state"].(string)
		switch st {
		case "running", "paused", "stopped", "error":
			return st
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("sandbox %s stays %s", id, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitSnapshot waits until the snapshot at path (…/snapshots/ID) is no
// longer processing (a restore's auto-N writes its memory in the
// background, at a low priority) and returns it.
func (s *vmStack) waitSnapshot(path string) map[string]any {
	s.t.Helper()
	deadline := time.Now().Add(4 * time.Minute)
	for {
		sn := s.must(200, "GET", path, "").data()
		if sn["status"] != "processing" {
			return sn
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s stays processing: %v", path, sn)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
