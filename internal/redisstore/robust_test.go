package redisstore_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/lua"
)

// Invariant 8: scripts validate every argument before their first write.
// Bad calls are refused in Go before Redis, and by the scripts themselves,
// leaving every key, field and expiry as it was.
func TestBadArgumentsWriteNothing(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	rdb := e.primary.Client()
	k := e.keys.Key("core", "alice")
	reset := t0.Truncate(time.Second).Add(minute)

	t.Run("refused in Go", func(t *testing.T) {
		good := charge("good", 1, k, reset, t0, 1)
		cases := map[string]func(e *limiter.Event){
			"bad producer":           func(e *limiter.Event) { e.Producer = "a b" },
			"empty producer":         func(e *limiter.Event) { e.Producer = "" },
			"zero seq":               func(e *limiter.Event) { e.Seq = 0 },
			"huge seq":               func(e *limiter.Event) { e.Seq = limiter.MaxSeq + 1 },
			"no kind":                func(e *limiter.Event) { e.Kind = 0 },
			"no key":                 func(e *limiter.Event) { e.Key = limiter.Key{} },
			"fractional reset":       func(e *limiter.Event) { e.ResetAt = reset.Add(time.Millisecond) },
			"start before 1970":      func(e *limiter.Event) { e.Start = time.Unix(-5, 0) },
			"zero units":             func(e *limiter.Event) { e.Units = 0 },
			"huge units":             func(e *limiter.Event) { e.Units = limiter.MaxLimit + 1 },
			"sub-second window":      func(e *limiter.Event) { e.Window = time.Millisecond },
			"charge with a ref":      func(e *limiter.Event) { e.RefProducer, e.RefSeq = "p", 1 },
			"refund with half a ref": func(e *limiter.Event) { e.Kind, e.RefSeq = limiter.Refund, 3 },
			"release without reset":  func(e *limiter.Event) { e.Kind, e.ResetAt = limiter.Release, time.Time{} },
		}
		for name, mutate := range cases {
			t.Run(name, func(t *testing.T) {
				bad := charge("bad", 1, k, reset, t0, 1)
				mutate(&bad)
				other := charge("good-"+strings.ReplaceAll(name, " ", "-"), 1, e.keys.Key("core", "bob-"+name), reset, t0, 1)
				res, err := e.store.Apply(ctx, 0, e.clock.Now(), []limiter.Event{bad, other})
				require.NoError(t, err)
				require.ErrorIs(t, res.Results[0].Err, limiter.ErrInvalidArgument)
				require.Equal(t, limiter.Applied, res.Results[1].Outcome, "the good event still runs")
				n, err := rdb.Exists(ctx, k.String()).Result()
				require.NoError(t, err)
				require.Zero(t, n)
			})
		}
		_ = good
		for name, a := range map[string]limiter.TakeArgs{
			"zero limit":        {Window: minute, Limit: 0, Need: 1, Want: 1, Producer: "p"},
			"need over want":    {Window: minute, Limit: 10, Need: 3, Want: 2, Producer: "p"},
			"want over limit":   {Window: minute, Limit: 10, Need: 1, Want: 11, Producer: "p"},
			"want without need": {Window: minute, Limit: 10, Need: 0, Want: 2, Producer: "p"},
			"bad producer":      {Window: minute, Limit: 10, Need: 1, Want: 1, Producer: "{p}"},
			"short window":      {Window: time.Millisecond, Limit: 10, Need: 1, Want: 1, Producer: "p"},
		} {
			_, err := e.store.Take(ctx, k, t0, a)
			require.ErrorIs(t, err, limiter.ErrInvalidArgument, name)
		}
	})

	t.Run("refused by the script", func(t *testing.T) {
		// An existing window and producer: every bad call must leave them,
		// their expiries and the rest of the database exactly as they were.
		e.take(t, k, 100, 3, 3)
		e.apply(t, charge("edge-a", 1, k, reset, t0, 1))
		e.takeAs(t, "edge-b", k, 100, 1, 1) // another holder's: the full form
		pk := e.keys.ProducerKey("edge-a")
		now := fmt.Sprint(t0.UnixMilli())
		r := fmt.Sprint(reset.UnixMilli())
		fk := e.keys.FinishKey(k.Digest(), "edge-a.1", reset.UnixMilli())
		ev := func(f ...string) []string { // an apply call's fixed arguments, producer "edge-a", then f
			return append([]string{now, "1", "60000", "2000", "90000000", "0", "60000", "edge-a"}, f...)
		}
		scripts := map[string]struct {
			src  string
			keys []string
			args []string
		}{
			"check": {lua.Check, []string{k.String()}, []string{now}},
			"take": {lua.Take, []string{k.String(), pk}, []string{now, "60000", "100", "1", "2", "60000", "edge-1.7", "edge-1", "3:1,4:2",
				"s1", "0", "0", now}},
			// The cold path (take.lua's compact takes): nothing owed, moved
			// or frozen, the shard's windows compact.
			"take-cold": {lua.Take, []string{k.String(), pk}, []string{now, "60000", "100", "1", "2", "60000", "edge-1.7", "edge-1", "",
				"", "", "", "", "1", ""}},
			"own": {lua.Own, []string{k.String()}, []string{now, "100", "1", "2", "edge-a.1"}},
			// A sliding window of two sub-windows of a minute: the one
			// before and the one after, and its span record.
			"slide": {lua.Slide, []string{k.String(), e.keys.ReseedKey(), k.SliceKey(reset.Add(-minute)), k.SliceKey(reset.Add(minute)),
				k.SpanRecordKey()}, []string{now, "60000", "100", "1", "2", "60000", "edge-a.1", r, "2", "0123456789abcdef"}},
			"hold":  {lua.Hold, []string{k.String()}, []string{now, r, "edge-a.1", "edge-a", "0", "5", now}},
			"apply": {lua.Apply, []string{pk, k.String()}, ev("1", "2", "c", "2", r, now, "60000", "1", "0", "0")},
			"lease": {lua.Lease, []string{"tally:lease:s0"}, []string{"hold", "acc-1", "1000"}},
			"finish": {lua.Finish, []string{k.String(), fk, pk}, []string{now, r, "0", "304", "1", "edge-a", "0", now, "60000",
				"60000", "2000", "90000000"}},
		}
		bad := []string{"", "-1", "1.5", "1e3", "0x10", " 1", "abc", "9999999999999999"}
		badProducer := []string{"", "a b", "{x}", ".a", "a.", "a..b", strings.Repeat("a", 65), "é"}
		special := map[string][]string{ // arguments that are not numbers
			"apply/8":      badProducer,
			"apply/11":     {"", "C", "cc", "z", "1"},
			"lease/1":      {"", "HOLD", "take", "1"},
			"lease/2":      {"", "a b", "{x}", strings.Repeat("a", 65), "é"},
			"take/7":       {"", " 1", "a b", "{x}", "g:x", strings.Repeat("a", 101), "é", "edge-2.7", "edge-10.7"},
			"take/8":       badProducer,
			"take/9":       {"x", "1:", ":1", "1:0", "0:1", ",1:1", "1:1,", "1:1,,2:2", "1:1;2:2", strings.Repeat("1:1,", 64) + "1:1"},
			"take/10":      {"S1", "a b", "{x}", strings.Repeat("a", 33), "é"},            // moving to: "" is none
			"take/11":      {"-1", "1.5", "1e3", "0x10", " 1", "abc", "9999999999999999"}, // keep: "" freezes nothing
			"take-cold/7":  {"", " 1", "a b", "{x}", "g:x", strings.Repeat("a", 101), "é", "edge-2.7", "edge-10.7", "edge-1." + strings.Repeat("a", 94)},
			"take-cold/8":  badProducer,
			"take-cold/9":  {"x", "1:", ":1", "1:0", "0:1", ",1:1", "1:1,", "1:1,,2:2", "1:1;2:2"},
			"take-cold/10": {"S1", "a b", "{x}", strings.Repeat("a", 33), "é"},
			"take-cold/11": {"-1", "1.5", "1e3", "0x10", " 1", "abc", "9999999999999999"},
			"take-cold/12": {}, // the frozen share and its expiry count only with keep
			"take-cold/13": {},
			"take-cold/14": {}, // anything but "1": not compact
			"take-cold/15": {"0", "2", "x", " 1"},
			"own/5":        {"", "ab", " 1", "a b", "{x}", "g:x", strings.Repeat("a", 101), "é", ".a.1", "edge-a.", "edge-a", "edge-a.1.x y"},
			"slide/7": {"", "ab", " 1", "a b", "{x}", "g:x", strings.Repeat("a", 101), "é", ".a.1", "edge-a.", "edge-a", "edge-a.1.x y",
				"edge..a.1"},
			"slide/9":  {"", "1", "3", "61", "x", " 2", "2.0"}, // 3: five keys are two sub-windows' spans
			"slide/10": {"x", "0123456789abcde", "0123456789abcdef0", "0123456789ABCDEF", " 0123456789abcde", "0123456789abcdeg"},
			"hold/3":   {"", " 1", "a b", "{x}", strings.Repeat("a", 101), "é", "edge-b.1"},
			"hold/4":   badProducer,
			"finish/6": badProducer,
		}
		before := state(t, rdb, k, pk)
		for name, sc := range scripts {
			for i := range sc.args {
				values := bad
				if v, ok := special[fmt.Sprintf("%s/%d", name, i+1)]; ok {
					values = v
				}
				for _, v := range values {
					args := append([]string(nil), sc.args...)
					args[i] = v
					err := rdb.Eval(ctx, sc.src, sc.keys, toAny(args)...).Err()
					require.Error(t, err, "%s ARGV[%d]=%q", name, i+1, v)
					require.Contains(t, err.Error(), "tally: invalid", "%s ARGV[%d]=%q", name, i+1, v)
					require.Equal(t, before, state(t, rdb, k, pk), "%s ARGV[%d]=%q wrote", name, i+1, v)
				}
			}
			if name != "lease" && name != "take-cold" { // lease's last argument is optional for "free", take's last three always
				err := rdb.Eval(ctx, sc.src, sc.keys, toAny(sc.args[:len(sc.args)-1])...).Err()
				require.Error(t, err, "%s without its last argument", name)
				require.Equal(t, before, state(t, rdb, k, pk))
			}
		}
		late := fmt.Sprint(t0.Add(-2 * minute).UnixMilli())
		slideKeys := scripts["slide"].keys
		start := fmt.Sprint(reset.Add(-minute).UnixMilli())
		// Range and consistency rules.
		for _, c := range []struct {
			name, src string
			keys      []string
			args      []string
		}{
			{"take: sub-second window", lua.Take, []string{k.String(), pk}, []string{now, "999", "100", "1", "1", "60000", "h", "h", ""}},
			{"take: need over limit", lua.Take, []string{k.String(), pk}, []string{now, "60000", "100", "101", "101", "60000", "h", "h", ""}},
			{"take: want under need", lua.Take, []string{k.String(), pk}, []string{now, "60000", "100", "5", "4", "60000", "h", "h", ""}},
			{"own: zero limit", lua.Own, []string{k.String()}, []string{now, "0", "1", "1", "edge-a.1"}},
			{"own: limit over 1e9", lua.Own, []string{k.String()}, []string{now, "1000000001", "1", "1", "edge-a.1"}},
			{"own: zero need", lua.Own, []string{k.String()}, []string{now, "100", "0", "1", "edge-a.1"}},
			{"own: need over limit", lua.Own, []string{k.String()}, []string{now, "100", "101", "101", "edge-a.1"}},
			{"own: want under need", lua.Own, []string{k.String()}, []string{now, "100", "5", "4", "edge-a.1"}},
			{"own: want over limit", lua.Own, []string{k.String()}, []string{now, "100", "1", "101", "edge-a.1"}},
			{"own: now past year 5138", lua.Own, []string{k.String()}, []string{"100000000000001", "100", "1", "1", "edge-a.1"}},
			{"own: a sixth argument", lua.Own, []string{k.String()}, []string{now, "100", "1", "1", "edge-a.1", "x"}},
			{"slide: reset not after now", lua.Slide, slideKeys, []string{now, "60000", "100", "1", "2", "60000", "edge-a.1", start, "2", "0123456789abcdef"}},
			{"slide: reset more than a sub-window after now", lua.Slide, slideKeys, []string{now, "60000", "100", "1", "2", "60000",
				"edge-a.1", fmt.Sprint(reset.Add(minute).UnixMilli()), "2", "0123456789abcdef"}},
			{"slide: fractional reset", lua.Slide, slideKeys, []string{now, "60000", "100", "1", "2", "60000", "edge-a.1", r + "1", "2", "0123456789abcdef"}},
			{"slide: sub-second length", lua.Slide, slideKeys, []string{now, "999", "100", "1", "2", "60000", "edge-a.1", r, "2", "0123456789abcdef"}},
			{"slide: zero need", lua.Slide, slideKeys, []string{now, "60000", "100", "0", "2", "60000", "edge-a.1", r, "2", "0123456789abcdef"}},
			{"slide: want under need", lua.Slide, slideKeys, []string{now, "60000", "100", "5", "4", "60000", "edge-a.1", r, "2", "0123456789abcdef"}},
			{"slide: want over limit", lua.Slide, slideKeys, []string{now, "60000", "100", "1", "101", "60000", "edge-a.1", r, "2", "0123456789abcdef"}},
			{"slide: short grace", lua.Slide, slideKeys, []string{now, "60000", "100", "1", "2", "999", "edge-a.1", r, "2", "0123456789abcdef"}},
			{"slide: an eleventh argument", lua.Slide, slideKeys, []string{now, "60000", "100", "1", "2", "60000", "edge-a.1", r, "2",
				"0123456789abcdef", "x"}},
			{"slide: the record alone without a level", lua.Slide, []string{k.String(), e.keys.ReseedKey(), k.SpanRecordKey()},
				[]string{now, "60000", "100", "1", "2", "60000", "edge-a.1", r, "2", ""}},
			{"slide: the keys of three sub-windows", lua.Slide, append(slideKeys, k.SliceKey(reset.Add(2*minute))),
				[]string{now, "60000", "100", "1", "2", "60000", "edge-a.1", r, "2", "0123456789abcdef"}},
			{"take: want without need", lua.Take, []string{k.String(), pk}, []string{now, "60000", "100", "0", "4", "60000", "h", "h", ""}},
			{"apply: producer index out of range", lua.Apply, []string{pk, k.String()}, ev("2", "2", "c", "2", r, now, "60000", "1", "0", "0")},
			{"apply: window index is a producer", lua.Apply, []string{pk, k.String()}, ev("1", "2", "c", "1", r, now, "60000", "1", "0", "0")},
			{"apply: fractional reset", lua.Apply, []string{pk, k.String()}, ev("1", "2", "c", "2", r+"1", now, "60000", "1", "0", "0")},
			{"apply: reset before the start", lua.Apply, []string{pk, k.String()}, ev("1", "2", "c", "2", r, r, "60000", "1", "0", "0")},
			{"apply: reset far beyond the start", lua.Apply, []string{pk, k.String()}, ev("1", "2", "c", "2", r, late, "60000", "1", "0", "0")},
			{"apply: charge with a ref", lua.Apply, []string{pk, k.String()}, ev("1", "2", "c", "2", r, now, "60000", "1", "1", "1")},
			{"apply: refund of a later charge", lua.Apply, []string{pk, k.String()}, ev("1", "2", "r", "2", r, now, "60000", "1", "1", "2")},
			{"apply: refund of another producer's charge", lua.Apply, []string{pk, pk + "x", k.String()},
				[]string{now, "2", "60000", "2000", "90000000", "0", "60000", "edge-a", "edge-b", "1", "5", "r", "3", r, now, "60000", "1", "2", "1"}},
			{"apply: release without reset", lua.Apply, []string{pk, k.String()}, ev("1", "2", "x", "2", "0", now, "60000", "1", "0", "0")},
			{"apply: a good event then a bad one", lua.Apply, []string{pk, k.String()}, ev(
				"1", "2", "c", "2", r, now, "60000", "1", "0", "0", "1", "3", "c", "2", r, now, "60000", "0", "0", "0")},
			{"apply: a partial event", lua.Apply, []string{pk, k.String()}, ev("1", "2", "c")},
			{"apply: a call without its reply key", lua.Apply, []string{pk, k.String()},
				[]string{now, "1", "60000", "2000", "90000000", "7", "60000", "edge-a", "1", "2", "c", "2", r, now, "60000", "1", "0", "0"}},
			{"apply: more producers than keys", lua.Apply, []string{pk, k.String()}, []string{now, "3", "60000", "2000", "90000000", "0", "60000", "a", "b", "c"}},
			{"finish: no window and no charge", lua.Finish, []string{k.String(), fk, pk}, []string{now, "0", "0", "304", "1", "edge-a", "0", now, "60000",
				"60000", "2000", "90000000"}},
			{"finish: reset before the start", lua.Finish, []string{k.String(), fk, pk}, []string{now, r, "0", "304", "1", "edge-a", "0", r, "60000",
				"60000", "2000", "90000000"}},
		} {
			err := rdb.Eval(ctx, c.src, c.keys, toAny(c.args)...).Err()
			require.Error(t, err, c.name)
			require.Contains(t, err.Error(), "tally: invalid", c.name)
			require.Equal(t, before, state(t, rdb, k, pk), c.name)
		}

		// A token bucket's take (ARGV[19..21], KEYS[6..9]): terms the
		// limiter would refuse are refused by the script, before anything
		// is written.
		period := t0.Truncate(time.Second)
		at := func(d time.Duration) string { return k.SliceKey(period.Add(time.Second + d)) }
		bk := []string{at(0), pk, e.keys.ReseedKey(), at(-time.Second), at(time.Second), k.BucketKey(), at(-2 * time.Second),
			at(-3 * time.Second), e.keys.RefillKey()}
		opens, end := fmt.Sprint(period.UnixMilli()), fmt.Sprint(period.Add(time.Second).UnixMilli())
		bucket := func(limit, rate, every, spent string) []string {
			return []string{now, "1000", limit, "1", "1", "60000", "h", "h", "", "", "", "", "", "", "1", opens, end, "2", rate, every, spent}
		}
		for name, args := range map[string][]string{
			"no rate":                  bucket("10", "0", "1000", ""),
			"a rate over 1e9":          bucket("10", "1000000001", "1000", ""),
			"a refill of 1.5 s":        bucket("10", "1", "1500", ""),
			"a refill over an hour":    bucket("10", "1", "3600001", ""),
			"a burst too large":        bucket("1000000000", "1", "3600000", ""),
			"spent neither 1 nor none": bucket("10", "1", "1000", "2"),
			"three periods":            append(bucket("10", "1", "1000", "")[:17], "3", "1", "1000", ""),
		} {
			err := rdb.Eval(ctx, lua.Take, bk, toAny(args)...).Err()
			require.Error(t, err, name)
			require.Contains(t, err.Error(), "tally: invalid", name)
			n, err := rdb.Exists(ctx, bk[0], k.BucketKey()).Result()
			require.NoError(t, err)
			require.Zero(t, n, "%s wrote", name)
		}
		// bucket.lua, the short way of a bucket Redis holds nothing of:
		// every argument, and the same terms.
		short := append([]string{bk[0]}, bk[2:]...) // take.lua's keys less the producer's
		fresh := func(limit, rate, every, spent string) []string {
			return []string{now, limit, "1", "1", "60000", "edge-a.1", end, rate, every, spent}
		}
		cases := map[string][]string{
			"no rate":               fresh("10", "0", "1000", ""),
			"a rate over 1e9":       fresh("10", "1000000001", "1000", ""),
			"a refill of 1.5 s":     fresh("10", "1", "1500", ""),
			"a refill over an hour": fresh("10", "1", "3600001", ""),
			"a burst too large":     fresh("1000000000", "1", "3600000", ""),
			"reset not after now":   append(fresh("10", "1", "1000", "")[:6], opens, "1", "1000", ""),
			"reset a period after the next": append(fresh("10", "1", "1000", "")[:6], fmt.Sprint(period.Add(2*time.Second).UnixMilli()),
				"1", "1000", ""),
			"an eleventh argument": append(fresh("10", "1", "1000", ""), "x"),
			"no refill key":        nil,
		}
		for i, good := range fresh("10", "1", "1000", "") {
			values := []string{"", "-1", "1.5", "1e3", "0x10", " 1", "abc", "9999999999999999"}
			switch i + 1 {
			case 6: // the holder
				values = []string{"", "ab", " 1", "a b", "{x}", "g:x", strings.Repeat("a", 101), "é", ".a.1", "edge-a.", "edge-a",
					"edge-a.1 x", "edge..a.1"}
			case 10: // spent at once: "1" or ""
				values = []string{"0", "2", "x", " 1", "11"}
			}
			for _, v := range values {
				args := fresh("10", "1", "1000", "")
				args[i] = v
				cases[fmt.Sprintf("ARGV[%d]=%q (%q)", i+1, v, good)] = args
			}
		}
		for name, args := range cases {
			keys := short
			if args == nil {
				keys, args = short[:7], fresh("10", "1", "1000", "")
			}
			err := rdb.Eval(ctx, lua.Bucket, keys, toAny(args)...).Err()
			require.Error(t, err, name)
			require.Contains(t, err.Error(), "tally: invalid", name)
			n, err := rdb.Exists(ctx, bk[0], k.BucketKey()).Result()
			require.NoError(t, err)
			require.Zero(t, n, "%s wrote", name)
		}
		require.NoError(t, rdb.Eval(ctx, lua.Take, bk, toAny(bucket("10", "1", "1000", ""))...).Err(), "the good call the cases vary")
		require.Equal(t, []any{int64(-1)}, rdb.Eval(ctx, lua.Bucket, short, toAny(fresh("10", "1", "1000", ""))...).Val(),
			"a bucket Redis holds is take.lua's")
	})

	t.Run("a key of the wrong type fails the call before its first write", func(t *testing.T) {
		// A refund before its charge leaves a marker; the run that brings
		// the charge (which would delete the marker) also names a window
		// that is not a hash. Nothing may change: were the marker deleted
		// and the call then failed, the retried charge would be applied in
		// full and the refund lost.
		w, broken := e.keys.Key("core", "wt-window"), e.keys.Key("core", "wt-broken")
		p := "wrong-type"
		e.apply(t, charge(p, 1, w, reset, t0, 3))
		require.Equal(t, limiter.Pending, e.apply(t, refund(p, 3, w, reset, t0, 2, p, 2))[0].Outcome)
		require.NoError(t, rdb.Set(ctx, broken.String(), "not a window", 0).Err())
		pk := e.keys.ProducerKey(p)
		before := state(t, rdb, w, pk)
		_, err := e.store.Apply(ctx, 0, e.clock.Now(), []limiter.Event{charge(p, 2, w, reset, t0, 2), charge(p, 4, broken, reset, t0, 1)})
		require.Error(t, err)
		require.True(t, redisstore.Permanent(err), "Redis refuses it the same way every time")
		require.Equal(t, before, state(t, rdb, w, pk), "nothing written")
		require.NoError(t, rdb.Del(ctx, broken.String()).Err())
		require.Equal(t, []limiter.Outcome{limiter.Netted, limiter.Applied}, outcomes(e.apply(t,
			charge(p, 2, w, reset, t0, 2), charge(p, 4, broken, reset, t0, 1))))
		require.EqualValues(t, 3, e.used(t, w), "the refund netted its charge")
	})
}

