package deploy_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// units are the systemd units Tally ships, and what each must do.
var units = []struct {
	file, exec string
	// reload: the process reads its configuration again on SIGHUP.
	reload bool
	user   string
}{
	{"tally-edge-checker.service", "/usr/local/bin/edge-checker -config /etc/tally/tally.yaml", true, "tally"},
	{"tally-accountant.service", "/usr/local/bin/accountant -config /etc/tally/tally.yaml", false, "tally"},
	{"nats-server.service", "/usr/local/bin/nats-server -c /etc/nats/tally.conf -sd /var/lib/nats", true, "nats"},
}

// The systemd units pass systemd-analyze verify without a word (a
// misspelt or unparsable setting is only a warning there: any output
// fails), are hardened as systemd-analyze security measures it (exposure
// at most 1.5 of 10), and carry the settings Tally relies on: a user of
// their own, a read-only system, no new privileges, no capabilities, a
// private /tmp, restart on failure, secrets from an environment file
// only root reads, and SIGHUP for reload where the binary reads its
// configuration again. The binaries are stand-ins (this test's own
// executable) at a temporary path: verify checks that ExecStart can run.
func TestSystemdUnits(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	require.NoError(t, err, "systemd-analyze is missing: make test installs it (Debian's systemd package)")
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	self, err := os.Executable()
	require.NoError(t, err)
	stub, err := os.ReadFile(self)
	require.NoError(t, err)
	var paths []string
	for _, u := range units {
		raw, err := os.ReadFile(filepath.Join("systemd", u.file))
		require.NoError(t, err)
		s := parseUnit(t, raw)
		require.Equal(t, []string{u.exec}, s["Service.ExecStart"], u.file)
		require.Equal(t, []string{u.user}, s["Service.User"], "%s: a user of its own, not root", u.file)
		for key, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
			"CapabilityBoundingSet": "", "AmbientCapabilities": "", "Restart": "on-failure", "ProtectHome": "yes",
			"SystemCallErrorNumber": "EPERM"} {
			require.Equal(t, []string{want}, s["Service."+key], "%s: %s", u.file, key)
		}
		require.Len(t, s["Service.EnvironmentFile"], 1, "%s: secrets from an environment file", u.file)
		if u.reload {
			require.Equal(t, []string{"/bin/kill -HUP $MAINPID"}, s["Service.ExecReload"], u.file)
		} else {
			require.Empty(t, s["Service.ExecReload"], "%s: its binary does not reload", u.file)
		}
		require.Equal(t, []string{"multi-user.target"}, s["Install.WantedBy"])

		name := strings.Fields(u.exec)[0]
		stand := filepath.Join(bin, filepath.Base(name))
		require.NoError(t, os.WriteFile(stand, stub, 0o755))
		path := filepath.Join(dir, u.file)
		require.NoError(t, os.WriteFile(path, bytes.ReplaceAll(raw, []byte(name), []byte(stand)), 0o644))
		paths = append(paths, path)
	}
	out, err := exec.Command(analyze, append([]string{"verify"}, paths...)...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Empty(t, string(out), "systemd-analyze verify has something to say")
	out, err = exec.Command(analyze, append([]string{"security", "--offline=yes", "--threshold=15", "--no-pager"}, paths...)...).CombinedOutput()
	require.NoError(t, err, "exposure above 1.5:\n%s", out)

	// The check can fail: a misspelt setting is reported.
	bad := filepath.Join(dir, "bad.service")
	raw, err := os.ReadFile(paths[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bad, bytes.Replace(raw, []byte("ProtectSystem=strict"), []byte("ProtectSytem=strict"), 1), 0o644))
	out, _ = exec.Command(analyze, "verify", bad).CombinedOutput()
	require.Contains(t, string(out), "Unknown key 'ProtectSytem'")

	sysusers, err := os.ReadFile(filepath.Join("systemd", "tally.sysusers.conf"))
	require.NoError(t, err)
	for _, u := range []string{"tally", "nats"} {
		require.Regexp(t, `(?m)^u\s+`+u+`\s+-\s+"[^"]+"\s+/nonexistent\s+/usr/sbin/nologin$`, string(sysusers))
	}
}

// parseUnit reads a unit file: the values of each "Section.Key", in
// order. Comments and blank lines are skipped.
func parseUnit(t *testing.T, raw []byte) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "a line of a unit: %q", line)
			out[section+"."+k] = append(out[section+"."+k], v)
		}
	}
	require.NoError(t, sc.Err())
	return out
}
