// Command demo runs the whole Tally pipeline on this machine for a minute:
// two Redis shards (a primary and a replica each), a NATS server with
// JetStream, the accountant, and the edge-checker in proxy mode in front of
// a small API that serves ETags and 304s. It drives a short burst of
// traffic from a few clients and prints what happened.
//
// Every process it starts is stopped when it ends, on success, on error and
// on Ctrl-C. It expects redis-server on PATH and the binaries in bin/
// (make demo builds them).
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/shard"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d := &demo{bin: "bin"}
	err := d.run(ctx)
	d.stopAll()
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "\ninterrupted: every process the demo started has been stopped")
		os.Exit(130)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		if d.dir != "" {
			fmt.Fprintln(os.Stderr, "logs are in", d.dir)
		}
		os.Exit(1)
	}
	_ = os.RemoveAll(d.dir)
}

type demo struct {
	bin   string
	dir   string
	mu    sync.Mutex
	procs []*exec.Cmd
}

const secret = "demo-secret"

func (d *demo) run(ctx context.Context) error {
	var err error
	if d.dir, err = os.MkdirTemp("", "tally-demo-"); err != nil {
		return err
	}
	step := func(s string) { fmt.Printf("  %-44s", s) }
	done := func() { fmt.Println("ok") }
	fmt.Println("Starting the pipeline:")

	// Two shards, each a primary and a replica.
	var shards []shard.Config
	for _, name := range []string{"s0", "s1"} {
		step("redis shard " + name + " (primary + replica)")
		p, err := d.redis(ctx, name+"-primary", "")
		if err != nil {
			return err
		}
		r, err := d.redis(ctx, name+"-replica", p)
		if err != nil {
			return err
		}
		shards = append(shards, shard.Config{Name: name, Primary: shard.Node{Addr: p}, Replicas: []shard.Node{{Addr: r}}})
		done()
	}

	step("nats-server with JetStream")
	natsPort := freePort()
	if err := d.start(ctx, "nats", filepath.Join(d.bin, "nats-server"), "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort),
		"-js", "-sd", filepath.Join(d.dir, "jetstream")); err != nil {
		return err
	}
	if err := waitTCP(ctx, fmt.Sprintf("127.0.0.1:%d", natsPort)); err != nil {
		return err
	}
	done()

	step("demo API (ETags, 304 Not Modified)")
	api, err := demoAPI()
	if err != nil {
		return err
	}
	defer api.Close()
	done()

	edgeAddr, edgeAdmin, accAdmin := fmt.Sprintf("127.0.0.1:%d", freePort()), fmt.Sprintf("127.0.0.1:%d", freePort()), fmt.Sprintf("127.0.0.1:%d", freePort())
	cfgPath := filepath.Join(d.dir, "tally.yaml")
	if err := os.WriteFile(cfgPath, []byte(config(shards, natsPort, edgeAddr, "http://"+api.Addr, edgeAdmin, accAdmin)), 0o600); err != nil {
		return err
	}
	step("accountant")
	if err := d.start(ctx, "accountant", filepath.Join(d.bin, "accountant"), "-config", cfgPath); err != nil {
		return err
	}
	if err := waitHTTP(ctx, "http://"+accAdmin+"/readyz"); err != nil {
		return fmt.Errorf("accountant not ready: %w", err)
	}
	done()
	step("edge-checker (proxy mode)")
	if err := d.start(ctx, "edge-checker", filepath.Join(d.bin, "edge-checker"), "-config", cfgPath); err != nil {
		return err
	}
	if err := waitHTTP(ctx, "http://"+edgeAdmin+"/readyz"); err != nil {
		return fmt.Errorf("edge-checker not ready: %w", err)
	}
	done()

	fmt.Println("\nTraffic (policy \"core\": 10 requests per minute per client):")
	results := drive(ctx, "http://"+edgeAddr)
	if ctx.Err() != nil {
		return ctx.Err()
	}

	// Let the accountant catch up, then read the windows from the primaries.
	time.Sleep(500 * time.Millisecond)
	keys, _ := limiter.NewKeySpace("tally", []byte(secret))
	primaries := make([]shard.Config, len(shards))
	for i, s := range shards {
		primaries[i] = shard.Config{Name: s.Name, Primary: s.Primary} // no replicas: reads go to the primary
	}
	store, err := limiter.NewStore(primaries, keys, limiter.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	fmt.Println()
	fmt.Printf("  %-8s %-34s %5s %7s %5s %5s %6s  %s\n", "client", "what it did", "sent", "allowed", "429", "304", "usage", "shard")
	for _, r := range results {
		k := keys.Key("core", "h:"+r.token)
		w, err := store.Check(ctx, k)
		usage := "?"
		if err == nil {
			usage = fmt.Sprintf("%d/10", w.Used)
		}
		fmt.Printf("  %-8s %-34s %5d %7d %5d %5d %6s  %s\n", r.name, r.what, r.sent, r.allowed, r.denied, r.notModified,
			usage, store.ShardName(store.ShardOf(k)))
	}
	em, am := scrape("http://"+edgeAdmin+"/metrics"), scrape("http://"+accAdmin+"/metrics")
	lagAvg := 0.0
	if n := am[`tally_accountant_lag_seconds_count`]; n > 0 {
		lagAvg = am[`tally_accountant_lag_seconds_sum`] / n * 1000
	}
	fmt.Printf(`
Summary:
  edge-checker   allowed %v, denied (429) %v, events published %v, dropped %v
  accountant     charged %v, refunded (304) %v, duplicates %v, late %v, dead-lettered %v
  accounting lag average %.1f ms, max %.1f ms (publish at the edge → effect in Redis)

`, em[`tally_edge_decisions_total{result="allowed"}`], em[`tally_edge_decisions_total{result="denied"}`],
		em["tally_edge_events_published_total"], em["tally_edge_events_dropped_total"],
		am[`tally_accountant_events_total{outcome="charged"}`], am[`tally_accountant_events_total{outcome="refunded"}`],
		am[`tally_accountant_events_total{outcome="duplicate"}`], am[`tally_accountant_events_total{outcome="late"}`],
		am[`tally_accountant_events_total{outcome="dead_lettered"}`], lagAvg, am["tally_accountant_lag_max_seconds"]*1000)
	fmt.Println("Usage = charges minus 304 refunds, read from the shard primaries. Stopping everything.")
	return nil
}

type clientResult struct {
	name, token, what                       string
	sent, allowed, denied, notModified, bad int
}

// drive sends a short burst: a light client, a heavy one that goes over its
// limit, one that revalidates with If-None-Match (304s are refunded), and
// one that mixes both.
func drive(ctx context.Context, base string) []*clientResult {
	clients := []*clientResult{
		{name: "alice", token: "tok-alice", what: "6 plain requests"},
		{name: "bob", token: "tok-bob", what: "15 requests, over the limit"},
		{name: "carol", token: "tok-carol", what: "1 request + 12 revalidations"},
		{name: "dave", token: "tok-dave", what: "8 requests + 6 revalidations"},
	}
	plan := map[string][]bool{ // true: conditional request
		"alice": repeat(false, 6),
		"bob":   repeat(false, 15),
		"carol": append([]bool{false}, repeat(true, 12)...),
		"dave":  append(repeat(false, 8), repeat(true, 6)...),
	}
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			for _, cond := range plan[c.name] {
				if ctx.Err() != nil {
					return
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", base+"/repos/tally", nil)
				req.Header.Set("Authorization", c.token)
				if cond {
					req.Header.Set("If-None-Match", `"v1"`)
				}
				resp, err := http.DefaultClient.Do(req)
				c.sent++
				if err != nil {
					c.bad++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					c.allowed++
				case 304:
					c.allowed++
					c.notModified++
				case 429:
					c.denied++
				default:
					c.bad++
				}
				time.Sleep(30 * time.Millisecond) // let 304 refunds land between requests
			}
		})
	}
	wg.Wait()
	return clients
}

