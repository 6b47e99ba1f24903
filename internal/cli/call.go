package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

// call is one run of a command: its flags and arguments, and the
// deployment it reaches, opened on first use and closed when it ends.
type call struct {
	env    Env
	cmd    *command
	flags  *flag.FlagSet
	config *string
	args   []string

	cfg   *config.File
	keys  *limiter.KeySpace
	store *redisstore.Store
	nc    *nats.Conn
	js    jetstream.JetStream
}

func newCall(env Env, c *command) *call {
	cl := &call{env: env, cmd: c, flags: flag.NewFlagSet("tally "+c.name, flag.ContinueOnError)}
	cl.flags.SetOutput(io.Discard)
	cl.config = cl.flags.String("config", "", "the deployment's configuration `file` (default $TALLY_CONFIG, else tally.yaml)")
	return cl
}

func (c *call) close() {
	if c.store != nil {
		_ = c.store.Close()
	}
	if c.nc != nil {
		c.nc.Close()
	}
}

func (c *call) out(format string, args ...any) { fmt.Fprintf(c.env.Stdout, format, args...) }

// configPath is the configuration file the call reads.
func (c *call) configPath() string {
	switch {
	case *c.config != "":
		return *c.config
	case c.env.Getenv("TALLY_CONFIG") != "":
		return c.env.Getenv("TALLY_CONFIG")
	}
	return "tally.yaml"
}

// deployment loads the configuration and the key space.
func (c *call) deployment() (*config.File, error) {
	if c.cfg != nil {
		return c.cfg, nil
	}
	cfg, err := config.Load(c.configPath(), c.env.Getenv)
	if err != nil {
		return nil, fmt.Errorf("%w (tally check-config %s lists every problem)", err, c.configPath())
	}
	if c.keys, err = limiter.NewKeySpace(cfg.KeyPrefix, cfg.KeySecret); err != nil {
		return nil, err
	}
	c.cfg = cfg
	return cfg, nil
}

// redis opens the store of the deployment's shards.
func (c *call) redis() (*redisstore.Store, error) {
	if c.store != nil {
		return c.store, nil
	}
	cfg, err := c.deployment()
	if err != nil {
		return nil, err
	}
	c.store, err = redisstore.NewStore(cfg.Redis.Shards, c.keys, cfg.StoreOptions())
	return c.store, err
}

// jetstream connects to the deployment's NATS (failing at once when it
// cannot be reached: an operator is waiting).
func (c *call) jetstream() (jetstream.JetStream, error) {
	if c.js != nil {
		return c.js, nil
	}
	cfg, err := c.deployment()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(cfg.NATS.URL, append(cfg.NATSOptions(), nats.Name("tally-cli"), nats.Timeout(5*time.Second))...)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w (set TALLY_NATS_USER and TALLY_NATS_PASSWORD to the operator's)", cfg.NATS.URL, err)
	}
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		return nil, err
	}
	return c.js, nil
}

// client is a window key an operator names: --policy with --identity (as
// limiter.NamedIdentity reads it) or --digest.
type client struct {
	policy, identity, digest *string
}

func (c *call) clientFlags() client {
	return client{
		policy:   c.flags.String("policy", "", "the `policy` the window is under"),
		identity: c.flags.String("identity", "", "the client: the identity header's `value`, ip:ADDRESS, or api:IDENTITY (the decision API's)"),
		digest:   c.flags.String("digest", "", "the window key's `digest` (32 hex, as decision records and alerts name it), instead of --identity"),
	}
}

// key resolves the client flags to the policy's terms and the window key.
func (c *call) key(cl client) (limiter.Policy, limiter.Key, error) {
	if *cl.policy == "" {
		return limiter.Policy{}, limiter.Key{}, usagef("--policy is required")
	}
	if (*cl.identity == "") == (*cl.digest == "") {
		return limiter.Policy{}, limiter.Key{}, usagef("name the client by --identity or by --digest (one of them)")
	}
	cfg, err := c.deployment()
	if err != nil {
		return limiter.Policy{}, limiter.Key{}, err
	}
	p, ok := cfg.PolicyMap()[*cl.policy]
	if !ok {
		names := make([]string, 0, len(cfg.Policies))
		for _, p := range cfg.Policies {
			names = append(names, p.Name)
		}
		return limiter.Policy{}, limiter.Key{}, fmt.Errorf("unknown policy %q (the configuration has: %s)", *cl.policy, strings.Join(names, ", "))
	}
	if *cl.digest != "" {
		k, err := c.keys.KeyFromDigest(*cl.digest)
		if err != nil {
			return limiter.Policy{}, limiter.Key{}, usagef("--digest: %v", err)
		}
		return p, k, nil
	}
	id := cfg.Edge.Identity
	name, err := limiter.NamedIdentity(*cl.identity, id.Header, id.IPv4Prefix, id.IPv6Prefix)
	if err != nil {
		return limiter.Policy{}, limiter.Key{}, usagef("--identity: %v", err)
	}
	return p, c.keys.Key(p.Name, name), nil
}

// record publishes an operator's action on the decisions stream and waits
// for JetStream to store it.
func (c *call) record(ctx context.Context, ds ...events.Decision) error {
	js, err := c.jetstream()
	if err != nil {
		return err
	}
	body := []byte{'['}
	seq := uint64(c.env.Now().UnixNano())
	for i := range ds {
		d := &ds[i]
		d.Source, d.Edge = "tally-cli", "operator"
		d.Seq = seq + uint64(i)
		if i > 0 {
			body = append(body, ',')
		}
		body = events.AppendDecision(body, d)
	}
	body = append(body, ']')
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = js.PublishMsg(ctx, events.DecisionsMsg(c.cfg.NATS.Streams.OperatorDecisionsSubject(), body))
	if err != nil {
		return fmt.Errorf("recording on the decisions stream: %w", err)
	}
	return nil
}

// confirm asks the operator to type yes, unless yes is already set.
func (c *call) confirm(yes bool, question string) error {
	if yes {
		return nil
	}
	fmt.Fprintf(c.env.Stdout, "%s\nType yes to go on: ", question)
	var answer string
	_, _ = fmt.Fscanln(c.env.Stdin, &answer)
	if strings.TrimSpace(answer) != "yes" {
		return errors.New("not confirmed: nothing was changed (--yes skips the question)")
	}
	return nil
}

// printJSON writes v as indented JSON.
func (c *call) printJSON(v any) error {
	enc := json.NewEncoder(c.env.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
