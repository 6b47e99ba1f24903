package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/setting"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/lua"
)

// ErrNoReplica is returned by Check when every replica of the key's shard
// is down and the read policy is shard.ReadFail.
var ErrNoReplica = errors.New("redisstore: no replica up")

var (
	checkScript  = redis.NewScript(lua.Check)
	takeScript   = redis.NewScript(lua.Take)
	ownScript    = redis.NewScript(lua.Own)
	slideScript  = redis.NewScript(lua.Slide)
	bucketScript = redis.NewScript(lua.Bucket)
	applyScript  = redis.NewScript(lua.Apply)
	leaseScript  = redis.NewScript(lua.Lease)
)

// Options configure a Store. Zero values take the defaults stated.
type Options struct {
	// Clock supplies now for every script call. Default limiter.SystemClock.
	Clock limiter.Clock
	// Grace is how long a window's key outlives its reset (garbage collection
	// only), and how old an event may be and still open a window on an empty
	// key. It must exceed the clock difference between Tally and Redis.
	// Default 60s; minimum 1s.
	Grace time.Duration
	// SkewTolerance lets an event that started up to this long before its
	// window's start count in that window: edge clocks differ, and two edges
	// can race to open one window. Default 2s; negative means 0.
	SkewTolerance time.Duration
	// ReadPolicy says what Check does when every replica of a shard is down.
	// Default shard.ReadPrimary. A shard with no replicas always reads its
	// primary.
	ReadPolicy shard.ReadPolicy
	// ReplicaCooldown is how long a failed replica stays out of rotation.
	// Default shard.DefaultCooldown.
	ReplicaCooldown time.Duration
	// DialTimeout, ReadTimeout and WriteTimeout bound each Redis round trip.
	// Default 500ms each. Context deadlines are honoured as well.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	// PoolSize is the connection pool size per node; 0 means go-redis's
	// default (10 per GOMAXPROCS).
	PoolSize int
	// MaxRetries is how often go-redis retries a read on a replica after a
	// connection error. Default 1; -1 disables retries. Calls on primaries
	// are never retried by go-redis: a reservation that is retried could be
	// granted twice, and Apply's callers retry whole runs themselves.
	MaxRetries int
	// ProducerTTL is how long a primary remembers what it applied of a
	// producer after its last event. It must exceed the longest an event can
	// wait in the accounting stream. Default 25h.
	ProducerTTL time.Duration
	// WaitReplicas is how many replicas ConfirmApplied waits for, so that an
	// accountant deletes applied events from the stream only once a
	// failover can no longer lose them. Default (0): 1 when the shard has replicas; at most the
	// shard's replicas; -1 never waits.
	WaitReplicas int
	// WaitTimeout bounds that wait. Default 100ms.
	WaitTimeout time.Duration
	// ReseedFor is how long, at least, a shard whose primary changed takes
	// no reservation and no write while every process re-asserts what it
	// holds in its windows (reseed.go): long enough for every process to
	// learn of the change (EpochCheck, a new connection). Default 1s; 100ms
	// to 10m.
	ReseedFor time.Duration
	// EpochCheck is how often each primary is asked whether it changed, for
	// the processes whose connections do not break when it does (an idle
	// edge with credit in hand). Default 250ms; 10ms to 1m.
	EpochCheck time.Duration
	// Log is where the store says what an operator should know (reseeds);
	// default: nowhere.
	Log Log
	// TLS, when set, is used for every connection to every node (CA,
	// client certificate, server name).
	TLS *tls.Config
	// ScriptEvents is the most events Apply sends in one script call: a
	// script holds its Redis node while it runs, and reservations on the
	// request path wait behind it. Default 128 (a couple of milliseconds).
	ScriptEvents int
	// Placement names the shards keys are placed on (default: every
	// shard); a shard not named is reachable for what it still holds.
	// PreviousPlacement, while shards are added or removed, is the
	// placement before: a key whose owner changed keeps a live window on
	// its previous owner until that window resets, and then opens its
	// windows on its new owner (docs/operations.md, Resharding).
	Placement, PreviousPlacement []string
}

