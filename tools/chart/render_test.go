package chart_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/tallyhq/tally/internal/cli"
	"github.com/tallyhq/tally/internal/testpki"
)

// Each values set renders objects that decode strictly into their
// Kubernetes types; every pod runs non-root on a read-only root file
// system, without privilege escalation or capabilities, with resource
// requests; the edge has its HPA, PDB, probes and a Service with the port
// of each door that is on; the configuration the pods get passes tally
// check-config.
func TestTemplate(t *testing.T) {
	for name, vals := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			o := render(t, vals)
			edge, acc := o.deployments["tally-edge"], o.deployments["tally-accountant"]
			require.NotNil(t, edge, "the edge-checkers' Deployment")
			require.NotNil(t, acc, "the accountants' Deployment")
			require.Len(t, o.deployments, 2)
			for _, d := range o.deployments {
				checkPod(t, d.Name, d.Spec.Template.Spec)
				require.Contains(t, d.Spec.Template.Annotations, "checksum/config", "%s rolls out when its configuration changes", d.Name)
			}
			for _, s := range o.statefulSets {
				checkPod(t, s.Name, s.Spec.Template.Spec)
			}
			checkEdge(t, o, vals)
			cfg := o.configMaps["tally-config"].Data["tally.yaml"]
			require.NotEmpty(t, cfg)
			shards := strings.Count(cfg, "- name: s")
			require.GreaterOrEqual(t, int(*acc.Spec.Replicas), max(2, shards), "accountants for the shards")
			for _, d := range o.deployments {
				checkConfig(t, o, d)
			}
			if _, bundled := o.statefulSets["tally-nats"]; bundled {
				checkBundledNATS(t, o)
			}
			for _, sec := range o.secrets {
				for k, v := range sec.StringData {
					for _, cm := range o.configMaps {
						for f, text := range cm.Data {
							require.NotContains(t, text, v, "secret %s/%s is not in ConfigMap %s/%s", sec.Name, k, cm.Name, f)
						}
					}
				}
			}
			for _, np := range o.policies {
				require.ElementsMatch(t, []string{"Ingress", "Egress"}, policyTypes(np.Spec.PolicyTypes), "%s denies what it does not allow, both ways", np.Name)
			}
			for _, r := range o.rules {
				require.NotEmpty(t, r.Spec.Groups)
				require.NotEmpty(t, r.Spec.Groups[0].Rules)
			}
		})
	}
}

// The checksum annotation changes with the configuration (a rollout), and
// only then.
func TestChecksumFollowsTheConfiguration(t *testing.T) {
	sum := func(vals map[string]any) string {
		return render(t, vals).deployments["tally-edge"].Spec.Template.Annotations["checksum/config"]
	}
	a := sum(map[string]any{})
	require.Equal(t, a, sum(map[string]any{}))
	require.NotEqual(t, a, sum(map[string]any{"config": map[string]any{"policies": []any{map[string]any{"name": "default", "limit": 5, "window": "1m"}}}}))
}

// Values that cannot work are refused by helm template with what to set.
func TestTemplateRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"proxy without upstream", map[string]any{"edge": map[string]any{"proxy": map[string]any{"enabled": true}}}, "edge.proxy.upstream is required"},
		{"external NATS without a URL", map[string]any{"nats": map[string]any{"bundled": map[string]any{"enabled": false}}}, "nats.url is required"},
		{"TLS without a Secret", map[string]any{"tls": map[string]any{"enabled": true}}, "tls.secretName is required"},
		{"a NATS cluster of two", map[string]any{"nats": map[string]any{"bundled": map[string]any{"replicas": 2}}}, "at least 3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			chrt := loadChart(t)
			install := newInstall()
			_, err := install.Run(chrt, c.vals)
			require.ErrorContains(t, err, c.want)
		})
	}
}

func policyTypes[T ~string](ts []T) []string {
	out := make([]string, len(ts))
	for i, x := range ts {
		out[i] = string(x)
	}
	return out
}

