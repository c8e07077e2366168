package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strata/client"
	"strata/internal/api"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// Environment variables read by createos.
const (
	EnvAPIURL    = client.EnvAPIURL
	EnvAPIKey    = client.EnvAPIKey
	EnvSandboxID = client.EnvSandboxID
	// EnvCredentials names the env file guestd writes inside a sandbox,
	// from which createos takes what its flags and environment lack.
	EnvCredentials = client.EnvCredentials
	// DefaultCredentials is that file's path when EnvCredentials is unset.
	DefaultCredentials = client.DefaultCredentials
)

// fileValues are the values createos may take from the credentials file,
// and what each is, for the notes that say so.
var fileValues = []struct{ name, what string }{
	{EnvAPIURL, "the API address"},
	{EnvAPIKey, "the API key"},
	{EnvSandboxID, "the sandbox"},
}

// Run executes one createos command line and returns its exit status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	env := newEnvironment(getenv)
	a := &app{stdout: stdout, stderr: stderr, env: env, getenv: env.get, used: map[string]bool{}}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var apiErr *APIError
	var callErr *callError
	var exit *exitStatus
	switch {
	case errors.As(err, &exit): // exec: the command's own status
		return exit.code
	case errors.As(err, &apiErr):
		a.printAPIError(apiErr)
		if a.output != "json" {
			a.printFileNotes()
		}
		return 1
	case errors.As(err, &callErr):
		fmt.Fprintln(stderr, "createos:", callErr.err)
		a.printFileNotes()
		return 1
	default:
		fmt.Fprintln(stderr, "createos:", err)
		a.printFileNotes()
		fmt.Fprintln(stderr, "Run 'createos --help' for usage.")
		return 2
	}
}

// printFileNotes says which of the values used came from the credentials
// file rather than from a flag or the environment: a stale key left there
// must not fail as though it were the one the user gave.
func (a *app) printFileNotes() {
	for _, v := range fileValues {
		if a.used[v.name] && a.env.inFile(v.name) {
			fmt.Fprintf(a.stderr, "  note: %s came from %s (%s there), not from a flag or the environment\n", v.what, a.env.File, v.name)
		}
	}
}

// callError is a failure to talk to the API at all (network, timeout).
type callError struct{ err error }