// dump is a key's full state: type, fields and expiry.
func dump(t *testing.T, rdb *redis.Client, key string) string {
	t.Helper()
	ctx := context.Background()
	h, err := rdb.HGetAll(ctx, key).Result()
	require.NoError(t, err)
	exp, err := rdb.PExpireTime(ctx, key).Result()
	require.NoError(t, err)
	return fmt.Sprintf("%v exp=%v", h, exp)
}

// state is the keys' full state and the number of keys in the database.
func state(t *testing.T, rdb *redis.Client, k limiter.Key, others ...string) string {
	t.Helper()
	n, err := rdb.DBSize(context.Background()).Result()
	require.NoError(t, err)
	s := fmt.Sprintf("%s keys=%d", dump(t, rdb, k.String()), n)
	for _, o := range others {
		s += " " + dump(t, rdb, o)
	}
	return s
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Invariant 9: no identity reaches Redis or another client's window.
func TestKeySafety(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	rdb := e.primary.Client()
	alice := e.keys.Key("core", "alice")
	e.take(t, alice, 100, 2, 2)

	evil := []string{
		"alice:exp", "alice:", ":alice", "{alice}", "{alice}:exp", "alice}", "{", "}",
		"alice\x00", "\x00alice", "alice\n", "Alice", "alice ",
		"аlice",                      // Cyrillic a
		"ａｌｉｃｅ",                      // full-width
		"alice\u200b", "a\u0301lice", // zero-width space, combining accent
		strings.Repeat("alice", 2048), // 10 KB
		strings.Repeat("{", 10240),
	}
	keyRE := regexp.MustCompile(`^tally:\{[0-9a-f]{32}\}$`)
	seen := map[string]string{alice.String(): "alice"}
	for _, id := range evil {
		for _, resource := range []string{"core", "core:alice", "search"} {
			k := e.keys.Key(resource, id)
			require.Regexp(t, keyRE, k.String())
			prev, dup := seen[k.String()]
			require.False(t, dup, "%q collides with %q", id, prev)
			seen[k.String()] = id
			g := e.take(t, k, 100, 1, 1)
			require.True(t, g.Opened, "a fresh window for %q", id)
			require.EqualValues(t, 1, g.Used)
		}
	}
	require.EqualValues(t, 2, e.used(t, alice), "alice's window is untouched")
	// Producer ids are hashed too, and refused when they are not ids.
	e.apply(t, charge("edge-a", 1, alice, time.Time{}, t0, 1))
	_, err := e.store.Take(ctx, alice, t0, limiter.TakeArgs{Window: minute, Limit: 100, Need: 1, Want: 1, Producer: "alice:exp"})
	require.ErrorIs(t, err, limiter.ErrInvalidArgument)

	// The resource and identity are length-prefixed: moving bytes between
	// them gives another key.
	require.NotEqual(t, e.keys.Key("core", "alice").String(), e.keys.Key("corea", "lice").String())
	require.NotEqual(t, e.keys.Key("", "corealice").String(), e.keys.Key("corealice", "").String())
	require.NotEqual(t, e.keys.Key("x", "\x01y").String(), e.keys.Key("x\x02", "y").String())
	require.Equal(t, e.keys.Key("core", "alice"), e.keys.KeyOf(e.keys.Sum("core", "alice")))
	require.EqualValues(t, 3, e.used(t, alice), "alice's own events reach her window")

	// Nothing stored names an identity or a producer (the epoch record
	// names the shard's primary: epoch.lua).
	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	anyKey := regexp.MustCompile(`^tally:((producer:)?\{[0-9a-f]{32}\}|epoch|windows)$`)
	for _, key := range keys {
		require.Regexp(t, anyKey, key)
		require.NotContains(t, key, "alice")
		require.NotContains(t, key, "edge-a")
	}

	// A different secret gives different keys; digests round-trip.
	other, err := limiter.NewKeySpace("tally", []byte("limiter-tests-other-secret-0123456789"))
	require.NoError(t, err)
	require.NotEqual(t, alice.String(), other.Key("core", "alice").String())
	back, err := e.keys.KeyFromDigest(alice.Digest().String())
	require.NoError(t, err)
	require.Equal(t, alice, back)
	for _, d := range []string{"", "alice", strings.Repeat("A", 32), strings.Repeat("a", 31) + "}", strings.Repeat("a", 33)} {
		_, err := e.keys.KeyFromDigest(d)
		require.ErrorIs(t, err, limiter.ErrInvalidKey, "%q", d)
	}
	for _, p := range []string{"", "Tally", "a{b}", "a:b", strings.Repeat("a", 33)} {
		_, err := limiter.NewKeySpace(p, []byte("limiter-tests-secret-0123456789abcdef"))
		require.ErrorIs(t, err, limiter.ErrInvalidKey, "%q", p)
	}
}

// The scripts keep working after SCRIPT FLUSH, a restart and a promotion:
// NOSCRIPT is recovered from on primaries and replicas, and what was applied
// (windows and producer sequences) survives a promotion.
func TestScriptsSurviveFlushRestartAndPromotion(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "alice")
	g := e.take(t, k, 100, 1, 1)
	e.apply(t, charge("p", 1, k, g.ResetAt, t0, 1))
	require.EqualValues(t, 2, e.checkReplica(t, k).Used)

	// SCRIPT FLUSH on both nodes: each script is sent again once, and
	// counted.
	before := e.store.ScriptReloads()
	require.NoError(t, e.primary.Client().ScriptFlush(ctx).Err())
	require.NoError(t, e.replica.Client().ScriptFlush(ctx).Err())
	require.EqualValues(t, 3, e.take(t, k, 100, 1, 1).Used)
	require.EqualValues(t, 3, e.checkReplica(t, k).Used)
	require.EqualValues(t, 3, e.checkReplica(t, k).Used, "cached again: no reload")
	require.Equal(t, before+2, e.store.ScriptReloads(), "take on the primary, check on the replica")
	require.NoError(t, e.primary.Client().ScriptFlush(ctx).Err())
	require.Equal(t, limiter.Applied, e.apply(t, charge("p", 2, k, g.ResetAt, t0, 1))[0].Outcome)
	require.Equal(t, before+3, e.store.ScriptReloads())

	// The replica restarts (empty cache, resynced data).
	e.replica.Restart()
	require.EqualValues(t, 4, eventually(t, func() (limiter.Window, error) { return e.store.Check(ctx, k) }).Used)

	// The primary restarts empty; the replica resyncs from it (to empty).
	e.primary.Restart()
	e.replica.WaitLinkUp()
	g2 := eventually(t, func() (limiter.Grant, error) {
		return e.store.Take(ctx, k, t0, limiter.TakeArgs{Window: minute, Limit: 100, Need: 1, Want: 1, Producer: "edge-a"})
	})
	require.True(t, g2.Opened, "the restarted primary lost its data (no persistence in tests)")
	res := eventually(t, func() (limiter.ApplyResult, error) {
		return e.store.Apply(ctx, 0, t0, []limiter.Event{charge("p", 3, k, g.ResetAt, t0, 1)})
	})
	require.Equal(t, limiter.Applied, res.Results[0].Outcome)
	require.EqualValues(t, 2, e.checkReplica(t, k).Used)

	// The replica is promoted; a store pointed at it as primary goes on, and
	// knows what was applied.
	e.replica.WaitSynced(e.primary)
	e.replica.Promote()
	// The promoted replica is another primary than the one the shard's
	// windows were written on: the store reseeds it first.
	promoted := newStore(t, []shard.Config{{Name: "s0", Primary: node(e.replica)}}, e.keys, redisstore.Options{Clock: e.clock})
	r := eventually(t, func() (limiter.ApplyResult, error) {
		return promoted.Apply(ctx, 0, t0, []limiter.Event{charge("p", 3, k, g.ResetAt, t0, 1), charge("p", 4, k, g.ResetAt, t0, 1)})
	})
	require.EqualValues(t, 1, promoted.ReseedStats().Reseeds)
	require.Equal(t, []limiter.Outcome{limiter.Duplicate, limiter.Applied}, outcomes(r.Results),
		"producer sequences replicated with the windows")
	g3, err := promoted.Take(ctx, e.keys.Key("core", "bob"), t0, limiter.TakeArgs{Window: minute, Limit: 10, Need: 1, Want: 1, Producer: "edge-a"})
	require.NoError(t, err)
	require.True(t, g3.Opened)
}

