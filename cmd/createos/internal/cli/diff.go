package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/spf13/cobra"

	"strata/internal/api"
)

func (a *app) diffCommand() *cobra.Command {
	var against string
	var live, patch bool
	cmd := &cobra.Command{
		Use:   "diff [SANDBOX] CHECKPOINT [--against CHECKPOINT2 | --live] [--patch]",
		Short: "Show what a checkpoint changed: against its parent, another checkpoint or the live directory",
		Long: `Show what a checkpoint changed, one line per added, modified or deleted
entry, sorted by path:

  (no flag)            from its parent (the checkpoint it continued from)
                       to the checkpoint
  --against CHECKPOINT2  from CHECKPOINT2 (of the same directory) to the checkpoint
  --live               from the checkpoint to the live directory: what
                       changed since, unsaved

--patch prints a unified diff of the text files instead (as diff -u and
git diff do: a/ the older side, b/ the newer one), both sides read
through the files route. A file that is not UTF-8 text, or holds a NUL
byte, is "Binary files … differ"; one over 4 MiB is named and skipped.
With --live, the live side of each file is read in the sandbox with
exec (sh and cat, as root; the files route reads checkpoints only), up
to 1 MiB a file. A checkpoint without a listed parent (the first of its
directory, or one whose parent was deleted) shows its added files in
full and names the others on stderr.`,
		Example: "  createos sandbox checkpoint diff sb-local cp_…\n" +
			"  createos sandbox checkpoint diff cp_NEW --against cp_OLD --patch\n" +
			"  createos sandbox checkpoint diff cp_… --live",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if patch && a.output == "json" {
				return errPatchJSON
			}
			if cmd.Flags().Changed("against") && against == "" {
				return errors.New("--against: want a checkpoint id (cp_…) or name")
			}
			c, sb, rest, err := a.startCheckpoint(cmd.Context(), args, 1)
			if err != nil {
				return err
			}
			if against != "" {
				if against, err = a.checkpointID(cmd.Context(), c, sb, against); err != nil {
					return err
				}
			}
			id := rest[0]
			q := against
			if live {
				q = api.AgainstLive
			}
			var raw json.RawMessage
			changes, err := c.Changes(cmd.Context(), sb, id, q, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			if !patch {
				return a.writeChanges(changes)
			}
			if live {
				dir, err := a.pathOf(cmd.Context(), c, sb, id)
				if err != nil {
					return err
				}
				p := patcher{ctx: cmd.Context(), c: c, sb: sb, oldID: id, newID: "live", liveDir: dir, w: a.stdout, notes: a.stderr}
				return p.write(changes)
			}
			old := against
			if old == "" {
				if old, err = a.parentOf(cmd.Context(), c, sb, id); err != nil {
					return err
				}
			}
			p := patcher{ctx: cmd.Context(), c: c, sb: sb, oldID: old, newID: id, w: a.stdout, notes: a.stderr}
			return p.write(changes)
		},
	}
	f := cmd.Flags()
	f.StringVar(&against, "against", "", "compare with this checkpoint of the same directory (the older side)")
	f.BoolVar(&live, "live", false, "compare the checkpoint with the live directory (the newer side)")
	f.BoolVar(&patch, "patch", false, "print a unified diff of the changed text files")
	cmd.MarkFlagsMutuallyExclusive("against", "live")
	cmd.ValidArgsFunction = a.completeCheckpoint
	return cmd
}

// parentOf is the parent_id of checkpoint id, from the list: "" when it
// has none, or when its parent was deleted (the files route cannot read
// a deleted checkpoint; the changes are then against the nearest older
// state the store kept, which has no id).
func (a *app) parentOf(ctx context.Context, c *Client, sb, id string) (string, error) {
	list, err := c.ListCheckpoints(ctx, sb)
	if err != nil {
		return "", wrap(err)
	}
	listed := map[string]bool{}
	for _, cp := range list {
		listed[cp.ID] = true
	}
	for _, cp := range list {
		if cp.ID == id && listed[cp.ParentID] {
			return cp.ParentID, nil
		}
	}
	return "", nil
}

// pathOf is the directory of checkpoint id, from the list.
func (a *app) pathOf(ctx context.Context, c *Client, sb, id string) (string, error) {
	list, err := c.ListCheckpoints(ctx, sb)
	if err != nil {
		return "", wrap(err)
	}
	for _, cp := range list {
		if cp.ID == id {
			return cp.Path, nil
		}
	}
	return "", wrap(&APIError{Status: http.StatusNotFound, Code: "checkpoint_not_found", Message: "no checkpoint has this id"})
}

