package chart_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/ratelimitenv"
	"github.com/tallyhq/tally/internal/testpki"
)

// strictly decodes one YAML document into into, refusing unknown fields.
func strictly(t *testing.T, doc []byte, into any) {
	t.Helper()
	js, err := sigsyaml.YAMLToJSONStrict(doc)
	require.NoError(t, err, "%s", doc)
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(into), "%s", doc)
}

func documents(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out [][]byte
	for _, d := range strings.Split(string(b), "\n---\n") {
		if strings.TrimSpace(stripComments(d)) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// envoyGateway is the part of Envoy Gateway's EnvoyGateway resource that
// deploy/envoy-gateway sets; the container's and pod's fields are
// Kubernetes' own types (as in Envoy Gateway's KubernetesContainerSpec and
// KubernetesPodSpec), decoded strictly.
type envoyGateway struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Gateway    struct {
		ControllerName string `json:"controllerName"`
	} `json:"gateway"`
	Logging struct {
		Level map[string]string `json:"level"`
	} `json:"logging"`
	Provider struct {
		Type       string `json:"type"`
		Kubernetes struct {
			RateLimitDeployment struct {
				Container struct {
					Image        string               `json:"image"`
					Env          []corev1.EnvVar      `json:"env"`
					VolumeMounts []corev1.VolumeMount `json:"volumeMounts"`
				} `json:"container"`
				Pod struct {
					Volumes []corev1.Volume `json:"volumes"`
				} `json:"pod"`
			} `json:"rateLimitDeployment"`
		} `json:"kubernetes"`
	} `json:"provider"`
	RateLimit struct {
		Backend struct {
			Type  string `json:"type"`
			Redis struct {
				URL string `json:"url"`
			} `json:"redis"`
		} `json:"backend"`
	} `json:"rateLimit"`
}

// The Envoy Gateway configuration of docs/envoy-gateway.md decodes
// strictly, and the rate-limit Deployment Envoy Gateway makes of it — its
// own environment (internal/infrastructure/kubernetes/ratelimit/
// resource.go) plus ours, the volume mounted where TALLY_DATA_DIR says —
// is a configuration Tally accepts.
func TestEnvoyGatewayManifests(t *testing.T) {
	docs := documents(t, root+"/deploy/envoy-gateway/envoy-gateway-config.yaml")
	require.Len(t, docs, 1)
	var cm corev1.ConfigMap
	strictly(t, docs[0], &cm)
	require.Equal(t, "envoy-gateway-config", cm.Name)
	require.Equal(t, "envoy-gateway-system", cm.Namespace)
	var eg envoyGateway
	strictly(t, []byte(cm.Data["envoy-gateway.yaml"]), &eg)
	require.Equal(t, "gateway.envoyproxy.io/v1alpha1 EnvoyGateway", eg.APIVersion+" "+eg.Kind)
	rl := eg.Provider.Kubernetes.RateLimitDeployment
	require.True(t, strings.HasPrefix(rl.Container.Image, "ghcr.io/tallyhq/tally:"), rl.Container.Image)
	var secret corev1.Secret
	for _, d := range documents(t, root+"/deploy/envoy-gateway/tally-secret.yaml") {
		strictly(t, d, &secret)
	}

	// What Envoy Gateway sets (with its TLS files made here), then ours.
	ca := testpki.NewCA(t, "envoy gateway CA")
	cert, key := ca.Server("envoy-ratelimit")
	env := map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
		"LOG_LEVEL": "info", "USE_STATSD": "false", "CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001",
		"CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": cert,
		"GRPC_SERVER_TLS_KEY": key, "GRPC_SERVER_TLS_CA_CERT": ca.File, "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": cert, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": key, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": ca.File,
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": eg.RateLimit.Backend.Redis.URL,
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
	}
	secretRefs := 0
	for _, e := range rl.Container.Env {
		if e.ValueFrom != nil {
			require.NotNil(t, e.ValueFrom.SecretKeyRef, e.Name)
			require.Equal(t, secret.Name, e.ValueFrom.SecretKeyRef.Name)
			require.Contains(t, secret.StringData, e.ValueFrom.SecretKeyRef.Key)
			env[e.Name] = strings.Repeat("5e", 32)
			secretRefs++
			continue
		}
		env[e.Name] = e.Value
	}
	require.Equal(t, 1, secretRefs, "the key secret comes from the Secret")
	checkDataDir(t, env, rl.Container.VolumeMounts, rl.Pod.Volumes)
	res, err := ratelimitenv.Read(func(k string) string { return env[k] }, ratelimitenv.Options{DataDir: env["TALLY_DATA_DIR"]})
	require.NoError(t, err)
	cfg, err := config.Parse(res.File, func(k string) string { return env[k] })
	require.NoError(t, err, "%s", res.File)
	require.True(t, cfg.Edge.RLS.XDS.On())
	require.Equal(t, "envoy-ratelimit", cfg.Edge.RLS.XDS.NodeID)
	require.Equal(t, "0.0.0.0:8081", cfg.Edge.RLS.Listen)
	require.Equal(t, ":19001", cfg.Edge.Metrics.Listen)
}

