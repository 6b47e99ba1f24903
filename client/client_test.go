package client_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/client"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/tallytest"
	"github.com/tallyhq/tally/internal/testutil"
)

// The package computes the key contract's test vectors: what a service
// publishes lands in the window an edge counts.
func TestKeysAgreeWithTheVectors(t *testing.T) {
	raw, err := os.ReadFile("../docs/keys.vectors.json")
	require.NoError(t, err)
	var v struct {
		SecretHex  string `json:"secret_hex"`
		Prefix     string `json:"prefix"`
		KeyID      string `json:"key_id"`
		Identities []struct {
			Source, Header, Value, Address string
			IPv4Prefix                     int    `json:"ipv4_prefix"`
			IPv6Prefix                     int    `json:"ipv6_prefix"`
			IdentityHex                    string `json:"identity_hex"`
		} `json:"identities"`
		ShardSets [][]string `json:"shard_sets"`
		Windows   []struct {
			Policy      string   `json:"policy"`
			IdentityHex string   `json:"identity_hex"`
			Digest      string   `json:"digest"`
			Shards      []string `json:"shards"`
		} `json:"windows"`
	}
	require.NoError(t, json.Unmarshal(raw, &v))
	secret, err := hex.DecodeString(v.SecretHex)
	require.NoError(t, err)
	checked := 0
	for i, iv := range v.Identities {
		addr := netip.MustParseAddr("192.0.2.200")
		if iv.Address != "" {
			addr = netip.MustParseAddr(iv.Address)
		}
		v4, v6 := max(iv.IPv4Prefix, 32*boolInt(iv.IPv4Prefix == 0)), max(iv.IPv6Prefix, 64*boolInt(iv.IPv6Prefix == 0))
		var id string
		switch iv.Source {
		case "header":
			if id = client.HeaderIdentity(iv.Header, iv.Value); id == "" {
				id = client.AddressIdentity(addr, v4, v6)
			}
		case "address":
			id = client.AddressIdentity(addr, v4, v6)
		case "api":
			id = client.APIIdentity(iv.Value)
		default:
			continue // descriptors: the edge's rate-limit service only
		}
		require.Equal(t, iv.IdentityHex, hex.EncodeToString([]byte(id)), "identity %d", i)
		checked++
	}
	require.Greater(t, checked, 10)
	for s, names := range v.ShardSets {
		keys, err := client.NewKeys(v.Prefix, secret, names)
		require.NoError(t, err)
		require.Equal(t, v.KeyID, keys.KeyID())
		for i, w := range v.Windows {
			id, err := hex.DecodeString(w.IdentityHex)
			require.NoError(t, err)
			got := keys.Window(w.Policy, string(id))
			require.Equal(t, client.Window{Digest: w.Digest, Shard: w.Shards[s]}, got, "window %d, shard set %d", i, s)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Against a running Tally: the decision API decides and finishes; a
// service's charges, published in binary mode, are applied once however
// often they are sent, and its refunds give them back; a single structured
// event is applied too; Follow sees the accountant's record of each.
func TestWithTally(t *testing.T) {
	tl := tallytest.Start(t, "- {name: core, limit: 3, window: 1h, mode: exact}")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api := client.NewDecisionClient(tl.API, tl.Token, &http.Client{Timeout: 10 * time.Second})

	// The decision API: three allowed, the fourth denied; a 304 gives one
	// back.
	var first client.Decision
	for i := range 3 {
		d, err := api.Check(ctx, client.CheckRequest{Policy: "core", Identity: "alice"})
		require.NoError(t, err)
		require.True(t, d.Allowed, "check %d", i+1)
		require.Equal(t, int64(2-i), d.Remaining)
		if i == 0 {
			first = d
		}
	}
	d, err := api.Check(ctx, client.CheckRequest{Policy: "core", Identity: "alice"})
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Positive(t, d.RetryAfter)
	f, err := api.Finish(ctx, client.FinishRequest{RequestID: first.RequestID, Status: http.StatusNotModified})
	require.NoError(t, err)
	require.Equal(t, client.Finished{Finished: true, Refunded: 1}, f)
	_, err = api.Finish(ctx, client.FinishRequest{RequestID: first.RequestID, Status: http.StatusNotModified})
	var apiErr *client.APIError
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, http.StatusConflict, apiErr.Status, "finished twice")
	_, err = api.Check(ctx, client.CheckRequest{Policy: "nope", Identity: "alice"})
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, http.StatusBadRequest, apiErr.Status)
	require.Contains(t, apiErr.Detail, "unknown policy")
	_, err = client.NewDecisionClient(tl.API, "wrong", nil).Check(ctx, client.CheckRequest{Policy: "core", Identity: "alice"})
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, http.StatusUnauthorized, apiErr.Status)

	// Follow the decisions stream as the analytics user.
	ac, ajs := tl.NATS.ConnectAs("analytics")
	defer ac.Close()
	var mu sync.Mutex
	outcomes := map[string][]string{} // request id → accountant outcomes
	followed := make(chan error, 1)
	go func() {
		followed <- client.Follow(ctx, ajs, client.FollowConfig{Subjects: []string{"tally.decisions.accountant"}},
			func(r client.DecisionRecord) error {
				mu.Lock()
				defer mu.Unlock()
				outcomes[r.Data.RequestID] = append(outcomes[r.Data.RequestID], r.Data.Outcome)
				return nil
			})
	}()
	outcomesOf := func(requestID string) []string {
		select {
		case err := <-followed:
			t.Fatalf("Follow ended: %v", err)
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), outcomes[requestID]...)
	}

	// A service's own events, as the billing user, in the "billing"
	// namespace.
	_, js := tl.NATS.ConnectAs("billing")
	keys, err := client.NewKeys(tl.Prefix, tl.Secret, tl.Shards)
	require.NoError(t, err)
	pub, err := client.NewPublisher(js, client.PublisherConfig{Namespace: "billing", Source: "billing-api", Keys: keys})
	require.NoError(t, err)
	_, err = client.NewPublisher(js, client.PublisherConfig{Namespace: "bad namespace", Source: "x", Keys: keys})
	require.Error(t, err)
	bob := client.APIIdentity("bob")
	charge, err := pub.Charge(ctx, client.Charge{Policy: "core", Limit: 3, Window: time.Hour, Identity: bob, Units: 3, RequestID: "billing-1"})
	require.NoError(t, err)
	require.Equal(t, uint64(1), charge.Seq)
	require.NoError(t, pub.Retry(ctx, charge), "the same event again")
	// A charge may take a window past its limit (an overdraft, as a cost
	// known at the end may), but not by more than a window can count.
	_, err = pub.Charge(ctx, client.Charge{Policy: "core", Limit: 3, Window: time.Hour, Identity: bob, Units: 1_000_000_001})
	require.ErrorIs(t, err, client.ErrInvalidEvent, "more units than 10^9")
	testutil.WaitFor(t, "the charge applied", func() bool { return len(outcomesOf("billing-1")) >= 1 })

	// bob's window is full: the edge counts the service's charge.
	d, err = api.Check(ctx, client.CheckRequest{Policy: "core", Identity: "bob"})
	require.NoError(t, err)
	require.False(t, d.Allowed, "the service's charge of 3 filled bob's window")

	refund, err := pub.Refund(ctx, charge)
	require.NoError(t, err)
	require.Equal(t, uint64(2), refund.Seq)
	_, err = pub.Finish(ctx, refund, http.StatusNotModified)
	require.ErrorIs(t, err, client.ErrInvalidEvent, "a refund of a refund")
	testutil.WaitFor(t, "the refund applied", func() bool { return len(outcomesOf("billing-1")) >= 2 })
	testutil.WaitFor(t, "bob admitted again", func() bool {
		d, err := api.Check(ctx, client.CheckRequest{Policy: "core", Identity: "bob"})
		require.NoError(t, err)
		return d.Allowed
	})
	// Applied once each, whatever was sent twice.
	require.Equal(t, []string{"charged", "refunded"}, outcomesOf("billing-1"))

	// One structured event (application/cloudevents+json) is applied too.
	w := keys.Window("core", client.APIIdentity("carol"))
	e := events.Accounting{Kind: events.Started, Producer: "billing.structured", Seq: 1, KeyID: keys.KeyID(), Source: "billing-api",
		Time: time.Now(), Key: w.Digest, Policy: "core", Limit: 3, WindowSeconds: 3600, Units: 1, StartedAt: time.Now(), RequestID: "billing-structured-1"}
	m := nats.NewMsg(events.AccountingSubject(client.DefaultSubjectPrefix, w.Shard, e.Producer))
	m.Header = nats.Header{events.HeaderContentType: {events.ContentTypeEvent}, events.HeaderMsgID: {"billing.structured.s0.1-1"}}
	m.Data = events.AppendAccounting(nil, w.Shard, &e)
	_, err = js.PublishMsg(ctx, m)
	require.NoError(t, err)
	testutil.WaitFor(t, "the structured event applied", func() bool {
		return len(outcomesOf("billing-structured-1")) == 1 && outcomesOf("billing-structured-1")[0] == "charged"
	})

	cancel()
	require.NoError(t, <-followed, "Follow ends when its context does")
	require.False(t, errors.Is(ctx.Err(), context.DeadlineExceeded), "the test ran out of time")
}
