package shard_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/shard"
)

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("shard-%d", i)
	}
	return out
}

func keyHashes(n int) []uint64 {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]uint64, n)
	for i := range out {
		out[i] = r.Uint64()
	}
	return out
}

func TestPickIsStableAndBalanced(t *testing.T) {
	const keys = 100_000
	m := shard.NewMap(names(8))
	again := shard.NewMap(names(8))
	counts := make([]int, 8)
	for _, h := range keyHashes(keys) {
		i := m.Pick(h)
		require.Equal(t, i, again.Pick(h), "same configuration, same shard")
		counts[i]++
	}
	for i, c := range counts {
		assert.InDelta(t, keys/8, c, keys/8*0.05, "shard %d holds %d keys", i, c)
	}
}

func TestPickDoesNotDependOnOrder(t *testing.T) {
	a := names(5)
	b := []string{a[3], a[0], a[4], a[2], a[1]}
	ma, mb := shard.NewMap(a), shard.NewMap(b)
	for _, h := range keyHashes(10_000) {
		require.Equal(t, a[ma.Pick(h)], b[mb.Pick(h)])
	}
}

// Adding a shard moves only the keys the new shard wins, about 1/(n+1);
// removing one moves only its own keys.
func TestPickMovesFewKeys(t *testing.T) {
	const keys = 100_000
	for _, n := range []int{1, 2, 4, 8} {
		t.Run(fmt.Sprintf("%d to %d", n, n+1), func(t *testing.T) {
			before, after := shard.NewMap(names(n)), shard.NewMap(names(n+1))
			moved := 0
			for _, h := range keyHashes(keys) {
				from, to := before.Pick(h), after.Pick(h)
				if from != to {
					moved++
					require.Equal(t, n, to, "a key moved between two old shards")
				}
			}
			want := float64(keys) / float64(n+1)
			assert.InDelta(t, want, float64(moved), want*0.05)
		})
	}
	t.Run("remove one", func(t *testing.T) {
		all := names(5)
		without := append(append([]string(nil), all[:2]...), all[3:]...)
		ma, mw := shard.NewMap(all), shard.NewMap(without)
		for _, h := range keyHashes(keys) {
			if from := all[ma.Pick(h)]; from != all[2] {
				require.Equal(t, from, without[mw.Pick(h)], "a key of a remaining shard moved")
			}
		}
	})
}

func TestValidate(t *testing.T) {
	ok := shard.Config{Name: "a", Primary: shard.Node{Addr: "127.0.0.1:6379"}, Replicas: []shard.Node{{Addr: "127.0.0.1:6380"}}}
	require.NoError(t, shard.Validate([]shard.Config{ok}))
	sentinel := shard.Sentinel{Master: "m", Addrs: []string{"127.0.0.1:26379", "127.0.0.1:26380"}}
	// Sentinel shards share sentinels, and a fixed shard may sit beside them.
	require.NoError(t, shard.Validate([]shard.Config{ok, {Name: "b", Sentinel: &sentinel},
		{Name: "c", Sentinel: &shard.Sentinel{Master: "n", Addrs: sentinel.Addrs}}}))
	cases := map[string]struct {
		shards []shard.Config
		want   string
	}{
		"none":           {nil, "no shards"},
		"bad name":       {[]shard.Config{{Name: "A b", Primary: ok.Primary}}, "shards[0].name"},
		"duplicate name": {[]shard.Config{ok, {Name: "a", Primary: shard.Node{Addr: "127.0.0.1:7000"}}}, "duplicate shard name"},
		"no port":        {[]shard.Config{{Name: "a", Primary: shard.Node{Addr: "localhost"}}}, "shards[0].primary"},
		"bad port":       {[]shard.Config{{Name: "a", Primary: shard.Node{Addr: "h:99999"}}}, "bad port"},
		"bad replica":    {[]shard.Config{{Name: "a", Primary: ok.Primary, Replicas: []shard.Node{{Addr: ":1"}}}}, "shards[0].replicas[0]"},
		"negative db":    {[]shard.Config{{Name: "a", Primary: shard.Node{Addr: "h:1", DB: -1}}}, "db -1"},
		"shared node": {[]shard.Config{ok, {Name: "b", Primary: shard.Node{Addr: "127.0.0.1:6380"}}},
			"shards[1].primary: 127.0.0.1:6380 is already shards[0].replicas[0]"},
		"sentinel and addresses": {[]shard.Config{{Name: "a", Primary: ok.Primary, Sentinel: &sentinel}}, "not both"},
		"sentinel, no master":    {[]shard.Config{{Name: "a", Sentinel: &shard.Sentinel{Addrs: sentinel.Addrs}}}, "shards[0].sentinel.master"},
		"sentinel, no addrs":     {[]shard.Config{{Name: "a", Sentinel: &shard.Sentinel{Master: "m"}}}, "no sentinels"},
		"sentinel, bad addr": {[]shard.Config{{Name: "a", Sentinel: &shard.Sentinel{Master: "m", Addrs: []string{"h"}}}},
			"shards[0].sentinel.addrs[0]"},
		"one master, two shards": {[]shard.Config{{Name: "a", Sentinel: &sentinel}, {Name: "b", Sentinel: &sentinel}},
			"shards[1].sentinel.master: \"m\" is already shards[0].sentinel"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			err := shard.Validate(c.shards)
			require.ErrorIs(t, err, shard.ErrInvalidConfig)
			require.ErrorContains(t, err, c.want)
		})
	}
	// Two databases of one server are two keyspaces.
	require.NoError(t, shard.Validate([]shard.Config{
		{Name: "a", Primary: shard.Node{Addr: "h:1"}}, {Name: "b", Primary: shard.Node{Addr: "h:1", DB: 1}},
	}))
	require.NoError(t, shard.ReadPrimary.Validate())
	require.ErrorIs(t, shard.ReadPolicy("maybe").Validate(), shard.ErrInvalidConfig)
}

func TestReplicasRotateAndCoolDown(t *testing.T) {
	now := time.Unix(1000, 0)
	r := shard.NewReplicas(3, time.Second)
	firsts := map[int]int{}
	for range 30 {
		c := r.Candidates(now, nil)
		require.Len(t, c, 3)
		firsts[c[0]]++
	}
	require.Equal(t, map[int]int{0: 10, 1: 10, 2: 10}, firsts, "reads rotate over the replicas")

	r.MarkDown(1, now)
	for range 6 {
		require.NotContains(t, r.Candidates(now.Add(999*time.Millisecond), nil), 1)
	}
	require.Contains(t, r.Candidates(now.Add(time.Second), nil), 1, "tried again after the cooldown")
	r.MarkDown(0, now)
	r.MarkDown(2, now)
	r.MarkUp(1)
	require.Equal(t, []int{1}, r.Candidates(now.Add(500*time.Millisecond), nil))
	r.MarkDown(1, now)
	require.Empty(t, r.Candidates(now, nil))
	require.Empty(t, shard.NewReplicas(0, 0).Candidates(now, nil))
}
