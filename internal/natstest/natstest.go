// Package natstest runs a real, embedded NATS server with JetStream for
// tests, its store in the test's temporary directory, on a free loopback
// port, shut down when the test ends.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is one embedded NATS server.
type Server struct {
	*server.Server
	t testing.TB
}

// Start starts a JetStream-enabled server.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, nil)
}

// StartWith is Start with options changed by mut (TLS, authentication).
func StartWith(t testing.TB, mut func(*server.Options)) *Server {
	t.Helper()
	o := &server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
	}
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

// Connect returns a connection and its JetStream context, closed when the
// test ends.
func (s *Server) Connect() (*nats.Conn, jetstream.JetStream) {
	s.t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		s.t.Fatalf("natstest: connect: %v", err)
	}
	s.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		s.t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}
