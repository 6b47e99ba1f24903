package dist

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The image: one for the three binaries, for both platforms. It has no
// entrypoint: its command is the edge-checker, and any of the binaries is
// run by naming it (they are on the PATH): "accountant -config …",
// "tally version".
const (
	// UID and GID the processes run as: not root, no login.
	UID = 65532
	// BinDir holds the binaries; ConfigPath is where the default command
	// reads its configuration (mount it there).
	BinDir = "/usr/local/bin"
	// RatelimitLink is envoyproxy/ratelimit's command, a link to tally.
	RatelimitLink = "bin/ratelimit"
	ConfigPath    = "/etc/tally/tally.yaml"
	// CACerts is the CA bundle (Mozilla's roots, as golang.org/x/crypto's
	// x509roots/fallback carries them), where Go looks for it on Linux.
	CACerts = "/etc/ssl/certs/ca-certificates.crt"
	// RepoURL is the repository the image is built from.
	RepoURL = "https://github.com/tallyhq/tally"
)

// Ports are the ports the image's processes listen on in the chart and
// the examples: proxy, decision API, forward-auth, Envoy's rate-limit
// service, the edge's admin listener, the accountant's.
var Ports = []string{"8080/tcp", "8081/tcp", "8082/tcp", "8083/tcp", "9090/tcp", "9091/tcp"}

// ImageFile is the file name of the image's OCI archive.
func (s Source) ImageFile() string { return "tally_" + s.Version + "_oci.tar" }

// Labels are the image's OCI labels (and its index's annotations).
func (s Source) Labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":      RepoURL,
		"org.opencontainers.image.version":     s.Version,
		"org.opencontainers.image.revision":    s.Commit,
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.created":     s.Time.Format(time.RFC3339),
		"org.opencontainers.image.title":       "tally",
		"org.opencontainers.image.description": "Tally: edge-checker, accountant and the tally CLI",
	}
}

// Image writes the OCI archive of the image, made from the release
// tarballs in dist (checked against dist/SHA256SUMS first), into dist and
// returns its file name.
func Image(src Source, dist string) (string, error) {
	sums, err := ReadSums(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		return "", fmt.Errorf("%w (make release writes it)", err)
	}
	base, err := baseLayer(src.Time)
	if err != nil {
		return "", err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range Platforms {
		tgz := filepath.Join(dist, src.Tarball(p))
		if err := checkSum(tgz, sums[src.Tarball(p)]); err != nil {
			return "", err
		}
		files, err := ReadTarball(tgz)
		if err != nil {
			return "", err
		}
		img, err := platformImage(src, p, base, files)
		if err != nil {
			return "", fmt.Errorf("%s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.OS, Architecture: p.Arch}}})
	}
	idx = mutate.Annotations(idx, src.Labels()).(v1.ImageIndex)

	dir, err := os.MkdirTemp("", "tally-oci-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": src.Version})); err != nil {
		return "", err
	}
	archive, err := tarDir(dir, src.Time)
	if err != nil {
		return "", err
	}
	name := src.ImageFile()
	return name, os.WriteFile(filepath.Join(dist, name), archive, 0o644)
}

// platformImage is the image for p: the base layer, then the binaries.
func platformImage(src Source, p Platform, base v1.Layer, files map[string][]byte) (v1.Image, error) {
	var bins []entry
	for _, b := range Binaries {
		raw, ok := files[b]
		if !ok {
			return nil, fmt.Errorf("the tarball has no %s", b)
		}
		bins = append(bins, entry{name: strings.TrimPrefix(BinDir, "/") + "/" + b, mode: 0o755, body: raw})
	}
	bins = append(bins, entry{name: "usr/share/doc/tally/LICENSE", mode: 0o644, body: files["LICENSE"]},
		// Envoy Gateway and Istio's sample run /bin/ratelimit: tally run
		// under that name is "tally serve -envoy-settings"
		// (docs/envoy-gateway.md).
		entry{name: RatelimitLink, mode: 0o777, link: BinDir + "/tally"})
	binLayer, err := layer(bins, src.Time)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: src.Time}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1),
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{Created: created,
			CreatedBy: "tally make image: /etc/passwd, /etc/group, CA certificates", Comment: "base"}},
		mutate.Addendum{Layer: binLayer, MediaType: types.OCILayer, History: v1.History{Created: created,
			CreatedBy: "tally make image: " + strings.Join(Binaries, ", ") + " " + src.Version + " for " + p.String()}})
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = p.OS, p.Arch, created
	ports := map[string]struct{}{}
	for _, port := range Ports {
		ports[port] = struct{}{}
	}
	cf.Config = v1.Config{
		User:         fmt.Sprintf("%d:%d", UID, UID),
		Env:          []string{"PATH=" + BinDir, "SSL_CERT_FILE=" + CACerts},
		Cmd:          []string{BinDir + "/edge-checker", "-config", ConfigPath},
		WorkingDir:   "/",
		ExposedPorts: ports,
		Labels:       src.Labels(),
		StopSignal:   "SIGTERM",
	}
	return mutate.ConfigFile(img, cf)
}

