package loadgen

import (
	"bufio"
	"context"
	"errors"
	"math"
	"net"
	"sync"
	"time"
)

// A Target says where to send requests and what to send.
type Target struct {
	// Addr is the server's TCP address, as host:port, for example
	// "127.0.0.1:8081".
	Addr string

	// Request returns the complete raw HTTP/1.1 request, with request line,
	// headers (Host and, if there is a body, Content-Length), blank line and
	// body, for request number i sent on connection conn. Connections are
	// numbered from 0. In ClosedLoop, i numbers the requests of one
	// connection from 0; in OpenLoop it is the request's place in the
	// schedule. Request is called concurrently from every connection and
	// should return pre-built slices, without allocating. The request must
	// not be empty; its bytes are only read, and not retained after it has
	// been written.
	Request func(conn int, i uint64) []byte

	// Observe, if not nil, is called for every response read, in the
	// measured period or not, from the goroutine of the connection that read
	// it, with the number of its request as in Request, its status code and
	// its header block: the header lines as received, each with its line
	// ending, without the status line and the blank line that ends the
	// block. The header slice is only valid during the call. The call is
	// not part of the response's latency, but the connection sends nothing
	// until it returns.
	Observe func(conn int, i uint64, status int, header []byte)
}

// A Result is what one run measured. It counts only the measured part of
// the run, as ClosedLoop and OpenLoop define it: nothing of the warm-up.
type Result struct {
	Sent      uint64 // requests written
	Completed uint64 // responses read in full
	// Warmup counts the responses read in full during OpenLoop's warm-up
	// (not in Completed): with Completed, every request a process served
	// while a run was sampled.
	Warmup uint64

	// Errors counts failed dials and connections that failed or sent a
	// response that could not be parsed (each is dialled again), and, for
	// OpenLoop, requests given up at the end of the run.
	Errors uint64

	Statuses map[int]uint64 // completed responses by status code
	Elapsed  time.Duration  // wall time of the measured period
	Latency  *Histogram     // latency of every completed response
}

// Throughput returns the number of completed responses per second of
// Elapsed, or 0 if Elapsed is not positive.
func (r Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Completed) / r.Elapsed.Seconds()
}

// redialDelay is the pause after a failed dial.
const redialDelay = 10 * time.Millisecond

// readBufferSize is the size of each connection's read buffer. A status
// line, header line or chunk-size line longer than this is a parse error.
const readBufferSize = 16 << 10

// aLongTimeAgo is a deadline in the past, used to interrupt pending I/O.
var aLongTimeAgo = time.Unix(1, 0)

func checkArgs(t Target, conns int, warmup, d time.Duration) error {
	switch {
	case t.Addr == "":
		return errors.New("loadgen: empty target address")
	case t.Request == nil:
		return errors.New("loadgen: nil Target.Request")
	case conns < 1:
		return errors.New("loadgen: need at least one connection")
	case warmup < 0:
		return errors.New("loadgen: negative warm-up")
	case d <= 0:
		return errors.New("loadgen: duration must be positive")
	}
	return nil
}

func checkRate(rate float64) error {
	if !(rate > 0) || math.IsInf(rate, 1) {
		return errors.New("loadgen: rate must be positive and finite")
	}
	return nil
}

// A worker owns one connection slot: the connection, its read buffer, and
// the counts of what it sent and read. Only its goroutine touches the
// counts; mu guards nc against stop, which runs on another goroutine.
type worker struct {
	id     int
	t      *Target
	ctx    context.Context // ends when the run ends
	dialer net.Dialer
	br     *bufio.Reader
	hdr    []byte // header block of the last response, kept for Observe

	// Errors are counted when they happen in [errFrom, errTo).
	errFrom, errTo time.Time

	mu      sync.Mutex
	nc      net.Conn
	stopped bool

	sent, completed, errors uint64
	warmed                  uint64 // OpenLoop: responses read during the warm-up
	failed                  uint64 // counted requests that failed (OpenLoop)
	last                    time.Time
	statuses                [1000]uint64
	hist                    *Histogram
}

func newWorkers(t *Target, conns int) []*worker {
	ws := make([]*worker, conns)
	for i := range ws {
		ws[i] = &worker{
			id:   i,
			t:    t,
			ctx:  context.Background(),
			br:   bufio.NewReaderSize(nil, readBufferSize),
			hist: NewHistogram(),
		}
	}
	return ws
}