// ErrInvalidOptions is wrapped by Options.Validate's errors.
var ErrInvalidOptions = errors.New("redisstore: invalid options")

// WithDefaults is o with its zero values replaced by the defaults; it
// changes nothing else.
func (o Options) WithDefaults() Options {
	if o.Clock == nil {
		o.Clock = limiter.SystemClock{}
	}
	if o.Grace == 0 {
		o.Grace = 60 * time.Second
	}
	if o.SkewTolerance == 0 {
		o.SkewTolerance = 2 * time.Second
	}
	for _, d := range []*time.Duration{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout} {
		if *d == 0 {
			*d = 500 * time.Millisecond
		}
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = 1
	}
	if o.ProducerTTL == 0 {
		o.ProducerTTL = 25 * time.Hour
	}
	if o.WaitTimeout == 0 {
		o.WaitTimeout = 100 * time.Millisecond
	}
	if o.ReseedFor == 0 {
		o.ReseedFor = time.Second
	}
	if o.EpochCheck == 0 {
		o.EpochCheck = 250 * time.Millisecond
	}
	if o.ScriptEvents == 0 {
		o.ScriptEvents = 128
	}
	return o
}

// Validate refuses, as a *setting.Error naming the field, every option a
// store cannot work with; zero values stand for the defaults.
func (o Options) Validate() error {
	bad := func(field, format string, args ...any) error {
		return setting.Errorf(ErrInvalidOptions, field, format, args...)
	}
	d := o.WithDefaults()
	switch {
	case d.Grace < time.Second || d.Grace > 24*time.Hour:
		return bad("grace", "%v: want 1s to 24h", d.Grace)
	case d.SkewTolerance < 0 || d.SkewTolerance > time.Minute:
		return bad("skew_tolerance", "%v: want 0 to 1m", d.SkewTolerance)
	case d.ReadPolicy.Validate() != nil:
		return bad("read_policy", "%q: want primary or fail", d.ReadPolicy)
	case d.DialTimeout < 0 || d.DialTimeout > time.Minute:
		return bad("dial_timeout", "%v: want a duration up to 1m (0: the default)", d.DialTimeout)
	case d.ReadTimeout < 0 || d.ReadTimeout > time.Minute:
		return bad("read_timeout", "%v: want a duration up to 1m (0: the default)", d.ReadTimeout)
	case d.WriteTimeout < 0 || d.WriteTimeout > time.Minute:
		return bad("write_timeout", "%v: want a duration up to 1m (0: the default)", d.WriteTimeout)
	case d.MaxRetries < -1:
		return bad("max_retries", "%d: want -1 (none) or more", d.MaxRetries)
	case d.PoolSize < 0:
		return bad("pool_size", "%d: want a positive size (0: go-redis's default)", d.PoolSize)
	case d.ProducerTTL < time.Second:
		return bad("producer_ttl", "%v: want at least 1s", d.ProducerTTL)
	case d.WaitReplicas < -1:
		return bad("wait_replicas", "%d: want -1 (never), 0 (default) or a number of replicas", d.WaitReplicas)
	case d.WaitTimeout < 0 || d.WaitTimeout > time.Minute:
		return bad("wait_timeout", "%v: want a duration up to 1m (0: the default)", d.WaitTimeout)
	case d.ReseedFor < 100*time.Millisecond || d.ReseedFor > maxReseedFor:
		return bad("reseed_for", "%v: want 100ms to 10m (0: the default)", d.ReseedFor)
	case d.EpochCheck < 10*time.Millisecond || d.EpochCheck > time.Minute:
		return bad("epoch_check", "%v: want 10ms to 1m (0: the default)", d.EpochCheck)
	case d.ScriptEvents < 0 || d.ScriptEvents > limiter.MaxApply:
		return bad("script_events", "%d: want 1 to %d (0: the default)", d.ScriptEvents, limiter.MaxApply)
	}
	return nil
}

