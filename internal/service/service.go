package service

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/tallyhq/tally/internal/redisstore"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"

	"github.com/tallyhq/tally/internal/buildinfo"
	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/telemetry"
)

// ConnectNATS connects to the configured NATS with its TLS and credentials.
// It does not wait for the server: the connection keeps retrying in the
// background (the binaries start, and decide, without NATS), and every
// disconnect and reconnect is logged with what it means (degraded). Closing
// the connection (a clean stop) is not a disconnect: it is logged at debug
// level only.
func ConnectNATS(cfg *config.File, name, degraded string, log *slog.Logger) (*nats.Conn, error) {
	return connectNATS(cfg, nil, name, degraded, log)
}

// connectNATS is ConnectNATS with the host's connection options, when it
// gives some, in place of the file's.
func connectNATS(cfg *config.File, h *Host, name, degraded string, log *slog.Logger) (*nats.Conn, error) {
	base := cfg.NATSOptions()
	if h != nil && h.NATS != nil {
		base = slices.Clip(h.NATS)
	}
	opts := append(base, nats.Name(name),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // closed by its owner (ClosedHandler)
			}
			log.Warn("NATS disconnected: "+degraded, "conn", name, "err", err)
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			log.Debug("NATS connection closed", "conn", name)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS reconnected", "conn", name, "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("NATS error", "conn", name, "err", err)
		}))
	nc, err := nats.Connect(cfg.NATS.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	return nc, nil
}

// CheckRedis refuses primaries whose maxmemory-policy may evict Tally's
// keys. A primary that cannot be asked (down, or INFO not allowed) is
// logged and let through: Tally starts degraded rather than not at all.
func CheckRedis(ctx context.Context, store *redisstore.Store, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err := store.CheckEviction(ctx)
	if err == nil {
		return nil
	}
	if errors.Is(err, redisstore.ErrEvictingPolicy) {
		return err
	}
	log.Warn("the Redis primaries' maxmemory-policy could not be checked; it must be noeviction", "err", err)
	return nil
}

// redisLogger writes go-redis's log lines through slog, at warn: they say
// that something went wrong with a connection.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
}

// RequireToken lets through requests that carry "Authorization: Bearer
// <token>" and answers others 401. An empty token lets everything through
// (config refuses that beyond loopback).
func RequireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tally"`)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]any{"type": "urn:tally:problem:unauthorized", "title": "Unauthorized",
				"status": http.StatusUnauthorized, "detail": "a valid bearer token is required"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// GuardAdmin is RequireToken for an admin listener, except for /healthz
// and /readyz, which probes reach without a token (they reveal nothing).
func GuardAdmin(token string, h http.Handler) http.Handler {
	guarded := RequireToken(token, h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			h.ServeHTTP(w, r)
			return
		}
		guarded.ServeHTTP(w, r)
	})
}

// StartLogging sets up the logging of a process named name: to stderr
// (JSON lines, or text when format is "text"; level debug, info, warn or
// error) and, with OTEL_LOGS_EXPORTER, over OpenTelemetry too. Every line
// the process writes goes through the logger it returns — the standard
// library's log package, go-redis's and OpenTelemetry's own lines too.
// flush pushes the records the log exporter holds: call it after the last
// line.
func StartLogging(name, format, level string) (log *slog.Logger, flush func(), err error) {
	h, err := telemetry.NewLogHandler(os.Stderr, format, level)
	var logs *telemetry.Logs
	if err == nil {
		// The resource is named as open names traces and metrics.
		h, logs, err = telemetry.SetupLogs(context.Background(), "tally-"+name, h)
	}
	if err != nil {
		return nil, nil, err
	}
	log = slog.New(h).With("service", name)
	slog.SetDefault(log)
	redis.SetLogger(redisLogger{log.With("component", "go-redis")})
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry: "+err.Error(), "component", "opentelemetry")
	}))
	return log, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if ferr := logs.Shutdown(ctx); ferr != nil {
			fmt.Fprintln(os.Stderr, name+": logs not exported:", ferr)
		}
	}, nil
}

// Main is the main of a Tally binary: "name version" (or -version) prints
// its build information (internal/buildinfo) and exits; otherwise it reads
// -config, logs to stderr
// (JSON lines, or text with TALLY_LOG_FORMAT=text; TALLY_LOG_LEVEL sets the
// level) and, with OTEL_LOGS_EXPORTER, over OpenTelemetry too, runs run
// until SIGINT or SIGTERM, and exits non-zero when run fails.
func Main(name string, run func(context.Context, *config.File, *slog.Logger) error) {
	path := flag.String("config", "tally.yaml", "configuration file (docs/configuration.md)")
	showVersion := flag.Bool("version", false, "print the version, commit, build date, Go version and licence, and exit")
	flag.Parse()
	if *showVersion || flag.Arg(0) == "version" {
		fmt.Print(buildinfo.Read(name))
		return
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "%s: unexpected argument %q (usage: %s [-config FILE] | %s version)\n", name, flag.Arg(0), name, name)
		os.Exit(2)
	}
	log, flushLogs, err := StartLogging(name, os.Getenv("TALLY_LOG_FORMAT"), os.Getenv("TALLY_LOG_LEVEL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	cfg, err := config.Load(*path, os.Getenv)
	if err == nil {
		err = run(ctx, cfg, log)
	}
	stop()
	if err != nil {
		log.Error(name+" stopped", "err", err)
	}
	flushLogs()
	if err != nil {
		os.Exit(1)
	}
}
