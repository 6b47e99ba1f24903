package events

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/setting"
)

// ErrInvalidConfig is wrapped by stream configuration errors.
var ErrInvalidConfig = errors.New("events: invalid config")

// StreamConfig names and bounds one stream. Zero values take the stream's
// defaults (Streams.WithDefaults).
type StreamConfig struct {
	Name          string        `yaml:"name"`
	SubjectPrefix string        `yaml:"subject_prefix"`
	MaxAge        time.Duration `yaml:"max_age"`
	// MaxBytes bounds the stream's size; -1 is unlimited.
	MaxBytes int64 `yaml:"max_bytes"`
}

// Streams are Tally's streams, each for one purpose, so that none takes
// another's capacity (docs/events.md):
//
//   - Accounting: the events still to apply (charges edges could not make
//     themselves, 304 refunds, released reservations). Accountants delete
//     what they applied, so it holds what is in flight, not history. When it
//     is full, publishes fail and edges apply their events themselves.
//   - Decisions: every decision, for analytics; replayable, oldest dropped
//     first when full.
//   - DeadLetters: accounting messages that can never be applied, with the
//     reason.
//   - Limits: the temporary limits operators put on identities, the latest
//     per window key (TemporaryLimit); every edge reads it from the start.
//
// Notices (full windows, room again) use core NATS subjects under
// NoticePrefix: they need no storage.
type Streams struct {
	// Storage is "file" (default) or "memory".
	Storage string `yaml:"storage"`
	// Replicas is the JetStream replication factor: 1 (default) on one
	// server, 3 on a cluster.
	Replicas int `yaml:"replicas"`
	// Duplicates is the window in which JetStream drops a repeated
	// accounting publish (by Nats-Msg-Id). Default 2m; later repeats are
	// caught by the accountant.
	Duplicates   time.Duration `yaml:"duplicates"`
	Accounting   StreamConfig  `yaml:"accounting"`
	Decisions    StreamConfig  `yaml:"decisions"`
	DeadLetters  StreamConfig  `yaml:"dead_letters"`
	Limits       StreamConfig  `yaml:"limits"`
	NoticePrefix string        `yaml:"notice_prefix"`
}

// WithDefaults returns s with zero values replaced by defaults.
func (s Streams) WithDefaults() Streams {
	def := func(c *StreamConfig, name, prefix string, age time.Duration, size int64) {
		if c.Name == "" {
			c.Name = name
		}
		if c.SubjectPrefix == "" {
			c.SubjectPrefix = prefix
		}
		if c.MaxAge == 0 {
			c.MaxAge = age
		}
		if c.MaxBytes == 0 {
			c.MaxBytes = size
		}
	}
	if s.Storage == "" {
		s.Storage = "file"
	}
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	if s.Duplicates == 0 {
		s.Duplicates = 2 * time.Minute
	}
	def(&s.Accounting, "TALLY_ACCOUNTING", "tally.accounting", 24*time.Hour, 256<<20)
	def(&s.Decisions, "TALLY_DECISIONS", "tally.decisions", 24*time.Hour, 1<<30)
	def(&s.DeadLetters, "TALLY_DLQ", "tally.dlq", 14*24*time.Hour, 256<<20)
	def(&s.Limits, "TALLY_LIMITS", "tally.limits", 8*24*time.Hour, 64<<20)
	if s.NoticePrefix == "" {
		s.NoticePrefix = "tally.notices"
	}
	return s
}

// Validate reports the first problem with s (zero values stand for the
// defaults) as a *setting.Error naming the field.
func (s Streams) Validate() error { return s.WithDefaults().check() }

