package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"strata/layers"
)

// exportUsage is the help of guestd export.
const exportUsage = `usage: guestd export --store DIR (--checkpoint ID | --path DIR) --to DIR

Write a checkpoint, or a managed directory's live state, from a layer
store into a new plain directory, without a running guestd: the way back
to plain files when the daemon is stopped or gone. --to must not exist.
`

// exportRequest reads guestd export's command line.
func exportRequest(args []string, stderr io.Writer) (layers.ExportRequest, error) {
	var r layers.ExportRequest
	fs := flag.NewFlagSet("guestd export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, exportUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&r.Store, "store", "/var/lib/strata", "layer store `directory` to read")
	fs.StringVar(&r.ID, "checkpoint", "", "checkpoint `id` to export")
	fs.StringVar(&r.Path, "path", "", "managed `directory` whose live state to export")
	fs.StringVar(&r.To, "to", "", "new `directory` to write (must not exist)")
	if err := fs.Parse(args); err != nil {
		return r, err
	}
	switch {
	case fs.NArg() > 0:
		return r, fmt.Errorf("export: unexpected arguments %q", fs.Args())
	case r.Store == "":
		return r, errors.New("export: --store: want the layer store directory")
	case (r.ID == "") == (r.Path == ""):
		return r, errors.New("export: give exactly one of --checkpoint and --path")
	case r.To == "":
		return r, errors.New("export: --to: want the directory to write")
	}
	return r, nil
}

// export is guestd export: it reads the store's metadata without taking
// it over from a daemon, and writes plain files.
func export(ctx context.Context, args []string, stderr io.Writer) error {
	r, err := exportRequest(args, stderr)
	if err != nil {
		return err
	}
	if err := layers.Export(ctx, r); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	what := r.ID
	if what == "" {
		what = "the live state of " + r.Path
	}
	fmt.Fprintf(stderr, "exported %s to %s\n", what, r.To)
	return nil
}