// Store runs the window scripts on the shards: checks on replicas, opens,
// charges and refunds on primaries. It is safe for concurrent use.
type Store struct {
	opts   Options
	keys   *limiter.KeySpace
	shards []*shardNodes
	byName map[string]int
	// m places keys (placed: its indexes into shards); prev, while keys
	// move, is the placement before (nil: none).
	m, prev           *shard.Map
	placed, prevPlace []int
	producers         sync.Map // producer id → its key (string)
	reloads           atomic.Uint64
	// The short scripts' calls (own.lua, slide.lua, bucket.lua): takes they
	// made, and those they handed on to take.lua (ShortTakes).
	shortMade, shortHanded atomic.Uint64

	// Reseeds (reseed.go): what a reseed re-asserts, and its counters.
	reseeder                                                     atomic.Pointer[Reseeder]
	reseeds, late, claims, opened, conflicts, added, checkErrors atomic.Uint64
	stop                                                         chan struct{}
	closed                                                       sync.Once
	wg                                                           sync.WaitGroup
}

type shardNodes struct {
	name     string
	primary  *redis.Client
	replicas []*redis.Client
	health   *shard.Replicas
	wait     int // replicas ConfirmApplied waits for
	takes    *takeQueue
	failover bool // Sentinel promotes a replica when the primary fails
	// reseed is the shard's reseed state (reseed.go).
	reseed reseeding
	// compact: the shard's windows may be compact (its format record says
	// so, read with every epoch check and probe; lua/window.lua).
	compact atomic.Bool
	// spans is the shard's format level when its format record says that
	// every process keeps sliding windows' span records true (lua/slide.lua
	// reads and writes them then), else nil; read as compact is.
	spans atomic.Pointer[string]
}

// level is lua/slide.lua's ARGV[10]: the shard's format level, or "" while
// span records are not to be trusted.
func (n *shardNodes) level() string {
	if p := n.spans.Load(); p != nil {
		return *p
	}
	return ""
}

// Log is where a store says what an operator should know.
type Log interface {
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
	Error(msg string, args ...any)
}

type discard struct{}

func (discard) Info(string, ...any)  {}
func (discard) Warn(string, ...any)  {}
func (discard) Error(string, ...any) {}

func (s *Store) log() Log {
	if s.opts.Log == nil {
		return discard{}
	}
	return s.opts.Log
}

// NewStore connects (lazily) to every node of every shard; keys names the
// producer and lease keys (window keys come with each call). Call Close when
// done.
func NewStore(shards []shard.Config, keys *limiter.KeySpace, opts Options) (*Store, error) {
	if keys == nil {
		return nil, fmt.Errorf("%w: no key space", limiter.ErrInvalidArgument)
	}
	if err := shard.Validate(shards); err != nil {
		return nil, err
	}
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Store{opts: opts, keys: keys, byName: make(map[string]int, len(shards)), stop: make(chan struct{})}
	for i, sc := range shards {
		s.byName[sc.Name] = i
	}
	var err error
	if s.m, s.placed, err = s.placement("placement", opts.Placement, true); err != nil {
		return nil, err
	}
	if s.prev, s.prevPlace, err = s.placement("previous_placement", opts.PreviousPlacement, false); err != nil {
		return nil, err
	}
	for i, sc := range shards {
		n := &shardNodes{name: sc.Name, wait: opts.WaitReplicas, failover: sc.Failover()}
		replicas := len(sc.Replicas)
		if sc.Failover() {
			// The sentinels name the primary and the replicas (reads go to
			// one of them through one client); a failover moves both.
			po := opts.failover(sc, false)
			po.OnConnect = s.onConnect(i)
			n.primary = redis.NewFailoverClient(po)
			n.replicas = []*redis.Client{redis.NewFailoverClient(opts.failover(sc, true))}
			replicas = max(1, n.wait)
		} else {
			po := opts.client(sc.Primary, -1)
			po.OnConnect = s.onConnect(i)
			n.primary = redis.NewClient(po)
			for _, r := range sc.Replicas {
				n.replicas = append(n.replicas, redis.NewClient(opts.client(r, opts.MaxRetries)))
			}
		}
		n.health = shard.NewReplicas(len(n.replicas), opts.ReplicaCooldown)
		switch {
		case n.wait < 0:
			n.wait = 0
		case n.wait == 0:
			n.wait = min(1, replicas)
		default:
			n.wait = min(n.wait, replicas)
		}
		n.takes = newTakeQueue(s, n.primary)
		s.shards = append(s.shards, n)
	}
	s.wg.Add(1)
	go s.watch()
	return s, nil
}

