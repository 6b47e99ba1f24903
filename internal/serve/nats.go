package serve

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tallyhq/tally/deploy"
	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/servertls"
)

// ErrNoDataDir is returned when the embedded NATS has no data directory.
var ErrNoDataDir = fmt.Errorf("%w: serve.data_dir: empty: name a directory for the embedded NATS's JetStream store "+
	"(or set nats.url to use an external NATS)", config.ErrInvalid)

// embedded is the embedded NATS server and the passwords of its users.
type embedded struct {
	s         *server.Server
	passwords map[string]string
}

// startNATS starts the embedded server of cfg.Serve and waits until it
// takes connections (within ready).
func startNATS(cfg *config.File, hostname string, log *slog.Logger, ready time.Duration) (*embedded, error) {
	sv := cfg.Serve
	if sv.DataDir == "" {
		return nil, ErrNoDataDir
	}
	// The server keeps its store in StoreDir/jetstream.
	if err := os.MkdirAll(sv.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("serve.data_dir: %w", err)
	}
	store := filepath.Join(sv.DataDir, "jetstream")
	o, passwords, err := natsOptions(cfg, hostname, log)
	if err != nil {
		return nil, err
	}
	o.StoreDir = sv.DataDir
	if l := sv.NATS.Listen; l != "" && !config.Loopback(l) && !sv.NATS.TLS.On() {
		log.Warn("the embedded NATS's client listener is reachable beyond loopback without TLS: passwords and events cross the network in the clear (serve.nats.tls)",
			"listen", l)
	}
	s, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	s.SetLoggerV2(natsLog{log.With("component", "nats-server")}, false, false, false)
	go s.Start()
	if !s.ReadyForConnections(ready) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready within %v", ready)
	}
	log.Info("embedded NATS started", "name", o.ServerName, "store", store, "client_listener", listenerOf(o, sv.NATS),
		"cluster", sv.NATS.Cluster.Listen, "routes", len(o.Routes))
	return &embedded{s: s, passwords: passwords}, nil
}

func listenerOf(o *server.Options, n config.EmbeddedNATS) string {
	if n.Listen == "" {
		return "none (in process only)"
	}
	return net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
}

// natsOptions builds the embedded server's options: the shipped users and
// permissions with cfg's passwords (a random one for each user without),
// JetStream, the client listener and the cluster.
func natsOptions(cfg *config.File, hostname string, log *slog.Logger) (*server.Options, map[string]string, error) {
	n := cfg.Serve.NATS
	passwords := map[string]string{}
	// The shipped file reads its passwords from variables: define each
	// with a placeholder, then set the real password on the parsed user
	// (no password is ever written into configuration text).
	var conf strings.Builder
	for _, u := range deploy.NATSUsers {
		fmt.Fprintf(&conf, "%s: \"placeholder-%s\"\n", deploy.NATSPasswordEnv(u), u)
		if p := n.Passwords[u]; p != "" {
			passwords[u] = p
		} else {
			passwords[u] = randomPassword()
		}
	}
	conf.Write(deploy.NATSConfig)
	o := &server.Options{}
	if err := o.ProcessConfigString(conf.String()); err != nil {
		return nil, nil, fmt.Errorf("embedded nats: the shipped configuration: %w", err)
	}
	if len(o.Users) != len(deploy.NATSUsers) {
		return nil, nil, errors.New("embedded nats: the shipped configuration does not name every user")
	}
	for _, u := range o.Users {
		p, ok := passwords[u.Username]
		if !ok {
			return nil, nil, fmt.Errorf("embedded nats: unknown user %q in the shipped configuration", u.Username)
		}
		u.Password = p
	}
	o.NoSigs, o.JetStream = true, true
	o.ServerName = n.Name
	if o.ServerName == "" {
		o.ServerName = hostname
	}
	switch {
	case n.Listen == "" && !n.Cluster.On():
		o.DontListen = true
		o.Host, o.Port = "127.0.0.1", -1
	case n.Listen == "":
		// A server that accepts no client accepts no route either: a
		// clustered one listens on a loopback port of its choosing,
		// which only the shipped users (with passwords) may use.
		o.Host, o.Port = "127.0.0.1", -1
	default:
		host, port, err := splitHostPort(n.Listen)
		if err != nil {
			return nil, nil, fmt.Errorf("serve.nats.listen: %w", err)
		}
		o.Host, o.Port = host, port
	}
	if n.TLS.On() {
		files, err := servertls.Load(n.TLS, log.With("tls", n.TLS.CertFile))
		if err != nil {
			return nil, nil, fmt.Errorf("serve.nats.tls: %w", err)
		}
		o.TLSConfig, o.TLS, o.TLSVerify = files.TLSConfig(), true, n.TLS.ClientCAFile != ""
	}
	if c := n.Cluster; c.On() {
		host, port, err := splitHostPort(c.Listen)
		if err != nil {
			return nil, nil, fmt.Errorf("serve.nats.cluster.listen: %w", err)
		}
		o.Cluster.Name, o.Cluster.Host, o.Cluster.Port = c.Name, host, port
		o.Cluster.Username, o.Cluster.Password = "route", c.Password
		for _, r := range c.Routes {
			u, err := config.RouteURL(r)
			if err != nil {
				return nil, nil, fmt.Errorf("serve.nats.cluster.routes: %w", err)
			}
			u.User = url.UserPassword("route", c.Password)
			o.Routes = append(o.Routes, u)
		}
	}
	return o, passwords, nil
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: want host:port", addr)
	}
	return host, port, nil
}

// randomPassword is a password nobody else knows: 128 random bits.
func randomPassword() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// options are the connection options of a part of the process playing
// user: in process, as that user, with its inbox prefix.
func (e *embedded) options(user string) []nats.Option {
	return []nats.Option{nats.InProcessServer(e.s), nats.UserInfo(user, e.passwords[user]),
		nats.CustomInboxPrefix(deploy.InboxPrefix(user))}
}

// shutdown stops the server; its store stays on disk.
func (e *embedded) shutdown() {
	e.s.Shutdown()
	e.s.WaitForShutdown()
}

// natsLog writes the server's lines through slog.
type natsLog struct{ log *slog.Logger }

func (l natsLog) Noticef(format string, v ...any) { l.log.Info(fmt.Sprintf(format, v...)) }
func (l natsLog) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l natsLog) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l natsLog) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l natsLog) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l natsLog) Tracef(string, ...any)           {}
