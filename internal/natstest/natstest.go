// Package natstest runs a real, embedded NATS server with JetStream for
// tests, its store in the test's temporary directory, on a free loopback
// port, shut down when the test ends. It runs with the users and
// permissions Tally ships (deploy/nats/tally.conf): each test connects as
// the role it plays, and a process that steps outside its permissions
// fails here as it would in production.
package natstest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/deploy"
)

// Server is one embedded NATS server.
type Server struct {
	*server.Server
	t testing.TB
}

// Password is the password of a user of the shipped configuration in
// tests.
func Password(user string) string { return "natstest-" + user + "-password" }

// Start starts a JetStream-enabled server with the shipped users and
// permissions.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, nil)
}

// StartWith is Start with options changed by mut (TLS, other
// authentication).
func StartWith(t testing.TB, mut func(*server.Options)) *Server {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "tally.conf")
	if err := os.WriteFile(conf, deploy.NATSConfig, 0o600); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	for _, u := range deploy.NATSUsers {
		// The configuration reads its passwords from the environment; every
		// test of the process uses the same ones.
		if err := os.Setenv(deploy.NATSPasswordEnv(u), Password(u)); err != nil {
			t.Fatalf("natstest: %v", err)
		}
	}
	o, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("natstest: the shipped configuration: %v", err)
	}
	o.Host, o.Port, o.NoLog, o.NoSigs = "127.0.0.1", -1, true, true
	o.JetStream, o.StoreDir = true, filepath.Join(dir, "jetstream")
	if mut != nil {
		mut(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("natstest: server not ready in 10s")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return &Server{Server: s, t: t}
}

// Connect returns a connection as the operator (every permission) and its
// JetStream context, closed when the test ends: what a test uses to read
// and publish as nobody in particular.
func (s *Server) Connect() (*nats.Conn, jetstream.JetStream) {
	s.t.Helper()
	return s.ConnectAs("operator")
}

// ConnectAs returns a connection as user (edge, accountant, billing,
// analytics or operator) with the user's inbox prefix, and its JetStream
// context, closed when the test ends.
func (s *Server) ConnectAs(user string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	s.t.Helper()
	nc, err := nats.Connect(s.ClientURL(), append(Options(user), opts...)...)
	if err != nil {
		s.t.Fatalf("natstest: connect as %s: %v", user, err)
	}
	s.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		s.t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}

// Options are the connection options of user: its password and inbox
// prefix, and reconnects that go on.
func Options(user string) []nats.Option {
	return []nats.Option{nats.UserInfo(user, Password(user)), nats.CustomInboxPrefix(InboxPrefix(user)),
		nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}
}

// InboxPrefix is the inbox prefix the shipped permissions give user.
func InboxPrefix(user string) string { return deploy.InboxPrefix(user) }