// checkPod: non-root, read-only, nothing to escalate, requests set, no
// service account token.
func checkPod(t *testing.T, name string, spec corev1.PodSpec) {
	t.Helper()
	require.NotNil(t, spec.SecurityContext, name)
	require.True(t, *spec.SecurityContext.RunAsNonRoot, "%s runs as non-root", name)
	require.NotZero(t, *spec.SecurityContext.RunAsUser, "%s: a user other than root", name)
	require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, spec.SecurityContext.SeccompProfile.Type, name)
	require.False(t, *spec.AutomountServiceAccountToken, "%s mounts no service account token", name)
	require.NotEmpty(t, spec.Containers)
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		sc := c.SecurityContext
		require.NotNil(t, sc, "%s/%s", name, c.Name)
		require.False(t, *sc.AllowPrivilegeEscalation, "%s/%s: no privilege escalation", name, c.Name)
		require.False(t, *sc.Privileged, "%s/%s", name, c.Name)
		require.True(t, *sc.ReadOnlyRootFilesystem, "%s/%s: read-only root file system", name, c.Name)
		require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, "%s/%s drops every capability", name, c.Name)
		require.Empty(t, sc.Capabilities.Add, "%s/%s", name, c.Name)
		require.False(t, c.Resources.Requests.Cpu().IsZero(), "%s/%s requests CPU", name, c.Name)
		require.False(t, c.Resources.Requests.Memory().IsZero(), "%s/%s requests memory", name, c.Name)
		require.NotNil(t, c.ReadinessProbe, "%s/%s", name, c.Name)
		require.NotNil(t, c.LivenessProbe, "%s/%s", name, c.Name)
	}
}

// checkEdge: probes on /readyz and /healthz, a Service port per door that
// is on (and none for a door that is off), the HPA and the PDB on it.
func checkEdge(t *testing.T, o *objects, vals map[string]any) {
	t.Helper()
	d := o.deployments["tally-edge"]
	c := d.Spec.Template.Spec.Containers[0]
	require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
	require.Equal(t, "admin", c.ReadinessProbe.HTTPGet.Port.String())
	container := map[string]int32{}
	for _, p := range c.Ports {
		container[p.Name] = p.ContainerPort
	}
	svc := o.services["tally-edge"]
	require.NotNil(t, svc)
	service := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		service[p.Name] = p.Port
		require.Equal(t, p.Name, p.TargetPort.String(), "the Service's %s goes to the container's", p.Name)
	}
	require.Equal(t, container, service, "the Service has the port of each door that is on")
	doors := map[string]string{"proxy": "listen", "api": "api_listen", "forward-auth": "forward_auth", "grpc-rls": "rls"}
	cfg := o.configMaps["tally-config"].Data["tally.yaml"]
	for port, field := range doors {
		_, on := container[port]
		require.Equal(t, on, strings.Contains(cfg, "\n  "+field+":"), "%s is open exactly when edge.%s is set", port, field)
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		require.Equal(t, v, svc.Spec.Selector[k])
	}
	if hpa, ok := o.hpas["tally-edge"]; ok {
		require.Equal(t, "Deployment", hpa.Spec.ScaleTargetRef.Kind)
		require.Equal(t, d.Name, hpa.Spec.ScaleTargetRef.Name)
		require.Nil(t, d.Spec.Replicas, "the HPA owns the replicas")
	} else {
		require.NotNil(t, d.Spec.Replicas)
	}
	pdb := o.pdbs["tally-edge"]
	require.NotNil(t, pdb)
	require.Equal(t, d.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels)
}

