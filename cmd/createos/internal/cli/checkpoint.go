package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/spf13/cobra"

	"strata/internal/api"
)

func (a *app) checkpointCommand() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "checkpoint",
		Aliases: []string{"checkpoints"},
		Short:   "Capture, list, draw, compare, read, restore, clone and delete directory checkpoints",
	})
	cmd.AddCommand(a.createCommand(), a.listCommand(), a.treeCommand(), a.restoreCommand(), a.deleteCommand(),
		a.diffCommand(), a.catCommand(), a.cloneCommand())
	return cmd
}

func (a *app) createCommand() *cobra.Command {
	var dir, name, key string
	var retain int
	cmd := &cobra.Command{
		Use:   "create [SANDBOX] --path DIR [--name NAME] [--retain N] [--idempotency-key KEY]",
		Short: "Capture a directory's current file state",
		Long: `Capture a directory's current file state as a new checkpoint.

Stop processes and file transfers that use the directory first: the API
answers directory_busy when it finds one, and lists them.

With --retain N, the capture then deletes the directory's oldest
checkpoints (automatic ones aside) so that it keeps at most N, the new
one included (retention delete_oldest). A directory holds at most 10,000
checkpoints: at that limit a capture without --retain fails with
checkpoint_limit.

With --idempotency-key, running the same command again with the same key
(within 24 hours) prints the checkpoint the first run made instead of
making another: safe to retry after a timeout.`,
		Example: "  createos sandbox checkpoint create sb-local --path /workspace/project --name before-update\n" +
			"  createos sandbox checkpoint create sb-local --path /workspace/project --retain 20\n" +
			"  createos sandbox checkpoint create sb-local --path /workspace/project --idempotency-key \"$(uuidgen)\"",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkIdempotencyFlag(cmd, key); err != nil {
				return err
			}
			if cmd.Flags().Changed("retain") && (retain < 1 || retain > api.MaxCheckpoints) {
				return fmt.Errorf("--retain %d: want 1 to %d", retain, api.MaxCheckpoints)
			}
			c, sb, _, err := a.start(args, 0)
			if err != nil {
				return err
			}
			var namePtr *string
			if cmd.Flags().Changed("name") {
				namePtr = &name
			}
			var retention *api.Retention
			if cmd.Flags().Changed("retain") {
				retention = &api.Retention{Mode: api.RetentionDeleteOldest, MaxCount: retain}
			}
			var raw json.RawMessage
			cp, err := c.CreateCheckpoint(cmd.Context(), sb, dir, namePtr, retention, key, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			return a.writeCheckpoints([]Checkpoint{cp})
		},
	}
	cmd.Flags().StringVar(&dir, "path", "", "absolute path of the directory to capture (required)")
	cmd.Flags().StringVar(&name, "name", "", "display name of the checkpoint (at most 128 bytes)")
	cmd.Flags().IntVar(&retain, "retain", 0, "keep at most N checkpoints of the directory (1 to 10000), deleting the oldest")
	idempotencyFlag(cmd, &key, "a retry with the same key gets the first run's checkpoint instead of a new one")
	_ = cmd.MarkFlagRequired("path")
	_ = cmd.MarkFlagDirname("path")
	return cmd
}

func (a *app) listCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "list [SANDBOX]",
		Aliases: []string{"ls"},
		Short:   "List every checkpoint of a sandbox, oldest first",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sb, _, err := a.start(args, 0)
			if err != nil {
				return err
			}
			var raw json.RawMessage
			list, err := c.ListCheckpoints(cmd.Context(), sb, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			if len(list) == 0 {
				_, err := fmt.Fprintln(a.stdout, "No checkpoints.")
				return err
			}
			return a.writeCheckpoints(list)
		},
	}
}

