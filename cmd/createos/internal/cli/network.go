package cli

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"strata/egress/policy"
)

// networkFlags are a create's, a fork's and network set's --egress,
// --allow and --deny.
type networkFlags struct {
	egress      string
	allow, deny []string
}

func (f *networkFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.egress, "egress", "", "where the sandbox's network reaches: all (the public internet), none, or list (only what --allow names)")
	cmd.Flags().StringArrayVar(&f.allow, "allow", nil, "with --egress list: a host name (pypi.org), a wildcard (*.github.com) or a CIDR it may reach (repeat for more)")
	cmd.Flags().StringArrayVar(&f.deny, "deny", nil, "a host name, wildcard or CIDR it may never reach, over --allow (repeat for more)")
}

// setting is the network setting the flags give; nil when none was given
// (a create's default, a fork's source's).
func (f *networkFlags) setting(cmd *cobra.Command) (*policy.Spec, error) {
	if !cmd.Flags().Changed("egress") && !cmd.Flags().Changed("allow") && !cmd.Flags().Changed("deny") {
		return nil, nil
	}
	s := policy.Spec{Egress: f.egress, Allow: f.allow, Deny: f.deny}
	if s.Egress == "" {
		if len(s.Allow) > 0 {
			s.Egress = "list" // --allow alone means a list
		} else {
			s.Egress = "all"
		}
	}
	if _, err := policy.Parse(s); err != nil {
		return nil, fmt.Errorf("network: %s", strings.TrimPrefix(err.Error(), "invalid_field: "))
	}
	return &s, nil
}

func (a *app) networkCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Show or replace a sandbox's network setting (account API key only)",
		Long: `A sandbox's network is enforced on the host: egress all (the public
internet, never private, loopback or link-local addresses nor the host's own
unless the deployment lists them), none, or list (only the names and CIDRs
--allow gives; *.example.com is any name below example.com). --deny wins over
--allow. Names are checked at DNS and at connect (TLS SNI, HTTP Host); a
refused connection fails at once. A change applies to new connections.`,
	}
	get := &cobra.Command{
		Use:     "get SANDBOX",
		Short:   "Print a sandbox's network setting and its usage",
		Example: "  createos sandbox network get scratch",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			n, err := c.GetNetwork(cmd.Context(), args[0], rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			return a.printNetwork(raw, n.Spec, n.Usage)
		},
	}
	var f networkFlags
	set := &cobra.Command{
		Use:   "set SANDBOX --egress all|none|list [--allow RULE]... [--deny RULE]...",
		Short: "Replace a sandbox's network setting, for new connections",
		Example: "  createos sandbox network set scratch --egress list --allow pypi.org --allow '*.github.com'\n" +
			"  createos sandbox network set scratch --egress none",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := f.setting(cmd)
			if err != nil {
				return err
			}
			if s == nil {
				return fmt.Errorf("give the new setting: --egress all|none|list, with --allow and --deny")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			n, err := c.SetNetwork(cmd.Context(), args[0], *s, rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			return a.printNetwork(raw, n.Spec, n.Usage)
		},
	}
	f.add(set)
	cmd.AddCommand(get, set)
	return cmd
}

func (a *app) printNetwork(raw json.RawMessage, s policy.Spec, u *NetworkUsage) error {
	if a.output == "json" {
		return a.writeJSON(raw)
	}
	fmt.Fprintf(a.stdout, "egress: %s\n", s.Egress)
	for _, r := range s.Allow {
		fmt.Fprintf(a.stdout, "allow:  %s\n", r)
	}
	for _, r := range s.Deny {
		fmt.Fprintf(a.stdout, "deny:   %s\n", r)
	}
	if u != nil {
		fmt.Fprintf(a.stdout, "usage:  %d bytes out, %d bytes in, %d connections, %d refused\n", u.BytesOut, u.BytesIn, u.Connections, u.Refused)
	}
	return nil
}
