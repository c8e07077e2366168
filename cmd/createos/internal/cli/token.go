package cli

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"strata/internal/api"
	"strata/internal/fault"
)

func (a *app) tokenCommand() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "access-token",
		Short: "Manage a sandbox's access token (account API key only)",
		Long: `A sandbox access token acts on its one sandbox, within its scopes:
checkpoints (the checkpoint commands), snapshots (snapshot create, list,
get), exec (exec and sessions), files (cp), ports, watch. Issued without
--scope it has checkpoints and snapshots. Only an account API key can
issue, show, rotate or revoke it; a rotate keeps the scopes.`,
	})
	ops := []struct{ op, short string }{
		{"issue", "Issue the sandbox's access token; it is shown once"},
		{"show", "Tell whether the sandbox has an access token, and its scopes (never the token)"},
		{"rotate", "Replace the access token at once, with its scopes; the old one stops working"},
		{"revoke", "Revoke the access token (succeeds when there is none)"},
	}
	for _, o := range ops {
		var scopes []string
		c := &cobra.Command{
			Use:   o.op + " [SANDBOX]",
			Short: o.short,
			Args:  cobra.MaximumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				var want api.Scopes
				if len(scopes) > 0 {
					var err error
					if want, err = api.ParseScopeList("--scope", strings.Join(scopes, ",")); err != nil {
						return fmt.Errorf("%s", errMessage(err))
					}
				}
				c, sb, _, err := a.start(args, 0)
				if err != nil {
					return err
				}
				var t Token
				var raw json.RawMessage
				if o.op == "issue" {
					t, err = c.IssueToken(cmd.Context(), sb, want, rawAnswer(&raw))
				} else {
					t, err = c.TokenCall(cmd.Context(), o.op, sb, rawAnswer(&raw))
				}
				if err != nil {
					return wrap(err)
				}
				if a.output == "json" {
					return a.writeJSON(raw)
				}
				return a.writeToken(o.op, sb, t)
			},
		}
		if o.op == "issue" {
			c.Flags().StringSliceVar(&scopes, "scope", nil, "a scope of the token: checkpoints, snapshots, exec, files, ports, watch (repeat it, or separate with commas; default checkpoints,snapshots)")
			c.Example = "  createos sandbox access-token issue sb-local\n" +
				"  createos sandbox access-token issue sb-local --scope checkpoints --scope exec"
		}
		cmd.AddCommand(c)
	}
	return cmd
}

func (a *app) writeToken(op, sandbox string, t Token) error {
	scopes := api.Scopes(t.Scopes).String()
	switch op {
	case "issue", "rotate":
		_, err := fmt.Fprintf(a.stdout, "Access token of %s (shown once; store it now):\n%s\nhint: %s  created: %s  scopes: %s\n", sandbox, t.Token, t.Hint, t.CreatedAt, scopes)
		return err
	case "show":
		if t.Enabled == nil || !*t.Enabled {
			_, err := fmt.Fprintf(a.stdout, "%s has no access token.\n", sandbox)
			return err
		}
		_, err := fmt.Fprintf(a.stdout, "%s has an access token ending in %s, created %s, with scopes %s.\n", sandbox, t.Hint, t.CreatedAt, scopes)
		return err
	default:
		_, err := fmt.Fprintf(a.stdout, "The access token of %s is revoked.\n", sandbox)
		return err
	}
}

// errMessage is the sentence of a refusal of package api's parsers.
func errMessage(err error) string {
	if fe := fault.As(err); fe != nil {
		return fe.Message
	}
	return err.Error()
}

// parseAccess reads --access and the access command's argument: "none",
// or scopes joined by commas.
func parseAccess(flag, s string) (api.Access, error) {
	if s == "" {
		return api.Access{}, fmt.Errorf("%s: want none, or scopes joined by commas (checkpoints,snapshots,exec,files,ports,watch)", flag)
	}
	a, err := api.ParseAccessString(flag, s)
	if err != nil {
		return api.Access{}, fmt.Errorf("%s", errMessage(err))
	}
	return a, nil
}

func (a *app) accessCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "access SANDBOX none|SCOPE[,SCOPE…]",
		Short: "Set what processes inside a sandbox may do with the key they are handed (account API key only)",
		Long: `A microVM sandbox's access setting is what its channel key may do: the key
its guest is handed (CREATEOS_API_KEY in /run/strata/credentials.env) that
works only from inside it. SCOPE is checkpoints, snapshots, exec, files,
ports or watch; none hands the guest no key at all, and refuses every call
from inside the sandbox, whatever key it carries. The change holds from the
next call on, for the key already in the guest too. The default (at
create) is checkpoints,snapshots.`,
		Example: "  createos sandbox access sb-local none\n" +
			"  createos sandbox access sb-local checkpoints,snapshots,exec",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			access, err := parseAccess("access", args[1])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			sb, err := c.SetAccess(cmd.Context(), args[0], access, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			_, err = fmt.Fprintf(a.stdout, "The access of %s is %s.\n", sb.ID, accessString(sb.Access))
			return err
		},
	}
}

// accessString is a record's access as the command line writes it.
func accessString(a *api.Access) string {
	if a == nil {
		return "-"
	}
	return a.String()
}
