// Package stack runs a local Tally deployment as real processes, for make
// demo, make bench and the fault suite: Redis shards (a primary and replicas each), a NATS
// server with JetStream, accountants and edge-checkers, each with its log in
// the stack's directory. Everything it starts is stopped by StopAll, in
// reverse order (edges before accountants before NATS before Redis), and by
// the kernel if the calling process dies first.
//
// A process can also be made to fail as a dependency fails in production:
// killed (Proc.Kill), frozen and thawed (Proc.Pause, Proc.Resume), and
// started again on the same port and data directory (Stack.Restart): what
// the fault suite (internal/faults) does under load.
//
// It runs as Tally is deployed: every process shares a key secret the stack
// generates (Secret), and NATS runs with the users and permissions Tally
// ships (deploy/nats/tally.conf), passwords generated for the stack, each
// edge and accountant connecting as its role (NATSEnv).
//
// It expects redis-server on PATH and the binaries edge-checker, accountant
// and nats-server in the stack's bin directory (make builds them).
package stack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"

	"github.com/tallyhq/tally/deploy"
	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/freeport"
	"github.com/tallyhq/tally/internal/shard"
)

// Stack is a set of processes started together.
type Stack struct {
	// Dir holds logs, data and configuration files; Bin the binaries.
	Dir, Bin string
	// Env is added to every process's environment (TALLY_KEY_SECRET
	// among them).
	Env []string

	secret    string            // TALLY_KEY_SECRET, hex
	passwords map[string]string // NATS user → password

	mu    sync.Mutex
	procs []*Proc
}

// Proc is one running process.
type Proc struct {
	Name string
	// Addr is its main address, AdminAddr its admin address, when it has
	// them.
	Addr, AdminAddr string

	bin  string
	args []string
	env  []string // added to the stack's
	log  string
	// ready waits until a (re)started process serves; nil: at once.
	ready func(context.Context) error

	mu     sync.Mutex // guards cmd and exited, replaced by Restart
	cmd    *exec.Cmd
	exited chan struct{}
}

// New returns an empty stack that keeps its files in dir, with a key
// secret and NATS passwords of its own.
func New(dir, bin string, env ...string) *Stack {
	s := &Stack{Dir: dir, Bin: bin, secret: randomHex(32), passwords: map[string]string{}}
	s.Env = append([]string{config.EnvKeySecret + "=" + s.secret}, env...)
	for _, u := range deploy.NATSUsers {
		s.passwords[u] = randomHex(16)
	}
	return s
}

// Secret is the key secret every process of the stack holds
// (TALLY_KEY_SECRET, hex).
func (s *Stack) Secret() []byte {
	b, _ := hex.DecodeString(s.secret)
	return b
}

// NATSEnv is the environment that makes a process connect to the stack's
// NATS as user (edge, accountant, billing, analytics or operator): its
// password and inbox prefix.
func (s *Stack) NATSEnv(user string) []string {
	return []string{config.EnvNATSUser + "=" + user, config.EnvNATSPassword + "=" + s.passwords[user],
		config.EnvNATSInbox + "=" + deploy.InboxPrefix(user)}
}

// NATSPassword is the password of user on the stack's NATS.
func (s *Stack) NATSPassword(user string) string { return s.passwords[user] }

// NATSOptions are the options an in-process client connects to the
// stack's NATS with as user.
func (s *Stack) NATSOptions(user string) []nats.Option {
	return []nats.Option{nats.UserInfo(user, s.passwords[user]), nats.CustomInboxPrefix(deploy.InboxPrefix(user))}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // the system has no randomness: nothing can run safely
	}
	return hex.EncodeToString(b)
}

// Start runs bin with args, its output in <Dir>/<name>.log.
func (s *Stack) Start(ctx context.Context, name, bin string, args ...string) (*Proc, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := &Proc{Name: name, bin: bin, args: args, log: filepath.Join(s.Dir, name+".log")}
	if err := s.add(p); err != nil {
		return nil, err
	}
	return p, nil
}

// add launches p and adds it to the stack.
func (s *Stack) add(p *Proc) error {
	if err := s.launch(p, os.O_TRUNC); err != nil {
		return err
	}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return nil
}

