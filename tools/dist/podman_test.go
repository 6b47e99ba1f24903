package dist_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tallyhq/tally/internal/freeport"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/testutil"
)

// The image runs under podman as Kubernetes runs it with the chart's
// settings — its own user, a read-only root file system, every
// capability dropped, no new privileges, the configuration mounted
// read-only at /etc/tally — against the tests' Redis and NATS: the
// edge-checker and the accountant both answer /readyz.
//
// How podman runs here, and why: this machine's kernel gives root no
// CAP_SYS_RESOURCE and mounts cgroups in hybrid mode (v1 controllers, an
// empty v2 hierarchy). podman's default runtime, crun, refuses hybrid
// cgroups ("cgroups in hybrid mode not supported"), so the test runs
// runc (Debian's runc, which make test installs); the rlimits are set
// below the current ones (runc could not even set the same process limit
// again without CAP_SYS_RESOURCE);
// the container shares the host's network so that it reaches the servers
// on loopback.
func TestImageRunsUnderPodman(t *testing.T) {
	podman, err := exec.LookPath("podman")
	require.NoError(t, err, "podman is missing: make test installs it (Debian's podman and runc)")
	_, err = exec.LookPath("runc")
	require.NoError(t, err, "runc is missing: make test installs it (Debian's runc)")
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, podman, append([]string{"--runtime", "runc", "--cgroup-manager", "cgroupfs"}, args...)...)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "podman %s: %s", strings.Join(args, " "), stderr.String())
		return strings.TrimSpace(string(out))
	}
	out := run("pull", "--quiet", "--arch", runtime.GOARCH, "oci-archive:"+filepath.Join(built.dir, built.src.ImageFile()))
	id := lastLine(out)
	require.NotEmpty(t, id)
	// The image is run by a name of this run's own, and only that name is
	// removed afterwards: two runs of the suite on one machine pull the
	// same image (the build is reproducible), and removing it by id, or
	// with --force, would remove the other run's containers under it.
	// The name the pull gave it (from the archive's ref.name) is taken
	// off once the run's own is on, so that podman removes the image with
	// the last run's name, once no container uses it.
	image := fmt.Sprintf("localhost/tally-test:%d-%d", os.Getpid(), time.Now().UnixNano())
	run("tag", id, image)
	t.Cleanup(func() { _ = exec.Command(podman, "rmi", image).Run() })
	for _, name := range strings.Fields(run("image", "inspect", "--format", `{{range .RepoTags}}{{.}} {{end}}`, id)) {
		if !strings.HasPrefix(name, "localhost/tally-test:") {
			_ = exec.Command(podman, "untag", id, name).Run() // another run may have taken it off first
		}
	}

	require.Equal(t, "tally "+built.src.Version, firstLine(run(append(runFlags(t, nil), image, "tally", "version")...)))

	rs := redistest.Start(t)
	ns := natstest.Start(t)
	edgeAdmin, accAdmin := freeAddr(t), freeAddr(t)
	dir := t.TempDir()
	cfg := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
		"nats:\n  url: " + ns.ClientURL() + "\n" +
		"edge:\n  api_listen: 127.0.0.1:0\n  admin_listen: " + edgeAdmin + "\n" +
		"accountant:\n  admin_listen: " + accAdmin + "\n" +
		"policies:\n  - {name: core, limit: 10, window: 1m}\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tally.yaml"), []byte(cfg), 0o644))
	require.NoError(t, os.Chmod(dir, 0o755))
	secret := strings.Repeat("7e", 32)
	for _, role := range []struct{ name, admin, user string }{{"edge-checker", edgeAdmin, "edge"}, {"accountant", accAdmin, "accountant"}} {
		name := fmt.Sprintf("tally-test-%s-%d", role.name, time.Now().UnixNano())
		env := []string{"TALLY_KEY_SECRET=" + secret, "TALLY_NATS_USER=" + role.user,
			"TALLY_NATS_PASSWORD=" + natstest.Password(role.user), "TALLY_NATS_INBOX_PREFIX=_INBOX_" + role.user}
		args := append(runFlags(t, env), "--detach", "--name", name, "--volume", dir+":/etc/tally:ro", image)
		if role.name == "accountant" {
			args = append(args, "accountant", "-config", "/etc/tally/tally.yaml")
		}
		run(args...)
		t.Cleanup(func() {
			_ = exec.Command(podman, "--runtime", "runc", "rm", "--force", "--time", "5", name).Run()
		})
		testutil.WaitForWithin(t, role.name+" in the image ready", time.Minute, func() bool {
			resp, err := http.Get("http://" + role.admin + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
		user := run("exec", name, "tally", "version")
		require.Contains(t, user, "licence: Apache-2.0")
	}
}

// runFlags are the flags of podman run: the chart's security settings,
// rlimits this machine allows, the host's network, and env.
func runFlags(t *testing.T, env []string) []string {
	t.Helper()
	nofile, nproc := rlimit(t, unix.RLIMIT_NOFILE, 1<<20), rlimit(t, unix.RLIMIT_NPROC, 4096)
	args := []string{"run", "--rm", "--read-only", "--cap-drop=all", "--security-opt=no-new-privileges",
		"--network=host", "--ulimit", "nofile=" + nofile + ":" + nofile, "--ulimit", "nproc=" + nproc + ":" + nproc}
	for _, e := range env {
		args = append(args, "--env", e)
	}
	return args
}

// rlimit is resource's hard limit, at most upTo: a limit a container may
// be given without CAP_SYS_RESOURCE.
func rlimit(t *testing.T, resource int, upTo uint64) string {
	t.Helper()
	var l unix.Rlimit
	require.NoError(t, unix.Getrlimit(resource, &l))
	return fmt.Sprint(min(l.Max, upTo))
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := freeport.Addr()
	require.NoError(t, err)
	return a
}
