package chart_test

import (
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chartutil"
	networkingv1 "k8s.io/api/networking/v1"
)

// With NetworkPolicies on, each role reaches only what it needs: edges
// and accountants DNS, Redis's ports and NATS (edges also the upstream's
// port), accountants accept only their admin port, the bundled NATS
// accepts clients only from Tally's pods (and the clients named), routes
// only from its own servers.
func TestNetworkPolicies(t *testing.T) {
	ports := func(rules []networkingv1.NetworkPolicyPort) []int {
		var out []int
		for _, p := range rules {
			out = append(out, p.Port.IntValue())
		}
		sort.Ints(out)
		return out
	}
	egress := func(np *networkingv1.NetworkPolicy) []int {
		var out []int
		for _, r := range np.Spec.Egress {
			out = append(out, ports(r.Ports)...)
			require.NotEmpty(t, r.To, "%s: every egress rule names its destination", np.Name)
		}
		sort.Ints(out)
		return out
	}
	ingress := func(np *networkingv1.NetworkPolicy) []int {
		var out []int
		for _, r := range np.Spec.Ingress {
			out = append(out, ports(r.Ports)...)
		}
		sort.Ints(out)
		return out
	}

	external, err := chartutil.ReadValuesFile(filepath.Join(chartDir, "values-external-nats-sentinel.yaml"))
	require.NoError(t, err)
	o := render(t, external)
	edge, acc := o.policies["tally-edge"], o.policies["tally-accountant"]
	require.NotNil(t, edge)
	require.NotNil(t, acc)
	require.NotContains(t, o.policies, "tally-nats", "no bundled NATS, no policy for it")
	require.Equal(t, []int{53, 53, 4222, 6379, 8080, 26379}, egress(edge), "edge: DNS, NATS, Redis and sentinels, the upstream")
	require.Equal(t, []int{53, 53, 4222, 6379, 26379}, egress(acc), "accountant: DNS, NATS, Redis and sentinels")
	require.Equal(t, []int{8080, 8081, 8082, 8083, 9090}, ingress(edge), "edge: its doors and its admin port")
	require.Equal(t, []int{9091}, ingress(acc), "accountant: its admin port only")
	for _, r := range edge.Spec.Egress {
		for _, to := range r.To {
			if to.IPBlock != nil {
				require.NotEqual(t, "0.0.0.0/0", to.IPBlock.CIDR, "the example names where Redis, NATS and the upstream are")
			}
		}
	}
	require.NotEmpty(t, edge.Spec.Ingress[0].From, "the doors only from the clients named")

	bundled, err := chartutil.ReadValuesFile(filepath.Join(chartDir, "values-bundled-nats-shards.yaml"))
	require.NoError(t, err)
	o = render(t, bundled)
	nats := o.policies["tally-nats"]
	require.NotNil(t, nats)
	require.Equal(t, []int{53, 53, 6222}, egress(nats), "NATS: DNS and its own routes")
	for _, r := range nats.Spec.Ingress {
		switch ports(r.Ports)[0] {
		case 4222:
			require.Len(t, r.From, 2, "clients: edges and accountants (no other client named)")
			require.Equal(t, "edge", r.From[0].PodSelector.MatchLabels["app.kubernetes.io/component"])
			require.Equal(t, "accountant", r.From[1].PodSelector.MatchLabels["app.kubernetes.io/component"])
		case 6222:
			require.Len(t, r.From, 1)
			require.Equal(t, "nats", r.From[0].PodSelector.MatchLabels["app.kubernetes.io/component"])
		}
	}
	for _, r := range o.policies["tally-edge"].Spec.Egress {
		for _, to := range r.To {
			if to.PodSelector != nil && to.NamespaceSelector == nil {
				require.Equal(t, "nats", to.PodSelector.MatchLabels["app.kubernetes.io/component"], "edges reach the bundled NATS by its pods")
			}
		}
	}
}