// launch starts p's command; its output goes to p's log, opened with
// os.O_CREATE|os.O_WRONLY|mode (a restart appends).
func (s *Stack) launch(p *Proc, mode int) error {
	log, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|mode, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(append(os.Environ(), s.Env...), p.env...)
	// A Ctrl-C reaches only the caller, which stops the processes in order;
	// if the caller dies anyway, the kernel stops them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); log.Close(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	return nil
}

// Restart starts p again, with the same arguments (so the same port and
// data directory), once its previous run has exited (after Kill or Stop),
// and waits until it serves as when it was first started: a Redis started
// with RedisOptions.Durable comes back with everything it acknowledged, a
// replica with its replication link up, NATS with its JetStream store.
func (s *Stack) Restart(ctx context.Context, p *Proc) error {
	select {
	case <-p.done():
	default:
		return fmt.Errorf("restart %s: it is still running", p.Name)
	}
	if err := s.launch(p, os.O_APPEND); err != nil {
		return err
	}
	if p.ready == nil {
		return nil
	}
	return p.ready(ctx)
}

// NATS starts a NATS server with JetStream (its store in the stack's
// directory), monitoring and the shipped users and permissions
// (deploy/nats/tally.conf), and returns once it accepts connections.
// p.Addr is its client URL, p.AdminAddr its monitoring address. Restart
// brings it back on the same port with the same store.
func (s *Stack) NATS(ctx context.Context) (*Proc, error) {
	addr, mon := FreeAddr(), FreeAddr()
	_, port, _ := net.SplitHostPort(addr)
	_, mport, _ := net.SplitHostPort(mon)
	conf := filepath.Join(s.Dir, "nats.conf")
	if err := os.WriteFile(conf, deploy.NATSConfig, 0o600); err != nil {
		return nil, err
	}
	p := &Proc{Name: "nats", bin: filepath.Join(s.Bin, "nats-server"), log: filepath.Join(s.Dir, "nats.log"),
		args: []string{"-c", conf, "-a", "127.0.0.1", "-p", port, "-m", mport, "-js", "-sd", filepath.Join(s.Dir, "jetstream")}}
	for _, u := range deploy.NATSUsers {
		p.env = append(p.env, deploy.NATSPasswordEnv(u)+"="+s.passwords[u])
	}
	if err := s.add(p); err != nil {
		return nil, err
	}
	p.Addr, p.AdminAddr = "nats://"+addr, mon
	p.ready = func(ctx context.Context) error { return WaitTCP(ctx, addr) }
	return p, p.ready(ctx)
}

// NATSCluster starts n NATS servers in one cluster (deploy/nats/cluster.conf:
// the shipped users and permissions, routes that authenticate), named
// nats-0 … nats-<n-1> (each Proc's Name is its server name), each with its
// JetStream store in the stack's directory, and returns once every one
// reports JetStream healthy. URLs joins their client URLs, as nats.url
// takes them. Restart brings a server back with its store.
func (s *Stack) NATSCluster(ctx context.Context, n int) ([]*Proc, error) {
	for name, body := range map[string][]byte{"tally.conf": deploy.NATSConfig, "nats-cluster.conf": deploy.NATSClusterConfig} {
		if err := os.WriteFile(filepath.Join(s.Dir, name), body, 0o600); err != nil {
			return nil, err
		}
	}
	routePassword := randomHex(16)
	clusterAddrs := make([]string, n)
	for i := range clusterAddrs {
		clusterAddrs[i] = FreeAddr()
	}
	var procs []*Proc
	for i := range n {
		addr, mon := FreeAddr(), FreeAddr()
		_, port, _ := net.SplitHostPort(addr)
		_, mport, _ := net.SplitHostPort(mon)
		var routes []string
		for j, a := range clusterAddrs {
			if j != i {
				routes = append(routes, "nats://route:"+routePassword+"@"+a)
			}
		}
		name := fmt.Sprintf("nats-%d", i)
		p := &Proc{Name: name, bin: filepath.Join(s.Bin, "nats-server"), log: filepath.Join(s.Dir, name+".log"),
			args: []string{"-c", filepath.Join(s.Dir, "nats-cluster.conf"), "-n", name, "-a", "127.0.0.1", "-p", port,
				"-m", mport, "-js", "-sd", filepath.Join(s.Dir, "jetstream-"+strconv.Itoa(i)),
				"--cluster", "nats://" + clusterAddrs[i], "--routes", strings.Join(routes, ",")},
			env: []string{deploy.NATSRoutePasswordEnv + "=" + routePassword}}
		for _, u := range deploy.NATSUsers {
			p.env = append(p.env, deploy.NATSPasswordEnv(u)+"="+s.passwords[u])
		}
		if err := s.add(p); err != nil {
			return nil, err
		}
		p.Addr, p.AdminAddr = "nats://"+addr, mon
		p.ready = func(ctx context.Context) error {
			if err := WaitTCP(ctx, addr); err != nil {
				return err
			}
			// Healthy: JetStream is up and current with the cluster.
			return WaitHTTP(ctx, "http://"+mon+"/healthz", p.done())
		}
		procs = append(procs, p)
	}
	for _, p := range procs {
		if err := p.ready(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", p.Name, err)
		}
	}
	return procs, nil
}

