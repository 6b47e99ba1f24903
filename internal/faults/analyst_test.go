package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
)

// An analyst reads the decisions stream with the documented consumer
// (examples/decisions, docs/events.md): for each of the scenario's windows
// its count from the stream alone — admitted less given back — is what the
// primary holds, and so is its overshoot. Two edges share keys in mode
// async, which may go over their limit, beside the usual targets. Every
// record on the stream, of every scenario so far, validates against the
// documented schema (docs/decision.schema.json).
func analyst(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	var async []*target
	for i := range 4 {
		id := fmt.Sprintf("analyst/async-%d", i)
		async = append(async, &target{identity: id, path: "/async/items", policy: loose.Limiter(), cost: 1,
			key: c.keys.Key(loose.Name, "h:"+id)})
		c.identities = append(c.identities, id)
	}
	second := c.startEdge(t, "edge-analyst-2", nil)
	l1 := startLoad([]string{r.e.proxy}, async, loadClients, loadRate)
	l2 := startLoad([]string{second.proxy}, async, loadClients, loadRate)
	time.Sleep(after)
	l1.finish()
	l2.finish()
	r.finish(t)
	c.settle(t, second)
	c.settle(t, r.e)

	analystAgrees(t, c, append(slices.Clone(r.l.targets), async...))

	// Every record validates against the documented schema.
	schema := decisionSchema(t)
	records := 0
	eachRecord(t, c, func(rec any) {
		require.NoError(t, schema.Validate(rec))
		records++
	})
	t.Logf("%d decision records valid against docs/decision.schema.json", records)
	require.Positive(t, records)
}

// decisionSchema compiles docs/decision.schema.json, formats asserted.
func decisionSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	s, err := c.Compile("../../docs/decision.schema.json")
	require.NoError(t, err)
	return s
}

func errOutput(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// analystAgrees runs the documented consumer (examples/decisions) over the
// decisions stream and checks its count and overshoot of each of targets'
// windows against the primaries. It returns the units over a limit.
func analystAgrees(t *testing.T, c *cluster, targets []*target) int64 {
	// As the analytics user of the shipped NATS permissions.
	cmd := exec.Command(filepath.Join(bin, "decisions"), "-nats", c.nats.Addr, "-user", "analytics", "-idle", "1s")
	cmd.Env = append(os.Environ(), "NATS_PASSWORD="+c.stack.NATSPassword("analytics"))
	out, err := cmd.Output()
	require.NoError(t, err, "%s", errOutput(err))
	type window struct {
		Key, Policy                               string
		Limit, Admitted, Refunded, Net, Overshoot int64
	}
	ours := map[string]bool{}
	for _, tg := range targets {
		ours[tg.key.Digest().String()] = true
	}
	windows := map[string]window{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var w window
		require.NoError(t, json.Unmarshal(sc.Bytes(), &w))
		if !ours[w.Key] {
			continue // earlier scenarios' keys: their faults cost them records (see docs/events.md)
		}
		_, dup := windows[w.Key]
		require.False(t, dup, "one window per key: %s", w.Key) // none of an hour ends during the suite
		windows[w.Key] = w
	}
	var overshoot, admitted int64
	for _, tg := range targets {
		w, ok := windows[tg.key.Digest().String()]
		used := c.usage(t, tg)
		if used == 0 && !ok {
			continue // no request of this key was allowed
		}
		require.True(t, ok, "%s: no window from the stream, %d on the primary", tg.identity, used)
		if used != w.Net {
			logRecords(t, c, w.Key)
		}
		require.Equal(t, used, w.Net, "%s: the stream's count (admitted %d, refunded %d) against the primary's", tg.identity,
			w.Admitted, w.Refunded)
		require.Equal(t, max(0, used-tg.policy.Limit), w.Overshoot, tg.identity)
		overshoot += w.Overshoot
		admitted += w.Admitted
	}
	t.Logf("analyst: %d of the scenario's windows from the stream, %d units admitted, %d over a limit",
		len(windows), admitted, overshoot)

	return overshoot
}

// eachRecord calls f with every record of the decisions stream, in order.
func eachRecord(t *testing.T, c *cluster, f func(rec any)) {
	t.Helper()
	cons, err := c.js.OrderedConsumer(context.Background(), c.streams.Decisions.Name, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			n++
			v, err := jsonschema.UnmarshalJSON(bytes.NewReader(m.Data()))
			require.NoError(t, err)
			recs, ok := v.([]any)
			require.True(t, ok, "a message is a JSON array of records")
			for _, rec := range recs {
				f(rec)
			}
		}
		if n == 0 {
			return
		}
	}
}

// logRecords logs the data of every record of the key with digest key, for
// a disagreement to be read.
func logRecords(t *testing.T, c *cluster, key string) {
	t.Helper()
	eachRecord(t, c, func(rec any) {
		m, _ := rec.(map[string]any)
		d, _ := m["data"].(map[string]any)
		if d["key"] != key {
			return
		}
		b, _ := json.Marshal(d)
		t.Logf("%s %s", m["source"], b)
	})
}
