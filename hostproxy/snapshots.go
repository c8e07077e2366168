package hostproxy

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/labstack/echo/v4"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/jsend"
	"strata/sandbox"
)

// The VM snapshot routes (/v1/sandboxes/{id}/snapshots…). Who may call
// which is the authorization table's (authz.go): a token with the
// snapshots scope may create, list and read the snapshots of its own
// sandbox; restore, delete, pin, unpin and fork need the account key. A
// restore or a fork is never taken from inside a sandbox: a restore ends
// the machine that carries the call, and a fork makes sandboxes (an
// account's act, as a create is).

// snapshotsRoute checks a snapshot route after authorize; a route with a
// body checks it (check) before it finds the sandbox not a microVM.
func (s *Server) snapshotsRoute(c echo.Context, check func(*http.Request) error) (Sandbox, error) {
	sb := sandboxOf(c)
	if err := check(c.Request()); err != nil {
		return sb, err
	}
	if s.machines == nil || sb.Machine == nil {
		return sb, sandbox.ErrNotAMachine
	}
	return sb, nil
}

// parsed is a route's body check: no query, a body of at most
// jsend.MaxBody that parse accepts, its value left in *out.
func parsed[T any](parse func([]byte) (T, error), out *T) func(*http.Request) error {
	return parsedUpTo(jsend.MaxBody, jsend.ErrBodyTooLarge, parse, out)
}

// parsedUpTo is parsed with a body of at most limit bytes, tooLarge
// beyond.
func parsedUpTo[T any](limit int64, tooLarge error, parse func([]byte) (T, error), out *T) func(*http.Request) error {
	return func(r *http.Request) error {
		if err := jsend.RejectQuery(r); err != nil {
			return err
		}
		b, err := jsend.ReadBody(r, limit, tooLarge)
		if err == nil {
			*out, err = parse(b)
		}
		return err
	}
}

func snapshotView(sandboxID string, sn sandbox.Snapshot) api.Snapshot {
	return api.Snapshot{
		ID: sn.ID, Ref: sn.Ref, Name: sn.Name, Sandbox: sandboxID, Comment: sn.Comment, Memory: sn.Memory, Auto: sn.Auto,
		Pinned: sn.Pinned, Status: string(sn.Status), SizeBytes: sn.SizeBytes,
		CreatedAt: api.FormatTime(sn.CreatedAt), PauseMs: sn.PauseMs, Live: sn.Live,
		MemoryLost: sn.MemoryLost,
	}
}

// snapshotOf is the snapshot a route names, by its id, ref or name, or
// snapshot_not_found.
func snapshotOf(c echo.Context, sb Sandbox) (sandbox.Snapshot, error) {
	id := c.Param("snapshot")
	sn, ok := findSnapshot(sb, id)
	if !ok {
		return sandbox.Snapshot{}, sandbox.ErrSnapshotNotFound.With("snapshot_id", id)
	}
	return sn, nil
}

// findSnapshot is sb's snapshot that s names: its id ("v1", "auto-1"),
// its ref ("sn-…") or its name, told apart by their shapes (no name looks
// like an id or a ref: api.ValidSnapshotName).
func findSnapshot(sb Sandbox, s string) (sandbox.Snapshot, bool) {
	var sn *sandbox.Snapshot
	ok := false
	switch {
	case api.ValidSnapshotID(s):
		sn, ok = sb.Snapshot(s)
	case api.ValidSnapshotRef(s):
		for i := range sb.Snapshots {
			if sb.Snapshots[i].Ref == s {
				sn, ok = &sb.Snapshots[i], true
				break
			}
		}
	case s != "":
		sn, ok = sb.SnapshotNamed(s)
	}
	if !ok {
		return sandbox.Snapshot{}, false
	}
	return *sn, true
}

// snapshotRoute is snapshotsRoute for a route on one snapshot: the
// sandbox, then the snapshot the route names.
func (s *Server) snapshotRoute(c echo.Context, check func(*http.Request) error) (Sandbox, sandbox.Snapshot, error) {
	sb, err := s.snapshotsRoute(c, check)
	if err != nil {
		return sb, sandbox.Snapshot{}, err
	}
	sn, err := snapshotOf(c, sb)
	return sb, sn, err
}