// URLs joins the client URLs of procs with commas (nats.url).
func URLs(procs []*Proc) string {
	urls := make([]string, len(procs))
	for i, p := range procs {
		urls[i] = p.Addr
	}
	return strings.Join(urls, ",")
}

// WriteConfig writes f as YAML to <Dir>/<name>.yaml and returns its path.
func (s *Stack) WriteConfig(name string, f *config.File) (string, error) {
	b, err := yaml.Marshal(f)
	if err != nil {
		return "", err
	}
	path := filepath.Join(s.Dir, name+".yaml")
	return path, os.WriteFile(path, b, 0o600)
}

// Accountant starts an accountant with the configuration at cfg, as NATS
// user accountant, and waits until its /readyz answers on adminAddr.
func (s *Stack) Accountant(ctx context.Context, name, cfg, adminAddr string) (*Proc, error) {
	return s.service(ctx, name, "accountant", cfg, adminAddr, s.NATSEnv("accountant")...)
}

// Edge starts an edge-checker with the configuration at cfg, as NATS user
// edge, and waits until its /readyz answers on adminAddr.
// env ("NAME=value") is added to its environment.
func (s *Stack) Edge(ctx context.Context, name, cfg, adminAddr string, env ...string) (*Proc, error) {
	return s.service(ctx, name, "edge-checker", cfg, adminAddr, append(s.NATSEnv("edge"), env...)...)
}

func (s *Stack) service(ctx context.Context, name, bin, cfg, adminAddr string, env ...string) (*Proc, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := &Proc{Name: name, bin: filepath.Join(s.Bin, bin), args: []string{"-config", cfg}, env: env,
		log: filepath.Join(s.Dir, name+".log")}
	if err := s.add(p); err != nil {
		return nil, err
	}
	p.AdminAddr = adminAddr
	p.ready = func(ctx context.Context) error {
		if err := WaitHTTP(ctx, "http://"+adminAddr+"/readyz", p.done()); err != nil {
			return fmt.Errorf("%s not ready (see %s): %w", name, p.log, err)
		}
		return nil
	}
	return p, p.ready(ctx)
}

// running returns p's current command and the channel closed when it
// exits.
func (p *Proc) running() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.exited
}

// done is closed when p's current run exits.
func (p *Proc) done() <-chan struct{} {
	_, exited := p.running()
	return exited
}

// Stop sends p SIGTERM (and SIGCONT, in case it is paused) and waits up to
// 15 seconds for it to exit, then kills it.
func (p *Proc) Stop() {
	cmd, exited := p.running()
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Kill stops p at once (SIGKILL), as a crash would.
func (p *Proc) Kill() {
	cmd, exited := p.running()
	_ = cmd.Process.Kill()
	<-exited
}

// Pause freezes p (SIGSTOP): it keeps its connections open and answers
// nothing, as a process stuck on a full disk or in a long pause would.
func (p *Proc) Pause() error { return p.signal(syscall.SIGSTOP) }

// Resume lets a paused p go on (SIGCONT).
func (p *Proc) Resume() error { return p.signal(syscall.SIGCONT) }

func (p *Proc) signal(sig syscall.Signal) error {
	cmd, _ := p.running()
	return cmd.Process.Signal(sig)
}

// LogFile is the path of p's log: its output, over every run.
func (p *Proc) LogFile() string { return p.log }

// Pid is the process id.
func (p *Proc) Pid() int {
	cmd, _ := p.running()
	return cmd.Process.Pid
}

// CPU is the processor time the process has used so far (user + system),
// read from /proc; 0 when it cannot be read.
func (p *Proc) CPU() time.Duration { return CPUOf(p.Pid()) }

// CPUOf is a process's processor time from /proc/<pid>/stat.
func CPUOf(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+2:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const hz = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / hz
}

// StopAll stops every process, newest first.
func (s *Stack) StopAll() {
	s.mu.Lock()
	procs := s.procs
	s.procs = nil
	s.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop()
	}
}