// Replica selection: a dead replica is skipped, a replica whose link is down
// is skipped after a probe, and when none is up the read policy decides.
func TestReplicaSelection(t *testing.T) {
	ctx := context.Background()
	p := redistest.Start(t)
	r1, r2 := p.StartReplica(t), p.StartReplica(t)
	clock := limiter.NewManualClock(t0)
	cfg := []shard.Config{{Name: "s0", Primary: node(p), Replicas: []shard.Node{node(r1), node(r2)}}}
	keys, err := limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	k := keys.Key("core", "alice")
	st := newStore(t, cfg, keys, redisstore.Options{Clock: clock})
	failing := newStore(t, cfg, keys, redisstore.Options{Clock: clock, ReadPolicy: shard.ReadFail})
	take := func(n int64) {
		_, err := st.Take(ctx, k, t0, limiter.TakeArgs{Window: minute, Limit: 100, Need: n, Want: n, Producer: "edge-a"})
		require.NoError(t, err)
	}
	take(4)
	r1.WaitSynced(p)
	r2.WaitSynced(p)

	// r1 dies: every check still answers, and r1 is taken out of rotation.
	r1.Stop()
	for range 4 {
		w, err := st.Check(ctx, k)
		require.NoError(t, err)
		require.EqualValues(t, 4, w.Used)
	}
	assert.False(t, st.ReplicaUp(0, 0))
	assert.True(t, st.ReplicaUp(0, 1))

	// r2's link to the primary goes down: it would serve counts that no
	// longer move. A probe takes it out; reads go to the primary.
	require.NoError(t, r2.Client().Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err())
	st.ProbeReplicas(ctx)
	assert.False(t, st.ReplicaUp(0, 1))
	take(1)
	w, err := st.Check(ctx, k)
	require.NoError(t, err)
	require.EqualValues(t, 5, w.Used, "read from the primary")

	// With the fail policy, the same situation is an error.
	failing.ProbeReplicas(ctx)
	_, err = failing.Check(ctx, k)
	require.ErrorIs(t, err, redisstore.ErrNoReplica)

	// r2 rejoins: a probe puts it back.
	require.NoError(t, r2.Client().Do(ctx, "REPLICAOF", "127.0.0.1", fmt.Sprint(p.Port)).Err())
	r2.WaitLinkUp()
	r2.WaitSynced(p)
	failing.ProbeReplicas(ctx)
	w, err = failing.Check(ctx, k)
	require.NoError(t, err)
	require.EqualValues(t, 5, w.Used)

	// A dead replica comes back into rotation after its cooldown.
	clock.Advance(shard.DefaultCooldown)
	assert.True(t, st.ReplicaUp(0, 0), "tried again after the cooldown")
}