// preDialTimeout bounds connect.
const preDialTimeout = time.Second

// connect dials every worker's connection once, before a run starts its
// clock, so that its first requests do not wait for connection setup.
// Failed dials are not counted: the workers dial again when the run starts.
func connect(ctx context.Context, ws []*worker) {
	ctx, cancel := context.WithTimeout(ctx, preDialTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			if nc, err := w.dialer.DialContext(ctx, "tcp", w.t.Addr); err == nil {
				w.nc = nc
				w.br.Reset(nc)
			}
		})
	}
	wg.Wait()
}

// countError counts an error that happened at now, if it falls in the
// period errors are counted in.
func (w *worker) countError(now time.Time) {
	if !now.Before(w.errFrom) && now.Before(w.errTo) {
		w.errors++
	}
}

// dial connects the worker, retrying failed dials every redialDelay. It
// returns false when the run has ended.
func (w *worker) dial() bool {
	for {
		nc, err := w.dialer.DialContext(w.ctx, "tcp", w.t.Addr)
		if err == nil {
			w.mu.Lock()
			if w.stopped {
				w.mu.Unlock()
				nc.Close()
				return false
			}
			w.nc = nc
			w.mu.Unlock()
			w.br.Reset(nc)
			return true
		}
		if w.ctx.Err() != nil {
			return false
		}
		w.countError(time.Now())
		t := time.NewTimer(redialDelay)
		select {
		case <-t.C:
		case <-w.ctx.Done():
			t.Stop()
			return false
		}
	}
}

// drop closes the worker's connection, if any.
func (w *worker) drop() {
	w.mu.Lock()
	if w.nc != nil {
		w.nc.Close()
		w.nc = nil
	}
	w.mu.Unlock()
}

// stop makes pending and future I/O on the worker's connection fail and
// keeps it from dialling again.
func (w *worker) stop() {
	w.mu.Lock()
	w.stopped = true
	if w.nc != nil {
		w.nc.SetDeadline(aLongTimeAgo)
	}
	w.mu.Unlock()
}

// roundTrip writes req and reads its response. It returns whether req was
// written, the response's status code and when the response had been read,
// before Observe was called. On error, or when the server asked for it, the
// connection is closed.
func (w *worker) roundTrip(req []byte, i uint64) (written bool, status int, done time.Time, err error) {
	if _, err := w.nc.Write(req); err != nil {
		w.drop()
		return false, 0, time.Time{}, err
	}
	status, closeAfter, err := readResponse(w.br, isHead(req), w.t.Observe != nil, &w.hdr)
	if err != nil {
		w.drop()
		return true, 0, time.Time{}, err
	}
	done = time.Now()
	if w.t.Observe != nil {
		w.t.Observe(w.id, i, status, w.hdr)
	}
	if closeAfter {
		w.drop()
	}
	return true, status, done, nil
}

// complete counts a completed response with the given latency.
func (w *worker) complete(status int, latency time.Duration) {
	w.completed++
	w.statuses[status]++
	w.hist.Record(latency)
}

// run starts fn on every worker, with ctx as the run's context and errors
// counted in [errFrom, errTo), stops them all when ctx ends, and waits for
// them to return.
func run(ctx context.Context, ws []*worker, errFrom, errTo time.Time, fn func(*worker)) {
	for _, w := range ws {
		w.ctx, w.errFrom, w.errTo = ctx, errFrom, errTo
	}
	stopAll := context.AfterFunc(ctx, func() {
		for _, w := range ws {
			w.stop()
		}
	})
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			defer w.drop()
			fn(w)
		})
	}
	wg.Wait()
	stopAll()
}

// collect adds up the workers' counts.
func collect(ws []*worker) Result {
	r := Result{Statuses: make(map[int]uint64), Latency: NewHistogram()}
	for _, w := range ws {
		r.Sent += w.sent
		r.Warmup += w.warmed
		r.Completed += w.completed
		r.Errors += w.errors
		for code, n := range w.statuses {
			if n != 0 {
				r.Statuses[code] += n
			}
		}
		r.Latency.Merge(w.hist)
	}
	return r
}
