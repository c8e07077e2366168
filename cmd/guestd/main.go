// Command guestd is strata's daemon inside a sandbox. See package guestd.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"strata/channel"
	"strata/guestd"
	"strata/internal/api"
	"strata/internal/logx"
	"strata/layers"
	"strata/pathpolicy"
	"strata/vmm"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "guestd:", err)
		}
		os.Exit(1)
	}
}

// options are guestd's command line.
type options struct {
	listen string
	vm     bool
	config guestd.Config // all but the logger
	log    logx.Options
}

// parse reads the command line; usage and flag errors go to stderr.
func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("guestd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "unix:///run/strata/guestd.sock", "listen `address`: unix:///path or tcp://127.0.0.1:PORT")
	fs.StringVar(&o.config.Store, "store", "/var/lib/strata", "layer store `directory` (on the filesystem of the managed directories)")
	fs.BoolVar(&o.config.LegacyMount, "legacy-mount", false, "use mount(2) instead of the new mount API")
	fs.StringVar(&o.config.Credentials, "credentials", guestd.DefaultCredentials,
		"env `file` written for processes in the sandbox (API address, sandbox id, access token); make run puts it under its STATE")
	fs.BoolVar(&o.config.NoCompaction, "no-compaction", false, "do not compact layers in the background (tests)")
	fs.IntVar(&o.config.AutoCheckpoints, "auto-checkpoints", layers.DefaultAutoCheckpoints,
		"automatic `count` of safety checkpoints (a restore's unsaved changes) kept per directory, the newest; 0 turns them off")
	fs.Uint64Var(&o.config.MinFree, "min-free", 0, "`bytes` a capture leaves free on a store's filesystem (0: 1% of it, 1 MiB to 64 MiB)")
	fs.BoolVar(&o.vm, "vm", false, "run as the daemon of a strata microVM: serve the host on the virtio-serial port "+vmm.ChannelPort+
		" too, carry calls to "+api.GuestAPIURL+" to the host's API through it, and let the host power the machine off")
	o.log.AddFlags(fs, "debug logging: each step of an operation, freed layers, processes that cannot be inspected")
	var allow []string
	fs.Func("allow-mount", "a mount point whose mount may hold managed directories (repeatable; default /, /tmp and /var/tmp)", func(v string) error {
		allow = append(allow, v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.config.AutoCheckpoints < 0 || o.config.AutoCheckpoints > layers.MaxCheckpoints {
		return options{}, fmt.Errorf("--auto-checkpoints: want 0 to %d", layers.MaxCheckpoints)
	}
	if o.config.Credentials == "" {
		return options{}, errors.New("--credentials: want a file path")
	}
	o.config.Policy = &pathpolicy.Policy{AllowedMounts: allow}
	return o, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "export" {
		return export(ctx, args[1:], stderr)
	}
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	log, err := logx.New(stderr, "guestd", o.log)
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	cfg := o.config
	cfg.Logger = log
	if o.vm {
		// Init (PID 1) stops guestd, syncs, unmounts and powers off.
		cfg.PowerOff = func() { unix.Kill(1, unix.SIGTERM) }
		// Requests still running when init stops guestd (an exec) are
		// cut after 2 s: init's own budget is 4 s, the host's 10 s.
		cfg.ShutdownTimeout = 2 * time.Second
		// Beside the store, not in it: the store owns its directory.
		cfg.CredentialsCopy = filepath.Join(filepath.Dir(cfg.Store), "strata-credentials.env")
		// strata-init mounts cgroup2 there.
		cfg.Cgroup = "/sys/fs/cgroup"
	}
	srv, err := guestd.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := guestd.Listen(o.listen)
	if err != nil {
		return err
	}
	serving := []func() error{func() error { return srv.Serve(ctx, ln) }}
	if o.vm {
		// The channel is opened only now, with the store recovered: the
		// host's first call answered is its sign that the sandbox is up.
		ch := channel.ListenGuest(func() (io.ReadWriteCloser, error) { return channel.OpenPort(vmm.ChannelPort) }, log)
		defer ch.Close()
		fwd, err := net.Listen("tcp", strings.TrimPrefix(api.GuestAPIURL, "http://"))
		if err != nil {
			return err
		}
		serving = append(serving,
			func() error { return srv.Serve(ctx, ch) },
			func() error { return guestd.ForwardAPI(ctx, fwd, ch.Open, log) })
	}
	log.Info("listening", "addr", o.listen, "vm", o.vm, "store", cfg.Store, "mounter", srv.Mounter())
	errs := make(chan error, len(serving))
	for _, serve := range serving {
		go func() { errs <- serve() }()
	}
	var first error
	for range serving {
		if err := <-errs; err != nil && first == nil {
			first = err
			stop() // one listener failing ends the others
		}
	}
	log.Info("stopped")
	return first
}