func (s Streams) check() error {
	bad := func(field, format string, args ...any) error {
		return setting.Errorf(ErrInvalidConfig, field, format, args...)
	}
	if s.Storage != "file" && s.Storage != "memory" {
		return bad("storage", "%q: want file or memory", clip(s.Storage))
	}
	if s.Replicas < 1 || s.Replicas > 5 {
		return bad("replicas", "%d: want 1 to 5", s.Replicas)
	}
	names := map[string]bool{}
	for _, c := range []struct {
		field string
		StreamConfig
	}{{"accounting", s.Accounting}, {"decisions", s.Decisions}, {"dead_letters", s.DeadLetters}, {"limits", s.Limits}} {
		switch {
		case !validStreamName(c.Name):
			return bad(c.field+".name", "%q: want 1 to 64 of [A-Za-z0-9_-]", clip(c.Name))
		case names[c.Name]:
			return bad(c.field+".name", "%q: another stream has this name", c.Name)
		case !validPrefix(c.SubjectPrefix):
			return bad(c.field+".subject_prefix", "%q: want tokens of [a-z0-9_-] separated by dots", clip(c.SubjectPrefix))
		case names[c.SubjectPrefix]:
			return bad(c.field+".subject_prefix", "%q: another stream has this prefix", c.SubjectPrefix)
		case c.MaxAge < 0:
			return bad(c.field+".max_age", "%v: want a positive duration (0: the default)", c.MaxAge)
		case c.MaxBytes < -1:
			return bad(c.field+".max_bytes", "%d: want a positive size, or -1 for no bound", c.MaxBytes)
		}
		names[c.Name], names[c.SubjectPrefix] = true, true
	}
	if !validPrefix(s.NoticePrefix) || names[s.NoticePrefix] {
		return bad("notice_prefix", "%q: want tokens of [a-z0-9_-] separated by dots, unlike the streams' prefixes", clip(s.NoticePrefix))
	}
	if s.Limits.MaxAge > 0 && s.Limits.MaxAge < MaxTemporary+time.Hour {
		return bad("limits.max_age", "%v: want at least %v (the longest temporary limit, and an hour)", s.Limits.MaxAge, MaxTemporary+time.Hour)
	}
	if s.Duplicates <= 0 || s.Duplicates > s.Accounting.MaxAge {
		return bad("duplicates", "%v: want a positive duration within the accounting stream's max_age (%v)", s.Duplicates, s.Accounting.MaxAge)
	}
	return nil
}

// DecisionsSubject is where edges publish their decisions.
func (s Streams) DecisionsSubject() string { return s.WithDefaults().Decisions.SubjectPrefix + ".edge" }

// AccountantDecisionsSubject is where accountants publish what applying
// each accounting event did.
func (s Streams) AccountantDecisionsSubject() string {
	return s.WithDefaults().Decisions.SubjectPrefix + ".accountant"
}

// OperatorDecisionsSubject is where operators' actions are recorded (a
// window reset, a temporary limit set or cleared).
func (s Streams) OperatorDecisionsSubject() string {
	return s.WithDefaults().Decisions.SubjectPrefix + ".operator"
}

// jetstream is the streams' configuration. The accounting stream takes
// the subjects of the shards named (<prefix>.<shard>.>), and nothing else:
// an event published for a shard no accountant serves is refused by
// JetStream (no stream takes it) instead of waiting in the stream forever.
// The decisions stream takes the edges' and the accountants' subjects only.
func (s Streams) jetstream(shards []string) ([]jetstream.StreamConfig, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	storage := jetstream.FileStorage
	if s.Storage == "memory" {
		storage = jetstream.MemoryStorage
	}
	for _, sh := range shards {
		if !validShard(sh) {
			return nil, fmt.Errorf("%w: shard %s", ErrInvalidConfig, quote(sh))
		}
	}
	stream := func(c StreamConfig, subjects []string, desc string, discard jetstream.DiscardPolicy, dup time.Duration) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name: c.Name, Description: desc, Subjects: subjects,
			Retention: jetstream.LimitsPolicy, Storage: storage, MaxAge: c.MaxAge, MaxBytes: c.MaxBytes,
			Discard: discard, Replicas: s.Replicas, Duplicates: dup,
		}
	}
	// The latest temporary limit of each window key: one message per
	// subject, kept for the longest a limit lasts.
	limits := stream(s.Limits, []string{s.Limits.SubjectPrefix + ".>"},
		"Tally temporary limits on identities, the latest per window key, signed", jetstream.DiscardOld, 2*time.Minute)
	limits.MaxMsgsPerSubject = 1
	accounting := make([]string, 0, len(shards))
	for _, sh := range shards {
		accounting = append(accounting, ShardSubjects(s.Accounting.SubjectPrefix, sh))
	}
	return []jetstream.StreamConfig{
		stream(s.Accounting, accounting, "Tally accounting events still to apply, a subject per shard and producer; accountants delete what they applied",
			jetstream.DiscardNew, s.Duplicates),
		stream(s.Decisions, []string{s.DecisionsSubject(), s.AccountantDecisionsSubject(), s.OperatorDecisionsSubject()},
			"Tally rate-limit decisions (CloudEvents JSON batches), for analytics", jetstream.DiscardOld, 2*time.Minute),
		stream(s.DeadLetters, []string{s.DeadLetters.SubjectPrefix + ".*"},
			"Tally accounting messages that could not be applied, with the reason; inspect and replay",
			jetstream.DiscardOld, 2*time.Minute),
		limits,
	}, nil
}

