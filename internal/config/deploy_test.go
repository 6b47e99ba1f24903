package config

import "testing"

// The example in deploy/ stays valid.
func TestDeployExampleLoads(t *testing.T) {
	env := map[string]string{EnvKeySecret: "s3cret"}
	if _, err := Load("../../deploy/tally.yaml", func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
}
