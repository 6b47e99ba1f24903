package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/cli"
	"github.com/tallyhq/tally/internal/tallytest"
	"github.com/tallyhq/tally/internal/testutil"
)

// deployment is a running Tally (tallytest: one shard, NATS, an edge
// serving the decision API, an accountant) and its configuration file on
// disk, as an operator's tally reads it.
type deployment struct {
	*tallytest.Tally
	path string
}

func start(t *testing.T, policies string) *deployment {
	t.Helper()
	tl := tallytest.Start(t, policies)
	path := filepath.Join(t.TempDir(), "tally.yaml")
	if err := os.WriteFile(path, []byte(tl.Config), 0o600); err != nil {
		t.Fatal(err)
	}
	return &deployment{Tally: tl, path: path}
}

// result is what one run of tally printed, and its exit status.
type result struct {
	code           int
	stdout, stderr string
}

// tally runs the CLI against d as the operator, with stdin as its input,
// until it ends or ctx is done.
func (d *deployment) tally(ctx context.Context, stdin string, args ...string) result {
	return d.tallyTo(ctx, stdin, &testutil.Buffer{}, args...)
}

// tallyTo is tally with its standard output written to out as it comes
// (for commands that follow a stream).
func (d *deployment) tallyTo(ctx context.Context, stdin string, out *testutil.Buffer, args ...string) result {
	var errOut testutil.Buffer
	env := d.Env("operator")
	code := cli.Main(ctx, cli.Env{Stdin: strings.NewReader(stdin), Stdout: out, Stderr: &errOut,
		Getenv: func(k string) string {
			if k == "TALLY_CONFIG" {
				return d.path
			}
			return env(k)
		}, Now: time.Now}, args)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// run is tally with no input, bounded in time.
func (d *deployment) run(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return d.tally(ctx, "", args...)
}
