// Package redistest starts real redis-server processes for tests: a primary
// and replicas on free loopback ports, each in its own temporary directory,
// stopped when the test ends. There are no mocks: Tally's behaviour lives in
// its Lua scripts and in Redis's replication.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/freeport"
)

// Server is one redis-server process.
type Server struct {
	t         testing.TB
	Port      int
	Addr      string
	dir       string
	replicaOf string
	tls       *TLS
	cmd       *exec.Cmd
	exited    chan struct{}
}

// binary finds redis-server or fails the test with what to install.
func binary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found on PATH: run `make test` (it installs Debian's redis-server) or `apt-get install redis-server`")
	}
	return p
}

// Start starts a primary on a free port.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, "")
}

// StartPair starts a primary and one replica of it, and waits until the
// replica's link is up.
func StartPair(t testing.TB) (primary, replica *Server) {
	t.Helper()
	primary = Start(t)
	return primary, primary.StartReplica(t)
}

// StartReplica starts a replica of s and waits until its link is up.
func (s *Server) StartReplica(t testing.TB) *Server {
	t.Helper()
	r := start(t, s.Addr)
	r.WaitLinkUp()
	return r
}

// TLS is what StartTLS needs: the server's certificate and key, the CA
// that signs client certificates (which the server then requires), and the
// client configuration the test uses to reach it.
type TLS struct {
	CertFile, KeyFile, CAFile string
	Client                    *tls.Config
}

// StartTLS starts a primary that accepts TLS connections only, on a free
// port, and requires client certificates signed by c.CAFile.
func StartTLS(t testing.TB, c TLS) *Server {
	t.Helper()
	return startWith(t, "", &c)
}

func start(t testing.TB, replicaOf string) *Server {
	t.Helper()
	return startWith(t, replicaOf, nil)
}

func startWith(t testing.TB, replicaOf string, c *TLS) *Server {
	t.Helper()
	bin := binary(t)
	dir := t.TempDir()
	var lastErr error
	for range 5 {
		s := &Server{t: t, Port: freePort(t), dir: dir, replicaOf: replicaOf, tls: c}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		if lastErr = s.launch(bin); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: start redis-server: %v", lastErr)
	return nil
}

func (s *Server) launch(bin string) error {
	port := []string{"--port", strconv.Itoa(s.Port)}
	if s.tls != nil {
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port), "--tls-cert-file", s.tls.CertFile,
			"--tls-key-file", s.tls.KeyFile, "--tls-ca-cert-file", s.tls.CAFile, "--tls-auth-clients", "yes"}
	}
	args := []string{
		"--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis-"+strconv.Itoa(s.Port)+".log"),
		"--daemonize", "no", "--protected-mode", "yes",
		"--repl-diskless-sync-delay", "0",
	}
	args = append(port, args...)
	if s.replicaOf != "" {
		host, port, _ := net.SplitHostPort(s.replicaOf)
		args = append(args, "--replicaof", host, port)
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Dir = s.dir
	// If the test binary dies without cleaning up (a timeout panic, a kill),
	// the kernel stops the server too.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exited = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	c := s.client()
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("redis-server on port %d exited: %s", s.Port, s.logTail())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.kill()
	return fmt.Errorf("redis-server on port %d did not answer in 10s: %s", s.Port, s.logTail())
}

// Client returns a client for this server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := s.client()
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *Server) client() *redis.Client {
	o := &redis.Options{Addr: s.Addr, DisableIdentity: true, MaxRetries: -1}
	if s.tls != nil {
		o.TLSConfig = s.tls.Client
	}
	return redis.NewClient(o)
}

// Pause stops the server's process (SIGSTOP) without closing its
// connections: a node that hangs. Resume continues it.
func (s *Server) Pause() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// Stop kills the server and waits for it to exit. It is safe to call twice.
func (s *Server) Stop() { s.kill() }

