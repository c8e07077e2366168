// Command guestd is strata's daemon inside a sandbox. See package guestd.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"strata/guestd"
	"strata/pathpolicy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "guestd:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("guestd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "unix:///run/strata/guestd.sock", "listen address: unix:///path or tcp://127.0.0.1:PORT")
	store := fs.String("store", "/var/lib/strata", "layer store directory (on the filesystem of the managed directories)")
	legacy := fs.Bool("legacy-mount", false, "use mount(2) instead of the new mount API")
	creds := fs.String("credentials", guestd.DefaultCredentials, "env file written for processes in the sandbox (API address, sandbox id, access token)")
	debug := fs.Bool("debug", false, "debug logging (freed layers, processes that cannot be inspected)")
	noCompaction := fs.Bool("no-compaction", false, "do not compact layers in the background (tests)")
	var allow []string
	fs.Func("allow-mount", "a mount point whose mount may hold managed directories (repeatable; default /, /tmp and /var/tmp)", func(v string) error {
		allow = append(allow, v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	srv, err := guestd.New(ctx, guestd.Config{Store: *store, Logger: log, LegacyMount: *legacy, NoCompaction: *noCompaction, Credentials: *creds,
		Policy: &pathpolicy.Policy{AllowedMounts: allow}})
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := guestd.Listen(*listen)
	if err != nil {
		return err
	}
	log.Info("guestd serving", "listen", *listen, "store", *store, "mounter", srv.Mounter())
	return srv.Serve(ctx, ln)
}
