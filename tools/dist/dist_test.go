package dist_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/tools/dist"
)

// root is the repository's root, seen from this package.
const root = "../.."

// built is one release of this checkout, with its image, made once by
// TestMain; the tests read it.
var built struct {
	src   dist.Source
	dir   string
	files []string
	took  time.Duration
}

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "tally-dist-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		start := time.Now()
		built.dir = dir
		if built.src, err = dist.ReadSource(context.Background(), root); err == nil {
			if built.files, err = dist.Release(context.Background(), built.src, dir, "go"); err == nil {
				var image string
				image, err = dist.Image(built.src, dir)
				built.files = append(built.files, image)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "building the release:", err)
			return 1
		}
		built.took = time.Since(start)
		return m.Run()
	}())
}

// Two releases of one commit, with their images, are the same bytes.
func TestReproducible(t *testing.T) {
	again := t.TempDir()
	files, err := dist.Release(context.Background(), built.src, again, "go")
	require.NoError(t, err)
	image, err := dist.Image(built.src, again)
	require.NoError(t, err)
	files = append(files, image)
	require.Equal(t, built.files, files)
	for _, f := range files {
		a, err := os.ReadFile(filepath.Join(built.dir, f))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(again, f))
		require.NoError(t, err)
		require.True(t, bytes.Equal(a, b), "%s differs between two builds of one commit", f)
	}
	t.Logf("first release and image: %v", built.took)
}

// A release is a tarball per platform with the three static binaries,
// stamped with the version, commit and commit time, for that platform;
// the licence, the docs, the example configuration and the systemd units
// beside them; SHA256SUMS names every other file with its digest.
func TestRelease(t *testing.T) {
	src := built.src
	sums, err := dist.ReadSums(filepath.Join(built.dir, "SHA256SUMS"))
	require.NoError(t, err)
	require.Len(t, sums, len(built.files)-2, "every file but SHA256SUMS and the image")
	for name, sum := range sums {
		raw, err := os.ReadFile(filepath.Join(built.dir, name))
		require.NoError(t, err)
		require.Equal(t, sum, fmt.Sprintf("%x", sha256.Sum256(raw)), name)
	}
	if _, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
		cmd.Dir = built.dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	licence, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	require.NoError(t, err)
	units, err := filepath.Glob(filepath.Join(root, "deploy", "systemd", "*.service"))
	require.NoError(t, err)
	require.NotEmpty(t, units)

	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for _, p := range dist.Platforms {
		files, err := dist.ReadTarball(filepath.Join(built.dir, src.Tarball(p)))
		require.NoError(t, err)
		require.Equal(t, licence, files["LICENSE"], "the licence, in full")
		for _, u := range units {
			require.Contains(t, files, "systemd/"+filepath.Base(u))
		}
		for _, f := range []string{"README.md", "CHANGELOG.md", "docs/install.md", "tally.yaml", "nats/tally.conf"} {
			require.Contains(t, files, f)
		}
		for _, b := range dist.Binaries {
			raw := files[b]
			require.NotEmpty(t, raw, "%s in the %s tarball", b, p)
			path := filepath.Join(t.TempDir(), b)
			require.NoError(t, os.WriteFile(path, raw, 0o755))
			ef, err := elf.Open(path)
			require.NoError(t, err)
			require.Equal(t, machines[p.Arch], ef.Machine, "%s for %s", b, p)
			for _, prog := range ef.Progs {
				require.NotEqual(t, elf.PT_INTERP, prog.Type, "%s is static: no dynamic loader", b)
			}
			libs, _ := ef.ImportedLibraries()
			require.Empty(t, libs, "%s links no shared library", b)
			ef.Close()
			bi, err := buildinfo.ReadFile(path)
			require.NoError(t, err)
			settings := map[string]string{}
			for _, s := range bi.Settings {
				settings[s.Key] = s.Value
			}
			require.Equal(t, "0", settings["CGO_ENABLED"])
			require.Equal(t, "true", settings["-trimpath"])
			require.Equal(t, p.Arch, settings["GOARCH"])
			if p.Arch == runtime.GOARCH {
				out, err := exec.Command(path, "version").CombinedOutput()
				require.NoError(t, err, "%s", out)
				require.Equal(t, b+" "+src.Version+"\n"+
					"commit:  "+src.Commit+"\n"+
					"built:   "+src.Time.Format(time.RFC3339)+"\n"+
					"go:      "+bi.GoVersion+" "+p.String()+"\n"+
					"licence: Apache-2.0\n", string(out))
			}
		}
	}
}

