package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
)

// Reservations of many keys share round trips. Each shard has a queue of
// takes and two senders; a sender takes every take waiting (up to
// maxBatch) and sends them in one pipeline: one write and one read for all
// of them, where one call each would cost a round trip, a pooled connection
// and two system calls apiece. Nothing waits to fill a batch: a take that
// finds a sender idle goes at once, alone, on its caller's context (its
// deadline and its trace); batches form only while senders are busy, which
// is when they pay.
//
// A take whose caller stopped waiting before it was sent is not sent. One
// sent and then given up on may still be made, as with a single call: the
// holder learns so from its next take (limiter.Grant.Mine).

const (
	// takeSenders per shard: round trips in flight at once. Two keep a
	// lone take from waiting behind a batch; more leave each sender too
	// little to batch (make bench over 1M keys: 1, 2 and 4 senders within
	// noise of each other in throughput, 2 with the lowest open-loop p99).
	takeSenders = 2
	maxBatch    = 128 // takes per pipeline
	queueLen    = 4096
)

// batchTimeout bounds a pipeline of several callers' takes, which runs on
// no caller's context.
const batchTimeout = 2 * time.Second

type takeCall struct {
	ctx context.Context
	key string // the window's
	// req is the take this is a call of; compact, whether the shard's
	// windows could be compact when the call was made. The script's
	// arguments are built from them when it runs (script).
	req     *takeReq
	compact bool
	// open, when set, is a compact window to open first with one SET ... NX
	// (TakeArgs.Fresh): the whole take when no key is stored; the script
	// runs only when one is.
	open *opening
	// short, when set, is a lean script sent first: lua/own.lua in a
	// window still the holder's own compact one (TakeArgs.Own),
	// lua/slide.lua in a sliding window's compact sub-windows, or
	// lua/bucket.lua in a token bucket quiet near now (TakeArgs.Fresh). It
	// is the whole take unless it answers that take.lua is the call to
	// send.
	short *shortCall
	v     []int64
	err   error
	// done is closed when v and err are in; async, when set, is called
	// with them instead (Store.TakeAsync), on the sender.
	done  chan struct{}
	async func([]int64, error)
}

// answer hands c's reply to whoever waits for it.
func (c *takeCall) answer() {
	if c.async != nil {
		c.async(c.v, c.err)
		return
	}
	close(c.done)
}

// opening is a window a take opens with one SET ... NX: its compact value
// (lua/window.lua), its bounds, when its key expires, the units reserved.
type opening struct {
	value                 []byte
	start, reset, expires time.Time
	want                  int64
}

// reply is take.lua's reply for the window the SET opened.
func (o *opening) reply() []int64 {
	return []int64{o.want, o.want, o.reset.UnixMilli(), o.start.UnixMilli(), 1, 0, o.want, -1, 1}
}

// shortCall is a lean script of a take (own.lua, slide.lua, bucket.lua):
// its keys and arguments, and, when set, then builds the lean script to
// send when this one hands the take on, before take.lua (slide.lua with
// every key after slide.lua with its span record alone: the keys of the
// spans are built only then).
type shortCall struct {
	script *redis.Script
	keys   []string
	args   []any
	then   func() *shortCall
}

// tried takes in the reply to c's short script and reports whether it was
// the whole take: false when the window is something else by now (the
// script runs then), and after a NOSCRIPT (take.lua, which the node has,
// runs instead, and the short script is loaded for the next ones); a
// failed call is c's error.
func (c *takeCall) tried(ctx context.Context, q *takeQueue, cmd *redis.Cmd) bool {
	v, err := cmd.Int64Slice()
	switch {
	case err == nil && len(v) == 1 && v[0] == -1:
		q.s.shortHanded.Add(1)
		if then := c.short.then; then != nil {
			c.short = then()
		} else {
			c.short = nil
		}
		return false
	case noScript(err):
		_ = q.s.reload(ctx, q.c, c.short.script)
		c.short = nil
		return false
	case err == nil:
		q.s.shortMade.Add(1)
	}
	c.v, c.err = v, err
	return true
}

// set is c's SET ... NX of the window it opens, on p.
func (c *takeCall) set(ctx context.Context, p redis.Cmdable) *redis.StatusCmd {
	return p.SetArgs(ctx, c.key, c.open.value, redis.SetArgs{Mode: "NX", ExpireAt: c.open.expires})
}

// opened takes in the reply to c's SET ... NX and reports whether it was
// the whole take: false when a key was there (the script runs then); a
// failed SET is c's error.
func (c *takeCall) opened(ok string, err error) bool {
	switch {
	case err == nil && ok == "OK":
		c.v, c.err = c.open.reply(), nil
		return true
	case err == nil || errors.Is(err, redis.Nil):
		return false
	}
	c.v, c.err = nil, err
	return true
}

