package faults

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// bin is the directory of the binaries TestMain built.
var bin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // the tests skip themselves
	}
	code, err := buildAndRun(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// buildAndRun builds the binaries the stack runs, as the Makefile's
// binaries target does, from the module this package is in, then runs the
// tests.
func buildAndRun(m *testing.M) (int, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return 0, fmt.Errorf("redis-server not found on PATH: run `make test` (it installs Debian's redis-server) or `apt-get install redis-server`")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return 0, fmt.Errorf("no module root at %s: %w", root, err)
	}
	dir, err := os.MkdirTemp("", "tally-faults-bin-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	for _, args := range [][]string{
		{"-o", dir + string(filepath.Separator), "./cmd/edge-checker", "./cmd/accountant", "./cmd/tally", "./examples/decisions"},
		{"-o", filepath.Join(dir, "nats-server"), "github.com/nats-io/nats-server/v2"},
	} {
		cmd := exec.Command("go", append([]string{"build"}, args...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("go build %v: %w\n%s", args, err, out)
		}
	}
	bin = dir
	return m.Run(), nil
}
