package dist

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Platform is a target of a release.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// Platforms are the platforms a release is built for.
var Platforms = []Platform{{"linux", "amd64"}, {"linux", "arm64"}}

// Binaries are the commands a release ships, from cmd/ of the repository.
var Binaries = []string{"edge-checker", "accountant", "tally"}

// Source is what a release is built from.
type Source struct {
	// Root is the repository's root.
	Root string
	// Version is the VERSION file's; Commit the commit's hash (with
	// "-dirty" when the tree has changes not committed); Time the commit's
	// time, which every file of the release carries.
	Version, Commit string
	Time            time.Time
}

// ReadSource reads the version and the commit of the repository at root
// with git; without git (a source tarball), from TALLY_COMMIT and
// SOURCE_DATE_EPOCH (seconds since 1970), which must then both be set.
func ReadSource(ctx context.Context, root string) (Source, error) {
	raw, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return Source{}, err
	}
	s := Source{Root: root, Version: strings.TrimSpace(string(raw))}
	if commit, epoch := os.Getenv("TALLY_COMMIT"), os.Getenv("SOURCE_DATE_EPOCH"); commit != "" || epoch != "" {
		sec, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil || commit == "" {
			return Source{}, fmt.Errorf("TALLY_COMMIT %q and SOURCE_DATE_EPOCH %q: set both, the commit and its time in seconds", commit, epoch)
		}
		s.Commit, s.Time = commit, time.Unix(sec, 0).UTC()
		return s, nil
	}
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w (a release is built from a git checkout, or with TALLY_COMMIT and SOURCE_DATE_EPOCH set)", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	if s.Commit, err = git("rev-parse", "HEAD"); err != nil {
		return Source{}, err
	}
	unix, err := git("log", "-1", "--format=%ct")
	if err != nil {
		return Source{}, err
	}
	sec, err := strconv.ParseInt(unix, 10, 64)
	if err != nil {
		return Source{}, fmt.Errorf("commit time %q: %w", unix, err)
	}
	s.Time = time.Unix(sec, 0).UTC()
	// Only tracked files enter a build: untracked ones (dist/ itself,
	// editors' files) do not make it dirty.
	status, err := git("status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return Source{}, err
	}
	if status != "" {
		s.Commit += "-dirty"
	}
	return s, nil
}

// Name is the base name of a platform's artefacts: tally_0.1.0_linux_amd64.
func (s Source) Name(p Platform) string { return "tally_" + s.Version + "_" + p.OS + "_" + p.Arch }

// Tarball is the file name of a platform's tarball.
func (s Source) Tarball(p Platform) string { return s.Name(p) + ".tar.gz" }

// SBOM is the file name of a binary's SBOM for a platform:
// tally_0.1.0_linux_amd64.edge-checker.cdx.json.
func (s Source) SBOM(p Platform, binary string) string { return s.Name(p) + "." + binary + ".cdx.json" }

// shipped are the files of the repository each tarball carries beside the
// binaries: where they are, and where they go in the tarball.
var shipped = [][2]string{
	{"LICENSE", "LICENSE"}, {"README.md", "README.md"}, {"CHANGELOG.md", "CHANGELOG.md"},
	{"docs/install.md", "docs/install.md"}, {"docs/configuration.md", "docs/configuration.md"},
	{"docs/security.md", "docs/security.md"}, {"deploy/tally.yaml", "tally.yaml"},
	{"deploy/nats/tally.conf", "nats/tally.conf"}, {"deploy/nats/cluster.conf", "nats/cluster.conf"},
}

