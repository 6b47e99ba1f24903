package credit

import (
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

// The departed cache holds no pointer: the collector never marks it,
// however many keys it remembers.
func TestDepartedHoldsNoPointers(t *testing.T) {
	var walk func(reflect.Type) bool
	walk = func(ty reflect.Type) bool {
		switch ty.Kind() {
		case reflect.Bool, reflect.Int32, reflect.Int64, reflect.Uint8, reflect.Uint64:
			return true
		case reflect.Array:
			return walk(ty.Elem())
		case reflect.Struct:
			for i := range ty.NumField() {
				if !walk(ty.Field(i).Type) {
					t.Errorf("%s.%s is a %s", ty.Name(), ty.Field(i).Name, ty.Field(i).Type)
					return false
				}
			}
			return true
		}
		return false
	}
	require.True(t, walk(reflect.TypeOf(departedSlot{})))
}

// digestOf is a digest for i, its first eight bytes (what the cache
// places by) mixed as a real digest's are.
func digestOf(i int) limiter.Digest {
	z := uint64(i) + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	var d limiter.Digest
	binary.BigEndian.PutUint64(d[:8], z^z>>31)
	binary.BigEndian.PutUint64(d[8:], uint64(i))
	return d
}

// The ring keeps the identities put last, as many as it has slots: one
// more forgets the oldest, putting a digest again makes its identity the
// newest, and an identity is taken once.
func TestDepartedKeepsTheLastPut(t *testing.T) {
	p := &departed{ring: make([]departedSlot, 2), index: map[limiter.Digest]int32{}}
	a, b, c := digestOf(1), digestOf(2), digestOf(3)
	p.put(a, identity{holderNum: 1})
	p.put(b, identity{holderNum: 2})
	p.put(a, identity{holderNum: 11}) // a again, now the newest: b is the oldest
	p.put(c, identity{holderNum: 3})  // forgets b
	_, ok := p.take(b)
	require.False(t, ok)
	id, ok := p.take(a)
	require.True(t, ok)
	require.EqualValues(t, 11, id.holderNum)
	id, ok = p.take(c)
	require.True(t, ok)
	require.EqualValues(t, 3, id.holderNum)
	_, ok = p.take(c) // taken once only
	require.False(t, ok)
	require.Empty(t, p.index)
}

// Every identity is still there when its key comes back after fewer other
// keys left the table than the cache has slots (twice the table's keys),
// whatever the digests; after as many as it has slots, none is.
func TestDepartedKeepsIdentitiesForItsCapacity(t *testing.T) {
	const keys, n = 4096, 40_000
	for _, tc := range []struct {
		between int
		kept    bool
	}{{keys, true}, {departedSlots*keys - 1, true}, {departedSlots * keys, false}} {
		p := newDeparted(keys)
		hits := 0
		for i := range n + tc.between {
			if i < n {
				p.put(digestOf(i), identity{holderNum: uint64(i)})
			}
			if j := i - tc.between; j >= 0 {
				if id, ok := p.take(digestOf(j)); ok {
					require.EqualValues(t, j, id.holderNum)
					hits++
				}
			}
		}
		if tc.kept {
			require.Equal(t, n, hits, "%d others left between: every identity kept", tc.between)
		} else {
			// Only those after which the puts stopped, fewer than the
			// slots following them.
			require.Equal(t, tc.between, hits, "%d others left between: none kept but the last", tc.between)
		}
	}
}