// checkDataDir: the data directory is a mounted emptyDir.
func checkDataDir(t *testing.T, env map[string]string, mounts []corev1.VolumeMount, volumes []corev1.Volume) {
	t.Helper()
	dir := env["TALLY_DATA_DIR"]
	require.NotEmpty(t, dir)
	var volume string
	for _, m := range mounts {
		if m.MountPath == dir {
			volume = m.Name
			require.False(t, m.ReadOnly)
		}
	}
	require.NotEmpty(t, volume, "%s is mounted", dir)
	found := false
	for _, v := range volumes {
		if v.Name == volume {
			require.NotNil(t, v.EmptyDir, "%s is an emptyDir", volume)
			found = true
		}
	}
	require.True(t, found, "the pod has the volume %s", volume)
}

// Istio's global rate-limit sample with Tally's image (docs/istio.md)
// decodes strictly; its ratelimit Deployment runs the reference's command
// with the reference's environment, its probe is on the HTTP port the
// settings serve, and the settings are a configuration Tally accepts.
func TestIstioManifests(t *testing.T) {
	var dep *appsv1.Deployment
	kinds := map[string]int{}
	for _, d := range documents(t, root+"/deploy/istio/rate-limit-service.yaml") {
		var head struct{ APIVersion, Kind string }
		js, err := sigsyaml.YAMLToJSON(d)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(js, &head))
		kinds[head.Kind]++
		switch head.APIVersion + " " + head.Kind {
		case "v1 Service":
			strictly(t, d, &corev1.Service{})
		case "apps/v1 Deployment":
			x := &appsv1.Deployment{}
			strictly(t, d, x)
			if x.Name == "ratelimit" {
				dep = x
			}
		default:
			t.Fatalf("unexpected %s %s", head.APIVersion, head.Kind)
		}
	}
	require.Equal(t, map[string]int{"Service": 2, "Deployment": 2}, kinds)
	require.NotNil(t, dep)
	c := dep.Spec.Template.Spec.Containers[0]
	require.Equal(t, []string{"/bin/ratelimit"}, c.Command)
	require.True(t, strings.HasPrefix(c.Image, "ghcr.io/tallyhq/tally:"), c.Image)
	rules := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(rules, "ratelimit", "config"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(rules, "ratelimit", "config", "config.yaml"),
		[]byte("domain: echo-ratelimit\ndescriptors:\n  - key: PATH\n    value: \"/\"\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o600))
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			require.Equal(t, "tally", e.ValueFrom.SecretKeyRef.Name)
			env[e.Name] = strings.Repeat("5e", 32)
			continue
		}
		env[e.Name] = e.Value
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == filepath.Join(env["RUNTIME_ROOT"], env["RUNTIME_SUBDIRECTORY"], "config") {
			mounted = true
		}
	}
	require.True(t, mounted, "the rules' ConfigMap is mounted where RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config says")
	checkDataDir(t, env, c.VolumeMounts, dep.Spec.Template.Spec.Volumes)
	require.Equal(t, "/healthcheck", c.ReadinessProbe.HTTPGet.Path)
	require.Equal(t, int32(8080), c.ReadinessProbe.HTTPGet.Port.IntVal)
	env["RUNTIME_ROOT"] = rules // the ConfigMap's files, here
	res, err := ratelimitenv.Read(func(k string) string { return env[k] }, ratelimitenv.Options{DataDir: env["TALLY_DATA_DIR"]})
	require.NoError(t, err)
	cfg, err := config.Parse(res.File, func(k string) string { return env[k] })
	require.NoError(t, err, "%s", res.File)
	require.Equal(t, "[::]:8081", cfg.Edge.RLS.Listen)
	require.Equal(t, "[::]:8080", cfg.Edge.RLS.HTTPListen)
	require.Equal(t, []string{"echo-ratelimit"}, cfg.Descriptors().Domains())
}
