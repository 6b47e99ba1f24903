// Command service is a service that works with Tally through the public
// client package (github.com/tallyhq/tally/client), in three ways:
//
//   - it asks the decision API before serving a request and reports how the
//     request finished (a 304 gives its charge back);
//   - it decides for itself and publishes what it served as accounting
//     events (a charge, then the refund of its 304), numbered as a producer
//     so that each is applied once;
//   - it follows the decisions stream to see the accountant apply them.
//
// It prints one JSON line per step.
//
//	TALLY_API_TOKEN=… TALLY_KEY_SECRET=… BILLING_PASSWORD=… ANALYTICS_PASSWORD=… \
//	  go run ./examples/service -api http://127.0.0.1:8081 -nats nats://127.0.0.1:4222 -shards s0
//
// It connects to NATS twice, as deploy/nats/tally.conf's users: billing
// publishes accounting events in its namespace (-namespace), analytics
// reads the decisions stream.
package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/client"
)

// Config is what the program needs to know of the deployment.
type Config struct {
	API, APIToken string
	// NATS publishes accounting events; Analytics reads the decisions
	// stream (the shipped permissions give these to different users).
	NATS, Analytics *nats.Conn
	Prefix          string
	Secret          []byte
	Shards          []string
	Namespace       string
	// Policy, Limit and Window are a policy's terms as the deployment
	// configures them.
	Policy string
	Limit  int64
	Window time.Duration
	// Wait bounds how long to wait for the accountant's records.
	Wait time.Duration
}

func main() {
	api := flag.String("api", "http://127.0.0.1:8081", "the edge's decision API")
	natsURL := flag.String("nats", nats.DefaultURL, "NATS server URL")
	shards := flag.String("shards", "s0", "the deployment's shard names, comma-separated")
	prefix := flag.String("prefix", "tally", "the deployment's key prefix")
	ns := flag.String("namespace", "billing", "this service's producer namespace")
	policy := flag.String("policy", "core", "the policy to count against")
	limit := flag.Int64("limit", 3, "its limit")
	window := flag.Duration("window", time.Hour, "its window")
	flag.Parse()
	secret, err := hexOrFail(os.Getenv("TALLY_KEY_SECRET"))
	if err != nil {
		fail(err)
	}
	connect := func(user string) *nats.Conn {
		nc, err := nats.Connect(*natsURL, nats.UserInfo(user, os.Getenv(strings.ToUpper(user)+"_PASSWORD")),
			nats.CustomInboxPrefix("_INBOX_"+user))
		if err != nil {
			fail(err)
		}
		return nc
	}
	nc, ac := connect("billing"), connect("analytics")
	defer nc.Close()
	defer ac.Close()
	err = run(context.Background(), Config{API: *api, APIToken: os.Getenv("TALLY_API_TOKEN"), NATS: nc, Analytics: ac, Prefix: *prefix,
		Secret: secret, Shards: strings.Split(*shards, ","), Namespace: *ns, Policy: *policy, Limit: *limit,
		Window: *window, Wait: 10 * time.Second}, os.Stdout)
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "service:", err)
	os.Exit(1)
}

// Step is one line of output.
type Step struct {
	Step     string `json:"step"`
	Identity string `json:"identity"`
	Allowed  *bool  `json:"allowed,omitempty"`
	Detail   string `json:"detail,omitempty"`
	Units    int64  `json:"units,omitempty"`
}

func run(ctx context.Context, c Config, out io.Writer) error {
	enc := json.NewEncoder(out)
	say := func(s Step) { _ = enc.Encode(s) }

	// 1. Ask first: check until denied, then give the first request's
	// charge back as its response was a 304.
	api := client.NewDecisionClient(c.API, c.APIToken, &http.Client{Timeout: 5 * time.Second})
	var tickets []string
	for range c.Limit + 1 {
		d, err := api.Check(ctx, client.CheckRequest{Policy: c.Policy, Identity: "alice"})
		if err != nil {
			return err
		}
		allowed := d.Allowed
		say(Step{Step: "check", Identity: "alice", Allowed: &allowed, Detail: fmt.Sprintf("remaining %d, retry after %ds", d.Remaining, d.RetryAfter)})
		if d.Allowed {
			tickets = append(tickets, d.RequestID)
		}
	}
	if len(tickets) > 0 {
		f, err := api.Finish(ctx, client.FinishRequest{RequestID: tickets[0], Status: http.StatusNotModified})
		if err != nil {
			return err
		}
		say(Step{Step: "finish 304", Identity: "alice", Units: f.Refunded})
	}

	// 2. Decide here, let Tally count: charge bob's window, then refund it.
	js, err := jetstream.New(c.NATS)
	if err != nil {
		return err
	}
	ajs, err := jetstream.New(c.Analytics)
	if err != nil {
		return err
	}
	keys, err := client.NewKeys(c.Prefix, c.Secret, c.Shards)
	if err != nil {
		return err
	}
	pub, err := client.NewPublisher(js, client.PublisherConfig{Namespace: c.Namespace, Source: "examples/service", Keys: keys})
	if err != nil {
		return err
	}
	requestID := pub.Producer() + "-1"
	charge, err := pub.Charge(ctx, client.Charge{Policy: c.Policy, Limit: c.Limit, Window: c.Window,
		Identity: client.APIIdentity("bob"), RequestID: requestID})
	if err != nil {
		return err
	}
	say(Step{Step: "charge", Identity: "bob", Units: 1, Detail: "shard " + charge.Window.Shard + ", window " + charge.Window.Digest})
	if _, err := pub.Refund(ctx, charge); err != nil {
		return err
	}
	say(Step{Step: "refund", Identity: "bob", Units: 1})

	// 3. Follow the accountant's records until both events are applied.
	fctx, cancel := context.WithTimeout(ctx, c.Wait)
	defer cancel()
	seen := 0
	done := errors.New("done")
	err = client.Follow(fctx, ajs, client.FollowConfig{Subjects: []string{"tally.decisions.accountant"}}, func(r client.DecisionRecord) error {
		if r.Data.RequestID != requestID {
			return nil
		}
		say(Step{Step: "applied", Identity: "bob", Units: r.Data.Cost, Detail: r.Data.Outcome})
		if seen++; seen == 2 {
			return done
		}
		return nil
	})
	switch {
	case errors.Is(err, done):
		return nil
	case err != nil:
		return err
	}
	return fmt.Errorf("the accountant's records of %s did not come within %v", requestID, c.Wait)
}

func hexOrFail(s string) ([]byte, error) {
	b, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) < 32 {
		return nil, errors.New("TALLY_KEY_SECRET: want the deployment's key secret in hex (at least 32 bytes)")
	}
	return b, nil
}
