package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"strata/internal/api"
)

// execCallMargin is how much longer than the command's timeout exec waits
// for the answer: the way through hostproxy and back, and the output.
const execCallMargin = time.Minute

// now is the clock of the AGE column (tests pin it).
var now = time.Now

// sandboxCommands are the lifecycle commands (fork among them) beside
// checkpoint, snapshot and access-token under "createos sandbox".
func (a *app) sandboxCommands() []*cobra.Command {
	cmds := []*cobra.Command{a.sandboxCreateCommand(), a.sandboxListCommand(), a.sandboxGetCommand(), a.sandboxRmCommand()}
	for _, o := range []struct{ op, target, short string }{
		{"pause", api.SandboxPaused, "Pause a running sandbox (its memory is kept); waits until it is paused"},
		{"resume", api.SandboxRunning, "Resume a paused sandbox; waits until it runs"},
		{"stop", api.SandboxStopped, "Shut a sandbox down cleanly (its disk is kept)"},
		{"start", api.SandboxRunning, "Boot a stopped sandbox (or one in error) from its disk; waits until it runs"},
	} {
		cmds = append(cmds, a.sandboxOpCommand(o.op, o.target, o.short))
	}
	return append(cmds, a.execCommand(), a.sessionCommand(), a.cpCommand(), a.forkCommand(), a.accessCommand(), a.labelsCommand(), a.networkCommand())
}

// waitFlags are --no-wait and --wait-timeout.
type waitFlags struct {
	noWait  bool
	timeout time.Duration
}

func (w *waitFlags) add(cmd *cobra.Command, what string) {
	cmd.Flags().BoolVar(&w.noWait, "no-wait", false, "answer at once instead of waiting until the sandbox "+what)
	cmd.Flags().DurationVar(&w.timeout, "wait-timeout", 5*time.Minute, "give up waiting after this long")
}

// wait asks for the sandbox with wait_s (the server answers once the
// sandbox has left a state on its way to another, or after wait_s) until
// it is in state target. It fails when the sandbox goes to error (with the
// record's reason), settles in another state, or is not there in time.
func (w *waitFlags) wait(ctx context.Context, c *Client, id, target string) (Sandbox, json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	last := "?"
	for {
		var raw json.RawMessage
		sb, err := c.WaitSandbox(ctx, id, c.LongPoll(ctx), rawAnswer(&raw))
		if err != nil {
			if ctx.Err() != nil {
				return Sandbox{}, nil, w.late(ctx, id, last, target)
			}
			return Sandbox{}, nil, wrap(err)
		}
		last = sb.State
		switch {
		case sb.State == target:
			return sb, raw, nil
		case sb.State == api.SandboxError:
			reason := sb.Error
			if reason == "" {
				reason = "no reason given"
			}
			return sb, raw, &callError{fmt.Errorf("sandbox %s went to state error: %s", id, reason)}
		case !api.SandboxTransient(sb.State) && sb.LastError != nil:
			// Answered 202, then failed on the host: the record says why.
			e := sb.LastError
			return sb, raw, &callError{fmt.Errorf("sandbox %s is %s, not %s: its %s failed: %s: %s", id, sb.State, target, e.Operation, e.Code, e.Message)}
		case !api.SandboxTransient(sb.State):
			return sb, raw, &callError{fmt.Errorf("sandbox %s is %s, not %s", id, sb.State, target)}
		}
		// Still on its way (the server's wait ran out): ask again, after
		// a breath in case the server answered early.
		t := time.NewTimer(minPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return Sandbox{}, nil, w.late(ctx, id, last, target)
		case <-t.C:
		}
	}
}

// late is the error of a wait that ran out of time (or was interrupted).
func (w *waitFlags) late(ctx context.Context, id, last, target string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &callError{fmt.Errorf("sandbox %s is still %s, not %s, after %v (--wait-timeout); see 'createos sandbox get %s'", id, last, target, w.timeout, id)}
	}
	return &callError{fmt.Errorf("stopped waiting for sandbox %s (%s): %w", id, last, context.Cause(ctx))}
}

