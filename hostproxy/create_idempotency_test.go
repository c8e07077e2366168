package hostproxy

import (
	"context"
	"errors"
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
