// Command tally is the operator's tool for a Tally deployment: check a
// configuration file, inspect and reset a client's window, follow the
// decisions stream, list and replay dead letters, and set, list and clear
// temporary limits. "tally help" lists the commands; docs/operations.md
// says when to use each.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tallyhq/tally/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := cli.Main(ctx, cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}, os.Args[1:])
	stop()
	os.Exit(code)
}