func (a *app) sandboxCreateCommand() *cobra.Command {
	var memory, vcpus, disk int
	var access string
	var env, labels []string
	var w waitFlags
	var nf networkFlags
	cmd := &cobra.Command{
		Use:   "create [NAME] [--memory-mib N] [--vcpus N] [--disk-gib N] [--env K=V]... [--label k=v]... [--access none|SCOPE,…] [--egress all|none|list] [--allow RULE]... [--deny RULE]... [--no-wait]",
		Short: "Create a sandbox (a microVM) and wait until it runs",
		Long: `Create a sandbox: a microVM booted from the guest image. Resources the
flags leave out take the API's defaults (512 MiB of memory, 1 vCPU, a 4 GiB
disk). createos waits until the sandbox runs, polling as the API says, and
fails with the sandbox's reason if it goes to state error; --no-wait prints
the record in state creating at once.

NAME is optional: 1 to 63 lowercase letters, digits and '-', starting with a
letter, not ending with '-' and not starting with sb- (an id's prefix),
unique among the account's sandboxes. Every command takes a sandbox's name
wherever it takes its id.

--env NAME=VALUE (repeat for more) is the environment of every exec and
session of the sandbox, under the command's own --env; --label KEY=VALUE
(repeat for more) labels it ('createos sandbox list --label', 'createos
sandbox labels').

--access is what processes inside may do with the key their guest is
handed: scopes joined by commas (checkpoints, snapshots, exec, files, ports,
watch; default checkpoints,snapshots), or none for no key at all (see
'createos sandbox access').

--egress, --allow and --deny are its network (see 'createos sandbox
network'): all by default; --allow alone makes a list.`,
		Example: "  createos sandbox create web-1 --memory-mib 1024 --vcpus 2\n" +
			"  createos sandbox create scratch --env CI=1 --label owner=docs\n" +
			"  createos sandbox create ci --access none\n" +
			"  createos sandbox create build --egress list --allow pypi.org --allow '*.github.com'\n" +
			"  id=$(createos sandbox create --no-wait -o json | jq -r .id)",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req api.SandboxCreateRequest
			if len(args) == 1 {
				if err := checkSandboxName(args[0]); err != nil {
					return err
				}
				req.Name = &args[0]
			}
			var err error
			if req.Env, err = parseAssignments("--env", env); err != nil {
				return err
			}
			if req.Labels, err = parseAssignments("--label", labels); err != nil {
				return err
			}
			if cmd.Flags().Changed("memory-mib") {
				req.MemoryMiB = &memory
			}
			if cmd.Flags().Changed("vcpus") {
				req.VCPUs = &vcpus
			}
			if cmd.Flags().Changed("disk-gib") {
				req.DiskGiB = &disk
			}
			if cmd.Flags().Changed("access") {
				acc, err := parseAccess("--access", access)
				if err != nil {
					return err
				}
				req.SetAccess(acc)
			}
			if req.Network, err = nf.setting(cmd); err != nil {
				return err
			}
			return a.createSandbox(cmd.Context(), req, &w)
		},
	}
	cmd.Flags().IntVar(&memory, "memory-mib", api.DefaultMemoryMiB, fmt.Sprintf("memory in MiB (%d to %d)", api.MinMemoryMiB, api.MaxMemoryMiB))
	cmd.Flags().IntVar(&vcpus, "vcpus", api.DefaultVCPUs, fmt.Sprintf("virtual CPUs (%d to %d)", api.MinVCPUs, api.MaxVCPUs))
	cmd.Flags().IntVar(&disk, "disk-gib", api.DefaultDiskGiB, fmt.Sprintf("disk in GiB (%d to %d)", api.MinDiskGiB, api.MaxDiskGiB))
	cmd.Flags().StringVar(&access, "access", "", "what the key handed to the guest may do: none, or scopes joined by commas (default checkpoints,snapshots)")
	addEnvAndLabels(cmd, &env, &labels)
	nf.add(cmd)
	w.add(cmd, "runs")
	return cmd
}

// createSandbox sends one create (a new sandbox or a fork), waits until
// the sandbox runs unless w says not to, and prints its record.
func (a *app) createSandbox(ctx context.Context, req api.SandboxCreateRequest, w *waitFlags) error {
	c, err := a.client()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	sb, err := c.CreateSandbox(ctx, req, rawAnswer(&raw))
	if err != nil {
		return wrap(err)
	}
	if !w.noWait && sb.State != api.SandboxRunning {
		if sb, raw, err = w.wait(ctx, c, sb.ID, api.SandboxRunning); err != nil {
			return err
		}
	}
	if a.output == "json" {
		return a.writeJSON(raw)
	}
	return a.writeSandboxes([]Sandbox{sb})
}

