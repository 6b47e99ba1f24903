// Command tally is the operator's tool for a Tally deployment: check a
// configuration file, inspect and reset a client's window, follow the
// decisions stream, list and replay dead letters, and set, list and clear
// temporary limits. "tally help" lists the commands; docs/operations.md
// says when to use each. "tally serve" runs Tally in one process (an
// edge, an accountant and an embedded NATS JetStream); started under the
// name "ratelimit" (a link), tally is "tally serve -envoy-settings", which
// reads envoyproxy/ratelimit's environment, so that an image whose
// /bin/ratelimit is tally takes the reference's place (docs/envoy-gateway.md).
package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/tallyhq/tally/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == "ratelimit" {
		args = append([]string{"serve", "-envoy-settings"}, args...)
	}
	code := cli.Main(ctx, cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}, args)
	stop()
	os.Exit(code)
}
