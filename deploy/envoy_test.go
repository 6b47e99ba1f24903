package deploy_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/descriptors"
)

// The Envoy example is a valid Envoy bootstrap (Envoy's own protocol
// buffers and their validation rules), its rate-limit filter asks for a
// domain the shipped rules have, with the descriptor keys they limit, and
// Tally's configuration beside it loads, run from the repository's root as
// docs/envoy.md says.
func TestEnvoyExample(t *testing.T) {
	raw, err := os.ReadFile("envoy/envoy.yaml")
	require.NoError(t, err)
	var doc any
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	js, err := json.Marshal(doc)
	require.NoError(t, err)
	var b bootstrapv3.Bootstrap
	require.NoError(t, protojson.Unmarshal(js, &b))
	require.NoError(t, b.ValidateAll())

	var filter *ratelimitv3.RateLimit
	hcm := b.StaticResources.Listeners[0].FilterChains[0].Filters[0]
	// The rate-limit filter's own configuration, decoded on its own.
	var cfg struct {
		StaticResources struct {
			Listeners []struct {
				FilterChains []struct {
					Filters []struct {
						TypedConfig struct {
							HTTPFilters []struct {
								Name        string         `json:"name"`
								TypedConfig map[string]any `json:"typed_config"`
							} `json:"http_filters"`
						} `json:"typed_config"`
					} `json:"filters"`
				} `json:"filter_chains"`
			} `json:"listeners"`
		} `json:"static_resources"`
	}
	require.NoError(t, json.Unmarshal(js, &cfg))
	require.Equal(t, "envoy.filters.network.http_connection_manager", hcm.Name)
	for _, f := range cfg.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig.HTTPFilters {
		if f.Name == "envoy.filters.http.ratelimit" {
			delete(f.TypedConfig, "@type")
			fj, err := json.Marshal(f.TypedConfig)
			require.NoError(t, err)
			filter = &ratelimitv3.RateLimit{}
			require.NoError(t, protojson.Unmarshal(fj, filter))
		}
	}
	require.NotNil(t, filter)

	rules, err := descriptors.LoadDir("envoy/ratelimit", descriptors.Options{})
	require.NoError(t, err)
	require.True(t, rules.Known(filter.Domain), "the filter's domain %q has rules", filter.Domain)
	for _, key := range []string{"remote_address", "token"} {
		m := rules.Match(filter.Domain, []descriptors.Entry{{Key: key, Value: "x"}})
		require.NotNil(t, m.Rule, "a rule limits %s", key)
	}

	t.Chdir("..")
	_, err = config.Load("deploy/envoy/tally.yaml", func(k string) string {
		return map[string]string{config.EnvKeySecret: strings.Repeat("ab", 32)}[k]
	})
	require.NoError(t, err)
}