// placement is the map over names (every shard when names is empty and
// all is set; nil otherwise) and its indexes into s.shards.
func (s *Store) placement(field string, names []string, all bool) (*shard.Map, []int, error) {
	if len(names) == 0 {
		if !all {
			return nil, nil, nil
		}
		names = make([]string, len(s.byName))
		for name, i := range s.byName {
			names[i] = name
		}
	}
	idx := make([]int, len(names))
	seen := map[string]bool{}
	for j, name := range names {
		i, ok := s.byName[name]
		if !ok || seen[name] {
			return nil, nil, setting.Errorf(ErrInvalidOptions, field, "%q: want names of configured shards, each once", name)
		}
		seen[name], idx[j] = true, i
	}
	return shard.NewMap(names), idx, nil
}

func (o *Options) client(n shard.Node, retries int) *redis.Options {
	return &redis.Options{
		Addr:                  n.Addr,
		Username:              n.Username,
		Password:              n.Password,
		DB:                    n.DB,
		DialTimeout:           o.DialTimeout,
		ReadTimeout:           o.ReadTimeout,
		WriteTimeout:          o.WriteTimeout,
		PoolSize:              o.PoolSize,
		MaxRetries:            retries,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
		TLSConfig:             o.TLS,
	}
}

// failover is the client of a Sentinel shard's primary (replica: of one of
// its replicas, for reads). The sentinels' own credentials are
// Sentinel.Username and Password; the nodes' are the shard's Primary's.
func (o *Options) failover(sc shard.Config, replica bool) *redis.FailoverOptions {
	c := o.client(sc.Primary, -1)
	if replica {
		c.MaxRetries = o.MaxRetries
	}
	return &redis.FailoverOptions{
		MasterName:            sc.Sentinel.Master,
		SentinelAddrs:         sc.Sentinel.Addrs,
		SentinelUsername:      sc.Sentinel.Username,
		SentinelPassword:      sc.Sentinel.Password,
		ReplicaOnly:           replica,
		Username:              c.Username,
		Password:              c.Password,
		DB:                    c.DB,
		DialTimeout:           c.DialTimeout,
		ReadTimeout:           c.ReadTimeout,
		WriteTimeout:          c.WriteTimeout,
		PoolSize:              c.PoolSize,
		MaxRetries:            c.MaxRetries,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
		TLSConfig:             c.TLSConfig,
	}
}

// Close stops the store's probes and re-assertions and closes every
// connection.
func (s *Store) Close() error {
	s.closed.Do(func() { close(s.stop) })
	s.wg.Wait()
	var errs []error
	for _, n := range s.shards {
		n.takes.close()
		errs = append(errs, n.primary.Close())
		for _, r := range n.replicas {
			errs = append(errs, r.Close())
		}
	}
	return errors.Join(errs...)
}

// Shards is the number of shards.
func (s *Store) Shards() int { return len(s.shards) }

// ShardName is the configured name of shard i.
func (s *Store) ShardName(i int) string { return s.shards[i].name }

// ShardOf is the index of the shard that owns k.
func (s *Store) ShardOf(k limiter.Key) int { return s.placed[s.m.Pick(k.Hash())] }

// previousOwner is k's owner before the move in progress, when it is not
// its owner now.
func (s *Store) previousOwner(k limiter.Key) (int, bool) {
	if s.prev == nil {
		return 0, false
	}
	j := s.prevPlace[s.prev.Pick(k.Hash())]
	return j, j != s.ShardOf(k)
}

