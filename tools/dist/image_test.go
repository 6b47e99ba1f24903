package dist_test

import (
	"archive/tar"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/tools/dist"
)

// openArchive unpacks the OCI archive and returns the image index it names
// (the archive's one entry, named after the version).
func openArchive(t *testing.T) v1.ImageIndex {
	t.Helper()
	f, err := os.Open(filepath.Join(built.dir, built.src.ImageFile()))
	require.NoError(t, err)
	defer f.Close()
	dir := t.TempDir()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.False(t, strings.Contains(h.Name, ".."), h.Name)
		path := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			require.NoError(t, os.MkdirAll(path, 0o755))
			continue
		}
		out, err := os.Create(path)
		require.NoError(t, err)
		_, err = io.Copy(out, tr)
		require.NoError(t, err)
		require.NoError(t, out.Close())
	}
	top, err := layout.ImageIndexFromPath(dir)
	require.NoError(t, err)
	m, err := top.IndexManifest()
	require.NoError(t, err)
	require.Len(t, m.Manifests, 1)
	require.Equal(t, built.src.Version, m.Manifests[0].Annotations["org.opencontainers.image.ref.name"])
	require.Equal(t, types.OCIImageIndex, m.Manifests[0].MediaType)
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	require.NoError(t, err)
	return idx
}

// files reads the flattened file system of img: each path's header and
// its bytes.
func files(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	hs, bodies := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hs, bodies
		}
		require.NoError(t, err)
		name := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		hs[name] = h
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		bodies[name] = b
	}
}

// The image archive holds one index for linux/amd64 and linux/arm64; each
// image runs as a non-root user, has the CA certificates, the OCI labels,
// the ports and no shell or package manager; its edge-checker, accountant
// and tally are the release's, and the one for this machine runs.
func TestImage(t *testing.T) {
	src := built.src
	idx := openArchive(t)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Equal(t, types.OCIImageIndex, im.MediaType)
	require.Equal(t, src.Labels(), im.Annotations)
	var platforms []string
	for _, d := range im.Manifests {
		require.Equal(t, types.OCIManifestSchema1, d.MediaType)
		platforms = append(platforms, d.Platform.String())
	}
	require.ElementsMatch(t, []string{"linux/amd64", "linux/arm64"}, platforms)

	for _, d := range im.Manifests {
		t.Run(d.Platform.String(), func(t *testing.T) {
			img, err := idx.Image(d.Digest)
			require.NoError(t, err)
			cf, err := img.ConfigFile()
			require.NoError(t, err)
			require.Equal(t, d.Platform.OS, cf.OS)
			require.Equal(t, d.Platform.Architecture, cf.Architecture)
			require.Equal(t, "65532:65532", cf.Config.User, "not root")
			require.Empty(t, cf.Config.Entrypoint, "no entrypoint: the command names the binary")
			require.Equal(t, []string{"/usr/local/bin/edge-checker", "-config", "/etc/tally/tally.yaml"}, cf.Config.Cmd)
			require.Contains(t, cf.Config.Env, "PATH=/usr/local/bin")
			for _, port := range []string{"8080/tcp", "8081/tcp", "8082/tcp", "8083/tcp", "9090/tcp", "9091/tcp"} {
				require.Contains(t, cf.Config.ExposedPorts, port)
			}
			labels := cf.Config.Labels
			require.Equal(t, "https://github.com/tallyhq/tally", labels["org.opencontainers.image.source"])
			require.Equal(t, src.Version, labels["org.opencontainers.image.version"])
			require.Equal(t, "Apache-2.0", labels["org.opencontainers.image.licenses"])
			require.Equal(t, src.Commit, labels["org.opencontainers.image.revision"])
			require.Equal(t, src.Time, cf.Created.Time.UTC())
			mf, err := img.Manifest()
			require.NoError(t, err)
			require.Equal(t, types.OCIConfigJSON, mf.Config.MediaType)
			for _, l := range mf.Layers {
				require.Equal(t, types.OCILayer, l.MediaType)
			}

			hs, bodies := files(t, img)
			for name, h := range hs {
				if strings.HasPrefix(name, "/bin/") {
					require.Equal(t, "/bin/ratelimit", name, "/bin holds envoyproxy/ratelimit's command only")
					require.Equal(t, byte(tar.TypeSymlink), h.Typeflag)
					require.Equal(t, "/usr/local/bin/tally", h.Linkname, "/bin/ratelimit is tally (serve -envoy-settings)")
				}
			}
			for _, shell := range []string{"/bin/sh", "/bin/bash", "/bin/busybox", "/usr/bin/sh", "/sbin", "/usr/bin",
				"/usr/bin/apt", "/usr/bin/dpkg", "/sbin/apk", "/var/lib/dpkg", "/lib/apk"} {
				require.NotContains(t, hs, shell, "no shell, no package manager")
			}
			for name, h := range hs {
				require.Zero(t, h.Mode&(04000|02000), "%s: no setuid or setgid file", name)
				require.Equal(t, 0, h.Uid, "%s: owned by root, not writable by the user the processes run as", name)
			}
			require.Contains(t, string(bodies["/etc/passwd"]), "tally:x:65532:65532:")
			pool := x509.NewCertPool()
			require.True(t, pool.AppendCertsFromPEM(bodies["/etc/ssl/certs/ca-certificates.crt"]))
			var n int
			for rest := bodies["/etc/ssl/certs/ca-certificates.crt"]; ; n++ {
				var b *pem.Block
				if b, rest = pem.Decode(rest); b == nil {
					break
				}
				_, err := x509.ParseCertificate(b.Bytes)
				require.NoError(t, err)
			}
			require.Greater(t, n, 100, "the CA bundle holds the public roots")

			release, err := dist.ReadTarball(filepath.Join(built.dir, src.Tarball(dist.Platform{OS: d.Platform.OS, Arch: d.Platform.Architecture})))
			require.NoError(t, err)
			for _, b := range dist.Binaries {
				path := "/usr/local/bin/" + b
				require.Equal(t, int64(0o755), hs[path].Mode&0o777, path)
				require.Equal(t, release[b], bodies[path], "%s is the release's", path)
			}
			if d.Platform.Architecture != runtime.GOARCH {
				return
			}
			dir := t.TempDir()
			for _, b := range dist.Binaries {
				bin := filepath.Join(dir, b)
				require.NoError(t, os.WriteFile(bin, bodies["/usr/local/bin/"+b], 0o755))
				out, err := exec.Command(bin, "version").CombinedOutput()
				require.NoError(t, err, "%s", out)
				require.True(t, strings.HasPrefix(string(out), b+" "+src.Version+"\ncommit:  "+src.Commit+"\n"), "%s", out)
				require.Contains(t, string(out), "licence: Apache-2.0")
			}
		})
	}
}