// FreeAddr returns a loopback address for a process the stack starts: a
// port nothing listened on a moment ago, that no other process using
// package freeport is handed and that the kernel does not hand out on its
// own (see freeport).
func FreeAddr() string {
	a, err := freeport.Addr()
	if err != nil {
		panic(err) // no loopback port at all: nothing can run
	}
	return a
}

// WaitTCP waits up to 10 seconds for addr to accept connections.
func WaitTCP(ctx context.Context, addr string) error {
	for range 200 {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not accept connections in 10s", addr)
}

// WaitHTTP waits up to 20 seconds for url to answer 200, or for exited to
// close (the process died).
func WaitHTTP(ctx context.Context, url string, exited <-chan struct{}) error {
	last := errors.New("no answer")
	for range 400 {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			err = errors.New(resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return errors.New("the process exited")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return last
}

// SentinelShard starts a shard whose primary Redis Sentinel watches and
// fails over: a primary (named master in the sentinels' configuration),
// replicas of it, and sentinels sentinels (quorum: a majority) that
// consider the primary down after down without an answer. procs holds the
// primary, the replicas, then the sentinels.
func (s *Stack) SentinelShard(ctx context.Context, name string, replicas, sentinels int, down time.Duration) (shard.Config, []*Proc, error) {
	p, err := s.Redis(ctx, name+"-primary", "")
	if err != nil {
		return shard.Config{}, nil, err
	}
	procs := []*Proc{p}
	for j := range replicas {
		r, err := s.Redis(ctx, fmt.Sprintf("%s-replica%d", name, j), p.Addr)
		if err != nil {
			return shard.Config{}, nil, err
		}
		procs = append(procs, r)
	}
	sc := shard.Config{Name: name, Sentinel: &shard.Sentinel{Master: name}}
	host, port, _ := net.SplitHostPort(p.Addr)
	for j := range sentinels {
		addr := FreeAddr()
		_, sport, _ := net.SplitHostPort(addr)
		dir := filepath.Join(s.Dir, fmt.Sprintf("%s-sentinel%d", name, j))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return shard.Config{}, nil, err
		}
		// Sentinel rewrites its configuration file as it learns.
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %s\nbind 127.0.0.1\ndir %s\n"+
			"sentinel monitor %s %s %s %d\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 10000\n"+
			"sentinel parallel-syncs %s %d\n",
			sport, dir, name, host, port, sentinels/2+1, name, down.Milliseconds(), name, name, max(1, replicas))
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return shard.Config{}, nil, err
		}
		sp, err := s.Start(ctx, fmt.Sprintf("%s-sentinel%d", name, j), "redis-sentinel", conf)
		if err != nil {
			return shard.Config{}, nil, err
		}
		sp.Addr = addr
		procs = append(procs, sp)
		sc.Sentinel.Addrs = append(sc.Sentinel.Addrs, addr)
	}
	// A failover needs the sentinels to know each other and the replicas
	// (they learn it from the primary within a few seconds).
	for _, sp := range procs[1+replicas:] {
		_, sport, _ := net.SplitHostPort(sp.Addr)
		for _, want := range []string{fmt.Sprintf("num-other-sentinels\n%d\n", sentinels-1), fmt.Sprintf("num-slaves\n%d\n", replicas)} {
			if err := waitRedis(ctx, sp.Name, sport, "SENTINEL master "+name, want); err != nil {
				return shard.Config{}, nil, err
			}
		}
	}
	return sc, procs, nil
}
