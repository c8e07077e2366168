package cli

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"strata/internal/api"
)

// A sandbox's env and labels on the command line: NAME=VALUE and
// KEY=VALUE, as exec's --env.

// addEnvAndLabels adds --env and --label to a create or a fork.
func addEnvAndLabels(cmd *cobra.Command, env, labels *[]string) {
	cmd.Flags().StringArrayVar(env, "env", nil, "NAME=VALUE in the environment of every exec and session of the sandbox (repeat for more)")
	cmd.Flags().StringArrayVar(labels, "label", nil, "KEY=VALUE, a label of the sandbox (repeat for more)")
}

// parseAssignments reads flag's values, each NAME=VALUE split at the first
// '=' (the value may hold more, and be empty); nil for none. A name given
// twice, or a value without '=', is a usage error; the API checks the
// rest.
func parseAssignments(flag string, values []string) (map[string]string, error) {
	if len(values) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(values))
	for _, kv := range values {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want NAME=VALUE", flag, kv)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("%s: %s is given twice", flag, k)
		}
		m[k] = v
	}
	return m, nil
}

// joinAssignments is m as k=v, sorted by key and joined by commas.
func joinAssignments(m map[string]string) string {
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// checkSandboxName refuses a name the API would, before any call.
func checkSandboxName(name string) error {
	if api.ValidateSandboxName(name) != nil {
		return fmt.Errorf("sandbox name %q: want 1 to 63 lowercase letters, digits and '-', starting with a letter, not ending with '-' and not starting with sb- (an id's prefix)", name)
	}
	return nil
}

func (a *app) labelsCommand() *cobra.Command {
	var clear bool
	cmd := &cobra.Command{
		Use:   "labels SANDBOX [KEY=VALUE]... [--clear]",
		Short: "Show a sandbox's labels, or replace them (account API key only)",
		Long: `With SANDBOX alone, print its labels, one KEY=VALUE a line. With
KEY=VALUE arguments, the sandbox's labels become exactly these: the ones
not given go (give every label to keep). --clear takes them all away.

Keys are 1 to 63 lowercase letters, digits, '.', '_', '/' and '-',
starting and ending with a letter or digit; values at most 256 bytes of
printable UTF-8; at most 32 labels. 'createos sandbox list --label k=v'
finds sandboxes by them.`,
		Example: "  createos sandbox labels scratch\n" +
			"  createos sandbox labels scratch owner=docs tier=a\n" +
			"  createos sandbox labels scratch --clear",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, err := parseAssignments("label", args[1:])
			if err != nil {
				return err
			}
			if clear && len(set) > 0 {
				return fmt.Errorf("--clear takes every label away: give no KEY=VALUE with it")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			var sb Sandbox
			if clear || len(set) > 0 {
				sb, err = c.SetLabels(cmd.Context(), args[0], set, rawAnswer(&raw))
			} else {
				sb, err = c.GetSandbox(cmd.Context(), args[0], rawAnswer(&raw))
			}
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				var rec struct {
					Labels json.RawMessage `json:"labels"`
				}
				if json.Unmarshal(raw, &rec) != nil || rec.Labels == nil {
					rec.Labels = json.RawMessage("{}")
				}
				return a.writeJSON(rec.Labels)
			}
			for _, k := range sortedKeys(sb.Labels) {
				fmt.Fprintf(a.stdout, "%s=%s\n", k, sb.Labels[k])
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&clear, "clear", false, "take every label away")
	return cmd
}
