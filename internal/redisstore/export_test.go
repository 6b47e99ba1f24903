package redisstore

import (
	"context"

	"github.com/tallyhq/tally/internal/limiter"
)

// SendClaims sends claims to shard i's primary as a reseed of epoch would.
func (s *Store) SendClaims(ctx context.Context, i int, epoch string, claims []limiter.Claim) error {
	return s.sendClaims(ctx, i, epoch, claims)
}