func (e *callError) Error() string { return e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

type app struct {
	stdout, stderr io.Writer
	env            *environment
	getenv         func(string) string // env.get
	// used names the variables whose values a command used (not
	// overridden by a flag), for printFileNotes.
	used map[string]bool

	apiURL, apiKey, output string
	timeout                time.Duration
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "createos",
		Short: "Directory checkpoints of CreateOS sandboxes",
		Long: `createos drives the checkpoint API of a sandbox: capture a directory,
list and draw its checkpoints, restore one, delete one, and manage the
sandbox's access token. It also creates and runs sandboxes (microVMs),
snapshots them whole, restores them and forks them.

The API address comes from --api-url or $CREATEOS_API_URL and the key from
--api-key or $CREATEOS_API_KEY. SANDBOX defaults to $CREATEOS_SANDBOX_ID for
the checkpoint and access-token commands and for snapshot create, list and
get; every other command that takes SANDBOX (sandbox get, rm, exec and the
like; snapshot restore, rm, pin and unpin; fork) needs it given.
What these leave unset is read from the sandbox's credentials file
($CREATEOS_CREDENTIALS, default /run/strata/credentials.env), and an error
says which values came from there.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.apiURL, "api-url", "", "API base URL (default $CREATEOS_API_URL)")
	pf.StringVar(&a.apiKey, "api-key", "", "account API key or sandbox access token (default $CREATEOS_API_KEY)")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	pf.DurationVar(&a.timeout, "timeout", 2*time.Minute, "give up on a call after this long")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))

	sandbox := group(&cobra.Command{Use: "sandbox", Short: "Work with a sandbox"})
	sandbox.AddCommand(a.checkpointCommand(), a.directoryCommand(), a.snapshotCommand(), a.tokenCommand())
	sandbox.AddCommand(a.sandboxCommands()...)
	root.AddCommand(sandbox)
	return root
}

// client checks the global flags and returns an API client.
func (a *app) client() (*Client, error) {
	if a.output != "table" && a.output != "json" {
		return nil, fmt.Errorf("--output %q: want table or json", a.output)
	}
	url := a.apiURL
	if url == "" {
		url = a.fromEnv(EnvAPIURL)
	}
	if url == "" {
		return nil, fmt.Errorf("no API address: pass --api-url or set %s (%s has none either)", EnvAPIURL, a.env.File)
	}
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("API address %q: want an http:// or https:// URL", url)
	}
	key := a.apiKey
	if key == "" {
		key = a.fromEnv(EnvAPIKey)
	}
	if key == "" {
		return nil, fmt.Errorf("no API key: pass --api-key or set %s (%s has none either)", EnvAPIKey, a.env.File)
	}
	return &Client{BaseURL: url, Key: key, HTTP: newHTTPClient(a.timeout)}, nil
}

// group makes cmd a command that only holds others: run alone it prints
// its help; with an unknown subcommand it is a usage error.
func group(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	return cmd
}

// fromEnv is a.getenv(name), marking name as used; call it only where a
// flag did not already give the value.
func (a *app) fromEnv(name string) string {
	a.used[name] = true
	return a.getenv(name)
}

// start is the beginning of every command: the API client, the sandbox
// and the other arguments.
func (a *app) start(args []string, want int) (*Client, string, []string, error) {
	c, err := a.client()
	if err != nil {
		return nil, "", nil, err
	}
	sb, rest, err := a.sandboxArg(args, want)
	return c, sb, rest, err
}

// startCheckpoint is start for a command whose first argument after the
// sandbox is a checkpoint: rest[0] is then its id, found by name when it
// is not one (checkpointID).
func (a *app) startCheckpoint(ctx context.Context, args []string, want int) (*Client, string, []string, error) {
	c, sb, rest, err := a.start(args, want)
	if err != nil {
		return nil, "", nil, err
	}
	if rest[0], err = a.checkpointID(ctx, c, sb, rest[0]); err != nil {
		return nil, "", nil, err
	}
	return c, sb, rest, nil
}

// checkpointID is arg when it is a checkpoint id, and otherwise the id of
// the one checkpoint of sandbox sb named arg: none is
// checkpoint_not_found, several a usage error that lists them.
func (a *app) checkpointID(ctx context.Context, c *Client, sb, arg string) (string, error) {
	if api.ValidCheckpointID(arg) {
		return arg, nil
	}
	all, err := c.ListCheckpoints(ctx, sb)
	if err != nil {
		return "", wrap(err)
	}
	var ids []string
	for _, cp := range all {
		if cp.Name == arg {
			ids = append(ids, cp.ID)
		}
	}
	switch len(ids) {
	case 0:
		name, _ := json.Marshal(arg)
		return "", &APIError{Status: 404, Code: "checkpoint_not_found", Message: "no checkpoint of this sandbox has this id or name",
			Fields: map[string]json.RawMessage{"checkpoint": name}}
	case 1:
		return ids[0], nil
	}
	return "", fmt.Errorf("%d checkpoints of %s are named %q (%s): give one's id", len(ids), sb, arg, strings.Join(ids, ", "))
}

// sandboxArg splits args into the sandbox (args[0] when there are want+1
// arguments, else $CREATEOS_SANDBOX_ID) and the rest.
func (a *app) sandboxArg(args []string, want int) (string, []string, error) {
	if len(args) == want+1 {
		return args[0], args[1:], nil
	}
	sb := a.fromEnv(EnvSandboxID)
	if sb == "" {
		return "", nil, fmt.Errorf("no sandbox: give SANDBOX or set %s (%s has none either)", EnvSandboxID, a.env.File)
	}
	return sb, args, nil
}

// wrap turns a failed call into the error that Run reports as exit 1.
func wrap(err error) error {
	if err == nil {
		return nil
	}
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		return err
	}
	return &callError{err}
}

// writeJSON prints data as indented JSON.
func (a *app) writeJSON(data json.RawMessage) error {
	var b bytes.Buffer
	if err := json.Indent(&b, data, "", "  "); err != nil {
		return err
	}
	b.WriteByte('\n')
	_, err := a.stdout.Write(b.Bytes())
	return err
}

func (a *app) writeValue(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

// printAPIError prints the server's code and message, then what the
// answer names (holders, path, field…). With -o json it prints the
// server's answer as is, for programs.
func (a *app) printAPIError(e *APIError) {
	if a.output == "json" && len(e.Body) > 0 {
		fmt.Fprintf(a.stderr, "%s\n", bytes.TrimSpace(e.Body))
		return
	}
	fmt.Fprintf(a.stderr, "createos: %s\n", e.Error())
	if raw, ok := e.Fields["holders"]; ok {
		var holders []struct {
			PID     int    `json:"pid"`
			Command string `json:"command"`
			Kind    string `json:"kind"`
		}
		if json.Unmarshal(raw, &holders) == nil && len(holders) > 0 {
			fmt.Fprintln(a.stderr, "  processes using the directory:")
			for _, h := range holders {
				fmt.Fprintf(a.stderr, "    pid %d  %s  (%s)\n", h.PID, h.Command, h.Kind)
			}
		}
	}
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		if k != "holders" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		var s string
		if json.Unmarshal(e.Fields[k], &s) != nil {
			s = string(e.Fields[k])
		}
		fmt.Fprintf(a.stderr, "  %s: %s\n", k, s)
	}
	if e.Status >= 500 && e.RequestID != "" {
		fmt.Fprintf(a.stderr, "  request id: %s\n", e.RequestID)
	}
}

func (a *app) table() *tabwriter.Writer {
	return tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
