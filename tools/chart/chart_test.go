// Package chart_test checks the Helm chart (deploy/helm/tally) without a
// cluster: helm lint, then helm template (Helm as a library: the same code
// as the helm command) with the default values and with each example
// values file; every object decoded strictly into its Kubernetes type;
// the security settings of every pod; and the configuration the pods get,
// laid out as their volumes and environment would be, passed to tally
// check-config.
package chart_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

const (
	root      = "../.."
	chartDir  = root + "/deploy/helm/tally"
	namespace = "tally"
)

var kubeVersion = &chartutil.KubeVersion{Version: "v1.31.0", Major: "1", Minor: "31"}

// valueSets are the values the chart is checked with: its defaults and
// each example file.
func valueSets(t *testing.T) map[string]map[string]any {
	t.Helper()
	sets := map[string]map[string]any{"default": {}}
	files, err := filepath.Glob(filepath.Join(chartDir, "values-*.yaml"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 2)
	for _, f := range files {
		v, err := chartutil.ReadValuesFile(f)
		require.NoError(t, err)
		sets[filepath.Base(f)] = v
	}
	return sets
}

// objects is a rendering: every object by kind and name.
type objects struct {
	deployments  map[string]*appsv1.Deployment
	statefulSets map[string]*appsv1.StatefulSet
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	hpas         map[string]*autoscalingv2.HorizontalPodAutoscaler
	pdbs         map[string]*policyv1.PodDisruptionBudget
	policies     map[string]*networkingv1.NetworkPolicy
	accounts     map[string]*corev1.ServiceAccount
	monitors     map[string]*monitoringv1.ServiceMonitor
	rules        map[string]*monitoringv1.PrometheusRule
}

// render is helm template: the chart with vals, as release "tally".
func render(t *testing.T, vals map[string]any) *objects {
	t.Helper()
	rel, err := newInstall().Run(loadChart(t), vals)
	require.NoError(t, err)
	return decode(t, rel.Manifest)
}

// decode reads every document of a manifest into its type, refusing
// unknown fields and duplicate keys.
func decode(t *testing.T, manifest string) *objects {
	t.Helper()
	o := &objects{deployments: map[string]*appsv1.Deployment{}, statefulSets: map[string]*appsv1.StatefulSet{},
		services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		policies: map[string]*networkingv1.NetworkPolicy{}, accounts: map[string]*corev1.ServiceAccount{},
		monitors: map[string]*monitoringv1.ServiceMonitor{}, rules: map[string]*monitoringv1.PrometheusRule{}}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(manifest, -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		js, err := sigsyaml.YAMLToJSONStrict([]byte(doc))
		require.NoError(t, err, "%s", doc)
		var head struct{ APIVersion, Kind string }
		require.NoError(t, json.Unmarshal(js, &head))
		strict := func(into any) {
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.DisallowUnknownFields()
			require.NoError(t, dec.Decode(into), "%s %s:\n%s", head.APIVersion, head.Kind, doc)
		}
		var name string
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			x := &appsv1.Deployment{}
			strict(x)
			name, o.deployments[x.Name] = x.Name, x
		case "apps/v1 StatefulSet":
			x := &appsv1.StatefulSet{}
			strict(x)
			name, o.statefulSets[x.Name] = x.Name, x
		case "v1 Service":
			x := &corev1.Service{}
			strict(x)
			name, o.services[x.Name] = x.Name, x
		case "v1 ConfigMap":
			x := &corev1.ConfigMap{}
			strict(x)
			name, o.configMaps[x.Name] = x.Name, x
		case "v1 Secret":
			x := &corev1.Secret{}
			strict(x)
			name, o.secrets[x.Name] = x.Name, x
		case "v1 ServiceAccount":
			x := &corev1.ServiceAccount{}
			strict(x)
			name, o.accounts[x.Name] = x.Name, x
		case "autoscaling/v2 HorizontalPodAutoscaler":
			x := &autoscalingv2.HorizontalPodAutoscaler{}
			strict(x)
			name, o.hpas[x.Name] = x.Name, x
		case "policy/v1 PodDisruptionBudget":
			x := &policyv1.PodDisruptionBudget{}
			strict(x)
			name, o.pdbs[x.Name] = x.Name, x
		case "networking.k8s.io/v1 NetworkPolicy":
			x := &networkingv1.NetworkPolicy{}
			strict(x)
			name, o.policies[x.Name] = x.Name, x
		case "monitoring.coreos.com/v1 ServiceMonitor":
			x := &monitoringv1.ServiceMonitor{}
			strict(x)
			name, o.monitors[x.Name] = x.Name, x
		case "monitoring.coreos.com/v1 PrometheusRule":
			x := &monitoringv1.PrometheusRule{}
			strict(x)
			name, o.rules[x.Name] = x.Name, x
		default:
			t.Fatalf("the chart renders a %s %s the test does not know", head.APIVersion, head.Kind)
		}
		require.NotEmpty(t, name, "%s without a name", head.Kind)
	}
	return o
}

// helm lint passes with the default values and each example, without an
// error or a warning.
func TestLint(t *testing.T) {
	for name, vals := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			l := lint.AllWithKubeVersion(chartDir, vals, namespace, kubeVersion)
			for _, m := range l.Messages {
				require.Less(t, m.Severity, support.WarningSev, "helm lint: %s", m)
			}
		})
	}
}

// The chart's version is the repository's, and the files it carries are
// deploy/'s, as shipped.
func TestChartCarriesTheShippedFiles(t *testing.T) {
	chrt, err := loader.Load(chartDir)
	require.NoError(t, err)
	version, err := os.ReadFile(filepath.Join(root, "VERSION"))
	require.NoError(t, err)
	require.Equal(t, strings.TrimSpace(string(version)), chrt.Metadata.Version)
	require.Equal(t, strings.TrimSpace(string(version)), chrt.Metadata.AppVersion)
	for copy, shipped := range map[string]string{"files/nats/tally.conf": "deploy/nats/tally.conf", "files/nats/cluster.conf": "deploy/nats/cluster.conf",
		"files/prometheus/alerts.yml": "deploy/prometheus/alerts.yml", "files/grafana/tally.json": "deploy/grafana/tally.json"} {
		want, err := os.ReadFile(filepath.Join(root, shipped))
		require.NoError(t, err)
		require.Equal(t, string(want), string(fileOf(chrt, copy)), "%s is a copy of %s: copy it again", copy, shipped)
	}
}

func fileOf(c *chart.Chart, name string) []byte {
	for _, f := range c.Files {
		if f.Name == name {
			return f.Data
		}
	}
	return nil
}

// Every value of values.yaml is in the chart's README.
func TestReadmeListsEveryValue(t *testing.T) {
	vals, err := chartutil.ReadValuesFile(filepath.Join(chartDir, "values.yaml"))
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	require.NoError(t, err)
	var keys []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			key := prefix + k
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 && key != "config" && !strings.HasSuffix(key, "resources") && !strings.HasSuffix(key, "labels") {
				walk(key+".", sub)
				continue
			}
			keys = append(keys, key)
		}
	}
	walk("", vals)
	sort.Strings(keys)
	for _, k := range keys {
		require.Contains(t, string(readme), "| `"+k+"` |", "README.md lists %s", k)
	}
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	require.NoError(t, err)
	return chrt
}

func newInstall() *action.Install {
	install := action.NewInstall(&action.Configuration{})
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace, install.KubeVersion = "tally", namespace, kubeVersion
	return install
}

func mustCompile(expr string) *regexp.Regexp { return regexp.MustCompile(expr) }