// baseLayer holds what the binaries need of a system: a user to run as,
// and the CA certificates to verify servers (Redis, NATS, OTLP over TLS).
func baseLayer(at time.Time) (v1.Layer, error) {
	var roots bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue // a constraint PEM cannot carry: left out rather than trusted beyond it
		}
		if err := pem.Encode(&roots, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
		n++
	}
	if n < 50 {
		return nil, fmt.Errorf("only %d CA certificates in the bundle", n)
	}
	id := fmt.Sprint(UID)
	return layer([]entry{
		{name: "etc/passwd", mode: 0o644, body: []byte("root:x:0:0:root:/root:/sbin/nologin\ntally:x:" + id + ":" + id + ":tally:/nonexistent:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, body: []byte("root:x:0:\ntally:x:" + id + ":\n")},
		{name: "etc/nsswitch.conf", mode: 0o644, body: []byte("hosts: files dns\n")},
		{name: strings.TrimPrefix(CACerts, "/"), mode: 0o644, body: roots.Bytes()},
		{name: "etc/tally/", mode: 0o755},
	}, at)
}

// layer is an OCI layer of entries (a name ending in / is a directory),
// with their parent directories, every header pinned.
func layer(entries []entry, at time.Time) (v1.Layer, error) {
	all := map[string]entry{}
	for _, e := range entries {
		all[e.name] = e
		for d := path.Dir(strings.TrimSuffix(e.name, "/")); d != "."; d = path.Dir(d) {
			if _, ok := all[d+"/"]; !ok {
				all[d+"/"] = entry{name: d + "/", mode: 0o755}
			}
		}
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := all[n]
		h := &tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: e.mode, Size: int64(len(e.body)), ModTime: at, Format: tar.FormatPAX}
		switch {
		case strings.HasSuffix(n, "/"):
			h.Typeflag, h.Size = tar.TypeDir, 0
		case e.link != "":
			h.Typeflag, h.Size, h.Linkname = tar.TypeSymlink, 0, e.link
		}
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
	raw := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// tarDir is a tar of the directory dir (an OCI layout), every header
// pinned.
func tarDir(dir string, at time.Time) ([]byte, error) {
	var names []string
	err := filepath.WalkDir(dir, func(file string, d fs.DirEntry, err error) error {
		if err != nil || file == dir {
			return err
		}
		names = append(names, file)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, file := range names {
		rel, _ := filepath.Rel(dir, file)
		info, err := os.Stat(file)
		if err != nil {
			return nil, err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: at, Format: tar.FormatPAX}
		var body []byte
		if info.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		} else if body, err = os.ReadFile(file); err != nil {
			return nil, err
		}
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// checkSum fails unless file has the SHA-256 want (hex).
func checkSum(file, want string) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if got := fmt.Sprintf("%x", sha256.Sum256(raw)); got != want {
		return fmt.Errorf("%s: SHA-256 %s, but SHA256SUMS says %q: make release again", file, got, want)
	}
	return nil
}
