package config

import (
	"os/exec"
	"testing"
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
