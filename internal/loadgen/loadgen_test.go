package loadgen

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var getRequest = []byte("GET /check HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: loadgen\r\n\r\n")

// target returns a Target sending getRequest to the server at url.
func target(url string) Target {
	return Target{
		Addr:    strings.TrimPrefix(url, "http://"),
		Request: func(int, uint64) []byte { return getRequest },
	}
}

func TestClosedLoop(t *testing.T) {
	const every, conns = 5, 4
	var n atomic.Uint64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%every == 0 {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Write([]byte("ok\n"))
	}))
	defer srv.Close()

	res, err := ClosedLoop(context.Background(), target(srv.URL), conns, 50*time.Millisecond, 300*time.Millisecond)
	require.NoError(t, err)
	require.Positive(t, res.Completed)
	assert.Zero(t, res.Errors)
	assert.Equal(t, 300*time.Millisecond, res.Elapsed)
	assert.Equal(t, res.Completed, res.Latency.Count())
	assert.Equal(t, res.Completed, res.Statuses[200]+res.Statuses[429])
	assert.Len(t, res.Statuses, 2)
	assert.InDelta(t, float64(res.Completed)/every, float64(res.Statuses[429]), 2*conns)
	assert.InDelta(t, float64(res.Completed), float64(res.Sent), conns)
	assert.InDelta(t, float64(res.Completed)/0.3, res.Throughput(), 1e-6)
	assert.Positive(t, res.Latency.Quantile(0.5))
	assert.LessOrEqual(t, res.Latency.Quantile(0.99), res.Latency.Max())
}

func TestClosedLoopRequestNumbers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Seq", r.Header.Get("X-Seq"))
	}))
	defer srv.Close()

	reqs := [2][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\nX-Seq: even\r\n\r\n"),
		[]byte("GET / HTTP/1.1\r\nHost: x\r\nX-Seq: odd\r\n\r\n"),
	}
	var mu sync.Mutex
	next := map[int]uint64{}
	var bad atomic.Int64
	tg := Target{
		Addr:    strings.TrimPrefix(srv.URL, "http://"),
		Request: func(_ int, i uint64) []byte { return reqs[i%2] },
		Observe: func(conn int, i uint64, status int, header []byte) {
			mu.Lock()
			if next[conn] != i {
				bad.Add(1)
			}
			next[conn] = i + 1
			mu.Unlock()
			want := "X-Seq: even\r\n"
			if i%2 == 1 {
				want = "X-Seq: odd\r\n"
			}
			if status != 200 || !strings.Contains(string(header), want) {
				bad.Add(1)
			}
		},
	}
	res, err := ClosedLoop(context.Background(), tg, 2, 0, 100*time.Millisecond)
	require.NoError(t, err)
	assert.Positive(t, res.Completed)
	assert.Zero(t, bad.Load())
	assert.Len(t, next, 2)
}

func TestChunkedResponses(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("hello, "))
		w.(http.Flusher).Flush()
		w.Write([]byte("world\n"))
	}))
	defer srv.Close()

	var chunked, other atomic.Uint64
	tg := target(srv.URL)
	tg.Observe = func(_ int, _ uint64, _ int, header []byte) {
		if strings.Contains(string(header), "Transfer-Encoding: chunked\r\n") {
			chunked.Add(1)
		} else {
			other.Add(1)
		}
	}
	res, err := ClosedLoop(context.Background(), tg, 2, 0, 200*time.Millisecond)
	require.NoError(t, err)
	assert.Positive(t, res.Completed)
	assert.Zero(t, res.Errors)
	assert.Equal(t, res.Completed, res.Statuses[200])
	assert.Positive(t, chunked.Load())
	assert.Zero(t, other.Load())
}

func TestConnectionClose(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.Write([]byte("bye\n"))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	res, err := ClosedLoop(context.Background(), target(srv.URL), 2, 0, 200*time.Millisecond)
	require.NoError(t, err)
	assert.Greater(t, res.Completed, uint64(2))
	assert.Zero(t, res.Errors)
	assert.Equal(t, res.Completed, res.Statuses[200])
	assert.GreaterOrEqual(t, conns.Load(), int64(res.Completed))
}

func TestDialErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()

	tg := Target{Addr: addr, Request: func(int, uint64) []byte { return getRequest }}
	start := time.Now()
	res, err := ClosedLoop(context.Background(), tg, 2, 0, 100*time.Millisecond)
	require.NoError(t, err)
	assert.Less(t, time.Since(start), time.Second)
	assert.Zero(t, res.Completed)
	assert.Zero(t, res.Sent)
	// Two connections retrying every 10ms for 100ms.
	assert.GreaterOrEqual(t, res.Errors, uint64(2))
	assert.LessOrEqual(t, res.Errors, uint64(22))
}

// rawServer serves each connection with handle until the test ends.
func rawServer(t *testing.T, handle func(net.Conn, *bufio.Reader)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c, bufio.NewReader(c))
			})
		}
	})
	return ln.Addr().String()
}

// readRequest reads a request without body from br.
func readRequest(br *bufio.Reader) bool {
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return false
		}
		if line == "\r\n" {
			return true
		}
	}
}

func TestMalformedResponses(t *testing.T) {
	var n atomic.Int64
	addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		for readRequest(br) {
			// Every third response is broken; the connection is then
			// abandoned by the client.
			if n.Add(1)%3 == 0 {
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"))
				continue
			}
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
		}
	})
	tg := Target{Addr: addr, Request: func(int, uint64) []byte { return getRequest }}
	res, err := ClosedLoop(context.Background(), tg, 2, 0, 150*time.Millisecond)
	require.NoError(t, err)
	assert.Positive(t, res.Completed)
	assert.Positive(t, res.Errors)
	assert.InDelta(t, float64(res.Completed)/2, float64(res.Errors), float64(res.Completed)/4+4)
	assert.Equal(t, res.Completed, res.Statuses[200])
}

func TestServerClosesMidResponse(t *testing.T) {
	addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if readRequest(br) {
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"))
		}
	})
	tg := Target{Addr: addr, Request: func(int, uint64) []byte { return getRequest }}
	res, err := ClosedLoop(context.Background(), tg, 1, 0, 100*time.Millisecond)
	require.NoError(t, err)
	assert.Zero(t, res.Completed)
	assert.Positive(t, res.Errors)
	// The last request may be cut off by the end of the run.
	assert.InDelta(t, float64(res.Sent), float64(res.Errors), 1)
}

func TestClosedLoopCancel(t *testing.T) {
	// A server that never answers: only cancellation ends the run early.
	addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		readRequest(br)
		br.ReadByte()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := ClosedLoop(ctx, Target{Addr: addr, Request: func(int, uint64) []byte { return getRequest }}, 2, 0, 10*time.Second)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Zero(t, res.Completed)
	assert.Zero(t, res.Errors)
	assert.Equal(t, uint64(2), res.Sent)
	assert.Less(t, res.Elapsed, time.Second)
}

func TestOpenLoopRate(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Write([]byte("ok\n"))
	}))
	defer srv.Close()

	var seen sync.Map
	var dup atomic.Int64
	tg := target(srv.URL)
	tg.Observe = func(_ int, i uint64, _ int, _ []byte) {
		if _, loaded := seen.LoadOrStore(i, true); loaded {
			dup.Add(1)
		}
	}
	res, err := OpenLoop(context.Background(), tg, 500, 4, 100*time.Millisecond, 400*time.Millisecond)
	require.NoError(t, err)
	assert.InDelta(t, 200, float64(res.Completed), 30)
	assert.Equal(t, res.Completed, res.Sent)
	assert.Equal(t, res.Completed, res.Statuses[200])
	assert.Equal(t, res.Completed, res.Latency.Count())
	assert.Zero(t, res.Errors)
	assert.Zero(t, dup.Load())
	// The warm-up's 50 requests are sent but not counted, and say so.
	assert.InDelta(t, 250, float64(n.Load()), 30)
	assert.EqualValues(t, n.Load(), res.Completed+res.Warmup)
	assert.InDelta(t, 500, res.Throughput(), 75)
	assert.GreaterOrEqual(t, res.Elapsed, 400*time.Millisecond)
}

