package cli

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/spf13/cobra"
)

// VM snapshots, as API.md's "VM snapshots and forks" states them.

func (a *app) snapshotCommand() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots"},
		Short:   "Snapshot a sandbox's VM; list, restore, pin and delete its snapshots",
		Long: `A snapshot keeps a whole sandbox: its memory, devices and disk (processes
come back running), or with --disk-only its disk alone (it comes back as a
fresh boot). They are VM-level; 'createos sandbox checkpoint' keeps one
directory. 'createos sandbox fork' makes new sandboxes from a snapshot.

SANDBOX defaults to $CREATEOS_SANDBOX_ID for create, list and get, which a
sandbox's access token may call on its own sandbox. restore, rm, pin, unpin
and 'createos sandbox fork' need the account key, and SANDBOX given.`,
	})
	cmd.AddCommand(a.snapshotCreateCommand(), a.snapshotListCommand(), a.snapshotGetCommand(),
		a.snapshotRestoreCommand(), a.snapshotRmCommand(),
		a.snapshotPinCommand(true), a.snapshotPinCommand(false))
	return cmd
}

func (a *app) snapshotCreateCommand() *cobra.Command {
	var comment, name string
	var diskOnly bool
	var maxCount int
	cmd := &cobra.Command{
		Use:   "create [SANDBOX] [--name NAME] [--disk-only] [--comment TEXT] [--retention-max-count N]",
		Short: "Snapshot a sandbox: its memory, devices and disk, or only its disk",
		Long: `Snapshot a sandbox. By default the snapshot keeps memory, devices and disk,
so that a restore or a fork has its processes running; --disk-only keeps
the disk alone (a restore or fork of it boots afresh). --name names it, once
per sandbox (name_taken): the name is accepted wherever its id is.

A sandbox holds at most 10 memory and 100 disk-only snapshots (automatic
ones not counted); at the limit the API answers snapshot_limit. With
--retention-max-count N the API deletes the oldest snapshots of the same
kind that are not pinned instead, keeping at most N; pinned ones never go.
Retention deletes, so it needs the account key: a sandbox's access token
may snapshot its own sandbox without it.`,
		Example: "  createos sandbox snapshot create sb-local --comment 'before the upgrade'\n" +
			"  createos sandbox snapshot create sb-local --name after-build && createos sandbox snapshot restore sb-local after-build\n" +
			"  createos sandbox snapshot create sb-local --disk-only --retention-max-count 20\n" +
			"  createos sandbox snapshot create --comment nightly   # inside a sandbox: SANDBOX from $CREATEOS_SANDBOX_ID",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req SnapshotCreateRequest
			if cmd.Flags().Changed("name") {
				req.Name = &name
			}
			if cmd.Flags().Changed("comment") {
				req.Comment = &comment
			}
			if diskOnly {
				memory := false
				req.Memory = &memory
			}
			if cmd.Flags().Changed("retention-max-count") {
				req.Retention = &Retention{Mode: RetentionDeleteOldest, MaxCount: maxCount}
			}
			c, sb, _, err := a.start(args, 0)
			if err != nil {
				return err
			}
			var raw json.RawMessage
			s, err := c.CreateSnapshot(cmd.Context(), sb, req, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			if err := a.writeSnapshots([]Snapshot{s}); err != nil {
				return err
			}
			return a.writeRef(s)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&diskOnly, "disk-only", false, "keep only the disk (sends memory: false); a restore of it is a fresh boot")
	f.StringVar(&name, "name", "", "a name for the snapshot, unique in the sandbox, accepted wherever its id is (1 to 64 letters, digits, '.', '_', '-')")
	f.StringVar(&comment, "comment", "", "a note kept with the snapshot (at most 256 bytes)")
	f.IntVar(&maxCount, "retention-max-count", 0, "keep at most N snapshots of this kind, deleting the oldest unpinned ones (1 to 100; sends retention delete_oldest)")
	return cmd
}

func (a *app) snapshotListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "list [SANDBOX]",
		Aliases: []string{"ls"},
		Short:   "List a sandbox's snapshots, oldest first",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sb, _, err := a.start(args, 0)
			if err != nil {
				return err
			}
			var raw json.RawMessage
			list, err := c.ListSnapshots(cmd.Context(), sb, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			if len(list) == 0 {
				_, err := fmt.Fprintln(a.stdout, "No snapshots.")
				return err
			}
			return a.writeSnapshots(list)
		},
	}
}

