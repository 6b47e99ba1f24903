package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/stack"
	"github.com/tallyhq/tally/internal/testutil"
)

// Durations of a scenario: load before the fault, how long a process stays
// down or frozen, load after it.
const (
	before   = time.Second
	downFor  = 2 * time.Second
	frozeFor = 3 * time.Second
	after    = 1500 * time.Millisecond
	// stallBound is the longest any request may take, whatever fails: far
	// above every budget (redis_budget 100 ms, publish_timeout 500 ms), far
	// below what a request stuck behind a frozen process would wait.
	stallBound = 2 * time.Second
)

// TestFaults runs the scenarios one after the other against one
// deployment, each with an edge and keys of its own (see the package doc,
// and docs/operations.md for what each asserts and what it measured).
func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault suite runs the whole pipeline as processes for about two minutes")
	}
	c := newCluster(t)
	for _, s := range []struct {
		name string
		run  func(*testing.T, *cluster)
	}{
		{"prometheus-scrapes", prometheusScrapes},
		{"primary-killed", primaryKilled},
		{"primary-frozen", primaryFrozen},
		{"replica-frozen", replicaFrozen},
		{"replica-killed", replicaKilled},
		{"nats-killed", natsKilled},
		{"nats-frozen", natsFrozen},
		{"accountant-killed", accountantKilled},
		{"accounting-stream-full", streamFull},
		{"poison-message", poisonMessage},
		{"wrong-type-key", wrongTypeKey},
		{"wrong-type-key-in-use", wrongTypeKeyInUse},
		{"analyst", analyst},
		{"no-identity-written-down", noIdentityWrittenDown},
	} {
		if !t.Run(s.name, func(t *testing.T) { s.run(t, c) }) && c.broken {
			break // the deployment is not fit for the next scenarios
		}
	}
}

// run is one scenario in progress: an edge of its own, load on keys of its
// own.
type run struct {
	c        *cluster
	e        *edge
	l        *load
	deadFrom uint64 // the first dead letter this scenario may have caused
	// acc is the accountant when the run started, and accFrom its metrics.
	acc     *stack.Proc
	accFrom map[string]float64
	// edge is the edge's metrics when the load stopped.
	edge map[string]float64
}

// start starts an edge (mut may change its configuration) and the load,
// and lets the load run for a while before the fault.
func (c *cluster) start(t *testing.T, mut func(*config.File)) *run {
	name := strings.TrimPrefix(t.Name(), "TestFaults/")
	r := &run{c: c, deadFrom: c.stream(t, c.streams.DeadLetters.Name).LastSeq + 1, acc: c.acc,
		accFrom: metrics(t, c.acc.AdminAddr)}
	r.e = c.startEdge(t, "edge-"+name, mut)
	r.l = startLoad([]string{r.e.proxy}, c.targets(name), loadClients, loadRate)
	t.Cleanup(func() { // when the scenario failed before the end
		if r.l.ended.IsZero() {
			r.l.finish()
		}
		r.e.Stop()
	})
	time.Sleep(before)
	return r
}

// fault runs f as the fault: latencies from then on count as "during", and
// after it as "after", for a while.
func (r *run) fault(f func()) {
	r.l.enter(phaseDuring)
	f()
	r.l.enter(phaseAfter)
	time.Sleep(after)
}

// finish stops the load, reads the edge's metrics and logs what both
// measured.
func (r *run) finish(t *testing.T) {
	r.l.finish()
	r.edge = metrics(t, r.e.AdminAddr)
	m := r.edge
	t.Logf("%s\n  edge: %v reservations failed; admitted without one: %v borrowed, %v failed open; "+
		"accounting events: %v to JetStream, %v applied directly; %v rechecks of full windows", r.l.summary(),
		m["tally_edge_reservation_errors_total"], m[`tally_edge_decisions_total{path="borrow",result="allowed"}`],
		m[`tally_edge_decisions_total{path="fail-open",result="allowed"}`],
		m[`tally_edge_accounting_events_total{outcome="published"}`], r.directly(), m["tally_edge_rechecks_total"])
}

