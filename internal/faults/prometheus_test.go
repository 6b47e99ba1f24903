package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/stack"
	"github.com/tallyhq/tally/internal/testutil"
)

// A real Prometheus (Debian's) scrapes the edge and the accountant, parses
// every series they expose, and evaluates the alert rules of
// deploy/prometheus against them without an error; none fires on a healthy
// deployment.
func prometheusScrapes(t *testing.T, c *cluster) {
	r := c.start(t, nil)
	time.Sleep(time.Second)
	r.finish(t)

	rules, err := filepath.Abs("../../deploy/prometheus/alerts.yml")
	require.NoError(t, err)
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: tally-edge
    static_configs: [{targets: [%q]}]
  - job_name: tally-accountant
    static_configs: [{targets: [%q]}]
`, rules, r.e.AdminAddr, c.acc.AdminAddr)
	cfgPath := filepath.Join(c.stack.Dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(cfg), 0o600))
	addr := stack.FreeAddr()
	_, err = c.stack.Start(context.Background(), "prometheus", "prometheus", "--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(c.stack.Dir, "prometheus"), "--web.listen-address="+addr)
	require.NoError(t, err)
	api := func(path string, query url.Values, out any) bool {
		resp, err := http.Get("http://" + addr + path + "?" + query.Encode())
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(out) == nil
	}

	var targets struct {
		Data struct {
			ActiveTargets []struct {
				Labels    map[string]string `json:"labels"`
				Health    string            `json:"health"`
				LastError string            `json:"lastError"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	testutil.WaitForWithin(t, "Prometheus to scrape both", 30*time.Second, func() bool {
		if !api("/api/v1/targets", nil, &targets) || len(targets.Data.ActiveTargets) != 2 {
			return false
		}
		for _, tg := range targets.Data.ActiveTargets {
			if tg.Health != "up" {
				return false
			}
		}
		return true
	})
	for _, q := range []string{`sum(tally_edge_policy_decisions_total)`, `sum(tally_accountant_messages_total) + 1`,
		`max(tally_edge_nats_connected)`, `count(go_sched_latencies_seconds_bucket{job="tally-accountant"})`} {
		var res struct {
			Data struct {
				Result []struct {
					Value [2]any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		testutil.WaitForWithin(t, q, 10*time.Second, func() bool {
			if !api("/api/v1/query", url.Values{"query": {q}}, &res) || len(res.Data.Result) != 1 {
				return false
			}
			s, _ := res.Data.Result[0].Value[1].(string)
			v, err := strconv.ParseFloat(s, 64)
			return err == nil && v > 0
		})
	}

	// Every query of the Grafana dashboard is valid PromQL over these series.
	b, err := os.ReadFile("../../deploy/grafana/tally.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	require.NotEmpty(t, dash.Panels)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			var res struct {
				Status string `json:"status"`
			}
			q := strings.ReplaceAll(tg.Expr, "$__rate_interval", "1m")
			require.True(t, api("/api/v1/query", url.Values{"query": {q}}, &res), "%s: %s", p.Title, q)
			require.Equal(t, "success", res.Status, "%s: %s", p.Title, q)
		}
	}

	var rulesRes struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
					State     string `json:"state"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	// Evaluations before the first scrapes may see no accountant: wait for
	// one that has seen both.
	testutil.WaitForWithin(t, "every rule evaluated, none firing", 15*time.Second, func() bool {
		if !api("/api/v1/rules", nil, &rulesRes) || len(rulesRes.Data.Groups) == 0 {
			return false
		}
		for _, g := range rulesRes.Data.Groups {
			for _, rule := range g.Rules {
				if rule.Health != "ok" || rule.State != "inactive" {
					return false
				}
			}
		}
		return true
	})
	for _, g := range rulesRes.Data.Groups {
		for _, rule := range g.Rules {
			require.Empty(t, rule.LastError, rule.Name)
		}
	}
}
