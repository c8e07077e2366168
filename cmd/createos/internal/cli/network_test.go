package cli

import (
	"reflect"
	"testing"

	"github.com/spf13/cobra"

	"strata/egress/policy"
)

func TestNetworkFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want *policy.Spec
		err  bool
	}{
		{name: "none given", args: nil, want: nil},
		{name: "none", args: []string{"--egress", "none"}, want: &policy.Spec{Egress: "none"}},
		{name: "allow alone is a list", args: []string{"--allow", "pypi.org", "--allow", "*.github.com"}, want: &policy.Spec{Egress: "list", Allow: []string{"pypi.org", "*.github.com"}}},
		{name: "deny alone is all", args: []string{"--deny", "10.0.0.0/8"}, want: &policy.Spec{Egress: "all", Deny: []string{"10.0.0.0/8"}}},
		{name: "bad rule", args: []string{"--egress", "list", "--allow", "not a name"}, err: true},
		{name: "allow with all", args: []string{"--egress", "all", "--allow", "pypi.org"}, err: true},
		{name: "bad egress", args: []string{"--egress", "some"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f networkFlags
			cmd := &cobra.Command{}
			f.add(cmd)
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := f.setting(cmd)
			if (err != nil) != tc.err || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("setting: %+v, %v; want %+v, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}
