// Command createos is the command-line client of strata's checkpoint API.
// See docs/cli.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"strata/cmd/createos/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
