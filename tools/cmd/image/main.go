// Command image writes Tally's OCI image, for linux/amd64 and linux/arm64,
// into dist/ as an OCI archive, from the release tarballs there (make
// image runs make release first; see docs/install.md). No Docker is used:
// the image is assembled with go-containerregistry.
//
// Usage (from tools/):
//
//	go run ./cmd/image -root .. -dist ../dist
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tallyhq/tally/tools/dist"
)

func main() {
	root := flag.String("root", "..", "the repository's root")
	out := flag.String("dist", "../dist", "the release's directory, where the archive is written")
	flag.Parse()
	src, err := dist.ReadSource(context.Background(), *root)
	if err == nil {
		var name string
		if name, err = dist.Image(src, *out); err == nil {
			fmt.Printf("tally %s: %s (linux/amd64, linux/arm64)\n", src.Version, filepath.Join(*out, name))
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}
