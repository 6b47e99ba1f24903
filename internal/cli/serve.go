package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/ratelimitenv"
	"github.com/tallyhq/tally/internal/serve"
	"github.com/tallyhq/tally/internal/service"
)

// EnvDataDir is the embedded NATS's data directory when Tally is started
// with envoyproxy/ratelimit's settings (default /var/lib/tally).
const EnvDataDir = "TALLY_DATA_DIR"

func init() {
	register(&command{name: "serve", args: "[-config FILE | -envoy-settings]",
		summary: "run Tally in one process: edge, accountant and an embedded NATS JetStream, with only Redis outside",
		help: `Runs an edge-checker, an accountant and (unless nats.url names an external NATS) an embedded
NATS JetStream server in one process, from one configuration file (its serve section:
docs/configuration.md), until SIGTERM or SIGINT: the edge stops admitting and delivers what it
holds, the accountant drains, then NATS stops.

With -envoy-settings — or with no configuration file (no -config, no $TALLY_CONFIG, no
./tally.yaml) and envoyproxy/ratelimit's variables in the environment (REDIS_URL, RUNTIME_ROOT,
CONFIG_TYPE or REDIS_SOCKET_TYPE) — it reads envoyproxy/ratelimit's environment variables instead,
serves its ports (gRPC 8081, HTTP 8080 /json and /healthcheck, the debug port 6070) and logs once
what it ignores and why; a setting it cannot honour stops it with an error naming the variable
(docs/envoy.md has the table). Its JetStream store is then in $TALLY_DATA_DIR (default
/var/lib/tally) or -data-dir. Started as "ratelimit" (a link named so), tally runs
"serve -envoy-settings".`,
		setup: func(c *call) func(context.Context) error {
			envoy := c.flags.Bool("envoy-settings", false, "read envoyproxy/ratelimit's environment variables instead of a configuration file")
			dataDir := c.flags.String("data-dir", "", "with -envoy-settings: the embedded NATS's data `directory` (default $TALLY_DATA_DIR, else /var/lib/tally)")
			printConfig := c.flags.Bool("print-config", false, "with -envoy-settings: print the equivalent configuration file and exit")
			return func(ctx context.Context) error {
				if len(c.args) > 0 {
					return usagef("unexpected argument %q", c.args[0])
				}
				ref := *envoy
				if !ref && *c.config == "" && c.env.Getenv("TALLY_CONFIG") == "" && ratelimitenv.Present(c.env.Getenv) {
					if _, err := os.Stat("tally.yaml"); errors.Is(err, os.ErrNotExist) {
						ref = true
					}
				}
				if (*printConfig || *dataDir != "") && !ref {
					return usagef("-print-config and -data-dir go with -envoy-settings")
				}
				if ref {
					if *c.config != "" {
						return usagef("-config and -envoy-settings: choose one")
					}
					return c.serveReference(ctx, *dataDir, *printConfig)
				}
				log, flush, err := service.StartLogging("serve", c.env.Getenv("TALLY_LOG_FORMAT"), c.env.Getenv("TALLY_LOG_LEVEL"))
				if err != nil {
					return err
				}
				defer flush()
				cfg, err := config.Load(c.configPath(), c.env.Getenv)
				if err != nil {
					return fmt.Errorf("%w (tally check-config %s lists every problem)", err, c.configPath())
				}
				return c.run(ctx, cfg, log)
			}
		}})
}

// serveReference runs tally serve from envoyproxy/ratelimit's settings.
func (c *call) serveReference(ctx context.Context, dataDir string, printConfig bool) error {
	getenv := c.env.Getenv
	if dataDir == "" {
		dataDir = getenv(EnvDataDir)
	}
	res, err := ratelimitenv.Read(getenv, ratelimitenv.Options{DataDir: dataDir,
		AdminToken: getenv(config.EnvAdminToken) != "", APIToken: getenv(config.EnvAPIToken) != "",
		ExternalNATS: getenv(config.EnvNATSURL) != ""})
	if err != nil {
		return err
	}
	if printConfig {
		c.out("# The configuration equivalent to envoyproxy/ratelimit's settings (tally serve -envoy-settings).\n%s", res.File)
		return nil
	}
	format, level := res.LogFormat, res.LogLevel
	if v := getenv("TALLY_LOG_FORMAT"); v != "" {
		format = v
	}
	if v := getenv("TALLY_LOG_LEVEL"); v != "" {
		level = v
	}
	log, flush, err := service.StartLogging("serve", format, level)
	if err != nil {
		return err
	}
	defer flush()
	log.Info("started with envoyproxy/ratelimit's settings", "variables", strings.Join(ratelimitenv.Names(getenv), ","))
	for _, n := range res.Notes {
		log.Info(n)
	}
	env := func(k string) string {
		if v, ok := res.Env[k]; ok && getenv(k) == "" {
			return v
		}
		return getenv(k)
	}
	secret := getenv(config.EnvKeySecret)
	if secret == "" {
		// The settings have no secret: every process over this Redis
		// shares one kept there.
		temp := strings.Repeat("5e", limiter.MinSecretLen)
		cfg, err := config.Parse(res.File, withVar(env, config.EnvKeySecret, temp))
		if err != nil {
			return err
		}
		if secret, err = serve.SharedSecret(ctx, cfg); err != nil {
			return err
		}
		log.Warn("TALLY_KEY_SECRET is not set: using the key secret kept in Redis, shared by every tally serve on it; "+
			"set TALLY_KEY_SECRET to keep it out of Redis", "key", serve.SharedSecretKey(cfg.KeyPrefix))
	}
	cfg, err := config.Parse(res.File, withVar(env, config.EnvKeySecret, secret))
	if err != nil {
		return err
	}
	return c.run(ctx, cfg, log)
}

func withVar(getenv func(string) string, name, value string) func(string) string {
	return func(k string) string {
		if k == name {
			return value
		}
		return getenv(k)
	}
}

// run runs tally serve until ctx ends, and logs how it stopped.
func (c *call) run(ctx context.Context, cfg *config.File, log *slog.Logger) error {
	host, _ := os.Hostname()
	err := serve.Run(ctx, cfg, log, serve.Options{Hostname: host})
	if err != nil {
		log.Error("serve stopped", "err", err)
		return err
	}
	log.Info("stopped")
	return nil
}
