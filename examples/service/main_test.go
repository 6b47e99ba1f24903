package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/tallytest"
)

// The example runs as its documentation says against a running Tally:
// three admitted and the fourth denied, a 304 given back, a charge and its
// refund each applied once by the accountant.
func TestExampleRuns(t *testing.T) {
	tl := tallytest.Start(t, "- {name: core, limit: 3, window: 1h, mode: exact}")
	nc, _ := tl.NATS.ConnectAs("billing")
	ac, _ := tl.NATS.ConnectAs("analytics")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := run(ctx, Config{API: tl.API, APIToken: tl.Token, NATS: nc, Analytics: ac, Prefix: tl.Prefix, Secret: tl.Secret,
		Shards: tl.Shards, Namespace: "billing", Policy: "core", Limit: 3, Window: time.Hour, Wait: 30 * time.Second}, &out)
	require.NoError(t, err, out.String())

	var steps []Step
	dec := json.NewDecoder(&out)
	for dec.More() {
		var s Step
		require.NoError(t, dec.Decode(&s))
		steps = append(steps, s)
	}
	var allowed []bool
	var rest []string
	for _, s := range steps {
		if s.Step == "check" {
			allowed = append(allowed, *s.Allowed)
			continue
		}
		rest = append(rest, s.Step+" "+s.Detail)
	}
	require.Equal(t, []bool{true, true, true, false}, allowed)
	require.Len(t, rest, 5)
	require.Equal(t, "finish 304 ", rest[0])
	require.Equal(t, "refund ", rest[2])
	require.Equal(t, []string{"applied charged", "applied refunded"}, rest[3:])
}
