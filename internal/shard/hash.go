package shard

import (
	"hash/fnv"
)

// Map places keys on shards by rendezvous hashing over shard names.
// It is immutable and safe for concurrent use.
type Map struct {
	seeds []uint64
}

// NewMap returns the map for the named shards, in configuration order:
// Pick returns indexes into names.
func NewMap(names []string) *Map {
	m := &Map{seeds: make([]uint64, len(names))}
	for i, n := range names {
		h := fnv.New64a()
		h.Write([]byte(n))
		m.seeds[i] = h.Sum64()
	}
	return m
}

// Len is the number of shards.
func (m *Map) Len() int { return len(m.seeds) }

// Pick returns the index of the shard that owns a key with the given 64-bit
// hash. The hash must be uniformly distributed and not chosen by clients
// (limiter.Key.Hash is both). Pick panics on an empty map.
func (m *Map) Pick(keyHash uint64) int {
	best, bestScore := 0, uint64(0)
	for i, seed := range m.seeds {
		if s := mix(keyHash ^ seed); i == 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

// mix is the SplitMix64 finaliser: a bijection that spreads every input bit
// over the output, so that scores for different shards are independent.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
