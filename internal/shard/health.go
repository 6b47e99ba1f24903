package shard

import (
	"sync"
	"sync/atomic"
	"time"
)

// DefaultCooldown is how long a replica stays out of rotation after a failure
// when Replicas is given no cooldown.
const DefaultCooldown = time.Second

// Replicas tracks which replicas of one shard are up and rotates reads over
// them. It is safe for concurrent use.
type Replicas struct {
	cooldown time.Duration
	next     atomic.Uint64

	mu        sync.Mutex
	downUntil []time.Time // zero: up
}

// NewReplicas tracks n replicas, all up. A replica marked down stays out of
// rotation for cooldown (DefaultCooldown when cooldown <= 0).
func NewReplicas(n int, cooldown time.Duration) *Replicas {
	if cooldown <= 0 {
		cooldown = DefaultCooldown
	}
	return &Replicas{cooldown: cooldown, downUntil: make([]time.Time, n)}
}

// Candidates appends to buf, and returns, the replicas to try for one read
// at time now, in order: those that are up (or whose cooldown has passed),
// starting at the next one in rotation. The result is empty when every
// replica is down. Pass a stack buffer to keep reads allocation-free.
func (r *Replicas) Candidates(now time.Time, buf []int) []int {
	n := len(r.downUntil)
	if n == 0 {
		return buf
	}
	start := int(r.next.Add(1) % uint64(n))
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range n {
		i := (start + k) % n
		if !now.Before(r.downUntil[i]) {
			buf = append(buf, i)
		}
	}
	return buf
}

// MarkDown takes replica i out of rotation until now + cooldown.
func (r *Replicas) MarkDown(i int, now time.Time) {
	r.mu.Lock()
	r.downUntil[i] = now.Add(r.cooldown)
	r.mu.Unlock()
}

// MarkUp puts replica i back into rotation at once.
func (r *Replicas) MarkUp(i int) {
	r.mu.Lock()
	r.downUntil[i] = time.Time{}
	r.mu.Unlock()
}

// Up reports whether replica i is in rotation at time now.
func (r *Replicas) Up(i int, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !now.Before(r.downUntil[i])
}
