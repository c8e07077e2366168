package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) tokenCommand() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "access-token",
		Short: "Manage a sandbox's access token (account API key only)",
		Long: `A sandbox access token acts on the checkpoints of its one sandbox, and may
create, list and get that sandbox's snapshots; nothing else. Only an account
API key can issue, show, rotate or revoke it.`,
	})
	ops := []struct{ op, short string }{
		{"issue", "Issue the sandbox's access token; it is shown once"},
		{"show", "Tell whether the sandbox has an access token (never the token)"},
		{"rotate", "Replace the access token at once; the old one stops working"},
		{"revoke", "Revoke the access token (succeeds when there is none)"},
	}
	for _, o := range ops {
		cmd.AddCommand(&cobra.Command{
			Use:   o.op + " [SANDBOX]",
			Short: o.short,
			Args:  cobra.MaximumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, sb, _, err := a.start(args, 0)
				if err != nil {
					return err
				}
				t, raw, err := c.TokenCall(cmd.Context(), o.op, sb)
				if err != nil {
					return wrap(err)
				}
				if a.output == "json" {
					return a.writeJSON(raw)
				}
				return a.writeToken(o.op, sb, t)
			},
		})
	}
	return cmd
}

func (a *app) writeToken(op, sandbox string, t Token) error {
	switch op {
	case "issue", "rotate":
		_, err := fmt.Fprintf(a.stdout, "Access token of %s (shown once; store it now):\n%s\nhint: %s  created: %s\n", sandbox, t.Token, t.Hint, t.CreatedAt)
		return err
	case "show":
		if t.Enabled == nil || !*t.Enabled {
			_, err := fmt.Fprintf(a.stdout, "%s has no access token.\n", sandbox)
			return err
		}
		_, err := fmt.Fprintf(a.stdout, "%s has an access token ending in %s, created %s.\n", sandbox, t.Hint, t.CreatedAt)
		return err
	default:
		_, err := fmt.Fprintf(a.stdout, "The access token of %s is revoked.\n", sandbox)
		return err
	}
}