// checkBundledNATS: three servers whose every password the configuration
// names comes from the Secret.
func checkBundledNATS(t *testing.T, o *objects) {
	t.Helper()
	s := o.statefulSets["tally-nats"]
	require.GreaterOrEqual(t, *s.Spec.Replicas, int32(3))
	env := map[string]bool{}
	for _, e := range s.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = true
	}
	confs := o.configMaps["tally-nats"].Data
	for _, conf := range []string{"tally.conf", "cluster.conf"} {
		for _, v := range regexpAll(`\$(TALLY_NATS_[A-Z_]+)`, confs[conf]) {
			require.True(t, env[v], "the NATS servers get %s", v)
		}
	}
	if np, ok := o.policies["tally-nats"]; ok {
		require.Len(t, np.Spec.Ingress, 3)
	}
}

// checkConfig lays out what the pod of d would see — its volumes under a
// temporary root (ConfigMaps and Secrets the chart rendered; Secrets made
// elsewhere with test contents: a CA and certificates made now), its
// environment from its env — and passes its configuration file to tally
// check-config, the paths under /etc placed under that root.
func checkConfig(t *testing.T, o *objects, d *appsv1.Deployment) {
	t.Helper()
	dir := t.TempDir()
	ca := testpki.NewCA(t, "chart test CA")
	cert, key := ca.Server("tally")
	external := func(name string) map[string][]byte {
		crt, _ := os.ReadFile(cert)
		k, _ := os.ReadFile(key)
		ca, _ := os.ReadFile(ca.File)
		return map[string][]byte{"tls.crt": crt, "tls.key": k, "ca.crt": ca,
			"TALLY_KEY_SECRET": []byte(strings.Repeat("ab", 32)), "TALLY_API_TOKEN": []byte("api"), "TALLY_ADMIN_TOKEN": []byte("admin"),
			"TALLY_REDIS_PASSWORD": []byte("redis"), "TALLY_SENTINEL_PASSWORD": []byte("sentinel"),
			"edge-password": []byte("edge"), "accountant-password": []byte("accountant")}
	}
	secret := func(name string) map[string][]byte {
		if s, ok := o.secrets[name]; ok {
			out := map[string][]byte{}
			for k, v := range s.StringData {
				out[k] = []byte(v)
			}
			for k, v := range s.Data {
				out[k] = v
			}
			return out
		}
		return external(name)
	}
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		require.True(t, ok, "%s mounts volume %s, which the pod has", d.Name, m.Name)
		var files map[string][]byte
		switch {
		case v.ConfigMap != nil:
			cm, ok := o.configMaps[v.ConfigMap.Name]
			require.True(t, ok, "%s: ConfigMap %s is rendered", d.Name, v.ConfigMap.Name)
			files = map[string][]byte{}
			for k, s := range cm.Data {
				files[k] = []byte(s)
			}
		case v.Secret != nil:
			files = secret(v.Secret.SecretName)
		default:
			t.Fatalf("%s: volume %s of an unexpected kind", d.Name, m.Name)
		}
		at := filepath.Join(dir, m.MountPath)
		require.NoError(t, os.MkdirAll(at, 0o755))
		for k, b := range files {
			require.NoError(t, os.WriteFile(filepath.Join(at, k), b, 0o600))
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secret(ref.Name)[ref.Key]
			require.True(t, ok || (ref.Optional != nil && *ref.Optional), "%s: %s from %s/%s", d.Name, e.Name, ref.Name, ref.Key)
			if ok {
				env[e.Name] = string(v)
			}
		}
	}
	require.Equal(t, "/etc/tally/tally.yaml", c.Args[len(c.Args)-1])
	path := filepath.Join(dir, "etc", "tally", "tally.yaml")
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, []byte(strings.ReplaceAll(string(raw), "/etc/tally/", filepath.Join(dir, "etc", "tally")+"/")), 0o600))
	var stdout, stderr strings.Builder
	code := cli.Main(context.Background(), cli.Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return env[k] }},
		[]string{"check-config", path})
	require.Equal(t, 0, code, "tally check-config of %s's configuration:\n%s%s\n%s", d.Name, stdout.String(), stderr.String(), raw)
	require.Contains(t, stdout.String(), ": ok")
}

func regexpAll(expr, s string) []string {
	var out []string
	for _, m := range mustCompile(expr).FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}
