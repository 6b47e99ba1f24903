package xds_test

import (
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/xds"
)

// A resource reads as the file the reference would make of it: every
// field the resource has, nested descriptors, replaces, unlimited rules.
func TestFile(t *testing.T) {
	c := &rlsconfv3.RateLimitConfig{Name: "api-config", Domain: "api", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "client", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 7, Name: "per-client"}},
		{Key: "path", Value: "/admin", ShadowMode: true, DetailedMetric: true,
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 3}},
		{Key: "tier", Value: "gold", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true,
				Replaces: []*rlsconfv3.RateLimitReplace{{Name: "per-client"}}}}}},
	}}
	a, err := anypb.New(c)
	require.NoError(t, err)
	f, err := xds.File(a)
	require.NoError(t, err)
	assert.Equal(t, "xds:api-config", f.Name)
	rules, err := descriptors.Load([]descriptors.File{f}, descriptors.Options{})
	require.NoError(t, err)
	got := map[string]string{}
	for _, r := range rules.Rules() {
		got[r.Key] = string(r.Unit)
		if r.Unlimited {
			got[r.Key] = "unlimited"
		}
		if r.Shadow {
			got[r.Key] += ",shadow"
		}
	}
	assert.Equal(t, map[string]string{"api.client": "MINUTE", "api.path_/admin": "HOUR,shadow", "api.tier_gold.user": "unlimited"}, got)

	// The reference refuses an unknown unit: so does the file.
	c.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	a, err = anypb.New(c)
	require.NoError(t, err)
	f, err = xds.File(a)
	require.NoError(t, err)
	_, err = descriptors.Load([]descriptors.File{f}, descriptors.Options{})
	require.ErrorContains(t, err, "invalid rate limit unit 'UNKNOWN'")

	// Another type is refused.
	other, err := anypb.New(&rlsconfv3.RateLimitPolicy{})
	require.NoError(t, err)
	_, err = xds.File(other)
	require.Error(t, err)
}

func TestNewChecksItsConfig(t *testing.T) {
	apply := func([]descriptors.File) error { return nil }
	for _, c := range []xds.Config{
		{Apply: apply, BackoffInitial: time.Second, BackoffMax: time.Second},
		{Server: "cp:1", BackoffInitial: time.Second, BackoffMax: time.Second},
		{Server: "cp:1", Apply: apply, BackoffInitial: 2 * time.Second, BackoffMax: time.Second},
	} {
		_, err := xds.New(c)
		require.ErrorIs(t, err, xds.ErrInvalidConfig)
	}
	_, err := xds.New(xds.Config{Server: "cp:1", Apply: apply, BackoffInitial: time.Second, BackoffMax: time.Second})
	require.NoError(t, err)
}
