package vmm

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestParseStateHeader(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want StateFormat
		err  bool
	}{
		{"ours", stateHeader(), FormatMappedRAM, false},
		{"qemu's stream", []byte("QEVM\x00\x00\x00\x03"), FormatStream, false},
		{"empty", nil, FormatStream, false},
		{"no format line", []byte(stateMagic + "format=mapped-ram"), "", true},
		{"not a format line", []byte(stateMagic + "size=1\n"), "", true},
		{"unknown format", []byte(stateMagic + "format=zstd\n"), "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStateHeader(tc.in)
			if got != tc.want || (err != nil) != tc.err {
				t.Fatalf("ParseStateHeader = %q, %v; want %q, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}

// FuzzParseStateHeader: a header is a known format or an error, and
// only a strata header is ever anything but a classic stream.
func FuzzParseStateHeader(f *testing.F) {
	f.Add(stateHeader()[:64])
	f.Add([]byte("QEVM"))
	f.Add([]byte(stateMagic + "format=x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseStateHeader(b)
		switch {
		case err != nil:
			if got != "" {
				t.Fatalf("%q with an error", got)
			}
		case got == FormatMappedRAM:
			if !bytes.HasPrefix(b, []byte(stateMagic)) {
				t.Fatalf("mapped-ram without the magic: %q", b)
			}
		case got != FormatStream:
			t.Fatalf("format %q", got)
		case bytes.HasPrefix(b, []byte(stateMagic)):
			t.Fatalf("a strata header read as a stream: %q", b)
		}
	})
}

// TestMappedRAMStates: a running guest saved live, saved live with a
// copy that may not converge (it is finished stopped, and says so), and
// saved stopped leaves a mapped-ram state (strata's header, RAM-sized and
// sparse), and each loads into a new machine that runs. The saving QEMU
// holds no descriptor of its state once a save is done.
func TestMappedRAMStates(t *testing.T) {
	h := newVMHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := h.config("saved", testUID(4))
	m := h.start(cfg)
	// The guest boots for a while: its kernel and init touch memory.
	time.Sleep(3 * time.Second)
	for i, opts := range []SaveOptions{{Live: true}, {Live: true, Converge: time.Nanosecond}, {Resume: true}} {
		path := filepath.Join(h.dir, "state"+string(rune('a'+i)))
		state, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		st, err := m.Save(ctx, state, opts)
		if err != nil {
			t.Fatalf("save %+v: %v", opts, err)
		}
		if running, err := m.Running(ctx); err != nil || !running {
			t.Fatalf("after save %+v: running %v, %v", opts, running, err)
		}
		if st.Format != FormatMappedRAM || st.Pause <= 0 || opts.Live && st.Passes < 1 {
			t.Fatalf("save %+v: %+v", opts, st)
		}
		if opts.Converge == time.Nanosecond && st.Converged {
			t.Fatalf("save %+v: converged, though its copy was to be finished stopped at once: %+v", opts, st)
		}
		if format, err := StateFormatOf(state); err != nil || format != FormatMappedRAM {
			t.Fatalf("the state's format: %q, %v", format, err)
		}
		fi, _ := state.Stat()
		used := fi.Sys().(*syscall.Stat_t).Blocks * 512
		if fi.Size() < int64(cfg.MemoryMiB)<<20 || used >= fi.Size() {
			t.Fatalf("state of %d bytes holds %d: want RAM-sized (%d MiB) and sparse", fi.Size(), used, cfg.MemoryMiB)
		}
		t.Logf("save %+v: %+v; %d bytes, %d held", opts, st, fi.Size(), used)
		if held := takeFDs(t, m.Process().Pid, func(target string) bool { return target == path }); len(held) > 0 {
			closeHeld(held)
			t.Fatalf("QEMU still holds %d descriptors of its state after the save", len(held))
		}

		lcfg := h.config("loaded"+string(rune('a'+i)), testUID(5+i))
		lcfg.Disk[1] = Layer{Node: "ttop", Path: cfg.Disk[0].Path}
		lcfg.Disk = append(lcfg.Disk, Layer{Node: "base", Path: h.base})
		lcfg.Incoming = true
		// The saved machine's top, frozen as it is now, under the new
		// machine's own top: the disk is not what this checks.
		lm := h.start(lcfg)
		if err := lm.Load(ctx, state); err != nil {
			t.Fatalf("load of save %+v: %v", opts, err)
		}
		if err := lm.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if running, err := lm.Running(ctx); err != nil || !running {
			t.Fatalf("loaded: running %v, %v", running, err)
		}
		lm.Kill()
		<-lm.Done()
		state.Close()
	}
}
