package config

import "testing"

// The example in deploy/ stays valid.
func TestDeployExampleLoads(t *testing.T) {
	if _, err := Load("../../deploy/tally.yaml", nil); err != nil {
		t.Fatal(err)
	}
}
