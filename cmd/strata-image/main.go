// Command strata-image builds the guest image of strata's microVM
// sandboxes into a cache and prints its directory. See package guestimage.
//
//	strata-image build --guestd bin/guestd --init bin/strata-init [--cache /var/cache/strata] [--kernel 6.12-cloud|6.1]
//
// The last line of stdout, alone, is the absolute path of the image
// directory (its image.json says the rest); progress goes to stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"strata/guestimage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "strata-image:", err)
		}
		os.Exit(1)
	}
}

const usage = "usage: strata-image build --guestd FILE --init FILE --createos FILE [--python DIR] [--cache DIR] [--kernel NAME] [--keep N]"

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(stderr, usage)
		return flag.ErrHelp
	}
	var cfg guestimage.Config
	fs := flag.NewFlagSet("strata-image build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Cache, "cache", guestimage.DefaultCache, "cache `directory` (bases and images)")
	fs.StringVar(&cfg.Guestd, "guestd", "", "static guestd `binary` (CGO_ENABLED=0)")
	fs.StringVar(&cfg.Init, "init", "", "static strata-init `binary` (CGO_ENABLED=0)")
	fs.StringVar(&cfg.Createos, "createos", "", "static createos `binary` (CGO_ENABLED=0), put on the guest's PATH")
	fs.StringVar(&cfg.Python, "python", "", "`directory` of the pure-Python SDK package (sdk/python/strata), put on the guest's Python path")
	fs.StringVar(&cfg.Kernel, "kernel", guestimage.DefaultKernel, "guest kernel: 6.12-cloud or 6.1")
	fs.IntVar(&cfg.Keep, "keep", guestimage.DefaultKeep, "image directories to keep")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if cfg.Guestd == "" || cfg.Init == "" || cfg.Createos == "" {
		return errors.New("--guestd, --init and --createos are required\n" + usage)
	}
	cfg.Log = stderr
	img, err := guestimage.Build(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, img.Dir)
	return nil
}