// Holds reports whether shard i may hold k's windows: its owner, or its
// previous owner while keys move. Accounting events of k are applied there
// only.
func (s *Store) Holds(i int, k limiter.Key) bool {
	j, moving := s.previousOwner(k)
	return i == s.ShardOf(k) || (moving && i == j)
}

// movedTo is the shard a take's TALLYMOVED error names.
func movedTo(err error) (string, bool) {
	if err == nil || !redis.HasErrorPrefix(err, "TALLYMOVED") {
		return "", false
	}
	return strings.TrimSpace(strings.TrimPrefix(err.Error(), "TALLYMOVED")), true
}

// Check reads k's live window from a replica of its shard at the store
// clock's now. A window whose reset_at is not after now reads as not live,
// whatever the replica still holds. A replica that fails with a connection error is marked down and
// the next one is tried; when none is up, the read policy applies.
func (s *Store) Check(ctx context.Context, k limiter.Key) (limiter.Window, error) {
	if j, moving := s.previousOwner(k); moving {
		// A live window on the previous owner is the key's until it resets.
		if w, err := s.checkOn(ctx, j, k); err != nil || w.Live {
			return w, err
		}
	}
	return s.checkOn(ctx, s.ShardOf(k), k)
}

func (s *Store) checkOn(ctx context.Context, i int, k limiter.Key) (limiter.Window, error) {
	n := s.shards[i]
	if err := s.gate(ctx, i); err != nil {
		return limiter.Window{}, err // its replicas hold what the primary lost
	}
	now := s.opts.Clock.Now()
	keys, arg := []string{k.String()}, ms(now)
	var buf [8]int
	for _, i := range n.health.Candidates(now, buf[:0]) {
		w, err := parseCheck(s.run(ctx, n.replicas[i], checkScript, true, keys, arg))
		if err == nil {
			return w, nil
		}
		if ctx.Err() != nil || !nodeDown(err) {
			return limiter.Window{}, fmt.Errorf("limiter: check on shard %s replica %d: %w", n.name, i, err)
		}
		n.health.MarkDown(i, s.opts.Clock.Now())
	}
	if len(n.replicas) > 0 && s.opts.ReadPolicy == shard.ReadFail {
		return limiter.Window{}, fmt.Errorf("limiter: check on shard %s: %w", n.name, ErrNoReplica)
	}
	w, err := parseCheck(s.run(ctx, n.primary, checkScript, true, keys, arg))
	if err != nil {
		return limiter.Window{}, fmt.Errorf("limiter: check on shard %s primary: %w", n.name, err)
	}
	return w, nil
}

// ProbeReplicas asks every replica for its replication state. Replicas that
// do not answer, or whose link to the primary is down (they would serve
// counts that no longer move), are marked down; the others are marked up.
// limiter.Run it periodically (RunProbes); Check marks replicas down on its own
// when reads fail.
func (s *Store) ProbeReplicas(ctx context.Context) {
	for _, n := range s.shards {
		for i, r := range n.replicas {
			info, err := r.Info(ctx, "replication").Result()
			if err == nil && strings.Contains(info, "master_link_status:up") {
				n.health.MarkUp(i)
			} else {
				n.health.MarkDown(i, s.opts.Clock.Now())
			}
		}
	}
}

