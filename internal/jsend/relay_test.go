package jsend

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// TestParseFailBounds pins what a relayed fail may hold (issue 30: every
// field of a guest's 4xx body became a map entry, and a 16 MiB body of
// 1.85 million tiny fields took 560 MiB).
func TestParseFailBounds(t *testing.T) {
	fields := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, `,"f%d":%d`, i, i)
		}
		return b.String()
	}
	cases := []struct {
		name, body string
		ok         bool
	}{
		{"code and message", `{"status":"fail","data":{"code":"checkpoint_not_found","message":"no checkpoint has this id"}}`, true},
		{"eight fields", `{"status":"fail","data":{"code":"c","message":"m"` + fields(8) + `}}`, true},
		{"nine fields", `{"status":"fail","data":{"code":"c","message":"m"` + fields(9) + `}}`, false},
		{"a field of the largest fail", `{"status":"fail","data":{"code":"directory_busy","message":"m","holders":[` + strings.Repeat(`{"pid":1,"command":"sh","kind":"cwd"},`, 1000) + `{}]}}`, true},
		{"over MaxFailBody", `{"status":"fail","data":{"code":"c","message":"` + strings.Repeat("m", MaxFailBody) + `"}}`, false},
		{"a field named twice", `{"status":"fail","data":{"code":"c","message":"m","a":1,"a":2}}`, false},
		{"code named twice", `{"status":"fail","data":{"code":"c","message":"m","code":"d"}}`, false},
		{"a name with a capital", `{"status":"fail","data":{"code":"c","message":"m","Path":"/"}}`, false},
		{"an escaped name", `{"status":"fail","data":{"code":"c","message":"m","p\u0061th":"/"}}`, false},
		{"a long name", `{"status":"fail","data":{"code":"c","message":"m","` + strings.Repeat("a", 65) + `":1}}`, false},
		{"a code not a name", `{"status":"fail","data":{"code":"<b>","message":"m"}}`, false},
		{"a code not a string", `{"status":"fail","data":{"code":1,"message":"m"}}`, false},
		{"no message", `{"status":"fail","data":{"code":"c"}}`, false},
		{"another member", `{"status":"fail","data":{"code":"c","message":"m"},"debug":"x"}`, false},
		{"an error envelope", `{"status":"error","data":{"code":"c","message":"m"}}`, false},
		{"data not an object", `{"status":"fail","data":["code"]}`, false},
		{"trailing data", `{"status":"fail","data":{"code":"c","message":"m"}} {}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fe, err := ParseFail(409, []byte(tc.body))
			if (err == nil) != tc.ok {
				t.Fatalf("ParseFail: %v, want ok %v", err, tc.ok)
			}
			if err == nil && (fe.Code == "" || len(fe.Fields) > MaxFailFields) {
				t.Fatalf("%+v", fe)
			}
		})
	}
}

// TestParseFailHeap pins issue 30's fail of 1.85 million tiny fields (560
// MiB): a 16 MiB body of them costs about nothing beyond its bytes.
func TestParseFailHeap(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"status":"fail","data":{"code":"c","message":"m"`)
	for i := 0; b.Len() < 16<<20; i++ {
		fmt.Fprintf(&b, `,"%x":0`, i)
	}
	b.WriteString("}}")
	body := []byte(b.String())
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := ParseFail(409, body)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a fail of 16 MiB was taken")
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
		t.Fatalf("ParseFail allocated %d bytes for a %d-byte body", n, len(body))
	}
}
