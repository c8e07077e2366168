package integration

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fingerprint is a managed directory's names, types, file sizes and
// contents, as read inside the guest. A directory's own size is left out:
// it says how the file system stores it (an overlay's merged directory,
// a fresh upper), not what it holds.
const fingerprint = `cd /workspace/p && find . -printf '%p %y\n' | LC_ALL=C sort && find . -type f -printf '%p %s\n' | LC_ALL=C sort && find . -type f -exec md5sum {} + | LC_ALL=C sort`

// TestPowerCuts kills QEMU at random moments during captures, restores and
// deletes of checkpoints inside the guest, 21 times; after each cold boot
// the managed directory is in its before or after state, the list agrees
// with it, every directory is ready, and the store's own check finds
// nothing orphaned.
func TestPowerCuts(t *testing.T) {
	s := startVMStack(t, "60s")
	id := s.create(s.key, `{"name":"cuts"}`)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	cp := "/v1/sandboxes/" + id + "/checkpoints"

	s.sh(id, "mkdir -p /workspace/p && seq 1 5000 > /workspace/p/a && echo 0 > /workspace/p/gen && sync")
	fp := map[string]string{} // checkpoint id -> fingerprint of its content
	t0 := time.Now()
	first := s.must(200, "POST", cp, `{"path":"/workspace/p","name":"first"}`).data()["id"].(string)
	fp[first] = s.sh(id, fingerprint)
	// Cuts land anywhere from before the guest gets the request to after
	// it answered: up to 1.5 times what a capture takes through the API.
	span := time.Since(t0) * 3 / 2
	completed := 0

	// list is the client's checkpoints; autos the automatic ones (each
	// restore over the unsaved change below makes one, the newest 5 kept).
	lists := func() (ids, autos []string) {
		for _, c := range s.must(200, "GET", cp, "").Body["data"].([]any) {
			rec := c.(map[string]any)
			if rec["auto"] == true {
				autos = append(autos, rec["id"].(string))
			} else {
				ids = append(ids, rec["id"].(string))
			}
		}
		return ids, autos
	}
	list := func() []string { ids, _ := lists(); return ids }
	ops := []string{"capture", "restore", "delete"}
	for i := range 21 {
		op := ops[i%3]
		// An uncaptured change, synced: what a power cut may not take.
		s.sh(id, fmt.Sprintf("echo %d > /workspace/p/gen && mkdir -p /workspace/p/d%d && seq %d > /workspace/p/d%d/f && sync", i, i, i*100, i))
		before := s.sh(id, fingerprint)
		listBefore := list()
		var target, method, path string
		switch op {
		case "capture":
			method, path = "POST", cp
		case "restore":
			target = listBefore[rng.IntN(len(listBefore))]
			method, path = "POST", cp+"/"+target+"/restore"
		case "delete":
			if len(listBefore) < 2 {
				op, method, path = "capture", "POST", cp
				break
			}
			target = listBefore[1+rng.IntN(len(listBefore)-1)]
			method, path = "DELETE", cp+"/"+target
		}
		body := ""
		if op == "capture" {
			body = fmt.Sprintf(`{"path":"/workspace/p","name":"cut-%d"}`, i)
		}
		pid := s.qemuPid(id)
		answered := make(chan reply, 1)
		go func() { answered <- s.call(s.key, method, path, body) }()
		delay := time.Duration(rng.Int64N(int64(span)))
		time.Sleep(delay)
		syscall.Kill(pid, syscall.SIGKILL)
		r := <-answered
		if r.Status == 200 {
			completed++
		}
		t.Logf("cut %d: %s %s, killed after %v, answer %d", i, op, target, delay, r.Status)

		s.waitState(s.key, id, "error", time.Minute)
		s.call(s.key, "POST", "/v1/sandboxes/"+id+"/start", "")
		s.waitState(s.key, id, "running", 4*time.Minute)

		after := s.sh(id, fingerprint)
		listAfter := list()
		// An operation that answered 200 was done: its after state only.
		if r.Status == 200 {
			switch op {
			case "capture":
				if len(listAfter) != len(listBefore)+1 || listAfter[len(listBefore)] != r.data()["id"] {
					t.Fatalf("cut %d: an answered capture (%v) is not in the list %v", i, r.data()["id"], listAfter)
				}
			case "restore":
				if after != fp[target] {
					t.Fatalf("cut %d: an answered restore of %s did not stay:\n%s\nwant:\n%s", i, target, after, fp[target])
				}
				// It kept the unsaved change, and that stayed too.
				safety, _ := r.data()["safety_checkpoint_id"].(string)
				if _, autos := lists(); safety == "" || !slices.Contains(autos, safety) {
					t.Fatalf("cut %d: an answered restore's safety checkpoint %q is not among the automatic ones %v", i, safety, autos)
				}
			case "delete":
				if slices.Contains(listAfter, target) {
					t.Fatalf("cut %d: an answered delete of %s came back: %v", i, target, listAfter)
				}
			}
		}
		switch op {
		case "capture":
			if after != before {
				t.Fatalf("cut %d (capture): the directory changed:\nbefore:\n%s\nafter:\n%s", i, before, after)
			}
			switch {
			case slices.Equal(listAfter, listBefore):
			case len(listAfter) == len(listBefore)+1 && slices.Equal(listAfter[:len(listBefore)], listBefore):
				fp[listAfter[len(listBefore)]] = before
			default:
				t.Fatalf("cut %d (capture): list %v, before %v", i, listAfter, listBefore)
			}
		case "restore":
			if after != before && after != fp[target] {
				t.Fatalf("cut %d (restore of %s): neither before nor the checkpoint:\nbefore:\n%s\ncheckpoint:\n%s\nafter:\n%s", i, target, before, fp[target], after)
			}
			if !slices.Equal(listAfter, listBefore) {
				t.Fatalf("cut %d (restore): list %v, before %v", i, listAfter, listBefore)
			}
		case "delete":
			if after != before {
				t.Fatalf("cut %d (delete): the directory changed", i)
			}
			gone := slices.DeleteFunc(slices.Clone(listBefore), func(x string) bool { return x == target })
			if !slices.Equal(listAfter, listBefore) && !slices.Equal(listAfter, gone) {
				t.Fatalf("cut %d (delete of %s): list %v, before %v", i, target, listAfter, listBefore)
			}
		}
		dirs := s.must(200, "GET", "/v1/sandboxes/"+id+"/directories", "").Body["data"]
		if !strings.Contains(fmt.Sprint(dirs), "state:ready") {
			t.Fatalf("cut %d: directories %v", i, dirs)
		}
		check := s.sh(id, "curl -sS --unix-socket /run/strata/guestd.sock http://guestd/v1/check")
		if !strings.Contains(check, `"problems":[]`) || strings.Contains(check, `"problems":["`) {
			t.Fatalf("cut %d: the store's check: %s", i, check)
		}
	}
	t.Logf("%d of 21 operations answered before their cut", completed)
	// Still working: every checkpoint left restores to its content.
	for _, c := range list() {
		s.must(200, "POST", cp+"/"+c+"/restore", "")
		if got := s.sh(id, fingerprint); got != fp[c] {
			t.Fatalf("restore of %s after the cuts:\n%s\nwant:\n%s", c, got, fp[c])
		}
	}
}