// skopeo (Debian's, which make test installs) reads the archive: the
// index for both platforms, and each platform's image with its labels and
// user.
func TestSkopeoInspect(t *testing.T) {
	skopeo, err := exec.LookPath("skopeo")
	require.NoError(t, err, "skopeo is missing: make test installs it (Debian's skopeo package)")
	ref := "oci-archive:" + filepath.Join(built.dir, built.src.ImageFile())
	out, err := exec.Command(skopeo, "inspect", "--raw", ref).Output()
	require.NoError(t, err, "%s", out)
	var index v1.IndexManifest
	require.NoError(t, json.Unmarshal(out, &index))
	require.Len(t, index.Manifests, 2)
	for _, arch := range []string{"amd64", "arm64"} {
		out, err := exec.Command(skopeo, "inspect", "--override-os", "linux", "--override-arch", arch, ref).Output()
		require.NoError(t, err, "skopeo inspect %s", arch)
		var info struct {
			Architecture, Os string
			Labels           map[string]string
		}
		require.NoError(t, json.Unmarshal(out, &info))
		require.Equal(t, arch, info.Architecture)
		require.Equal(t, built.src.Version, info.Labels["org.opencontainers.image.version"])
		require.Equal(t, built.src.Commit, info.Labels["org.opencontainers.image.revision"])
		out, err = exec.Command(skopeo, "inspect", "--config", "--override-os", "linux", "--override-arch", arch, ref).Output()
		require.NoError(t, err)
		var cfg v1.ConfigFile
		require.NoError(t, json.Unmarshal(out, &cfg))
		require.Equal(t, "65532:65532", cfg.Config.User)
	}
}