func (a *app) snapshotGetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get [SANDBOX] SNAPSHOT",
		Short: "Show a snapshot's record",
		Long: `Show a snapshot's record. With one argument, it is the snapshot and the
sandbox is $CREATEOS_SANDBOX_ID.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sb, rest, err := a.start(args, 1)
			if err != nil {
				return err
			}
			var raw json.RawMessage
			s, err := c.GetSnapshot(cmd.Context(), sb, rest[0], rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			if err := a.writeSnapshots([]Snapshot{s}); err != nil {
				return err
			}
			if _, err = fmt.Fprintf(a.stdout, "created: %s\n", s.CreatedAt); err != nil {
				return err
			}
			return a.writeRef(s)
		},
	}
	cmd.ValidArgsFunction = a.completeSnapshotOrDefault
	return cmd
}

func (a *app) snapshotRestoreCommand() *cobra.Command {
	var diskOnly bool
	cmd := &cobra.Command{
		Use:   "restore SANDBOX SNAPSHOT [--disk-only]",
		Short: "Put a sandbox back to a snapshot (its state before is kept as an automatic snapshot)",
		Long: `Put a sandbox back to a snapshot. Its current state is kept first, as an
automatic snapshot auto-N (disk-only when the sandbox is stopped; the
newest 5 are kept), so a restore can itself be undone.

