package jsend

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"strata/internal/fault"
)

// TestDecodeValueBound pins issue 30's 8 MiB bodies (exec, sessions) of
// tiny values: decoded, an 8 MiB list of empty strings was 2.8 million
// strings and 150 MiB of heap before cmd's limit of 256 was checked. A
// body of more than MaxValues values is refused before it is decoded;
// a body of MaxBody bytes never is.
func TestDecodeValueBound(t *testing.T) {
	type target struct {
		Cmd []string          `json:"cmd"`
		Env map[string]string `json:"env"`
	}
	cases := []struct {
		name, body string
		refused    bool
	}{
		{"a few values", `{"cmd":["sh","-c","true"],"env":{"A":"1"}}`, false},
		{"MaxValues", `{"cmd":[` + strings.Repeat(`"",`, MaxValues-3) + `""]}`, false},
		{"one more", `{"cmd":[` + strings.Repeat(`"",`, MaxValues-2) + `""]}`, true},
		{"8 MiB of empty strings", `{"cmd":[` + strings.Repeat(`"",`, 8<<20/3) + `""]}`, true},
		{"8 MiB of empty arrays", `{"cmd":[` + strings.Repeat(`[],`, 8<<20/3) + `[]]}`, true},
		{"keys are not values", `{"env":{` + entries(9000) + `}}`, false},
		{"a body of MaxBody bytes of one-byte values", `{"cmd":[` + strings.Repeat(`1,`, MaxBody/2-8) + `1]}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var v target
			err := DecodeBytes(body, &v)
			runtime.ReadMemStats(&after)
			refused := err != nil && fault.CodeOf(err) == "invalid_json" && strings.Contains(fault.As(err).Fields["reason"].(string), "JSON values")
			if refused != tc.refused {
				t.Fatalf("DecodeBytes: %v, want refused %v", err, tc.refused)
			}
			if tc.refused && after.TotalAlloc-before.TotalAlloc > 64<<10 {
				t.Fatalf("a refused body of %d bytes allocated %d bytes", len(body), after.TotalAlloc-before.TotalAlloc)
			}
		})
	}
}

// entries is n members of an object, "k0":"" and on.
func entries(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":""`, i)
	}
	return b.String()
}