// directly is how many accounting events the edge applied on the primaries
// itself (JetStream did not take them in time).
func (r *run) directly() float64 {
	return r.edge[`tally_edge_accounting_events_total{outcome="applied_directly"}`]
}

// accountant returns what the accountant counted during the run, by metric
// name (a new accountant counts from zero).
func (r *run) accountant(t *testing.T) func(name string) float64 {
	now := metrics(t, r.c.acc.AdminAddr)
	return func(name string) float64 {
		if r.c.acc == r.acc {
			return now[name] - r.accFrom[name]
		}
		return now[name]
	}
}

// verify settles the pipeline, then checks what every scenario must hold:
// no request failed or stalled; every key's window holds exactly what its
// clients were allowed less what was refunded; windows with a small limit
// let no more through than it, or, when the edge admitted requests without
// a reservation (a primary unreachable, on_redis_error: allow), no more
// than the accountant counted as over the limit, itself at most those
// admissions (docs/accuracy.md; the limited keys cost 1). Keys in skip are
// not read (their window is broken on purpose). It returns the dead letters
// the scenario caused.
func (r *run) verify(t *testing.T, skip ...*target) []*jetstream.RawStreamMsg {
	c, l := r.c, r.l
	c.settle(t, r.e)
	ok, notModified, _, failed := l.totals()
	require.Positive(t, ok)
	require.Positive(t, notModified)
	require.Zero(t, l.errN, "transport errors, e.g. %v", l.errs)
	require.Zero(t, failed, "answers other than 200, 304 and 429 (on_redis_error: allow never answers 503)")
	require.Less(t, l.maxLatency(), stallBound, "a request stalled")
	require.Zero(t, r.edge[`tally_edge_accounting_events_total{outcome="dropped"}`], "accounting events the edge dropped")

	var wrong []string
	var over int64
	for _, tg := range l.targets {
		if slices.Contains(skip, tg) {
			continue
		}
		used, want := c.usage(t, tg), tg.charged()
		if used != want {
			wrong = append(wrong, fmt.Sprintf("%s (%s, cost %d): window holds %d, clients were allowed %d net of refunds "+
				"(200: %d, 304: %d, 429: %d)", tg.identity, c.shardOf(tg), tg.cost, used, want,
				tg.ok.Load(), tg.notModified.Load(), tg.denied.Load()))
		}
		over += max(0, want-tg.policy.Limit)
	}
	acc := r.accountant(t)
	counted := acc("tally_accountant_over_limit_units_total")
	unreserved := r.edge[`tally_edge_decisions_total{path="borrow",result="allowed"}`] +
		r.edge[`tally_edge_decisions_total{path="fail-open",result="allowed"}`]
	t.Logf("accountant: %v runs tried again, %v purges held back (no replica confirmed), %v units charged over a limit; "+
		"%d units allowed over a limit, %v admissions without a reservation", acc("tally_accountant_retries_total"),
		acc("tally_accountant_unconfirmed_total"), counted, over, unreserved)
	require.Empty(t, wrong, "windows that do not hold what their clients were allowed net of refunds")
	require.LessOrEqual(t, float64(over), counted, "units allowed beyond a limit that the accountant did not count")
	require.LessOrEqual(t, counted, unreserved, "over the limit, beyond the admissions made without a reservation")
	return c.deadLetters(t, r.deadFrom)
}

// freeze stops p (SIGSTOP) for d, then lets it go on.
func freeze(t *testing.T, p *stack.Proc, d time.Duration) {
	require.NoError(t, p.Pause())
	defer func() { require.NoError(t, p.Resume()) }()
	time.Sleep(d)
}

// A shard's primary dies (SIGKILL) and comes back 2 s later from its
// append-only file. Requests with credit go on; the others wait at most
// redis_budget, then are decided from what the edge knows and charged by
// events that apply once the primary is back.
func primaryKilled(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	r.fault(func() { c.killAndRestart(t, c.primary(0), downFor) })
	r.finish(t)
	require.Positive(t, r.edge["tally_edge_reservation_errors_total"])
	require.Empty(t, r.verify(t), "dead letters")
}