func (s *Server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused process dies too
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Restart kills the server and starts it again on the same port with an
// empty dataset and an empty script cache. A replica resyncs from its
// primary before Restart returns.
func (s *Server) Restart() {
	s.t.Helper()
	s.kill()
	var err error
	for range 50 { // the port can take a moment to be free again
		if err = s.launch(binary(s.t)); err == nil {
			if s.replicaOf != "" {
				s.WaitLinkUp()
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart: %v", err)
}

// WaitLinkUp waits until this replica reports master_link_status:up and its
// primary lists it as online.
func (s *Server) WaitLinkUp() {
	s.t.Helper()
	c := s.client()
	defer c.Close()
	p := redis.NewClient(&redis.Options{Addr: s.replicaOf, DisableIdentity: true, MaxRetries: -1})
	defer p.Close()
	online := "port=" + strconv.Itoa(s.Port) + ",state=online"
	for range 500 {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			pinfo, err := p.Info(context.Background(), "replication").Result()
			if err == nil && strings.Contains(pinfo, online) {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.t.Fatalf("redistest: replica %s: link to %s not up after 5s", s.Addr, s.replicaOf)
}

// WaitSynced waits until this replica has applied everything its primary
// has written so far (WAIT on the primary would tie up a connection).
func (s *Server) WaitSynced(primary *Server) {
	s.t.Helper()
	p, r := primary.client(), s.client()
	defer p.Close()
	defer r.Close()
	ctx := context.Background()
	want := offset(p.Info(ctx, "replication").Val(), "master_repl_offset")
	for range 500 {
		if offset(r.Info(ctx, "replication").Val(), "master_repl_offset") >= want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.t.Fatalf("redistest: replica %s did not reach offset %d in 2.5s", s.Addr, want)
}

// Promote turns this replica into a primary (REPLICAOF NO ONE).
func (s *Server) Promote() {
	s.t.Helper()
	c := s.client()
	defer c.Close()
	if err := c.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
		s.t.Fatalf("redistest: promote %s: %v", s.Addr, err)
	}
	s.replicaOf = ""
}

func offset(info, field string) int64 {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis-"+strconv.Itoa(s.Port)+".log"))
	if len(b) > 800 {
		b = b[len(b)-800:]
	}
	return string(b)
}

func freePort(t testing.TB) int {
	t.Helper()
	p, err := freeport.Port()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return p
}

// StartSentinels starts n redis-sentinel processes on free ports watching
// s as master (quorum: a majority), which they consider down after down
// without an answer, and waits until each knows s's replicas (replicas of
// them) and the other sentinels. It returns their addresses.
func (s *Server) StartSentinels(t testing.TB, master string, n, replicas int, down time.Duration) []string {
	t.Helper()
	return s.StartSentinelsWith(t, master, n, replicas, down, "")
}

// StartSentinelsWith is StartSentinels with sentinels that require
// password (requirepass; "" none).
func (s *Server) StartSentinelsWith(t testing.TB, master string, n, replicas int, down time.Duration, password string) []string {
	t.Helper()
	bin, err := exec.LookPath("redis-sentinel")
	if err != nil {
		t.Fatal("redis-sentinel not found on PATH: run `make test` (it installs Debian's redis-sentinel) or `apt-get install redis-sentinel`")
	}
	var addrs []string
	for range n {
		dir := t.TempDir()
		port := freePort(t)
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
			"sentinel monitor %s 127.0.0.1 %d %d\nsentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 10000\n", port, dir, filepath.Join(dir, "sentinel.log"),
			master, s.Port, n/2+1, master, down.Milliseconds(), master)
		if password != "" {
			body += fmt.Sprintf("requirepass %s\nsentinel sentinel-pass %s\n", password, password)
		}
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, conf)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("redistest: start redis-sentinel: %v", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		addrs = append(addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	for _, a := range addrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: a, DisableIdentity: true, MaxRetries: -1, Password: password})
		ok := false
		for range 500 {
			m, err := c.Master(context.Background(), master).Result()
			if err == nil && m["num-slaves"] == strconv.Itoa(replicas) && m["num-other-sentinels"] == strconv.Itoa(n-1) {
				ok = true
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = c.Close()
		if !ok {
			t.Fatalf("redistest: sentinel %s did not learn %s's %d replicas and %d other sentinels in 10s", a, master, replicas, n-1)
		}
	}
	return addrs
}

// SentinelPrimary is the address the sentinel at addr names as master's
// primary ("" when it cannot say).
func SentinelPrimary(addr, master string) string {
	c := redis.NewSentinelClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	v, err := c.GetMasterAddrByName(context.Background(), master).Result()
	if err != nil || len(v) != 2 {
		return ""
	}
	return net.JoinHostPort(v[0], v[1])
}
