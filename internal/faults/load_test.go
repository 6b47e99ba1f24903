package faults

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/loadgen"
)

// target is one client key of a scenario and what the clients saw for it.
type target struct {
	identity, path string
	policy         limiter.Policy
	cost           int64 // the route's cost (the policy's unless the route overrides it)
	key            limiter.Key

	ok, notModified, denied, failed atomic.Int64 // 200, 304, 429, anything else
	// retired: the clients send nothing more for this key.
	retired atomic.Bool
	// share, when set, is the part of the load's requests that go to this
	// key (a hot key); the others share the rest evenly.
	share float64
}

// charged is what the window must hold once everything is accounted for:
// every allowed request (200 and 304) times its cost, less the 304s'
// refunds.
func (tg *target) charged() int64 { return tg.ok.Load() * tg.cost }

// Phases of a scenario: latencies are reported for each.
const (
	phaseBefore = iota
	phaseDuring
	phaseAfter
	phases
)

var phaseNames = [phases]string{"before", "during", "after"}

// load is a few clients sending requests at a steady rate through the
// edge's proxy. Unlike loadgen's runs, it never abandons a request in
// flight when it stops: every request the edge decided is counted.
type load struct {
	targets []*target
	// hot are the targets with a share of the load, even the others.
	hot, even []*target
	phase     atomic.Int32
	stop      chan struct{}
	wg        sync.WaitGroup

	mu      sync.Mutex
	lat     [phases]*loadgen.Histogram
	errs    []string // transport errors, a few of them
	errN    int
	started time.Time
	ended   time.Time
}

// loadClients and loadRate shape the load: each client sends one request
// every 1/loadRate seconds (fewer when answers are slow).
const (
	loadClients = 4
	loadRate    = 150
	// revalidateEvery: one request in this many carries If-None-Match, which
	// the API answers 304.
	revalidateEvery = 4
)

// startLoad starts clients clients, each sending rate requests a second
// (fewer when answers are slow) to one of the edges' proxies at addrs in
// turn.
func startLoad(addrs []string, targets []*target, clients, rate int) *load {
	l := &load{targets: targets, stop: make(chan struct{}), started: time.Now()}
	for _, tg := range targets {
		if tg.share > 0 {
			l.hot = append(l.hot, tg)
		} else {
			l.even = append(l.even, tg)
		}
	}
	for i := range l.lat {
		l.lat[i] = loadgen.NewHistogram()
	}
	for c := range clients {
		l.wg.Go(func() { l.client(addrs[c%len(addrs)], uint64(c), rate) })
	}
	return l
}

// enter starts a phase.
func (l *load) enter(phase int) { l.phase.Store(int32(phase)) }

// client sends requests until the load stops, each waiting for the one
// before.
func (l *load) client(addr string, seed uint64, rate int) {
	tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
	defer tr.CloseIdleConnections()
	// Generous: a request that takes this long is counted as an error, and
	// the no-stall bound is far below it.
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	rnd := rand.New(rand.NewPCG(seed, 42))
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	lat := [phases]*loadgen.Histogram{}
	for i := range lat {
		lat[i] = loadgen.NewHistogram()
	}
	defer func() {
		l.mu.Lock()
		for i := range lat {
			l.lat[i].Merge(lat[i])
		}
		l.mu.Unlock()
	}()
	for n := 0; ; n++ {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		tg := l.pick(rnd)
		if tg == nil {
			continue
		}
		phase := l.phase.Load()
		began := time.Now()
		err := send(hc, addr, tg, n%revalidateEvery == revalidateEvery-1)
		lat[phase].Record(time.Since(began))
		if err != nil {
			l.transportError(err)
		}
	}
}

// send sends one request for tg (revalidating: If-None-Match, which the
// API answers 304) and counts its answer.
func send(hc *http.Client, addr string, tg *target, revalidate bool) error {
	req, _ := http.NewRequest("GET", "http://"+addr+tg.path, nil)
	req.Header.Set("Authorization", tg.identity)
	if revalidate {
		req.Header.Set("If-None-Match", `"v1"`)
	}
	resp, err := hc.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if err != nil {
		return err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		tg.ok.Add(1)
	case http.StatusNotModified:
		tg.notModified.Add(1)
	case http.StatusTooManyRequests:
		tg.denied.Add(1)
	default:
		tg.failed.Add(1)
	}
	return nil
}

// warm sends one request for each target through the proxy at addr, one
// after the other, before the load starts: every key then has a window.
func warm(addr string, targets []*target) error {
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	for _, tg := range targets {
		if err := send(hc, addr, tg, false); err != nil {
			return err
		}
	}
	return nil
}

// pick chooses a target that is not retired, or nil: a hot one by its
// share of the load, else any other.
func (l *load) pick(rnd *rand.Rand) *target {
	x := rnd.Float64()
	for _, tg := range l.hot {
		if x -= tg.share; x < 0 {
			if tg.retired.Load() {
				return nil
			}
			return tg
		}
	}
	if len(l.even) == 0 {
		return nil
	}
	for range 8 {
		if tg := l.even[rnd.IntN(len(l.even))]; !tg.retired.Load() {
			return tg
		}
	}
	return nil
}

func (l *load) transportError(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errN++
	if len(l.errs) < 5 {
		l.errs = append(l.errs, err.Error())
	}
}

// finish stops the clients once their requests in flight are answered.
func (l *load) finish() {
	close(l.stop)
	l.wg.Wait()
	l.ended = time.Now()
}

// totals adds up what every target saw.
func (l *load) totals() (ok, notModified, denied, failed int64) {
	for _, tg := range l.targets {
		ok += tg.ok.Load()
		notModified += tg.notModified.Load()
		denied += tg.denied.Load()
		failed += tg.failed.Load()
	}
	return
}

// maxLatency is the slowest request of the run.
func (l *load) maxLatency() time.Duration {
	var m time.Duration
	for _, h := range l.lat {
		m = max(m, h.Max())
	}
	return m
}

// summary is the run's figures, for the test log.
func (l *load) summary() string {
	ok, nm, denied, failed := l.totals()
	total := ok + nm + denied + failed + int64(l.errN)
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests in %.1fs (%.0f/s): %d × 200, %d × 304, %d × 429, %d other, %d transport errors",
		total, l.ended.Sub(l.started).Seconds(), float64(total)/l.ended.Sub(l.started).Seconds(), ok, nm, denied, failed, l.errN)
	for i, h := range l.lat {
		if h.Count() == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n  %-6s %5d requests  p50 %-8v p99 %-8v max %v", phaseNames[i], h.Count(),
			round(h.Quantile(0.5)), round(h.Quantile(0.99)), round(h.Max()))
	}
	return b.String()
}

func round(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d.Round(100 * time.Microsecond)
}