// A shard's primary freezes (SIGSTOP) for 3 s: its connections stay open
// and nothing answers, the worst case for timeouts.
//
// A reservation already sent when the primary froze times out at the edge,
// which then decides without it, and Redis makes it when it wakes: the
// edge learns so from the window's count of what was reserved for it, and
// takes those units back (tally_edge_recovered_units_total). The
// accountant's script calls time out too and are sent again; the decisions
// stream still counts every window as the primary holds it (its records say
// what a lost call did, not that its retry found the events applied).
func primaryFrozen(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	r.fault(func() { freeze(t, c.primary(0), frozeFor) })
	r.finish(t)
	require.Positive(t, r.edge["tally_edge_reservation_errors_total"])
	t.Logf("units of lost reservations taken back: %v", r.edge["tally_edge_recovered_units_total"])
	require.Empty(t, r.verify(t), "dead letters")
	analystAgrees(t, c, r.l.targets)
}

// A replica freezes for 3 s. Replicas are read only to recheck full windows
// (the tight keys') and to confirm what the accountant applied before it
// deletes it from the stream: requests must not notice.
func replicaFrozen(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	r.fault(func() { freeze(t, c.replica(0), frozeFor) })
	r.finish(t)
	require.Empty(t, r.verify(t), "dead letters")
}

// A replica dies and comes back 2 s later (empty: it resynchronises). The
// accountant deletes nothing from the stream meanwhile that no replica
// confirmed.
func replicaKilled(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	r.fault(func() { c.killAndRestart(t, c.replica(0), downFor) })
	r.finish(t)
	require.Empty(t, r.verify(t), "dead letters")
}

// NATS dies and comes back 2 s later on the same port and store. The edge
// applies its accounting events on the primaries meanwhile.
func natsKilled(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	r.fault(func() { c.killAndRestart(t, c.nats, downFor) })
	r.finish(t)
	require.Positive(t, r.directly())
	require.Empty(t, r.verify(t), "dead letters")
}

// NATS freezes for 3 s: publishes are not acknowledged, and the edge
// applies the batches itself after publish_timeout; the copies JetStream
// stores when it wakes are duplicates.
func natsFrozen(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	r.fault(func() { freeze(t, c.nats, frozeFor) })
	r.finish(t)
	require.Positive(t, r.directly())
	require.Empty(t, r.verify(t), "dead letters")
}

// The accountant dies; a new one starts 1 s later and takes the shards
// over when the dead one's leases expire. Events wait in the stream.
func accountantKilled(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	r.fault(func() {
		c.stopAccountant(true)
		time.Sleep(time.Second)
		c.startAccountant(t)
	})
	r.finish(t)
	require.Empty(t, r.verify(t), "dead letters")
}

// No accountant reads the accounting stream, which is small: it fills,
// JetStream refuses the edge's publishes, and the edge applies its events
// on the primaries itself.
func streamFull(t *testing.T, c *cluster) {
	const small = 16 << 10
	r := c.start(t, func(f *config.File) { f.NATS.Streams.Accounting.MaxBytes = small })
	testutil.WaitForWithin(t, "the edge to shrink the accounting stream", 10*time.Second, func() bool {
		s, err := c.js.Stream(context.Background(), c.streams.Accounting.Name)
		return err == nil && s.CachedInfo().Config.MaxBytes == small
	})
	var full jetstream.StreamState
	r.fault(func() {
		c.stopAccountant(false)
		testutil.WaitForWithin(t, "a full stream", 20*time.Second, func() bool {
			return c.stream(t, c.streams.Accounting.Name).Bytes > small*3/4
		})
		time.Sleep(downFor)
		full = c.stream(t, c.streams.Accounting.Name)
	})
	r.finish(t)
	t.Logf("the stream held %d messages, %d bytes of %d", full.Msgs, full.Bytes, small)
	require.Positive(t, r.directly())
	// The accountant's configuration gives the stream its size back.
	c.startAccountant(t)
	require.Empty(t, r.verify(t), "dead letters")
}