func (a *app) sandboxListCommand() *cobra.Command {
	var limit, offset int
	var labels []string
	cmd := &cobra.Command{
		Use:     "list [--label k=v]... [--limit N] [--offset N]",
		Aliases: []string{"ls"},
		Short:   "List the account's sandboxes, oldest first, one page at a time",
		Long: `List the account's sandboxes, oldest first, one page at a time. With
--label KEY=VALUE (repeat for more), only those that have every one of
these labels. A LABELS column shows when any sandbox listed has labels.`,
		Example: "  createos sandbox list --label owner=docs\n" +
			"  createos sandbox list -o json --limit 500 | jq -r '.data[].name'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var lo ListOptions
			if cmd.Flags().Changed("limit") {
				lo.Limit = &limit
			}
			if cmd.Flags().Changed("offset") {
				lo.Offset = &offset
			}
			if lo.Labels, err = parseAssignments("--label", labels); err != nil {
				return err
			}
			var raw json.RawMessage
			list, err := c.ListSandboxes(cmd.Context(), lo, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			p := list.Pagination
			if len(list.Data) == 0 {
				if p.Total > 0 {
					_, err := fmt.Fprintf(a.stdout, "No sandboxes at offset %d (%d in all).\n", p.Offset, p.Total)
					return err
				}
				_, err := fmt.Fprintln(a.stdout, "No sandboxes.")
				return err
			}
			if err := a.writeSandboxes(list.Data); err != nil {
				return err
			}
			if p.Offset > 0 || p.Offset+p.Count < p.Total {
				fmt.Fprintf(a.stdout, "%d to %d of %d", p.Offset+1, p.Offset+p.Count, p.Total)
				if next := p.Offset + p.Count; next < p.Total {
					fmt.Fprintf(a.stdout, "; next page: --offset %d", next)
				}
				fmt.Fprintln(a.stdout)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "sandboxes per page (1 to 500)")
	cmd.Flags().IntVar(&offset, "offset", 0, "sandboxes to skip")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "KEY=VALUE: only sandboxes with this label (repeat: all must match)")
	return cmd
}

func (a *app) sandboxGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get SANDBOX",
		Short: "Show a sandbox's record",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			sb, err := c.GetSandbox(cmd.Context(), args[0], rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			if err := a.writeSandboxes([]Sandbox{sb}); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "created: %s\n", sb.CreatedAt)
			if sb.Access != nil {
				fmt.Fprintf(a.stdout, "access: %s\n", sb.Access)
			}
			if n := sb.Network; n != nil {
				fmt.Fprintf(a.stdout, "network: %s", n.Egress)
				if len(n.Allow) > 0 {
					fmt.Fprintf(a.stdout, ", allow %s", strings.Join(n.Allow, ","))
				}
				if len(n.Deny) > 0 {
					fmt.Fprintf(a.stdout, ", deny %s", strings.Join(n.Deny, ","))
				}
				fmt.Fprintln(a.stdout)
			}
			if sb.From != nil {
				fmt.Fprintf(a.stdout, "from: snapshot %s of %s\n", sb.From.Snapshot, sb.From.Sandbox)
			}
			if len(sb.Labels) > 0 {
				fmt.Fprintf(a.stdout, "labels: %s\n", joinAssignments(sb.Labels))
			}
			for _, k := range sortedKeys(sb.Env) {
				fmt.Fprintf(a.stdout, "env: %s=%s\n", k, sb.Env[k])
			}
			if sb.Error != "" {
				fmt.Fprintf(a.stdout, "error: %s\n", sb.Error)
			}
			if e := sb.LastError; e != nil {
				fmt.Fprintf(a.stdout, "last error: %s at %s: %s: %s\n", e.Operation, e.At, e.Code, e.Message)
			}
			return nil
		},
	}
}

func (a *app) sandboxRmCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "rm SANDBOX",
		Aliases: []string{"delete", "destroy"},
		Short:   "Destroy a sandbox: its VM, disk, checkpoints and snapshots",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			st, err := c.SandboxOp(cmd.Context(), "rm", args[0], rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			_, err = fmt.Fprintf(a.stdout, "Destroyed %s\n", orDash(st.ID))
			return err
		},
	}
}

