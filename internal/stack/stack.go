// Package stack runs a local Tally deployment as real processes, for make
// demo and make bench: Redis shards (a primary and replicas each), a NATS
// server with JetStream, accountants and edge-checkers, each with its log in
// the stack's directory. Everything it starts is stopped by StopAll, in
// reverse order (edges before accountants before NATS before Redis), and by
// the kernel if the calling process dies first.
//
// It expects redis-server on PATH and the binaries edge-checker, accountant
// and nats-server in the stack's bin directory (make builds them).
package stack

import (
	"context"
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

	"go.yaml.in/yaml/v3"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/shard"
)

// Stack is a set of processes started together.
type Stack struct {
	// Dir holds logs, data and configuration files; Bin the binaries.
	Dir, Bin string
	// Env is added to every process's environment (e.g. TALLY_KEY_SECRET).
	Env []string

	mu    sync.Mutex
	procs []*Proc
}

// Proc is one running process.
type Proc struct {
	Name string
	// Addr is its main address, AdminAddr its admin address, when it has
	// them.
	Addr, AdminAddr string
	cmd             *exec.Cmd
	exited          chan struct{}
}

// New returns an empty stack that keeps its files in dir.
func New(dir, bin string, env ...string) *Stack { return &Stack{Dir: dir, Bin: bin, Env: env} }

// Start runs bin with args, its output in <Dir>/<name>.log.
func (s *Stack) Start(ctx context.Context, name, bin string, args ...string) (*Proc, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(s.Dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), s.Env...)
	// A Ctrl-C reaches only the caller, which stops the processes in order;
	// if the caller dies anyway, the kernel stops them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(p.exited) }()
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p, nil
}

// Redis starts a redis-server on a free loopback port (a replica of primary
// when primary is not empty) and returns once it answers, and for a replica
// once its link is up.
func (s *Stack) Redis(ctx context.Context, name, primary string) (*Proc, error) {
	addr := FreeAddr()
	_, port, _ := net.SplitHostPort(addr)
	dir := filepath.Join(s.Dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--repl-diskless-sync-delay", "0", "--maxmemory-policy", "noeviction"}
	if primary != "" {
		h, p, _ := net.SplitHostPort(primary)
		args = append(args, "--replicaof", h, p)
	}
	p, err := s.Start(ctx, name, "redis-server", args...)
	if err != nil {
		return nil, err
	}
	p.Addr = addr
	if err := WaitTCP(ctx, addr); err != nil {
		return nil, err
	}
	if primary != "" {
		for i := 0; ; i++ {
			out, _ := exec.CommandContext(ctx, "redis-cli", "-p", port, "INFO", "replication").Output()
			if strings.Contains(string(out), "master_link_status:up") {
				break
			}
			if i == 200 {
				return nil, fmt.Errorf("%s: replication link not up after 10s", name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return p, nil
}

// Shards starts n shards named s0, s1, ..., each a primary and replicas.
func (s *Stack) Shards(ctx context.Context, n, replicas int) ([]shard.Config, []*Proc, error) {
	var out []shard.Config
	var procs []*Proc
	for i := range n {
		name := "s" + strconv.Itoa(i)
		p, err := s.Redis(ctx, name+"-primary", "")
		if err != nil {
			return nil, nil, err
		}
		procs = append(procs, p)
		sc := shard.Config{Name: name, Primary: shard.Node{Addr: p.Addr}}
		for j := range replicas {
			r, err := s.Redis(ctx, fmt.Sprintf("%s-replica%d", name, j), p.Addr)
			if err != nil {
				return nil, nil, err
			}
			procs = append(procs, r)
			sc.Replicas = append(sc.Replicas, shard.Node{Addr: r.Addr})
		}
		out = append(out, sc)
	}
	return out, procs, nil
}

// NATS starts a NATS server with JetStream (its store in the stack's
// directory) and monitoring, and returns once it accepts connections.
// p.Addr is its client URL, p.AdminAddr its monitoring address.
func (s *Stack) NATS(ctx context.Context) (*Proc, error) {
	addr, mon := FreeAddr(), FreeAddr()
	_, port, _ := net.SplitHostPort(addr)
	_, mport, _ := net.SplitHostPort(mon)
	p, err := s.Start(ctx, "nats", filepath.Join(s.Bin, "nats-server"), "-a", "127.0.0.1", "-p", port, "-m", mport,
		"-js", "-sd", filepath.Join(s.Dir, "jetstream"))
	if err != nil {
		return nil, err
	}
	p.Addr, p.AdminAddr = "nats://"+addr, mon
	return p, WaitTCP(ctx, addr)
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

// Accountant starts an accountant with the configuration at cfg and waits
// until its /readyz answers on adminAddr.
func (s *Stack) Accountant(ctx context.Context, name, cfg, adminAddr string) (*Proc, error) {
	return s.service(ctx, name, "accountant", cfg, adminAddr)
}

// Edge starts an edge-checker with the configuration at cfg and waits until
// its /readyz answers on adminAddr.
func (s *Stack) Edge(ctx context.Context, name, cfg, adminAddr string) (*Proc, error) {
	return s.service(ctx, name, "edge-checker", cfg, adminAddr)
}

func (s *Stack) service(ctx context.Context, name, bin, cfg, adminAddr string) (*Proc, error) {
	p, err := s.Start(ctx, name, filepath.Join(s.Bin, bin), "-config", cfg)
	if err != nil {
		return nil, err
	}
	p.AdminAddr = adminAddr
	if err := WaitHTTP(ctx, "http://"+adminAddr+"/readyz", p.exited); err != nil {
		return nil, fmt.Errorf("%s not ready (see %s): %w", name, filepath.Join(s.Dir, name+".log"), err)
	}
	return p, nil
}

// Stop sends p SIGTERM and waits up to 15 seconds for it to exit, then
// kills it.
func (p *Proc) Stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// Kill stops p at once (SIGKILL), as a crash would.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

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

// FreeAddr returns a loopback address with a port that was free a moment
// ago.
func FreeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err) // no loopback port at all: nothing can run
	}
	defer l.Close()
	return l.Addr().String()
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
