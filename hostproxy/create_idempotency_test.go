package hostproxy

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/sandbox"
)

// TestCreateKeyIsClaimedWithTheRecord: a sandbox create's Idempotency-Key
// is claimed in the transaction that records the sandbox, so a retry finds
// the first sandbox (and records none), the same key with another request
// is idempotency_key_reused, another account's key is its own, and a key
// older than 24 hours is free again.
func TestCreateKeyIsClaimedWithTheRecord(t *testing.T) {
	ctx := context.Background()
	reg, err := OpenRegistry(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	insert := func(id, account, key, request string, at time.Time) (*createClaimReq, error) {
		c := &createClaimReq{account: account, key: key, request: request, now: at}
		return c, reg.Insert(withCreateClaim(ctx, c), Sandbox{ID: id, Account: account, State: sandbox.Creating})
	}
	if _, err := insert("sb-1", "acct-a", "k1", "req-a", now); err != nil {
		t.Fatal(err)
	}
	c, err := insert("sb-2", "acct-a", "k1", "req-a", now.Add(time.Hour))
	if !errors.Is(err, errClaimed) || c.prior != "sb-1" {
		t.Fatalf("retry: %v, prior %q; want errClaimed naming sb-1", err, c.prior)
	}
	if _, err := reg.Sandbox(ctx, "sb-2"); fault.CodeOf(err) != "sandbox_not_found" {
		t.Fatalf("a retry recorded a second sandbox: %v", err)
	}
	if _, err := insert("sb-3", "acct-a", "k1", "req-b", now.Add(time.Hour)); fault.CodeOf(err) != "idempotency_key_reused" {
		t.Fatalf("same key, another request: %v", err)
	}
	if _, err := insert("sb-4", "acct-b", "k1", "req-b", now.Add(time.Hour)); err != nil {
		t.Fatalf("another account's key: %v", err)
	}
	if _, err := insert("sb-5", "acct-a", "k1", "req-b", now.Add(25*time.Hour)); err != nil {
		t.Fatalf("a key past 24 hours: %v", err)
	}
	if _, err := reg.Sandbox(ctx, "sb-5"); err != nil {
		t.Fatal(err)
	}
}

// TestRequestHashIsTheRequestAsUnderstood: {} and the same request with its
// defaults written out are one request; another size is another.
func TestRequestHashIsTheRequestAsUnderstood(t *testing.T) {
	hash := func(body string) string {
		req, err := api.ParseSandboxCreate([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return requestHash(req)
	}
	empty, explicit := hash(`{}`), hash(`{"memory_mib":512,"vcpus":1,"disk_gib":4}`)
	bigger, named := hash(`{"memory_mib":1024}`), hash(`{"name":"a"}`)
	if empty != explicit || empty == bigger || empty == named {
		t.Fatalf("hashes: {} %s, defaults %s, 1024 MiB %s, named %s", empty, explicit, bigger, named)
	}
}

// TestTakeChecksWhatInsertChecks: a pooled sandbox given to an account
// (Take) claims the create's Idempotency-Key in the same transaction (a
// retry finds it, a reuse with another request is refused and leaves the
// sandbox pooled), and its name must be free in the account.
func TestTakeChecksWhatInsertChecks(t *testing.T) {
	ctx := context.Background()
	reg, err := OpenRegistry(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, sb := range []Sandbox{
		{ID: "sb-web", Account: "acct-a", Name: "web", State: sandbox.Running},
		{ID: "sb-p1", Pooled: true, State: sandbox.Running},
		{ID: "sb-p2", Pooled: true, State: sandbox.Running},
	} {
		if err := reg.Insert(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	take := func(id, name, key, request string) (*createClaimReq, error) {
		c := &createClaimReq{account: "acct-a", key: key, request: request, now: now}
		_, err := reg.Take(withCreateClaim(ctx, c), id, func(sb *Sandbox) error {
			sb.Pooled, sb.Account, sb.Name = false, "acct-a", name
			return nil
		})
		return c, err
	}
	if _, err := take("sb-p1", "web", "k0", "req-a"); fault.CodeOf(err) != "name_taken" {
		t.Fatalf("a name the account has: %v", err)
	}
	if sb, _ := reg.Sandbox(ctx, "sb-p1"); !sb.Pooled || sb.Account != "" {
		t.Fatalf("after a refused take: %+v", sb)
	}
	if _, err := take("sb-p1", "api", "k1", "req-a"); err != nil {
		t.Fatal(err)
	}
	c, err := take("sb-p2", "api", "k1", "req-a")
	if !errors.Is(err, errClaimed) || c.prior != "sb-p1" {
		t.Fatalf("retry: %v, prior %q; want errClaimed naming sb-p1", err, c.prior)
	}
	if _, err := take("sb-p2", "db", "k1", "req-b"); fault.CodeOf(err) != "idempotency_key_reused" {
		t.Fatalf("same key, another request: %v", err)
	}
	if sb, _ := reg.Sandbox(ctx, "sb-p2"); !sb.Pooled || sb.Account != "" {
		t.Fatalf("after refused takes: %+v", sb)
	}
}

// TestForkKeyIsClaimedForkByFork pins issue 30 item 6.4 (POST …/fork took
// no Idempotency-Key, so a retry made count more forks): each fork of a
// many-forks fork claims the key in the transaction that records it; a
// retry with the same request finds each fork made (and records none), a
// fork the first request did not make is made by the retry, the same key
// with another request is refused before any fork is asked for
// (checkForkKey) and at each insert, and a create's key is not a fork's
// nor the other way round.
func TestForkKeyIsClaimedForkByFork(t *testing.T) {
	ctx := context.Background()
	reg, err := OpenRegistry(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	fork := func(id, key string, n int, request string, at time.Time) (*createClaimReq, error) {
		c := &createClaimReq{account: "acct-a", key: forkClaimKey(key, n), request: request, now: at}
		return c, reg.Insert(withCreateClaim(ctx, c), Sandbox{ID: id, Account: "acct-a", State: sandbox.Creating})
	}
	// The first request made forks 1 and 3; fork 2 was refused.
	for n, id := range map[int]string{1: "sb-f1", 3: "sb-f3"} {
		if _, err := fork(id, "k1", n, "req-a", now); err != nil {
			t.Fatal(err)
		}
	}
	if err := reg.checkForkKey(ctx, "acct-a", "k1", "req-a", now.Add(time.Hour)); err != nil {
		t.Fatalf("a retry of the same request: %v", err)
	}
	for n, want := range map[int]string{1: "sb-f1", 3: "sb-f3"} {
		c, err := fork(fmt.Sprintf("sb-r%d", n), "k1", n, "req-a", now.Add(time.Hour))
		if !errors.Is(err, errClaimed) || c.prior != want {
			t.Fatalf("retry of fork %d: %v, prior %q; want errClaimed naming %s", n, err, c.prior, want)
		}
		if _, err := reg.Sandbox(ctx, fmt.Sprintf("sb-r%d", n)); fault.CodeOf(err) != "sandbox_not_found" {
			t.Fatalf("a retry recorded fork %d again: %v", n, err)
		}
	}
	if _, err := fork("sb-r2", "k1", 2, "req-a", now.Add(time.Hour)); err != nil {
		t.Fatalf("the fork the first request did not make: %v", err)
	}
	for name, check := range map[string]func() error{
		"another request, before any fork": func() error {
			return reg.checkForkKey(ctx, "acct-a", "k1", "req-b", now.Add(time.Hour))
		},
		"another request, at an insert": func() error {
			_, err := fork("sb-x", "k1", 1, "req-b", now.Add(time.Hour))
			return err
		},
		"a create with a fork's key": func() error {
			c := &createClaimReq{account: "acct-a", key: "k1", request: "req-a", now: now.Add(time.Hour)}
			return reg.Insert(withCreateClaim(ctx, c), Sandbox{ID: "sb-c", Account: "acct-a", State: sandbox.Creating})
		},
	} {
		if err := check(); fault.CodeOf(err) != "idempotency_key_reused" {
			t.Errorf("%s: %v, want idempotency_key_reused", name, err)
		}
	}
	c := &createClaimReq{account: "acct-a", key: "k2", request: "req-c", now: now}
	if err := reg.Insert(withCreateClaim(ctx, c), Sandbox{ID: "sb-c2", Account: "acct-a", State: sandbox.Creating}); err != nil {
		t.Fatal(err)
	}
	if err := reg.checkForkKey(ctx, "acct-a", "k2", "req-c", now); fault.CodeOf(err) != "idempotency_key_reused" {
		t.Errorf("a fork with a create's key: %v", err)
	}
	if _, err := fork("sb-y", "k2", 1, "req-c", now); fault.CodeOf(err) != "idempotency_key_reused" {
		t.Errorf("a fork's insert with a create's key: %v", err)
	}
	// Past 24 hours the key is free again, for any request.
	later := now.Add(26 * time.Hour)
	if err := reg.checkForkKey(ctx, "acct-a", "k1", "req-b", later); err != nil {
		t.Errorf("a key past 24 hours: %v", err)
	}
	if _, err := fork("sb-z", "k1", 1, "req-b", later); err != nil {
		t.Errorf("a fork's insert with a key past 24 hours: %v", err)
	}
}