func (a *app) writeChanges(changes []Change) error {
	if len(changes) == 0 {
		_, err := fmt.Fprintln(a.stdout, "No changes.")
		return err
	}
	w := a.table()
	fmt.Fprintln(w, "CHANGE\tTYPE\tSIZE\tPATH")
	for _, ch := range changes {
		size := humanSize(ch.Size)
		if ch.Type == "dir" {
			size = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", ch.Change, ch.Type, size, ch.Path)
	}
	return w.Flush()
}

// patcher writes the unified diff of changes between two checkpoints,
// reading each text file's sides through the files route.
type patcher struct {
	ctx          context.Context
	c            *Client
	sb           string
	oldID, newID string // oldID "" when the older side has no checkpoint
	// liveDir, when set, is the managed directory whose live files are
	// the newer side (newID is then only a label), read with exec.
	liveDir  string
	w, notes io.Writer
}

// side is one side of a file: absent (the file is not there), or its
// content; skip says why it cannot be shown.
type side struct {
	present bool
	content []byte
	skip    string
}

func (p *patcher) write(changes []Change) error {
	for _, ch := range changes {
		if ch.Type != "file" && ch.Change != "modified" {
			continue
		}
		var older, newer side
		var err error
		if ch.Change != "added" {
			if p.oldID == "" {
				fmt.Fprintf(p.notes, "note: %s: %s has no listed parent checkpoint to read the older side from; skipped\n", ch.Path, p.newID)
				continue
			}
			if older, err = p.read(p.oldID, ch.Path); err != nil {
				return err
			}
		}
		if ch.Change != "deleted" {
			read := p.read
			if p.liveDir != "" {
				read = p.readLive
			}
			if newer, err = read(p.newID, ch.Path); err != nil {
				return err
			}
		}
		if err := p.file(ch.Path, older, newer); err != nil {
			return err
		}
	}
	return nil
}

// read fetches path from checkpoint id: a file's content; anything else
// (a directory, a symlink, nothing) is absent from a text diff.
func (p *patcher) read(id, path string) (side, error) {
	e, err := p.c.ReadEntry(p.ctx, p.sb, id, path)
	var apiErr *APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.Code == "entry_not_found":
		return side{}, nil
	case errors.As(err, &apiErr) && apiErr.Code == "file_too_large":
		return side{present: true, skip: "larger than 4 MiB"}, nil
	case err != nil:
		return side{}, wrap(err)
	case e.Content == nil:
		return side{}, nil
	}
	return side{present: true, content: *e.Content}, nil
}

// liveRead is the program that reads one live file in the sandbox: its
// bytes when it is a regular file (not a symlink), exit status 3 when it
// is anything else or nothing.
var liveRead = []string{"sh", "-c", `[ -f "$1" ] && [ ! -L "$1" ] || exit 3; exec cat -- "$1"`, "sh"}

// readLive reads path of the live directory with exec; the label is
// unused (the live side has no checkpoint).
func (p *patcher) readLive(_, path string) (side, error) {
	req := api.ExecRequest{Cmd: append(slices.Clone(liveRead), p.liveDir+"/"+path), Encoding: api.EncodingBase64, TimeoutS: 30}
	res, err := p.c.Exec(p.ctx, p.sb, req)
	switch {
	case err != nil:
		return side{}, wrap(err)
	case res.ExitCode == 3:
		return side{}, nil
	case res.Truncated:
		return side{present: true, skip: fmt.Sprintf("larger than %d MiB in the live directory", api.MaxExecOutput>>20)}, nil
	case res.ExitCode != 0 || res.TimedOut:
		return side{present: true, skip: "the live file could not be read: " + strings.TrimSpace(decodeOr(res.Stderr))}, nil
	}
	b, err := base64.StdEncoding.DecodeString(res.Stdout)
	if err != nil {
		return side{}, fmt.Errorf("exec output of %s: %w", path, err)
	}
	return side{present: true, content: b}, nil
}

// decodeOr is s decoded from base64, or s when it is not base64.
func decodeOr(s string) string {
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return string(b)
	}
	return s
}

func (p *patcher) file(path string, older, newer side) error {
	if !older.present && !newer.present {
		return nil
	}
	for _, s := range []side{older, newer} {
		if s.skip != "" {
			fmt.Fprintf(p.notes, "note: %s: %s; not shown\n", path, s.skip)
			return nil
		}
	}
	from, to := "a/"+path, "b/"+path
	fromDate, toDate := p.oldID, p.newID
	if !older.present {
		from, fromDate = "/dev/null", ""
	}
	if !newer.present {
		to, toDate = "/dev/null", ""
	}
	if !isText(older.content) || !isText(newer.content) {
		_, err := fmt.Fprintf(p.w, "Binary files %s and %s differ\n", from, to)
		return err
	}
	return difflib.WriteUnifiedDiff(p.w, difflib.UnifiedDiff{
		A: splitLines(older.content), B: splitLines(newer.content),
		FromFile: from, ToFile: to, FromDate: fromDate, ToDate: toDate, Context: 3,
	})
}

// isText reports whether b is shown as text: valid UTF-8 without NUL.
func isText(b []byte) bool { return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 }

// noNewline is how diff -u marks a last line without a newline.
const noNewline = "\n\\ No newline at end of file\n"

// splitLines splits b into lines that keep their "\n"; a last line
// without one carries diff's marker instead, so that it differs from the
// same line with a newline and prints as diff -u prints it. (difflib's
// own SplitLines adds an empty line at the end of every text.)
func splitLines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	lines := strings.SplitAfter(string(b), "\n")
	if last := lines[len(lines)-1]; last == "" {
		lines = lines[:len(lines)-1]
	} else {
		lines[len(lines)-1] = last + noNewline
	}
	return lines
}
