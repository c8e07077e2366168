package hostproxy_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"strata/hostproxy/hostproxytest"
)

// TestIdempotencyKeyAtTheEdge: hostproxy checks the Idempotency-Key header
// of create and restore (issue 6) before a guest sees it. Absent is fine;
// present, it is 1 to 255 printable ASCII characters, sent once, else
// 400 invalid_field naming the header, and the request never reaches the
// guest. Other routes ignore it.
func TestIdempotencyKeyAtTheEdge(t *testing.T) {
	s := startStack(t, nil)
	cp := s.create(keyA, "sb-a1", "/workspace/project", "first")
	create := func(h http.Header) request {
		return request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/project"}`, more: h}
	}
	restore := func(h http.Header) request {
		return request{method: "POST", path: cpsA1 + "/" + cp.ID + "/restore", key: keyA, more: h}
	}
	key := func(vs ...string) http.Header { return http.Header{"Idempotency-Key": vs} }
	cases := []struct {
		name string
		req  request
		ok   bool
	}{
		{"create without a key", create(nil), true},
		{"create with a key", create(key("create-1")), true},
		{"create with 255 characters", create(key(strings.Repeat("k", 255))), true},
		{"create with spaces and punctuation", create(key("a b~!")), true},
		{"create with an empty key", create(key("")), false},
		{"create with 256 characters", create(key(strings.Repeat("k", 256))), false},
		{"create with a tab", create(key("a\tb")), false},
		{"create with non-ASCII", create(key("clé")), false},
		{"create with the key twice", create(key("create-2", "create-2")), false},
		{"create with two keys", create(key("create-3", "create-4")), false},
		{"create with two spellings", create(http.Header{"Idempotency-Key": {"create-5"}, "idempotency-key": {"create-5"}}), false},
		{"restore without a key", restore(nil), true},
		{"restore with a key", restore(key("restore-1")), true},
		{"restore with an empty key", restore(key("")), false},
		{"restore with 256 characters", restore(key(strings.Repeat("r", 256))), false},
		{"restore with two keys", restore(key("restore-2", "restore-3")), false},
		{"list ignores it", request{method: "GET", path: cpsA1, key: keyA, more: key("", "x")}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			guest := s.guests["sb-a1"]
			before := guest.Requests()
			rep := s.do(tc.req)
			code := checkJSend(t, rep)
			if tc.ok {
				if rep.status != 200 {
					t.Fatalf("%d %s", rep.status, rep.body)
				}
				return
			}
			if rep.status != 400 || code != "invalid_field" || !bytes.Contains(rep.body, []byte(`"field":"Idempotency-Key"`)) {
				t.Errorf("%d %s, want 400 invalid_field naming Idempotency-Key", rep.status, rep.body)
			}
			if guest.Requests() != before {
				t.Errorf("a refused Idempotency-Key reached the guest")
			}
		})
	}
}