func validStreamName(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func validPrefix(s string) bool {
	if len(s) < 1 || len(s) > 128 {
		return false
	}
	tok := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if tok == 0 {
				return false
			}
			tok = 0
		case (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-':
			tok++
		default:
			return false
		}
	}
	return tok > 0
}

// EnsureStreams creates Tally's streams, or updates them when their settings
// differ from s, for the shards named (the accounting stream's subjects).
// A shard's subject is added, never taken away: processes of a deployment
// whose shard list is changing do not undo each other's (remove a shard's
// subject by hand once no process names it; docs/operations.md). It is
// idempotent and writes nothing when the streams already match, so every
// process can call it at start.
func EnsureStreams(ctx context.Context, js jetstream.StreamManager, s Streams, shards []string) error {
	s = s.WithDefaults()
	all, err := s.jetstream(shards)
	if err != nil {
		return err
	}
	for i, sc := range all {
		var keep func(string) bool
		if i == 0 { // accounting: keep other shards' subjects
			keep = func(subject string) bool {
				rest, ok := strings.CutPrefix(subject, s.Accounting.SubjectPrefix+".")
				sh, ok2 := strings.CutSuffix(rest, ".>")
				return ok && ok2 && validShard(sh)
			}
		}
		if err := ensureStream(ctx, js, sc, keep); err != nil {
			return fmt.Errorf("events: stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

// ensureStream creates or updates a stream; the subjects it has that keep
// accepts are kept beside want's.
func ensureStream(ctx context.Context, js jetstream.StreamManager, want jetstream.StreamConfig, keep func(string) bool) error {
	st, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Another process may create it first: an identical create
		// succeeds, and a different one is refused as a name in use —
		// then the stream is read again and brought to want.
		if _, err = js.CreateStream(ctx, want); !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return err
		}
		st, err = js.Stream(ctx, want.Name)
	}
	if err != nil {
		return err
	}
	have := st.CachedInfo().Config
	if keep != nil {
		for _, sub := range have.Subjects {
			if keep(sub) && !slices.Contains(want.Subjects, sub) {
				want.Subjects = append(want.Subjects, sub)
			}
		}
	}
	slices.Sort(want.Subjects)
	if sameStream(have, want) {
		return nil
	}
	_, err = js.UpdateStream(ctx, want)
	return err
}

// sameStream compares the settings Tally sets; the server fills in others.
func sameStream(have, want jetstream.StreamConfig) bool {
	hs := slices.Sorted(slices.Values(have.Subjects))
	return slices.Equal(hs, want.Subjects) && have.Description == want.Description &&
		have.Retention == want.Retention && have.Storage == want.Storage &&
		have.Duplicates == want.Duplicates && have.MaxAge == want.MaxAge &&
		have.MaxBytes == want.MaxBytes && have.Discard == want.Discard && have.Replicas == want.Replicas &&
		have.MaxMsgsPerSubject == want.MaxMsgsPerSubject
}

// EnsureStreamsRetry calls EnsureStreams until it succeeds or ctx ends,
// waiting every between attempts and reporting each failure to onErr
// (which may be nil). A process can start before NATS does.
func EnsureStreamsRetry(ctx context.Context, js jetstream.StreamManager, s Streams, shards []string, every time.Duration, onErr func(error)) error {
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := EnsureStreams(attempt, js, s, shards)
		cancel()
		if err == nil || errors.Is(err, ErrInvalidConfig) {
			return err
		}
		if onErr != nil {
			onErr(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}
