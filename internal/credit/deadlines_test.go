package credit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Requests whose deadlines fall in the same tick share a channel; it is
// closed only once the deadline has passed, and a deadline already past
// is closed at once.
func TestDeadlinesShareATick(t *testing.T) {
	d := newDeadlines(50 * time.Millisecond)
	// The start of a tick, so that both deadlines fall in the one after.
	at := time.Unix(0, (time.Now().Add(time.Second).UnixNano()/d.tick+1)*d.tick)
	a, b := d.after(at.Add(time.Millisecond)), d.after(at.Add(40*time.Millisecond))
	require.Equal(t, a, b, "one channel for one tick")
	require.NotEqual(t, a, d.after(at.Add(60*time.Millisecond)), "another for the next")
	select {
	case <-a:
		t.Fatal("closed before its deadline")
	default:
	}
	select {
	case <-a:
		require.False(t, time.Now().Before(at.Add(40*time.Millisecond)), "closed before the later deadline of its tick")
	case <-time.After(30 * time.Second):
		t.Fatal("never closed")
	}
	select {
	case <-d.after(time.Now().Add(-time.Second)):
	case <-time.After(30 * time.Second):
		t.Fatal("a deadline past is not closed")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	require.NotContains(t, d.slots, (at.UnixNano()+int64(time.Millisecond))/d.tick+1, "a closed tick is forgotten")
}