// Release writes the release of src into dist (created; files of the same
// names replaced), building with the go command goCmd, and returns the
// names of the files it wrote.
func Release(ctx context.Context, src Source, dist, goCmd string) ([]string, error) {
	if err := os.MkdirAll(dist, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "tally-release-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	units, err := filepath.Glob(filepath.Join(src.Root, "deploy", "systemd", "*"))
	if err != nil {
		return nil, err
	}
	files := append([][2]string(nil), shipped...)
	for _, u := range units {
		files = append(files, [2]string{filepath.Join("deploy", "systemd", filepath.Base(u)), "systemd/" + filepath.Base(u)})
	}
	var written []string
	for _, p := range Platforms {
		bin := filepath.Join(work, p.OS+"_"+p.Arch)
		if err := build(ctx, src, p, bin, goCmd); err != nil {
			return nil, err
		}
		entries := []entry{}
		for _, b := range Binaries {
			raw, err := os.ReadFile(filepath.Join(bin, b))
			if err != nil {
				return nil, err
			}
			entries = append(entries, entry{name: b, mode: 0o755, body: raw})
			sbom, err := SBOM(filepath.Join(bin, b), src)
			if err != nil {
				return nil, fmt.Errorf("%s %s: sbom: %w", b, p, err)
			}
			if err := os.WriteFile(filepath.Join(dist, src.SBOM(p, b)), sbom, 0o644); err != nil {
				return nil, err
			}
			written = append(written, src.SBOM(p, b))
		}
		for _, f := range files {
			raw, err := os.ReadFile(filepath.Join(src.Root, f[0]))
			if err != nil {
				return nil, fmt.Errorf("a shipped file: %w", err)
			}
			entries = append(entries, entry{name: f[1], mode: 0o644, body: raw})
		}
		tgz, err := writeTarball(src.Name(p), entries, src.Time)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dist, src.Tarball(p)), tgz, 0o644); err != nil {
			return nil, err
		}
		written = append(written, src.Tarball(p))
	}
	sort.Strings(written)
	if err := writeSums(dist, written); err != nil {
		return nil, err
	}
	return append(written, "SHA256SUMS"), nil
}

// build compiles the binaries for p into dir.
func build(ctx context.Context, src Source, p Platform, dir, goCmd string) error {
	const pkg = "github.com/tallyhq/tally/internal/buildinfo"
	ldflags := fmt.Sprintf("-s -w -X %s.Commit=%s -X %s.Date=%s", pkg, src.Commit, pkg, src.Time.Format(time.RFC3339))
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", dir + string(filepath.Separator)}
	for _, b := range Binaries {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.CommandContext(ctx, goCmd, args...)
	cmd.Dir = src.Root
	// Static, for p, whatever this machine's settings; GOFLAGS cleared so
	// that a developer's flags cannot change the bytes.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Arch, "GOFLAGS=", "GOARM64=v8.0", "GOAMD64=v1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s: %w: %s", p, err, stderr.String())
	}
	return nil
}

// entry is a file of a tarball.
type entry struct {
	name string
	mode int64
	body []byte
	// link, when set, makes the entry a symbolic link to it (image layers
	// only).
	link string
}

// writeTarball is a gzipped tar of entries under the directory top, every
// header pinned: sorted names, the given time, root's ownership.
func writeTarball(top string, entries []entry, at time.Time) ([]byte, error) {
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	dirs := map[string]bool{}
	addDir := func(name string) error {
		if dirs[name] {
			return nil
		}
		dirs[name] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, ModTime: at, Format: tar.FormatPAX})
	}
	if err := addDir(top); err != nil {
		return nil, err
	}
	for _, e := range entries {
		name := top + "/" + e.name
		if d := path.Dir(name); d != top { // one level: docs/, nats/, systemd/
			if err := addDir(d); err != nil {
				return nil, err
			}
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: e.mode, Size: int64(len(e.body)), ModTime: at, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeSums writes SHA256SUMS of names in dist, in sha256sum's format
// (sha256sum -c SHA256SUMS checks them).
func writeSums(dist string, names []string) error {
	var b strings.Builder
	for _, n := range names {
		raw, err := os.ReadFile(filepath.Join(dist, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%x  %s\n", sha256.Sum256(raw), n)
	}
	return os.WriteFile(filepath.Join(dist, "SHA256SUMS"), []byte(b.String()), 0o644)
}

// ReadSums reads a SHA256SUMS file: hex digest by name.
func ReadSums(path string) (map[string]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok || len(sum) != 64 {
			return nil, fmt.Errorf("%s: %q: want \"<sha256>  <name>\"", path, line)
		}
		sums[name] = sum
	}
	return sums, nil
}

// ReadTarball returns the files of a release tarball by their path under
// its top directory.
func ReadTarball(path string) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		_, rest, _ := strings.Cut(h.Name, "/")
		var b bytes.Buffer
		if _, err := b.ReadFrom(tr); err != nil {
			return nil, err
		}
		files[rest] = b.Bytes()
	}
}
