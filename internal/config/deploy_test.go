package config

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The example in deploy/ stays valid.
func TestDeployExampleLoads(t *testing.T) {
	if _, err := Load("../../deploy/tally.yaml", withSecret); err != nil {
		t.Fatal(err)
	}
}

// Prometheus accepts the alert rules in deploy/prometheus, and each alert
// fires on the series that should raise it and only then (its unit tests).
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found on PATH: run `make test` (it installs Debian's prometheus) or `apt-get install prometheus`")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "../../deploy/prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// Every alert leads somewhere: its runbook_url names the row of
// docs/operations.md that says what to do, and that row is there.
func TestAlertsHaveRunbooks(t *testing.T) {
	const base = "https://github.com/tallyhq/tally/blob/main/docs/operations.md#"
	b, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, base)
			if !ok || anchor != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook_url %q, want %s%s", r.Alert, url, base, strings.ToLower(r.Alert))
				continue
			}
			if !strings.Contains(string(ops), `<a id="`+anchor+`"></a>`+"`"+r.Alert+"`") {
				t.Errorf("%s: docs/operations.md has no runbook row with the anchor %q", r.Alert, anchor)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alert rules read")
	}
}
