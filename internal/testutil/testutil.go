// Package testutil holds the helpers the tests of several packages share:
// waiting for a condition with a bound, and a log destination tests read
// while a server writes to it. It is imported by tests only.
package testutil

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// WaitFor polls cond every 20 ms until it holds, failing t after 30 s:
// for what a server does in the background (apply, publish, converge). The
// bound is generous: a machine whose cores are busy with other work (a CI
// runner, the whole suite at once) takes several times what an idle one
// does, and the bound is only reached by a test that fails.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	WaitForWithin(t, what, 30*time.Second, cond)
}

// WaitForWithin is WaitFor with its own bound.
func WaitForWithin(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
	}
}

// Buffer is a bytes.Buffer safe for concurrent writers: a log destination
// a test reads while the code under test writes.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