// One accountant holds a shard's lease at a time; it lapses when not
// renewed, and its holder can give it up for a quick hand-over.
func TestLease(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	hold := func(owner string, ttl time.Duration) bool {
		l, err := e.store.HoldLease(ctx, 0, owner, ttl)
		require.NoError(t, err)
		require.Zero(t, l.Waited, "a plain renewal does not wait for replicas")
		return l.Held
	}
	require.True(t, hold("a", time.Second))
	require.False(t, hold("b", time.Second), "held by a")
	require.True(t, hold("a", 300*time.Millisecond), "a renews")
	require.NoError(t, e.store.FreeLease(ctx, 0, "b"), "b cannot free a's lease")
	require.False(t, hold("b", time.Second))
	time.Sleep(400 * time.Millisecond) // Redis expires the lease by its own clock
	require.True(t, hold("b", time.Second), "a's lease lapsed")
	require.NoError(t, e.store.FreeLease(ctx, 0, "b"))
	require.True(t, hold("a", time.Second), "freed at once")
}

// ConfirmApplied renews the lease and waits for a replica on the same
// connection (Redis WAIT), which confirms everything applied before it, and
// says so when none confirmed in time.
func TestLeaseConfirmsWhatWasApplied(t *testing.T) {
	e := newEnv(t, redisstore.Options{WaitTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	k := e.keys.Key("core", "alice")
	// Right after a sync a replica may take a moment to acknowledge; once it
	// does, every renewal is confirmed.
	var l redisstore.Lease
	for seq := uint64(1); seq <= 20; seq++ {
		e.apply(t, charge("p", seq, k, time.Time{}, t0, 1))
		var err error
		l, err = e.store.ConfirmApplied(ctx, 0, "acc", time.Second)
		require.NoError(t, err)
		require.True(t, l.Held)
		require.Equal(t, 1, l.Waited)
		if l.Replicated == 1 {
			break
		}
	}
	require.Equal(t, 1, l.Replicated)
	e.replica.WaitSynced(e.primary)

	e.replica.Stop()
	e.apply(t, charge("p", 100, k, time.Time{}, t0, 1))
	start := time.Now()
	l, err := e.store.ConfirmApplied(ctx, 0, "acc", time.Second)
	require.NoError(t, err)
	require.Equal(t, 1, l.Waited)
	require.Zero(t, l.Replicated, "no replica confirmed")
	require.Less(t, time.Since(start), 5*time.Second, "the wait is bounded")

	off := newStore(t, e.config(), e.keys, redisstore.Options{Clock: e.clock, WaitReplicas: -1})
	l, err = off.ConfirmApplied(ctx, 0, "acc", time.Second)
	require.NoError(t, err)
	require.Zero(t, l.Waited)
}
