package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strings"

	"github.com/spf13/cobra"

	"strata/internal/api"
)

// The checkpoint commands of issue 8: diff, cat, restore --only, clone,
// and the directory commands (list, release).

// relPath turns the PATH of cat into a path relative to the checkpoint's
// directory: a relative path is taken as is ("." and "/" name the root);
// an absolute one must lie in the checkpoint's directory, whose path
// comes from the list.
func (a *app) relPath(ctx context.Context, c *Client, sb, id, p string) (string, error) {
	if p == "." || p == "" {
		return "", nil
	}
	if !strings.HasPrefix(p, "/") {
		// src/ or a/./b, as a shell completes or a person types them;
		// what stays unclean ("../x") the API refuses.
		if p = path.Clean(p); p == "." {
			return "", nil
		}
		return p, nil
	}
	list, err := c.ListCheckpoints(ctx, sb)
	if err != nil {
		return "", wrap(err)
	}
	for _, cp := range list {
		if cp.ID != id {
			continue
		}
		clean := path.Clean(p)
		if clean == cp.Path {
			return "", nil
		}
		if rel, ok := strings.CutPrefix(clean, cp.Path+"/"); ok {
			return rel, nil
		}
		return "", fmt.Errorf("%s is not in %s, the directory of %s; give a path relative to it", p, cp.Path, id)
	}
	// Unknown checkpoint: the API says so.
	return strings.TrimPrefix(p, "/"), nil
}

func (a *app) catCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cat [SANDBOX] CHECKPOINT PATH",
		Short: "Print a file, symlink or directory as it is in a checkpoint",
		Long: `Print one entry as it is in a checkpoint, read from its layers: a file's
content, a symlink's target, or a directory's names (a directory's with a
trailing /, a symlink's with a trailing @). PATH is relative to the
checkpoint's directory ("." is the directory itself; "src/" is "src"), or
an absolute path inside it. Files larger than 4 MiB are refused (file_too_large): restore
them, or read them in the sandbox. -o json prints the API's answer, the
content in base64.`,
		Example: "  createos sandbox checkpoint cat sb-local cp_… src/main.go\n" +
			"  createos sandbox checkpoint cat cp_… /workspace/project/README.md",
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sb, rest, err := a.startCheckpoint(cmd.Context(), args, 2)
			if err != nil {
				return err
			}
			rel, err := a.relPath(cmd.Context(), c, sb, rest[0], rest[1])
			if err != nil {
				return err
			}
			var raw json.RawMessage
			e, err := c.ReadEntry(cmd.Context(), sb, rest[0], rel, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			return a.writeEntry(e)
		},
	}
	cmd.ValidArgsFunction = a.completeCheckpoint
	return cmd
}

func (a *app) writeEntry(e Entry) error {
	var err error
	switch {
	case e.Content != nil:
		_, err = a.stdout.Write(*e.Content)
	case e.Target != nil:
		_, err = fmt.Fprintln(a.stdout, *e.Target)
	case e.Entries != nil:
		for _, d := range *e.Entries {
			suffix := map[string]string{"dir": "/", "symlink": "@"}[d.Type]
			if _, err = fmt.Fprintln(a.stdout, d.Name+suffix); err != nil {
				break
			}
		}
	}
	return err
}

func (a *app) cloneCommand() *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "clone [SANDBOX] CHECKPOINT --to DIR",
		Short: "Make a new managed directory from a checkpoint, sharing its layers",
		Long: `Make DIR a new managed directory whose content is the checkpoint's. Nothing
is copied: the clone shares the checkpoint's layers, and deleting the
source directory's checkpoints never breaks it. DIR must not exist, its
parent must, it must be on the filesystem of the checkpoint's directory,
and the path rules of create apply. The clone's first checkpoint has the
source checkpoint as parent_id.`,
		Example: "  createos sandbox checkpoint clone sb-local cp_… --to /workspace/experiment",
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sb, rest, err := a.startCheckpoint(cmd.Context(), args, 1)
			if err != nil {
				return err
			}
			var raw json.RawMessage
			r, err := c.Clone(cmd.Context(), sb, rest[0], to, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			_, err = fmt.Fprintf(a.stdout, "Cloned %s to %s\n", r.FromCheckpointID, r.Path)
			return err
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "absolute path of the new directory (must not exist; required)")
	_ = cmd.MarkFlagRequired("to")
	_ = cmd.MarkFlagDirname("to")
	cmd.ValidArgsFunction = a.completeCheckpoint
	return cmd
}

// restoreOnly is restore --only: restore-paths.
func (a *app) restoreOnly(ctx context.Context, c *Client, sb, id string, paths []string) error {
	var raw json.RawMessage
	r, err := c.RestorePaths(ctx, sb, id, paths, rawAnswer(&raw))
	if err != nil {
		return wrap(err)
	}
	if a.output == "json" {
		return a.writeJSON(raw)
	}
	_, err = fmt.Fprintf(a.stdout, "Restored %s from %s at %s\n", strings.Join(r.Paths, ", "), r.CheckpointID, r.Path)
	if err == nil && r.SafetyCheckpointID != "" {
		_, err = fmt.Fprintf(a.stdout, "Unsaved changes kept as %s (restore it to undo)\n", r.SafetyCheckpointID)
	}
	return err
}

func (a *app) directoryCommand() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "directory",
		Aliases: []string{"directories", "dir"},
		Short:   "List managed directories, or release one back to a plain directory",
	})
	cmd.AddCommand(a.directoryListCommand(), a.releaseCommand())
	return cmd
}

func (a *app) directoryListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "list [SANDBOX]",
		Aliases: []string{"ls"},
		Short:   "List the managed directories, the checkpoint each continues from, and their sizes",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sb, _, err := a.start(args, 0)
			if err != nil {
				return err
			}
			var list []api.Directory
			raw, err := c.Call(cmd.Context(), http.MethodGet, sandboxPath(sb, "directories"), nil, &list)
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			if len(list) == 0 {
				_, err := fmt.Fprintln(a.stdout, "No managed directories.")
				return err
			}
			w := a.table()
			fmt.Fprintln(w, "PATH\tSTATE\tCHECKPOINT\tSIZE")
			for _, d := range list {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", d.Path, orDash(d.State), orDash(d.CheckpointID), humanSize(d.SizeBytes))
			}
			return w.Flush()
		},
	}
}

func (a *app) releaseCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "release [SANDBOX] --path DIR",
		Short: "Turn a managed directory back into a plain one and delete its checkpoints",
		Long: `Turn the managed directory DIR back into a plain directory holding its live
content, and delete all its checkpoints (clones made from them are not
affected). Stop processes that use the directory first, as for restore.
This cannot be undone: capture nothing more of it, or clone a checkpoint
first to keep one.`,
		Example: "  createos sandbox directory release sb-local --path /workspace/project",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sb, _, err := a.start(args, 0)
			if err != nil {
				return err
			}
			var raw json.RawMessage
			r, err := c.Release(cmd.Context(), sb, dir, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			_, err = fmt.Fprintf(a.stdout, "Released %s; deleted %d checkpoint(s)\n", r.Path, len(r.DeletedCheckpointIDs))
			for _, id := range r.DeletedCheckpointIDs {
				if err == nil {
					_, err = fmt.Fprintf(a.stdout, "  %s\n", id)
				}
			}
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "path", "", "absolute path of the managed directory (required)")
	_ = cmd.MarkFlagRequired("path")
	_ = cmd.MarkFlagDirname("path")
	return cmd
}

// errPatchJSON refuses --patch with -o json: the patch is text.
var errPatchJSON = errors.New("--patch prints a text diff; it does not combine with -o json")