func repeat(v bool, n int) []bool {
	out := make([]bool, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func config(shards []shard.Config, natsPort int, edgeAddr, upstream, edgeAdmin, accAdmin string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "key_prefix: tally\nredis:\n  shards:\n")
	for _, s := range shards {
		fmt.Fprintf(&b, "    - name: %s\n      primary: {addr: %q}\n      replicas: [{addr: %q}]\n", s.Name, s.Primary.Addr, s.Replicas[0].Addr)
	}
	fmt.Fprintf(&b, `nats:
  url: nats://127.0.0.1:%d
edge:
  listen: %q
  upstream: %q
  admin_listen: %q
  default_policy: core
  identity:
    header: Authorization
accountant:
  admin_listen: %q
policies:
  - name: core
    limit: 10
    window: 1m
`, natsPort, edgeAddr, upstream, edgeAdmin, accAdmin)
	return b.String()
}

// demoAPI serves an ETag for every path and 304 when it matches.
func demoAPI() (*http.Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Addr: ln.Addr().String(), ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", `"v1"`)
			if r.Header.Get("If-None-Match") == `"v1"` {
				w.WriteHeader(http.StatusNotModified)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"name":"tally","stars":42}` + "\n"))
		})}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

// redis starts a redis-server (a replica when primary is set) and returns
// its address once it answers (a replica once its link is up).
func (d *demo) redis(ctx context.Context, name, primary string) (string, error) {
	port := freePort()
	dir := filepath.Join(d.dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--repl-diskless-sync-delay", "0"}
	if primary != "" {
		h, p, _ := net.SplitHostPort(primary)
		args = append(args, "--replicaof", h, p)
	}
	if err := d.start(ctx, name, "redis-server", args...); err != nil {
		return "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitTCP(ctx, addr); err != nil {
		return "", err
	}
	if primary != "" {
		for i := 0; ; i++ {
			out, _ := exec.CommandContext(ctx, "redis-cli", "-p", strconv.Itoa(port), "INFO", "replication").Output()
			if strings.Contains(string(out), "master_link_status:up") {
				break
			}
			if i == 100 {
				return "", fmt.Errorf("%s: replication link not up", name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return addr, nil
}

// start runs a process with its output in <dir>/<name>.log.
func (d *demo) start(ctx context.Context, name, bin string, args ...string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	log, err := os.Create(filepath.Join(d.dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "TALLY_KEY_SECRET="+secret)
	// Ctrl-C reaches only us (we stop the others in order); if we die
	// anyway, the kernel stops them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	d.mu.Lock()
	d.procs = append(d.procs, cmd)
	d.mu.Unlock()
	return nil
}

// stopAll stops processes in reverse start order: edge, accountant, NATS,
// Redis. Each gets SIGTERM and 10 seconds, then SIGKILL.
func (d *demo) stopAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := len(d.procs) - 1; i >= 0; i-- {
		p := d.procs[i]
		_ = p.Process.Signal(syscall.SIGTERM)
		exited := make(chan struct{})
		go func() { _ = p.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
			<-exited
		}
	}
	d.procs = nil
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitTCP(ctx context.Context, addr string) error {
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

func waitHTTP(ctx context.Context, url string) error {
	var last error
	for range 200 {
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
		case <-time.After(50 * time.Millisecond):
		}
	}
	return last
}

var sample = regexp.MustCompile(`^([a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$`)

// scrape reads a Prometheus text page into name{labels} → value.
func scrape(url string) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get(url)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := sample.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			out[m[1]] = v
		}
	}
	return out
}
