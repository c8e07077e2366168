package hostproxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"strata/hostproxy/hostproxytest"
	"strata/internal/api"
)

// TestAttachPassesTheGeneration pins issue 30 item 6.2 at the edge: an
// attachment's ?generation= reaches guestd as sent, the guest's 409
// session_restored is relayed (so a client never gets another run's
// output after its own), the handshake names the guest's generation,
// and a generation of another shape, or one from a guest that is not of
// its shape, goes no further.
func TestAttachPassesTheGeneration(t *testing.T) {
	const (
		sid     = "se-0123456789abcdef"
		current = "00112233445566ff"
		old     = "0123456789abcdef"
	)
	s := startStack(t, nil)
	var (
		mu        sync.Mutex // the guest's handler runs on its own goroutine
		queries   []string
		announced = current
	)
	s.guests["sb-a1"].SetHandler("GET", "/v1/sessions/"+sid+"/attach", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.URL.RawQuery)
		announce := announced
		mu.Unlock()
		if g := r.URL.Query().Get("generation"); g != "" && g != current {
			f := hostproxytest.Fail(http.StatusConflict, api.CodeSessionRestored, "restored", map[string]any{"session_id": sid, "generation": current})
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(f.Status)
			io.WriteString(w, f.Body)
			return
		}
		w.Header().Set(api.HeaderSessionGeneration, announce)
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.Close(websocket.StatusNormalClosure, "")
	}))
	attach := func(query string) (int, http.Header, map[string]any) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, strings.Replace(s.url, "http", "ws", 1)+"/v1/sandboxes/sb-a1/sessions/"+sid+"/attach"+query,
			&websocket.DialOptions{HTTPHeader: http.Header{"X-Api-Key": {keyA}}})
		if err == nil {
			c.CloseNow()
			return resp.StatusCode, resp.Header, nil
		}
		if resp == nil {
			t.Fatalf("attach%s: %v", query, err)
		}
		var env struct{ Data map[string]any }
		b, _ := io.ReadAll(resp.Body)
		json.Unmarshal(b, &env)
		return resp.StatusCode, resp.Header, env.Data
	}
	cases := []struct {
		name, query, announce string
		status                int
		code, header          string
		reached               string // the query the guest saw; "" when it saw none
	}{
		{"the current generation", "?since=5&generation=" + current, current, http.StatusSwitchingProtocols, "", current, "generation=" + current + "&since=5"},
		{"an old generation", "?since=5&generation=" + old, current, http.StatusConflict, api.CodeSessionRestored, "", "generation=" + old + "&since=5"},
		{"no generation", "?since=5", current, http.StatusSwitchingProtocols, "", current, "since=5"},
		{"a guest's generation of another shape", "", "<script>", http.StatusSwitchingProtocols, "", "", ""},
		{"a generation of another shape", "?generation=ABC", current, http.StatusBadRequest, "invalid_field", "", "-"},
		{"two generations", "?generation=" + current + "&generation=" + current, current, http.StatusBadRequest, "invalid_field", "", "-"},
		{"another parameter", "?since=5&gen=" + current, current, http.StatusBadRequest, "invalid_field", "", "-"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			queries, announced = nil, tc.announce
			mu.Unlock()
			status, h, fail := attach(tc.query)
			mu.Lock()
			defer mu.Unlock()
			if status != tc.status {
				t.Fatalf("status %d, want %d: %v", status, tc.status, fail)
			}
			if tc.code != "" && fail["code"] != tc.code {
				t.Fatalf("fail %v, want %s", fail, tc.code)
			}
			if tc.code == api.CodeSessionRestored && fail["generation"] != current {
				t.Errorf("the refusal does not name the current generation: %v", fail)
			}
			if got := h.Get(api.HeaderSessionGeneration); got != tc.header {
				t.Errorf("handshake's generation %q, want %q", got, tc.header)
			}
			switch {
			case tc.reached == "-" && len(queries) != 0:
				t.Errorf("a refused query reached the guest: %q", queries)
			case tc.reached != "-" && (len(queries) != 1 || queries[0] != tc.reached):
				t.Errorf("the guest saw %q, want %q", queries, tc.reached)
			}
		})
	}
}