// TestIdempotencyKeyRelay runs the Idempotency-Key of create and restore
// (issue 6) end to end through real HTTP: hostproxy forwards the header
// unchanged to the guest (the fake guestd, which keeps answers as guestd
// does) and relays what it answers. A retry with the same key and request
// gets the first answer, byte for byte, and changes nothing; the same key
// with another request is 422 idempotency_key_reused; a key is forgotten
// after 24 hours.
func TestIdempotencyKeyRelay(t *testing.T) {
	s := startStack(t, nil)
	guest := s.guests["sb-a1"]
	clock := time.Date(2026, 11, 5, 12, 0, 0, 0, time.UTC)
	guest.SetClock(func() time.Time { return clock })
	const project = "/workspace/project"
	withKey := func(r request, k string) request {
		r.more = http.Header{"Idempotency-Key": {k}}
		return r
	}
	create := func(name string) request {
		return request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"` + project + `","name":"` + name + `"}`}
	}
	restore := func(id string) request {
		return request{method: "POST", path: cpsA1 + "/" + id + "/restore", key: keyA}
	}
	const createKey = "0b3c9d1e-create ~!"

	first := s.do(withKey(create("first"), createKey))
	if first.status != 200 {
		t.Fatalf("create: %d %s", first.status, first.body)
	}
	if got := guest.LastHeader().Get("Idempotency-Key"); got != createKey {
		t.Errorf("the guest got Idempotency-Key %q, want %q", got, createKey)
	}
	var cp1 checkpoint
	s.mustData(withKey(create("first"), createKey), &cp1)

	steps := []struct {
		name  string
		req   request
		same  *reply // the answer must be this one's, byte for byte
		code  string
		count int // checkpoints the guest holds afterwards
	}{
		{"retry of create", withKey(create("first"), createKey), &first, "", 1},
		{"same key, another name", withKey(create("second"), createKey), nil, "idempotency_key_reused", 1},
		{"same key on restore", withKey(restore(cp1.ID), createKey), nil, "idempotency_key_reused", 1},
		{"no key: a new checkpoint", create("first"), nil, "", 2},
		{"another key: a new checkpoint", withKey(create("first"), "create-2"), nil, "", 3},
	}
	for _, st := range steps {
		rep := s.do(st.req)
		code := checkJSend(t, rep)
		switch {
		case st.code != "" && (rep.status != 422 || code != st.code):
			t.Errorf("%s: %d %s, want 422 %s", st.name, rep.status, rep.body, st.code)
		case st.code == "" && rep.status != 200:
			t.Errorf("%s: %d %s", st.name, rep.status, rep.body)
		case st.same != nil && !bytes.Equal(rep.body, st.same.body):
			t.Errorf("%s: answer %s, want the first %s", st.name, rep.body, st.same.body)
		}
		if n := len(guest.Checkpoints()); n != st.count {
			t.Errorf("%s: the guest holds %d checkpoints, want %d", st.name, n, st.count)
		}
	}

	// Restore: the retry returns the first answer and restores nothing
	// again, even after a capture moved the directory on.
	const restoreKey = "restore-1"
	restored := s.do(withKey(restore(cp1.ID), restoreKey))
	if restored.status != 200 || guest.Head(project) != cp1.ID {
		t.Fatalf("restore: %d %s, head %s", restored.status, restored.body, guest.Head(project))
	}
	later := s.create(keyA, "sb-a1", project, "later")
	again := s.do(withKey(restore(cp1.ID), restoreKey))
	if again.status != 200 || !bytes.Equal(again.body, restored.body) {
		t.Errorf("retry of restore: %d %s, want %s", again.status, again.body, restored.body)
	}
	if h := guest.Head(project); h != later.ID {
		t.Errorf("the retry restored again: head %s, want %s", h, later.ID)
	}
	if rep := s.do(withKey(restore(later.ID), restoreKey)); rep.status != 422 || checkJSend(t, rep) != "idempotency_key_reused" {
		t.Errorf("restore key on another checkpoint: %d %s", rep.status, rep.body)
	}

	// A failed first attempt did nothing and is not kept: its retry runs.
	guest.SetFault(hostproxytest.OpCreate, "/workspace/busy", hostproxytest.Fail(409, "directory_busy", "processes use the directory", nil))
	busy := withKey(request{method: "POST", path: cpsA1, key: keyA, body: `{"path":"/workspace/busy"}`}, "busy-1")
	if rep := s.do(busy); rep.status != 409 {
		t.Fatalf("busy create: %d %s", rep.status, rep.body)
	}
	guest.ClearFaults()
	if rep := s.do(busy); rep.status != 200 {
		t.Errorf("retry after a failure: %d %s", rep.status, rep.body)
	}

	// After 24 hours the key is forgotten: the same request runs again.
	n := len(guest.Checkpoints())
	clock = clock.Add(hostproxytest.IdempotencyWindow + time.Minute)
	var fresh checkpoint
	s.mustData(withKey(create("first"), createKey), &fresh)
	if fresh.ID == cp1.ID || len(guest.Checkpoints()) != n+1 {
		t.Errorf("a key older than the window answered %s (first %s); %d checkpoints, want %d", fresh.ID, cp1.ID, len(guest.Checkpoints()), n+1)
	}
}