// sandboxOpCommand is pause, resume, stop or start: the operation, then,
// when the answer is a state on the way, a wait for target.
func (a *app) sandboxOpCommand(op, target, short string) *cobra.Command {
	var w waitFlags
	cmd := &cobra.Command{
		Use:   op + " SANDBOX",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			id := args[0]
			var raw json.RawMessage
			st, err := c.SandboxOp(cmd.Context(), op, id, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if !w.noWait && st.State != target && api.SandboxTransient(st.State) {
				sb, sraw, err := w.wait(cmd.Context(), c, id, target)
				if err != nil {
					return err
				}
				st, raw = SandboxState{ID: sb.ID, State: sb.State}, sraw
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			_, err = fmt.Fprintf(a.stdout, "%s is %s\n", id, st.State)
			return err
		},
	}
	if op != "stop" { // stop answers once the sandbox is stopped
		w.add(cmd, "is "+target)
	}
	return cmd
}

// execTimeout is exec's --timeout: whole seconds, given as a number
// ("90") or a duration ("90s", "5m"); 0 when not given.
type execTimeout int

func (t *execTimeout) String() string {
	if *t == 0 {
		return ""
	}
	return strconv.Itoa(int(*t))
}

func (t *execTimeout) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		d, derr := time.ParseDuration(s)
		if derr != nil || d%time.Second != 0 {
			return errors.New("want whole seconds, such as 90 or 5m")
		}
		n = int(d / time.Second)
	}
	if n < 1 || n > api.MaxExecTimeoutS {
		return fmt.Errorf("want 1 to %d seconds", api.MaxExecTimeoutS)
	}
	*t = execTimeout(n)
	return nil
}

func (t *execTimeout) Type() string { return "seconds" }

// exitStatus ends createos with the status of a command run by exec; Run
// prints nothing more for it.
type exitStatus struct{ code int }

func (e *exitStatus) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func (a *app) execCommand() *cobra.Command {
	var cwd, stdinFile string
	var env []string
	var timeout execTimeout
	var interactive, tty, detach bool
	cmd := &cobra.Command{
		Use:   "exec SANDBOX [-i] [-t] [--detach] [--cwd DIR] [--env K=V]... [--timeout S] [--stdin-file FILE] -- COMMAND [ARG]...",
		Short: "Run a command in a sandbox, streaming its output, and exit with its status",
		Long: `Run a command in a running sandbox, without a shell (give "sh -c '…'" for
one), and copy its stdout and stderr here as they come, byte for byte.
createos exits with the command's exit status (128+N when signal N killed
it); when --timeout passes, the command's whole process group is killed and
createos exits 124.

Put -- before the command, so that its own flags are not taken for
createos's. --timeout is the command's (at most 3600 s; default 60 s, and
none with -i, -t or --detach). -i
sends createos's standard input to the command (its end closes the
command's); -t gives the command a terminal, this one's size (raw mode
here when standard input is a terminal; its size changes follow). The
command runs as an exec session (createos sandbox session): if createos
is cut off, the command gets SIGHUP. --detach starts it as a session that
stays, prints its id and returns at once (attach with 'createos sandbox
session attach').

With -o json or --stdin-file (a file of UTF-8 text up to 1 MiB), the
command runs as one call instead: its output comes at the end, each
stream up to 1 MiB (a note says when one was cut); -o json prints the
API's answer as is, stdout and stderr base64-encoded.`,
		Example: "  createos sandbox exec sb-local -- uname -a\n" +
			"  createos sandbox exec sb-local --cwd /workspace --env CI=1 --timeout 10m -- make test\n" +
			"  createos sandbox exec -it sb-local -- bash\n" +
			"  createos sandbox exec -i sb-local -- tar -C /workspace -xz < workspace.tgz",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return errors.New("give SANDBOX, then -- and the command to run")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			req := api.ExecRequest{Cmd: args[1:], Cwd: cwd, TimeoutS: int(timeout), Encoding: api.EncodingBase64}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return fmt.Errorf("--env %q: want NAME=VALUE", kv)
				}
				if req.Env == nil {
					req.Env = map[string]string{}
				}
				req.Env[k] = v
			}
			oneCall := a.output == "json" || stdinFile != ""
			if oneCall && (interactive || tty || detach) {
				return errors.New("-i, -t and --detach stream through a session: not with -o json or --stdin-file")
			}
			if stdinFile != "" {
				in, err := readStdinFile(stdinFile)
				if err != nil {
					return err
				}
				req.Stdin = in
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			wait := time.Duration(api.DefaultExecTimeoutS) * time.Second
			if timeout != 0 {
				wait = time.Duration(timeout) * time.Second
			}
			if !oneCall {
				sreq := api.SessionRequest{Cmd: req.Cmd, Cwd: req.Cwd, Env: req.Env, TTY: tty, Detachable: detach, TimeoutS: int(wait / time.Second)}
				if timeout == 0 && (interactive || tty || detach) {
					sreq.TimeoutS = 0 // a shell, or a command that stays: none unless given
				}
				if detach {
					se, err := c.StartSession(cmd.Context(), args[0], sreq)
					if err != nil {
						return wrap(err)
					}
					fmt.Fprintln(a.stdout, se.ID)
					return nil
				}
				return a.runSession(cmd.Context(), c, args[0], sreq, interactive)
			}
			c.HTTP = newHTTPClient(wait + execCallMargin)
			var raw json.RawMessage
			res, err := c.Exec(cmd.Context(), args[0], req, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				if err := a.writeJSON(raw); err != nil {
					return err
				}
			} else if err := a.copyOutput(res); err != nil {
				return err
			}
			if res.TimedOut {
				return a.exitWith(-1, int(wait/time.Second))
			}
			return a.exitWith(res.ExitCode, 0)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cwd, "cwd", "", "absolute working directory of the command (default /)")
	f.StringArrayVar(&env, "env", nil, "NAME=VALUE added to the command's environment (repeat for more)")
	f.Var(&timeout, "timeout", "kill the command after this many seconds, or a duration such as 5m (1 to 3600; default 60)")
	f.StringVar(&stdinFile, "stdin-file", "", "send this file (UTF-8 text, at most 1 MiB) as the command's stdin, in one call")
	f.BoolVarP(&interactive, "interactive", "i", false, "send standard input to the command")
	f.BoolVarP(&tty, "tty", "t", false, "give the command a terminal")
	f.BoolVar(&detach, "detach", false, "start the command as a session that stays, print its id and return")
	_ = cmd.MarkFlagFilename("stdin-file")
	return cmd
}

