package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"strata/internal/api"
)

// forkFailure is a fork of a batch (the index-th) that did not come to
// run.
type forkFailure struct {
	index int
	err   error
}

func (a *app) forkCommand() *cobra.Command {
	var count int
	var access string
	var env, labels []string
	var nf networkFlags
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "fork SANDBOX SNAPSHOT [NAME] [--count N] [--env K=V]... [--label k=v]... [--access none|SCOPE,…] [--egress all|none|list] [--allow RULE]... [--deny RULE]... [--no-wait]",
		Short: "Make new sandboxes from a snapshot and wait until they run",
		Long: `Make a new, independent sandbox from a snapshot of SANDBOX: its disk, and
its memory when it has one, so that its processes run on. The fork takes
its resources from the snapshot. createos waits until it runs, as create
does; --no-wait prints the record in state creating at once.

NAME is optional and follows the rule of create's. With --count N (1 to
100), N forks are made in one call, each made or refused on its own, and
NAME is sent as their name_prefix (they are named NAME-1, NAME-2, …);
createos then waits for each, prints them all, and fails (exit 1) when any
did not come to run. A fork's access setting, env and labels are --access,
--env and --label (as create's), never its source's.

SANDBOX is the sandbox's id or name; SNAPSHOT its snapshot's id, name or
ref (sn-…). With a ref SANDBOX may be -: a ref names one snapshot on the
whole deployment.`,
		Example: "  createos sandbox fork sb-local v2 web-2\n" +
			"  createos sandbox fork scratch v1 scratch-copy --label owner=docs\n" +
			"  createos sandbox fork - sn-0123456789abcdefghijklmn scratch-3\n" +
			"  createos sandbox fork sb-local v2 worker --count 5",
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			from := &api.SandboxFrom{Sandbox: args[0], Snapshot: args[1]}
			if from.Sandbox == "-" {
				if !api.ValidSnapshotRef(from.Snapshot) {
					return fmt.Errorf("SANDBOX - needs SNAPSHOT to be a ref (sn-…), not %q", from.Snapshot)
				}
				from.Sandbox = ""
			}
			envs, err := parseAssignments("--env", env)
			if err != nil {
				return err
			}
			lbls, err := parseAssignments("--label", labels)
			if err != nil {
				return err
			}
			var name *string
			if len(args) == 3 {
				name = &args[2]
			}
			network, err := nf.setting(cmd)
			if err != nil {
				return err
			}
			var raw json.RawMessage
			if cmd.Flags().Changed("access") {
				acc, err := parseAccess("--access", access)
				if err != nil {
					return err
				}
				raw, _ = json.Marshal(acc)
			}
			if !cmd.Flags().Changed("count") {
				if name != nil {
					if err := checkSandboxName(*name); err != nil {
						return err
					}
				}
				return a.createSandbox(cmd.Context(), api.SandboxCreateRequest{Name: name, From: from, Access: raw, Env: envs, Labels: lbls, Network: network}, &w)
			}
			if from.Sandbox == "" {
				return errors.New("--count needs SANDBOX given: the many-forks route is the sandbox's")
			}
			return a.forkMany(cmd.Context(), from, ForkRequest{Count: count, NamePrefix: name, Access: raw, Env: envs, Labels: lbls, Network: network}, &w)
		},
	}
	cmd.Flags().IntVar(&count, "count", 1, "make N forks in one call (1 to 100); NAME is then their name prefix")
	cmd.Flags().StringVar(&access, "access", "", "what the key handed to each fork's guest may do: none, or scopes joined by commas (default checkpoints,snapshots)")
	addEnvAndLabels(cmd, &env, &labels)
	nf.add(cmd)
	w.add(cmd, "runs")
	cmd.ValidArgsFunction = a.completeSnapshot
	return cmd
}

// forkMany makes req.Count forks in one call, waits for each unless w
// says not to, prints them all, and fails when any did not come to run.
func (a *app) forkMany(ctx context.Context, from *api.SandboxFrom, req ForkRequest, w *waitFlags) error {
	c, err := a.client()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	forks, err := c.ForkSnapshot(ctx, from.Sandbox, from.Snapshot, req, "", rawAnswer(&raw))
	if err != nil {
		return wrap(err)
	}
	// The answer as sent, for -o json, with each record replaced by the
	// last one the wait saw.
	var answer map[string]json.RawMessage
	var records []json.RawMessage
	if json.Unmarshal(raw, &answer) != nil || json.Unmarshal(answer["sandboxes"], &records) != nil || len(records) != len(forks.Sandboxes) {
		return &callError{fmt.Errorf("the fork answer is not {\"sandboxes\":[…]}: %.200s", raw)}
	}
	var failed []forkFailure
	total := len(forks.Sandboxes) + len(forks.Failed)
	for j, f := range forks.Failed {
		failed = append(failed, forkFailure{len(forks.Sandboxes) + j, fmt.Errorf("a fork was not made: %s: %s", f.Code, f.Message)})
	}
	if !w.noWait {
		// One deadline for the batch: --wait-timeout bounds the whole wait,
		// not each fork's.
		wctx, cancel := context.WithTimeout(ctx, w.timeout)
		defer cancel()
		for i, sb := range forks.Sandboxes {
			if sb.State == api.SandboxRunning || !api.SandboxTransient(sb.State) {
				continue
			}
			got, graw, err := w.wait(wctx, c, sb.ID, api.SandboxRunning)
			if got.ID != "" {
				forks.Sandboxes[i], records[i] = got, graw
			}
			var apiErr *APIError
			if errors.As(err, &apiErr) { // it does not name the sandbox
				err = fmt.Errorf("sandbox %s: %w", sb.ID, err)
			}
			if err != nil {
				failed = append(failed, forkFailure{i, err})
			}
		}
	}
	// A fork that settled in error, or was answered in it, failed too.
	for i, sb := range forks.Sandboxes {
		if sb.State == api.SandboxError && !hasFailure(failed, i) {
			reason := sb.Error
			if reason == "" {
				reason = "no reason given"
			}
			failed = append(failed, forkFailure{i, fmt.Errorf("sandbox %s is in state error: %s", orDash(sb.ID), reason)})
		}
	}
	switch {
	case a.output == "json" && w.noWait:
		err = a.writeJSON(raw)
	case a.output == "json":
		answer["sandboxes"], _ = json.Marshal(records)
		err = a.writeValue(answer)
	default:
		err = a.writeSandboxes(forks.Sandboxes)
	}
	if err != nil {
		return err
	}
	if len(failed) == 0 {
		return nil
	}
	for _, f := range failed {
		fmt.Fprintf(a.stderr, "createos: %v\n", f.err)
	}
	return &callError{fmt.Errorf("%d of %d forks did not come to run", len(failed), total)}
}

func hasFailure(failed []forkFailure, index int) bool {
	for _, f := range failed {
		if f.index == index {
			return true
		}
	}
	return false
}