type takeQueue struct {
	s     *Store
	c     *redis.Client
	calls chan *takeCall
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

func newTakeQueue(s *Store, c *redis.Client) *takeQueue {
	q := &takeQueue{s: s, c: c, calls: make(chan *takeCall, queueLen), stop: make(chan struct{})}
	for range takeSenders {
		q.wg.Go(q.send)
	}
	return q
}

var errStoreClosed = errors.New("limiter: the store is closed")

// queue hands c to the senders without waiting for its answer (c.async
// gets it). It does not block its caller: when the queue is full, a
// goroutine waits for room.
func (q *takeQueue) queue(c *takeCall) {
	select {
	case <-q.stop:
		c.v, c.err = nil, errStoreClosed
		go c.answer() // never on the caller's goroutine (Store.TakeAsync)
		return
	default:
	}
	select {
	case q.calls <- c:
		return
	default:
	}
	go func() {
		select {
		case q.calls <- c:
		case <-q.stop:
			c.v, c.err = nil, errStoreClosed
			c.answer()
		}
	}()
}

// do runs c through the queue and waits for its answer or ctx.
func (q *takeQueue) do(ctx context.Context, c *takeCall) ([]int64, error) {
	c.done = make(chan struct{})
	select {
	case q.calls <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-q.stop:
		return nil, errStoreClosed
	}
	select {
	case <-c.done:
		return c.v, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-q.stop:
		return nil, errStoreClosed
	}
}

// close stops the senders once they have sent what they hold; Store.Close
// may be called more than once.
func (q *takeQueue) close() {
	q.once.Do(func() { close(q.stop) })
	q.wg.Wait()
	// What was queued and not sent is answered: the store is closed.
	for {
		select {
		case c := <-q.calls:
			c.v, c.err = nil, errStoreClosed
			c.answer()
		default:
			return
		}
	}
}

func (q *takeQueue) send() {
	batch := make([]*takeCall, 0, maxBatch)
	for {
		var first *takeCall
		select {
		case first = <-q.calls:
		case <-q.stop:
			return
		}
		batch = append(batch[:0], first)
	fill:
		for len(batch) < maxBatch {
			select {
			case c := <-q.calls:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		// Callers that stopped waiting are answered now, unsent.
		live := batch[:0]
		for _, c := range batch {
			if err := c.ctx.Err(); err != nil {
				c.err = err
				c.answer()
				continue
			}
			live = append(live, c)
		}
		switch len(live) {
		case 0:
		case 1:
			c := live[0] // on its caller's context
			switch {
			case c.open != nil && c.opened(c.set(c.ctx, q.c).Result()):
			case c.triedShort(q):
			default:
				keys, args := c.script()
				c.v, c.err = q.s.run(c.ctx, q.c, takeScript, false, keys, args...).Int64Slice()
			}
			c.answer()
		default:
			q.pipeline(live)
		}
	}
}

// shortCmd is c's short script, on p.
func (c *takeCall) shortCmd(ctx context.Context, p redis.Cmdable) *redis.Cmd {
	return p.EvalSha(ctx, c.short.script.Hash(), c.short.keys, c.short.args...)
}

// triedShort sends c's short scripts in turn, alone on q's client, and
// reports whether one was the whole take.
func (c *takeCall) triedShort(q *takeQueue) bool {
	for c.short != nil {
		if c.tried(c.ctx, q, c.shortCmd(c.ctx, q.c)) {
			return true
		}
	}
	return false
}

// script is lua/take.lua's keys and arguments for c.
func (c *takeCall) script() ([]string, []any) { return c.req.scriptArgs(c.key, c.compact) }

// pipeline sends calls in one round trip: the SETs of the windows they
// open, the short scripts of those that have one (own.lua, slide.lua,
// bucket.lua), and the scripts of the others; then, in a second, the
// scripts of those whose SET found a key or whose window was something
// else. The calls the node
// answers NOSCRIPT (its script cache emptied) are sent again once the
// script is loaded.
func (q *takeQueue) pipeline(calls []*takeCall) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	// The pipeline's span, if any, joins the first caller's trace.
	ctx = trace.ContextWithSpan(ctx, trace.SpanFromContext(calls[0].ctx))
	scripts := q.exec(ctx, calls, true)
	// Those handed on to another lean script go once more; then take.lua.
	var lean, rest []*takeCall
	for _, c := range scripts {
		if c.short != nil {
			lean = append(lean, c)
		} else {
			rest = append(rest, c)
		}
	}
	if len(lean) > 0 {
		rest = append(rest, q.exec(ctx, lean, true)...)
	}
	if len(rest) > 0 {
		q.exec(ctx, rest, false)
	}
	var again []*takeCall
	for _, c := range calls {
		if noScript(c.err) {
			again = append(again, c)
		}
	}
	if len(again) > 0 && q.s.reload(ctx, q.c, takeScript) == nil {
		q.exec(ctx, again, false)
	}
	for _, c := range calls {
		c.answer()
	}
}

// exec sends calls in one pipeline and takes in their answers: with first,
// a call that opens a window sends its SET ... NX, and one with a short
// script sends that script; either is returned when it was not the whole take,
// for its script to run.
func (q *takeQueue) exec(ctx context.Context, calls []*takeCall, first bool) (scripts []*takeCall) {
	pipe := q.c.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	sets := make([]*redis.StatusCmd, len(calls))
	for i, c := range calls {
		switch {
		case first && c.open != nil:
			sets[i] = c.set(ctx, pipe)
		case first && c.short != nil:
			cmds[i] = c.shortCmd(ctx, pipe)
		default:
			keys, args := c.script()
			cmds[i] = pipe.EvalSha(ctx, takeScript.Hash(), keys, args...)
		}
	}
	_, _ = pipe.Exec(ctx)
	for i, c := range calls {
		var whole bool
		switch {
		case sets[i] != nil:
			whole = c.opened(sets[i].Result())
		case first && c.short != nil:
			whole = c.tried(ctx, q, cmds[i])
		default:
			c.v, c.err = cmds[i].Int64Slice()
			whole = true
		}
		if !whole {
			scripts = append(scripts, c)
		}
	}
	return scripts
}