A memory snapshot that the host's QEMU or guest image no longer matches
fails with snapshot_incompatible; --disk-only restores its disk alone, as a
fresh boot.`,
		Example: "  createos sandbox snapshot restore sb-local v2\n" +
			"  createos sandbox snapshot restore sb-local auto-1   # undo that restore",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			r, err := c.RestoreSnapshot(cmd.Context(), args[0], args[1], diskOnly, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			what := orDash(r.SnapshotID)
			if diskOnly {
				what = "the disk of " + what + " (a fresh boot)"
			}
			fmt.Fprintf(a.stdout, "Restored %s to %s; it is %s\n", args[0], what, orDash(r.State))
			if r.AutoID != "" {
				fmt.Fprintf(a.stdout, "Its state before is kept as %s: 'createos sandbox snapshot restore %s %s' undoes this\n", r.AutoID, args[0], r.AutoID)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&diskOnly, "disk-only", false, "restore only the snapshot's disk, as a fresh boot")
	cmd.ValidArgsFunction = a.completeSnapshot
	return cmd
}

func (a *app) snapshotRmCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "rm SANDBOX SNAPSHOT",
		Aliases: []string{"delete"},
		Short:   "Delete a snapshot (forks made from it are unaffected)",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			err = c.DeleteSnapshot(cmd.Context(), args[0], args[1], rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			_, err = fmt.Fprintf(a.stdout, "Deleted snapshot %s of %s\n", args[1], args[0])
			return err
		},
	}
	cmd.ValidArgsFunction = a.completeSnapshot
	return cmd
}

// snapshotPinCommand is pin (pin true) or unpin.
func (a *app) snapshotPinCommand(pin bool) *cobra.Command {
	op, short := "unpin", "Unpin a snapshot: retention may delete it again"
	if pin {
		op, short = "pin", "Pin a snapshot: retention never deletes it"
	}
	cmd := &cobra.Command{
		Use:   op + " SANDBOX SNAPSHOT",
		Short: short,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			s, err := c.PinSnapshot(cmd.Context(), args[0], args[1], pin, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			state := "pinned"
			if !s.Pinned {
				state = "not pinned"
			}
			_, err = fmt.Fprintf(a.stdout, "Snapshot %s of %s is %s\n", orDash(s.ID), args[0], state)
			return err
		},
	}
	cmd.ValidArgsFunction = a.completeSnapshot
	return cmd
}

// writeSnapshots prints records as a table.
func (a *app) writeSnapshots(list []Snapshot) error {
	w := a.table()
	// A NAME column only when a snapshot has a name.
	named := slices.ContainsFunc(list, func(s Snapshot) bool { return s.Name != "" })
	name := func(s Snapshot) string {
		if !named {
			return ""
		}
		return orDash(s.Name) + "\t"
	}
	fmt.Fprintln(w, "ID\t"+name(Snapshot{Name: "NAME"})+"KIND\tAUTO\tPINNED\tSTATUS\tSIZE\tAGE\tCOMMENT")
	for _, s := range list {
		fmt.Fprintf(w, "%s\t%s%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, name(s), snapshotKind(s), yes(s.Auto), yes(s.Pinned),
			orDash(s.Status), snapshotSize(s), age(s.CreatedAt), cell(s.Comment))
	}
	return w.Flush()
}

// writeRef prints a snapshot's ref, when the server gave one: the name of
// the snapshot on the whole deployment (a fork of it needs no sandbox).
func (a *app) writeRef(s Snapshot) error {
	if s.Ref == "" {
		return nil
	}
	_, err := fmt.Fprintf(a.stdout, "ref: %s\n", s.Ref)
	return err
}

func snapshotKind(s Snapshot) string {
	if s.Memory {
		return "memory"
	}
	return "disk"
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return ""
}

// snapshotSize is SIZE: "-" while a snapshot has no size yet (processing,
// or failed, with size_bytes 0).
func snapshotSize(s Snapshot) string {
	if s.SizeBytes == 0 && s.Status != SnapshotReady {
		return "-"
	}
	return humanSize(s.SizeBytes)
}

// humanSize is n bytes in binary units with one decimal: 512 B, 1.5 KiB,
// 76.2 MiB.
func humanSize(n int64) string {
	if n < 0 {
		return "-"
	}
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n) / 1024
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	// Compare the value as printed, so that 1048575 bytes is 1.0 MiB and
	// not 1024.0 KiB.
	for math.Round(v*10)/10 >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// cell shows free text in a table: "-" when empty, quoted when it has
// control characters (a tab or newline would break the table) or spaces
// at its ends.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	if strings.TrimSpace(s) != s || strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// completeSnapshot offers the snapshot ids of the sandbox given as the
// first argument.
func (a *app) completeSnapshot(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) != 1 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return a.snapshotIDs(cmd, args[0], toComplete)
}

// completeSnapshotOrDefault is completeSnapshot for a command whose
// SANDBOX may be left out: with no argument yet, it offers the snapshots
// of $CREATEOS_SANDBOX_ID, as completeCheckpoint does.
func (a *app) completeSnapshotOrDefault(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	switch {
	case len(args) == 1:
		return a.snapshotIDs(cmd, args[0], toComplete)
	case len(args) == 0 && a.getenv(EnvSandboxID) != "":
		return a.snapshotIDs(cmd, a.getenv(EnvSandboxID), toComplete)
	}
	return nil, cobra.ShellCompDirectiveNoFileComp
}

// snapshotIDs offers the sandbox's snapshot ids, newest first, with their
// kind and comment as descriptions, when the API can be reached.
func (a *app) snapshotIDs(cmd *cobra.Command, sandbox, toComplete string) ([]string, cobra.ShellCompDirective) {
	c, err := a.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	list, err := c.ListSnapshots(cmd.Context(), sandbox)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for i := len(list) - 1; i >= 0; i-- {
		s := list[i]
		if strings.HasPrefix(s.ID, toComplete) {
			desc := snapshotKind(s)
			if s.Comment != "" {
				desc += " " + cell(s.Comment)
			}
			out = append(out, s.ID+"\t"+desc)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
