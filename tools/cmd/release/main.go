// Command release writes Tally's release into dist/: a tarball of the
// static binaries per platform, a CycloneDX SBOM per binary and
// SHA256SUMS, byte-identical for one commit (make release runs it; see
// docs/install.md).
//
// Usage (from tools/):
//
//	go run ./cmd/release -root .. -dist ../dist
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/tallyhq/tally/tools/dist"
)

func main() {
	root := flag.String("root", "..", "the repository's root")
	out := flag.String("dist", "../dist", "where to write the release")
	goCmd := flag.String("go", "go", "the go command to build with")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *root, *out, *goCmd); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, root, out, goCmd string) error {
	src, err := dist.ReadSource(ctx, root)
	if err != nil {
		return err
	}
	files, err := dist.Release(ctx, src, out, goCmd)
	if err != nil {
		return err
	}
	fmt.Printf("tally %s (commit %s, %s) in %s:\n", src.Version, src.Commit, src.Time.Format("2006-01-02T15:04:05Z"), out)
	for _, f := range files {
		fmt.Println("  " + f)
	}
	return nil
}
