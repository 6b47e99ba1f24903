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

// A set keeps the two identities put last: a third forgets the older, and
// putting a digest again replaces its own.
func TestDepartedSetKeepsTheLastTwo(t *testing.T) {
	p := &departed{sets: make([][departedWays]departedSlot, 1)}
	a, b, c := digestOf(1), digestOf(2), digestOf(3)
	p.put(a, identity{holderNum: 1})
	p.put(b, identity{holderNum: 2})
	p.put(a, identity{holderNum: 11}) // a again: b stays
	id, ok := p.take(b)
	require.True(t, ok)
	require.EqualValues(t, 2, id.holderNum)
	p.put(b, identity{holderNum: 22})
	p.put(c, identity{holderNum: 3}) // forgets a, the older
	_, ok = p.take(a)
	require.False(t, ok)
	id, ok = p.take(c)
	require.True(t, ok)
	require.EqualValues(t, 3, id.holderNum)
	id, ok = p.take(b)
	require.True(t, ok)
	require.EqualValues(t, 22, id.holderNum)
	_, ok = p.take(b) // taken once only
	require.False(t, ok)
}

// Over a stretch in which as many other keys leave the table as it holds,
// most identities are still there when their keys come back: about three
// in four with two slots a set (2/e), where one slot a key keeps 1/e.
func TestDepartedKeepsMostIdentities(t *testing.T) {
	const keys, n = 4096, 40_000
	p := newDeparted(keys)
	hits := 0
	for i := range n + keys {
		if i < n {
			p.put(digestOf(i), identity{holderNum: uint64(i)})
		}
		if j := i - keys; j >= 0 {
			if id, ok := p.take(digestOf(j)); ok {
				require.EqualValues(t, j, id.holderNum)
				hits++
			}
		}
	}
	require.Greater(t, float64(hits)/n, 0.68, "identities kept: %d of %d", hits, n)
}