// copyOutput writes the command's stdout and stderr here as they were.
func (a *app) copyOutput(res ExecResult) error {
	for _, s := range []struct {
		w    io.Writer
		data string
	}{{a.stdout, res.Stdout}, {a.stderr, res.Stderr}} {
		b, err := base64.StdEncoding.DecodeString(s.data)
		if err != nil {
			return &callError{fmt.Errorf("the API sent output that is not base64: %w", err)}
		}
		if _, err := s.w.Write(b); err != nil {
			return err
		}
	}
	if res.Truncated {
		fmt.Fprintf(a.stderr, "createos: the output was cut at %d bytes per stream (truncated)\n", api.MaxExecOutput)
	}
	return nil
}

// readStdinFile reads --stdin-file: UTF-8 text of at most MaxExecStdin
// bytes, since the API takes stdin as a JSON string.
func readStdinFile(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", fmt.Errorf("--stdin-file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, api.MaxExecStdin+1))
	if err != nil {
		return "", fmt.Errorf("--stdin-file: %w", err)
	}
	if len(b) > api.MaxExecStdin {
		return "", fmt.Errorf("--stdin-file %s: over 1 MiB, the most the API takes", name)
	}
	if !utf8.Valid(b) {
		return "", fmt.Errorf("--stdin-file %s: not UTF-8 text; the API takes stdin as a JSON string", name)
	}
	return string(b), nil
}

// writeSandboxes prints records as a table, with a LABELS column when
// any has labels.
func (a *app) writeSandboxes(list []Sandbox) error {
	w := a.table()
	labeled := slices.ContainsFunc(list, func(sb Sandbox) bool { return len(sb.Labels) > 0 })
	head := "ID\tNAME\tSTATE\tMEMORY\tVCPUS\tDISK\tAGE"
	if labeled {
		head += "\tLABELS"
	}
	fmt.Fprintln(w, head)
	for _, sb := range list {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d MiB\t%d\t%d GiB\t%s", sb.ID, orDash(sb.Name), sb.State, sb.MemoryMiB, sb.VCPUs, sb.DiskGiB, age(sb.CreatedAt))
		if labeled {
			fmt.Fprintf(w, "\t%s", cell(orDash(joinAssignments(sb.Labels))))
		}
		fmt.Fprintln(w)
	}
	return w.Flush()
}

// age is how long ago created_at was, in its largest unit: 45s, 12m, 5h,
// 3d; "-" when it cannot be read.
func age(createdAt string) string {
	t, err := time.Parse(time.RFC3339, createdAt)
	if err != nil {
		return "-"
	}
	d := max(now().Sub(t), 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}