// A message on the accounting subject that is not an event at all goes to
// the dead letters with its reason, and the shard applies the rest.
func poisonMessage(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	body := []byte("this is not an accounting event")
	subject := events.AccountingSubject(c.streams.Accounting.SubjectPrefix, c.store.ShardName(0), "fault-suite")
	var seq uint64
	r.fault(func() {
		ack, err := c.js.Publish(context.Background(), subject, body)
		require.NoError(t, err)
		seq = ack.Sequence
	})
	r.finish(t)
	dead := r.verify(t)
	require.Len(t, dead, 1, "dead letters")
	h := dead[0].Header
	require.Equal(t, body, dead[0].Data)
	require.Equal(t, subject, h.Get(accountant.HeaderDeadSubject))
	require.Equal(t, fmt.Sprint(seq), h.Get(accountant.HeaderDeadSeq))
	require.Contains(t, h.Get(accountant.HeaderDeadReason), "invalid event")
	t.Logf("dead letter: %s", h.Get(accountant.HeaderDeadReason))
}

// A window key that holds no window (an operator's mistake, a stray SET),
// on a key nobody uses any more: applying the event that gives the edge's
// credit in it back fails every time (an unreadable window), so after
// accountant.max_attempts the message is dead-lettered, and the shard
// applies the rest.
func wrongTypeKey(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	broken := r.pick(t, far, 0)
	r.fault(func() {
		// With no more requests, the edge gives the credit back after
		// idle_release.
		broken.retired.Store(true)
		c.breakWindow(t, broken)
		testutil.WaitForWithin(t, "a dead letter", 20*time.Second, func() bool {
			return c.stream(t, c.streams.DeadLetters.Name).LastSeq >= r.deadFrom
		})
	})
	r.finish(t)
	dead := r.verify(t, broken)
	require.Len(t, dead, 1, "dead letters")
	reason := dead[0].Header.Get(accountant.HeaderDeadReason)
	require.Contains(t, reason, "unreadable window")
	t.Logf("dead letter: %s", reason)
	r.requireOnly(t, dead, broken)
}

// The same on a key in use, in mode exact (every request reserves): its
// reservations fail, and the edge admits its requests without one, charged
// by events that can never be applied. Those events, and only those, end
// in the dead letters, and the shard's other events do not wait for them
// longer than the suite waits for the stream to empty.
func wrongTypeKeyInUse(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	broken := r.pick(t, exact, 0)
	r.fault(func() {
		c.breakWindow(t, broken)
		time.Sleep(downFor)
		broken.retired.Store(true)
	})
	r.finish(t)
	dead := r.verify(t, broken)
	require.NotEmpty(t, dead, "dead letters")
	r.requireOnly(t, dead, broken)
}

// pick returns the first of the run's targets under policy p on shard i.
func (r *run) pick(t *testing.T, p config.Policy, i int) *target {
	for _, tg := range r.l.targets {
		if tg.policy.Name == p.Name && r.c.store.ShardOf(tg.key) == i {
			return tg
		}
	}
	t.Fatalf("no key of policy %s on shard %d", p.Name, i)
	return nil
}

// breakWindow makes tg's window key a string that is no window: every
// script on it fails (lua/window.lua's read), and a SET ... NX finds it.
func (c *cluster) breakWindow(t *testing.T, tg *target) {
	rdb := c.rdb[c.store.ShardOf(tg.key)]
	require.NoError(t, rdb.Set(context.Background(), tg.key.String(), "not a window", 0).Err())
}

// requireOnly checks that the dead letters hold events of tg's window only.
func (r *run) requireOnly(t *testing.T, dead []*jetstream.RawStreamMsg, tg *target) {
	shard := r.c.shardOf(tg)
	for _, m := range dead {
		producer := events.ProducerOfSubject(r.c.streams.Accounting.SubjectPrefix, shard, m.Header.Get(accountant.HeaderDeadSubject))
		evs, err := events.DecodeAccounting(shard, producer, m.Header, m.Data)
		require.NoError(t, err)
		for _, e := range evs {
			require.Equal(t, tg.key.Digest().String(), e.Key, "an event of another window was dead-lettered with the broken one")
		}
	}
}
