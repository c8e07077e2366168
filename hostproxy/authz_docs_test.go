package hostproxy

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestAuthTableDocs: docs/api.md prints the table as authTableMarkdown
// renders it; on a difference the test prints what the section should
// hold.
func TestAuthTableDocs(t *testing.T) {
	b, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	want := authTableMarkdown()
	if !strings.Contains(string(b), want) {
		t.Errorf("docs/api.md does not hold the authorization table as it is; it should hold:\n%s", want)
	}
}

// authTableMarkdown is the authorization table as docs/api.md shows it.
func authTableMarkdown() string {
	var b strings.Builder
	b.WriteString("| route | who may call it | scope |\n| --- | --- | --- |\n")
	names := map[CredentialKind]string{KindAccountKey: "account key", KindAccessToken: "token", KindChannelKey: "channel key"}
	param := regexp.MustCompile(`:([a-z]+)`)
	for _, r := range authTable {
		if r.rule == public {
			continue
		}
		p := strings.Replace(param.ReplaceAllString(r.path, "{$1}"), "*", "{path…}", 1)
		var who []string
		for _, k := range r.rule.kinds.list() {
			who = append(who, names[k])
		}
		w := strings.Join(who, ", ")
		if r.rule.outside {
			w += "; never from inside a sandbox"
		}
		scope := "–"
		if r.rule.scope != "" {
			scope = "`" + string(r.rule.scope) + "`"
		}
		fmt.Fprintf(&b, "| `%s %s` | %s | %s |\n", r.method, p, w, scope)
	}
	return b.String()
}