// RunProbes calls ProbeReplicas every interval until ctx is done.
func (s *Store) RunProbes(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.ProbeReplicas(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ReplicaUp reports whether replica r of shard i is in rotation.
func (s *Store) ReplicaUp(i, r int) bool {
	return s.shards[i].health.Up(r, s.opts.Clock.Now())
}

// Ping checks that every primary answers.
func (s *Store) Ping(ctx context.Context) error {
	for _, n := range s.shards {
		if err := n.primary.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("limiter: shard %s primary: %w", n.name, err)
		}
	}
	return nil
}

// ErrEvictingPolicy is returned by CheckEviction for a primary that may
// evict keys when it runs out of memory.
var ErrEvictingPolicy = errors.New("limiter: evicting maxmemory-policy")

// CheckEviction reads every primary's maxmemory-policy (INFO memory, which
// managed services allow where CONFIG is renamed) and refuses any policy
// but noeviction: an evicted window lets its key start over (more than the
// limit), and an evicted producer record makes a redelivered event count
// twice. Every Tally key has a TTL, so volatile-* policies evict them too.
// A primary that cannot be read is reported as such (not ErrEvictingPolicy)
// so that the caller may start degraded and say so.
func (s *Store) CheckEviction(ctx context.Context) error {
	var errs []error
	for _, n := range s.shards {
		info, err := n.primary.Info(ctx, "memory").Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("limiter: shard %s primary: reading maxmemory-policy: %w", n.name, err))
			continue
		}
		policy := infoField(info, "maxmemory_policy")
		if policy == "" {
			errs = append(errs, fmt.Errorf("limiter: shard %s primary: INFO memory has no maxmemory_policy", n.name))
			continue
		}
		if policy != "noeviction" {
			errs = append(errs, fmt.Errorf("%w: shard %s primary has maxmemory-policy %s; Tally needs noeviction (docs/operations.md)",
				ErrEvictingPolicy, n.name, policy))
		}
	}
	return errors.Join(errs...)
}

// infoField returns a field of an INFO reply ("name:value" lines).
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func parseCheck(cmd *redis.Cmd) (limiter.Window, error) {
	v, err := cmd.Int64Slice()
	if err != nil {
		return limiter.Window{}, scriptErr(err)
	}
	switch {
	case len(v) == 1 && v[0] == 0:
		return limiter.Window{}, nil
	case len(v) == 5 && v[0] == 1:
		return limiter.Window{Live: true, Used: v[1], ResetAt: fromMS(v[2]), Start: fromMS(v[3]), Expired: v[4]}, nil
	}
	return limiter.Window{}, fmt.Errorf("unexpected check reply %v", v)
}

// Permanent reports whether a failed script call will fail again however
// often it is retried: Redis refused the command itself (a wrong type, a script
// error), rather than being unreachable, read-only, loading or full.
func Permanent(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, limiter.ErrInvalidArgument):
		return true
	case err == nil, errors.As(err, &ne), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout):
		return false
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return false // I/O: EOF, reset connections
	}
	msg := re.Error()
	for _, transient := range []string{"READONLY", "LOADING", "MASTERDOWN", "BUSY", "TRYAGAIN", "OOM", "NOSCRIPT", "CLUSTERDOWN",
		"TALLYRESEEDING"} {
		if strings.HasPrefix(msg, transient) {
			return false
		}
	}
	return true
}

// refused reports whether err is a script's refusal of its arguments.
func refused(err error) bool {
	return err != nil && strings.Contains(err.Error(), "tally: invalid")
}

// scriptErr marks a script's refusal of its arguments as
// limiter.ErrInvalidArgument, and its refusal to write while the shard
// re-seeds as ErrReseeding.
func scriptErr(err error) error {
	switch {
	case refused(err):
		return fmt.Errorf("%w: %v", limiter.ErrInvalidArgument, err)
	case redis.HasErrorPrefix(err, "TALLYRESEEDING"):
		return ErrReseeding // the script saw the reseed marker (epoch.lua)
	}
	return err
}

// nodeDown reports whether err means the node could not serve the command,
// as opposed to the command failing on a node that works.
func nodeDown(err error) bool {
	var ne net.Error
	switch {
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout):
		return true
	}
	return redis.HasErrorPrefix(err, "LOADING") || redis.HasErrorPrefix(err, "MASTERDOWN")
}

// producerKey is the key of a producer's hash, computed once per producer.
func (s *Store) producerKey(id string) string {
	if k, ok := s.producers.Load(id); ok {
		return k.(string)
	}
	k := s.keys.ProducerKey(id)
	s.producers.Store(id, k)
	return k
}

// Clock is the store's clock.
func (s *Store) Clock() limiter.Clock { return s.opts.Clock }

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(v int64) time.Time { return time.UnixMilli(v) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
