package faults

import (
	"bytes"
	"encoding/hex"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// After every scenario, no raw identity (the API tokens the clients sent)
// and not the key secret is anywhere a process wrote: the logs of every
// process, the Redis primaries' append-only files (every key and value
// they were sent), NATS's JetStream store (the accounting, decisions and
// dead-letter streams), Prometheus's data, and the binaries' /metrics.
func noIdentityWrittenDown(t *testing.T, c *cluster) {
	require.NotEmpty(t, c.identities, "the scenarios before this one sent no identities")
	secrets := append([][]byte{c.stack.Secret(), []byte(hex.EncodeToString(c.stack.Secret()))}, toBytes(c.identities)...)
	// What the scan must see for it to mean anything: the key the first
	// identity's window has in Redis (a digest), in the primaries' files.
	control := []byte(c.keys.Key(far.Name, "h:"+c.identities[0]).String())
	var scanned int
	var seen bool
	find := func(where string, data []byte) {
		for _, s := range secrets {
			require.False(t, bytes.Contains(data, s), "%q written in %s", s, where)
		}
		seen = seen || bytes.Contains(data, control)
	}
	require.NoError(t, filepath.WalkDir(c.stack.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		scanned += len(b)
		find(path, b)
		return nil
	}))
	resp, err := http.Get("http://" + c.acc.AdminAddr + "/metrics")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	find("the accountant's /metrics", b)
	t.Logf("%d identities absent from %d bytes of logs, data and metrics", len(c.identities), scanned)
	require.True(t, seen, "the scan did not reach the Redis data (no %s in it)", control)
}

func toBytes(ss []string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}