// Each SBOM is the module list of its own binary: the binary's digest,
// and every module Go linked into it with its version and go.sum hash.
func TestSBOM(t *testing.T) {
	src := built.src
	for _, p := range dist.Platforms {
		files, err := dist.ReadTarball(filepath.Join(built.dir, src.Tarball(p)))
		require.NoError(t, err)
		for _, b := range dist.Binaries {
			path := filepath.Join(t.TempDir(), b)
			require.NoError(t, os.WriteFile(path, files[b], 0o755))
			bi, err := buildinfo.ReadFile(path)
			require.NoError(t, err)
			bom := readSBOM(t, filepath.Join(built.dir, src.SBOM(p, b)))
			sum := sha256.Sum256(files[b])
			require.Equal(t, b, bom.Metadata.Component.Name)
			require.Equal(t, src.Version, bom.Metadata.Component.Version)
			require.Equal(t, hex.EncodeToString(sum[:]), (*bom.Metadata.Component.Hashes)[0].Value, "%s %s: the digest of the binary shipped", b, p)
			require.Equal(t, "Apache-2.0", (*bom.Metadata.Component.Licenses)[0].License.ID)
			want := map[string]string{}
			for _, d := range bi.Deps {
				want[d.Path+"@"+d.Version] = d.Sum
			}
			got := map[string]string{}
			for _, c := range *bom.Components {
				sum := ""
				if c.Properties != nil {
					sum = (*c.Properties)[0].Value
				}
				got[c.Name+"@"+c.Version] = sum
				require.Equal(t, "pkg:golang/"+c.Name+"@"+c.Version, c.PackageURL)
			}
			require.Equal(t, want, got, "%s %s: the SBOM lists exactly the binary's modules", b, p)
			require.Contains(t, got, "github.com/redis/go-redis/v9@v9.23.0")
		}
	}
	// Binaries differ in what they link: each SBOM is its own.
	a := readSBOM(t, filepath.Join(built.dir, src.SBOM(dist.Platforms[0], "edge-checker")))
	c := readSBOM(t, filepath.Join(built.dir, src.SBOM(dist.Platforms[0], "tally")))
	require.NotEqual(t, a.SerialNumber, c.SerialNumber)
}

// A release names its version the same way everywhere: VERSION, the
// changelog's newest release, the chart.
func TestVersionEverywhere(t *testing.T) {
	v := built.src.Version
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	require.NoError(t, err)
	require.Contains(t, string(changelog), "\n## ["+v+"] - ", "CHANGELOG.md has a section for %s", v)
	require.Less(t, strings.Index(string(changelog), "## [Unreleased]"), strings.Index(string(changelog), "## ["+v+"]"))
	require.Contains(t, string(changelog), "["+v+"]: https://github.com/tallyhq/tally/releases/tag/v"+v)
}

// Without git, the commit and its time come from TALLY_COMMIT and
// SOURCE_DATE_EPOCH, both or neither.
func TestSourceFromTheEnvironment(t *testing.T) {
	t.Setenv("TALLY_COMMIT", "0123abc")
	t.Setenv("SOURCE_DATE_EPOCH", "1764115200")
	src, err := dist.ReadSource(context.Background(), root)
	require.NoError(t, err)
	require.Equal(t, "0123abc", src.Commit)
	require.Equal(t, time.Date(2025, 11, 26, 0, 0, 0, 0, time.UTC), src.Time)
	require.Equal(t, built.src.Version, src.Version)
	t.Setenv("SOURCE_DATE_EPOCH", "")
	_, err = dist.ReadSource(context.Background(), root)
	require.ErrorContains(t, err, "set both")
}