func TestOpenLoopLatencyFromSchedule(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond)
		w.Write([]byte("slow\n"))
	}))
	defer srv.Close()

	// Two connections serve at most 100 requests per second: at 200 per
	// second the queue grows by one request every 10ms, and the last of the
	// 60 requests waits about 300ms for a connection.
	res, err := OpenLoop(context.Background(), target(srv.URL), 200, 2, 0, 300*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, uint64(60), res.Completed)
	assert.Zero(t, res.Errors)
	assert.Greater(t, res.Latency.Quantile(0.99), 150*time.Millisecond)
	assert.Greater(t, res.Latency.Quantile(0.5), 60*time.Millisecond)
	assert.GreaterOrEqual(t, res.Latency.Quantile(0), 20*time.Millisecond)
	assert.Greater(t, res.Elapsed, 500*time.Millisecond)
	assert.Less(t, res.Throughput(), 110.0)

	// At the same rate, a closed loop sees only the service time.
	cl, err := ClosedLoop(context.Background(), target(srv.URL), 2, 0, 200*time.Millisecond)
	require.NoError(t, err)
	assert.Less(t, cl.Latency.Quantile(0.5), 60*time.Millisecond)
}

func TestOpenLoopCancel(t *testing.T) {
	addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		readRequest(br)
		br.ReadByte()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := OpenLoop(ctx, Target{Addr: addr, Request: func(int, uint64) []byte { return getRequest }}, 100, 2, 0, 10*time.Second)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Zero(t, res.Completed)
	assert.Zero(t, res.Errors)
	assert.Equal(t, uint64(2), res.Sent)
}

func TestSchedule(t *testing.T) {
	for _, rate := range []float64{1, 3, 500, 7777.7, 1e6} {
		s := &schedule{interval: 1e9 / rate}
		for _, off := range []time.Duration{0, 1, time.Millisecond, 333 * time.Millisecond, time.Second, 10 * time.Second} {
			k := s.first(off)
			assert.GreaterOrEqual(t, s.at(k), off)
			if k > 0 {
				assert.Less(t, s.at(k-1), off)
			}
		}
	}
	s := &schedule{interval: 1e9 / 500}
	assert.Equal(t, uint64(200), s.first(400*time.Millisecond)-s.first(0))
}

func TestBadArguments(t *testing.T) {
	ctx := context.Background()
	ok := Target{Addr: "127.0.0.1:1", Request: func(int, uint64) []byte { return getRequest }}
	_, err := ClosedLoop(ctx, Target{Addr: "127.0.0.1:1"}, 1, 0, time.Second)
	assert.Error(t, err)
	_, err = ClosedLoop(ctx, Target{Request: ok.Request}, 1, 0, time.Second)
	assert.Error(t, err)
	_, err = ClosedLoop(ctx, ok, 0, 0, time.Second)
	assert.Error(t, err)
	_, err = ClosedLoop(ctx, ok, 1, -1, time.Second)
	assert.Error(t, err)
	_, err = ClosedLoop(ctx, ok, 1, 0, 0)
	assert.Error(t, err)
	_, err = OpenLoop(ctx, ok, 0, 1, 0, time.Second)
	assert.Error(t, err)
	_, err = OpenLoop(ctx, ok, -1, 1, 0, time.Second)
	assert.Error(t, err)
	assert.Zero(t, Result{}.Throughput())
}

// rawEchoServer answers every request with a fixed response, without
// allocating, so that allocations measured in the process are the client's.
func rawEchoServer(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-RateLimit-Remaining: 9\r\nContent-Length: 3\r\n\r\nok\n")
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if len(line) == 2 {
						if _, err := c.Write(resp); err != nil {
							return
						}
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

func TestRoundTripAllocs(t *testing.T) {
	tg := Target{
		Addr:    rawEchoServer(t),
		Request: func(int, uint64) []byte { return getRequest },
		Observe: func(int, uint64, int, []byte) {},
	}
	ws := newWorkers(&tg, 1)
	w := ws[0]
	defer w.drop()
	require.True(t, w.dial())
	var i uint64
	allocs := testing.AllocsPerRun(200, func() {
		i++
		if _, _, _, err := w.roundTrip(tg.Request(0, i), i); err != nil {
			t.Fatal(err)
		}
		w.complete(200, time.Millisecond)
	})
	assert.Zero(t, allocs)
}

func BenchmarkRoundTrip(b *testing.B) {
	tg := target("http://" + rawEchoServer(b))
	ws := newWorkers(&tg, 1)
	w := ws[0]
	defer w.drop()
	require.True(b, w.dial())
	b.ReportAllocs()
	for i := uint64(0); b.Loop(); i++ {
		if _, _, _, err := w.roundTrip(getRequest, i); err != nil {
			b.Fatal(err)
		}
	}
}