func (a *app) writeCheckpoints(list []Checkpoint) error {
	w := a.table()
	fmt.Fprintln(w, "ID\tPATH\tNAME\tCREATED\tPARENT\tSIZE")
	for _, cp := range list {
		name := orDash(cp.Name)
		if cp.Auto {
			name = autoMark + " " + cp.Name
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", cp.ID, cp.Path, name, cp.CreatedAt, orDash(cp.ParentID), humanSize(cp.SizeBytes))
	}
	return w.Flush()
}

// autoMark marks an automatic checkpoint (a restore's safety checkpoint
// of unsaved changes) in list and tree.
const autoMark = "[auto]"

func (a *app) treeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "tree [SANDBOX]",
		Short: "Draw each directory's checkpoint lineage, newest first",
		Long: `Draw each directory's checkpoint lineage, newest first, as git log --graph
does: a restore followed by a capture makes a branch. "<- live" marks the
checkpoint each live directory continues from: the last one captured or
restored there (see docs/cli.md).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sb, _, err := a.start(args, 0)
			if err != nil {
				return err
			}
			list, err := c.ListCheckpoints(cmd.Context(), sb)
			if err != nil {
				return wrap(err)
			}
			live := map[string]string{}
			dirs, err := c.ListDirectories(cmd.Context(), sb)
			var apiErr *APIError
			switch {
			case err == nil:
				for _, d := range dirs {
					live[d.Path] = d.CheckpointID
				}
			case errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound && apiErr.Code == "not_found":
				live = nil // a server without the extension: guess from the list
			default:
				return wrap(err)
			}
			lineages := BuildLineage(list, live)
			if a.output == "json" {
				if lineages == nil {
					lineages = []*Lineage{}
				}
				return a.writeValue(lineages)
			}
			return writeTree(a.stdout, lineages)
		},
	}
}

func (a *app) restoreCommand() *cobra.Command {
	var key string
	var only []string
	cmd := &cobra.Command{
		Use:   "restore [SANDBOX] CHECKPOINT [--only PATH]... [--idempotency-key KEY]",
		Short: "Restore a checkpoint at its original path, or only some paths of it",
		Long: `Restore a checkpoint at its original path. Changes made since that
checkpoint that were not captured are discarded from the live directory,
but kept first as an automatic checkpoint (the answer names it: restore
that one to undo); later checkpoints stay restorable.

With --only PATH (repeatable, 1 to 100 paths relative to the directory),
only those paths become what they are in the checkpoint, recursively
(removed when the checkpoint lacks them); the rest of the directory is
untouched; the directory's unsaved changes are kept as an automatic
checkpoint first (a capture of the whole directory), as for a whole
restore.

With --idempotency-key, running the same command again with the same key
(within 24 hours) prints the first run's answer and restores nothing
again, even if the directory changed since.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkIdempotencyFlag(cmd, key); err != nil {
				return err
			}
			if len(only) > 0 && key != "" {
				return errors.New("--only does not take --idempotency-key: restoring the same paths again is safe")
			}
			c, sb, rest, err := a.startCheckpoint(cmd.Context(), args, 1)
			if err != nil {
				return err
			}
			if len(only) > 0 {
				return a.restoreOnly(cmd.Context(), c, sb, rest[0], only)
			}
			var raw json.RawMessage
			r, err := c.RestoreCheckpoint(cmd.Context(), sb, rest[0], key, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			_, err = fmt.Fprintf(a.stdout, "Restored %s at %s\n", r.CheckpointID, r.Path)
			if err == nil && r.SafetyCheckpointID != "" {
				_, err = fmt.Fprintf(a.stdout, "Unsaved changes kept as %s (restore it to undo)\n", r.SafetyCheckpointID)
			}
			return err
		},
	}
	cmd.Flags().StringArrayVar(&only, "only", nil, "restore only this path, relative to the directory (repeatable)")
	idempotencyFlag(cmd, &key, "a retry with the same key gets the first run's answer and restores nothing again")
	cmd.ValidArgsFunction = a.completeCheckpoint
	return cmd
}

// idempotencyFlag adds --idempotency-key to cmd.
func idempotencyFlag(cmd *cobra.Command, key *string, what string) {
	cmd.Flags().StringVar(key, "idempotency-key", "", "send this Idempotency-Key (1-255 printable ASCII characters): "+what)
	_ = cmd.RegisterFlagCompletionFunc("idempotency-key", cobra.NoFileCompletions)
}

// checkIdempotencyFlag refuses, as a usage error, a --idempotency-key
// that the API would refuse: given but empty, too long, or not printable
// ASCII.
func checkIdempotencyFlag(cmd *cobra.Command, key string) error {
	if !cmd.Flags().Changed("idempotency-key") {
		return nil
	}
	if _, err := api.IdempotencyKey([]string{key}); err != nil {
		return fmt.Errorf("--idempotency-key %q: want 1 to 255 printable ASCII characters", key)
	}
	return nil
}

func (a *app) deleteCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "delete [SANDBOX] CHECKPOINT",
		Aliases: []string{"rm"},
		Short:   "Delete a checkpoint record (the live directory is not changed)",
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sb, rest, err := a.startCheckpoint(cmd.Context(), args, 1)
			if err != nil {
				return err
			}
			var raw json.RawMessage
			err = c.DeleteCheckpoint(cmd.Context(), sb, rest[0], rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			_, err = fmt.Fprintf(a.stdout, "Deleted %s\n", rest[0])
			return err
		},
	}
	cmd.ValidArgsFunction = a.completeCheckpoint
	return cmd
}

// completeCheckpoint offers the sandbox's checkpoint ids, newest first,
// with their path and name as descriptions, when the API can be reached.
func (a *app) completeCheckpoint(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	c, err := a.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var sb string
	switch {
	case len(args) == 1:
		sb = args[0]
	case len(args) == 0 && a.getenv(EnvSandboxID) != "":
		sb = a.getenv(EnvSandboxID)
	default:
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	list, err := c.ListCheckpoints(cmd.Context(), sb)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for i := len(list) - 1; i >= 0; i-- {
		cp := list[i]
		if strings.HasPrefix(cp.ID, toComplete) {
			out = append(out, cp.ID+"\t"+cp.Path+" "+cp.Name)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