func (s *Server) createSnapshot(c echo.Context) (any, error) {
	var req api.SnapshotCreateRequest
	sb, err := s.snapshotsRoute(c, func(r *http.Request) error {
		if err := parsed(api.ParseSnapshotCreate, &req)(r); err != nil {
			return err
		}
		if req.Retention != nil {
			// Retention deletes snapshots: it needs what a delete needs.
			return s.authorizeAs(c, http.MethodDelete, snapRoute)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r := c.Request()
	sr := sandbox.SnapshotRequest{Memory: *req.Memory}
	if req.Name != nil {
		sr.Name = *req.Name
	}
	if req.Comment != nil {
		sr.Comment = *req.Comment
	}
	if req.Retention != nil {
		sr.RetentionMax = req.Retention.MaxCount
	}
	if sr.Memory {
		s.endAttachments(sb.ID, "the sandbox is taking a memory snapshot")
	}
	// Once begun, a snapshot runs to its end even if the caller hangs up.
	sn, err := s.machines.Snapshot(context.WithoutCancel(r.Context()), sb.ID, sr)
	if err != nil {
		return nil, err
	}
	if sn.Ref == "" {
		// The registry gave the ref as it recorded the snapshot, after
		// package sandbox had made its copy.
		if rec, err := s.reg.Sandbox(context.WithoutCancel(r.Context()), sb.ID); err == nil {
			if got, ok := rec.Snapshot(sn.ID); ok {
				sn.Ref = got.Ref
			}
		}
	}
	return snapshotView(sb.ID, sn), nil
}

func (s *Server) listSnapshots(c echo.Context) (any, error) {
	sb, err := s.snapshotsRoute(c, jsend.RejectQueryAndBody)
	if err != nil {
		return nil, err
	}
	out := make([]api.Snapshot, 0, len(sb.Snapshots))
	for _, sn := range sb.Snapshots {
		out = append(out, snapshotView(sb.ID, sn))
	}
	return out, nil
}

func (s *Server) getSnapshot(c echo.Context) (any, error) {
	sb, sn, err := s.snapshotRoute(c, jsend.RejectQueryAndBody)
	if err != nil {
		return nil, err
	}
	return snapshotView(sb.ID, sn), nil
}

func (s *Server) deleteSnapshot(c echo.Context) (any, error) {
	sb, sn, err := s.snapshotRoute(c, jsend.RejectQueryAndBody)
	if err != nil {
		return nil, err
	}
	if err := s.machines.DeleteSnapshot(context.WithoutCancel(c.Request().Context()), sb.ID, sn.ID); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

func (s *Server) pinSnapshot(pinned bool) func(c echo.Context) (any, error) {
	return func(c echo.Context) (any, error) {
		sb, sn, err := s.snapshotRoute(c, jsend.RejectQueryAndBody)
		if err != nil {
			return nil, err
		}
		sn, err = s.machines.PinSnapshot(c.Request().Context(), sb.ID, sn.ID, pinned)
		if err != nil {
			return nil, err
		}
		return snapshotView(sb.ID, sn), nil
	}
}

func (s *Server) restoreSnapshot(c echo.Context) (any, error) {
	var req api.SnapshotRestoreRequest
	sb, sn, err := s.snapshotRoute(c, parsed(api.ParseSnapshotRestore, &req))
	if err != nil {
		return nil, err
	}
	r := c.Request()
	s.endAttachments(sb.ID, "the sandbox is being restored")
	res, err := s.machines.Restore(r.Context(), sb.ID, sn.ID, req.DiskOnly)
	// The guest's connections were the old machine's.
	s.guests.Forget(sb.Guest)
	if err != nil {
		return nil, err
	}
	return api.SnapshotRestore{SnapshotID: res.SnapshotID, AutoID: res.AutoID, State: string(res.State)}, nil
}

// forksAtOnce is how many forks of one request are made at once.
const forksAtOnce = 4

// forkSnapshot is POST …/snapshots/{snapshot}/fork: count forks, each
// made or refused on its own (admitted on its own, forksAtOnce at a
// time). When none is made, the first refusal is the answer. With an
// Idempotency-Key, each fork claims it as it is recorded (idempotency.go):
// a retry answers the forks the first request made, as they are now, and
// makes none of them again.
func (s *Server) forkSnapshot(c echo.Context) error {
	p := principalOf(c)
	r := c.Request()
	key, err := api.IdempotencyKey(r.Header.Values(api.HeaderIdempotencyKey))
	if err != nil {
		return err
	}
	var req api.ForkRequest
	sb, sn, err := s.snapshotRoute(c, parsedUpTo(api.MaxCreateBody, api.ErrCreateBodyTooLarge, api.ParseFork, &req))
	if err != nil {
		return err
	}
	access := recordAccess(req.Access)
	// The forks keep their source's network unless the request gives
	// one.
	network := sb.Network
	if req.Network != nil {
		network = req.Network
	}
	var request string
	now := s.now()
	if key != "" {
		request = requestHash(forkRequest{Sandbox: sb.ID, Snapshot: sn.ID, Count: req.Count, NamePrefix: req.NamePrefix, Access: access, Env: req.Env, Labels: req.Labels, Network: req.Network})
		if err := s.reg.checkForkKey(r.Context(), p.Account, key, request, now); err != nil {
			return err
		}
	}
	// Made a few at a time: each fork's own steps (its disk's top, its
	// record, admission) overlap, and its boot runs in the background.
	views, errs := make([]api.Sandbox, req.Count), make([]error, req.Count)
	var wg sync.WaitGroup
	sem := make(chan struct{}, forksAtOnce)
	for i := range req.Count {
		name := ""
		if req.NamePrefix != nil {
			name = api.ForkName(*req.NamePrefix, i+1)
		}
		ctx := r.Context()
		var claim *createClaimReq
		if key != "" {
			claim = &createClaimReq{account: p.Account, key: forkClaimKey(key, i+1), request: request, now: now}
			ctx = withCreateClaim(ctx, claim)
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			rec, err := s.fork(ctx, p, sb.ID, sn.ID, Sandbox{Name: name, Access: access, Env: req.Env, Labels: req.Labels, Network: network})
			if errors.Is(err, errClaimed) {
				views[i], errs[i] = s.claimedFork(r.Context(), claim.prior)
				return
			}
			if err == nil {
				s.handedOver(rec)
				views[i] = sandboxView(rec)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	made := []api.Sandbox{}
	var failed []map[string]any
	var first error
	for i, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			fe := fault.As(err)
			if fe == nil {
				s.log.Error("fork failed", "sandbox", sb.ID, "snapshot", sn.ID, "err", err)
				fe = fault.New(fault.Internal, "internal_error", "the fork could not be made")
			}
			failed = append(failed, map[string]any{"code": fe.Code, "message": fe.Message})
			continue
		}
		made = append(made, views[i])
	}
	if len(made) == 0 {
		return first
	}
	data := map[string]any{"sandboxes": made}
	if len(failed) > 0 {
		data["failed"] = failed
	}
	return accepted(c, data)
}

// claimedFork is the answer for a fork an earlier request with the same
// Idempotency-Key made: its record as it is now, or {"id","state":
// "destroyed"} when it was deleted since.
func (s *Server) claimedFork(ctx context.Context, id string) (api.Sandbox, error) {
	sb, err := s.reg.Sandbox(ctx, id)
	switch {
	case fault.CodeOf(err) == "sandbox_not_found":
		return api.Sandbox{ID: id, State: string(sandbox.Destroyed)}, nil
	case err != nil:
		return api.Sandbox{}, err
	}
	return sandboxView(sb), nil
}

// fork makes one fork of a snapshot for account p, with what its own
// record gives (its name, its access setting, env and labels).
func (s *Server) fork(ctx context.Context, p Principal, src, snap string, own Sandbox) (Sandbox, error) {
	id, err := s.newSandboxID()
	if err != nil {
		return Sandbox{}, err
	}
	rec := Sandbox{ID: id, Account: p.Account, Name: own.Name, Guest: guestAddress(id), CreatedAt: s.now().UTC().Truncate(1e9),
		Access: own.Access, Env: own.Env, Labels: own.Labels, Network: own.Network}
	return s.machines.Fork(withTaken(ctx, rec), src, snap, rec)
}
