package edge_test

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

const llmExample = "../../deploy/examples/llm-budget"

// llmBudget reads the worked example's configuration and rules as a
// deployment would (its rules' directory where the file says /etc/tally/rules).
func llmBudget(t *testing.T) *config.File {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(llmExample, "tally.yaml"))
	require.NoError(t, err)
	dir, err := filepath.Abs(filepath.Join(llmExample, "rules"))
	require.NoError(t, err)
	src = bytes.Replace(src, []byte("/etc/tally/rules"), []byte(dir), 1)
	f, err := config.Parse(src, func(k string) string {
		if k == config.EnvKeySecret { // the edges use the pipeline's keys: this one only lets the file load
			return "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		}
		return ""
	})
	require.NoError(t, err)
	return f
}

// The worked example of docs/llm-budgets.md, from its files: a monthly
// token budget per API key, by plan, on Berlin's calendar. Through the
// decision API the LLM service checks an estimate and finishes with the
// tokens the model used: what the estimate held beyond them comes back,
// a shortfall is charged in full, once; a request whose estimate is more
// than is left is denied, and so is every request once the month is
// spent, until Berlin's next first of the month, which every answer
// names. Two edges, one manual clock, a month ahead of now (Redis expires
// keys by its own clock).
func TestLLMBudgetExample(t *testing.T) {
	f := llmBudget(t)
	loc := berlin(t)
	month := testutil.MonthStart(time.Now(), loc, 1)
	next := testutil.MonthStart(time.Now(), loc, 2)
	clock := limiter.NewManualClock(month.Add(20 * 24 * time.Hour))

	pl := newPipeline(t)
	atEnd := map[string]bool{}
	for _, d := range f.Edge.RLS.ChargeAtEnd {
		atEnd[d] = true
	}
	example := func(o *edge.Options) {
		o.Limits, o.Clock, o.Descriptors, o.RLS.ChargeAtEnd = f.Limits(), clock, f.Descriptors(), atEnd
	}
	a, b := pl.edge(example), pl.edge(example)

	checkCost := func(e *edgeUnderTest, key, tier string, cost int64) (*http.Response, map[string]any) {
		t.Helper()
		return post(t, e.api.URL+"/v1/check", fmt.Sprintf(`{"policy":"llm-tokens","identity":%q,"tier":%q,"cost":%d}`, key, tier, cost))
	}
	finish := func(e *edgeUnderTest, id string, cost int64) map[string]any {
		t.Helper()
		resp, m := post(t, e.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":200,"cost":%d}`, id, cost))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%v", m)
		return m
	}
	reset := strconv.FormatInt(next.Unix(), 10)

	// The free plan: 100,000 tokens a month.
	resp, m := checkCost(a, "sk-free-1", "free", 60_000) // the request's max_tokens
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", m)
	require.Equal(t, reset, resp.Header.Get("X-RateLimit-Reset"), "the next first of the month in Berlin")
	require.EqualValues(t, 100_000, m["limit"])
	require.EqualValues(t, 15_000, finish(a, m["request_id"].(string), 45_000)["refunded"])
	k := pl.keys.Key("llm-tokens", limiter.APIIdentity("sk-free-1"))
	pl.waitUsed(k, 45_000)
	resp, m = checkCost(b, "sk-free-1", "free", 60_000) // more than the 55,000 left
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%v", m)
	resp, m = checkCost(b, "sk-free-1", "free", 50_000)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", m)
	require.EqualValues(t, 20_000, finish(b, m["request_id"].(string), 70_000)["charged"], "past the estimate, and the budget")
	pl.waitUsed(k, 115_000)
	for _, e := range []*edgeUnderTest{a, b} {
		testutil.WaitFor(t, "the month spent on both edges", func() bool {
			resp, _ := checkCost(e, "sk-free-1", "free", 1)
			return resp.StatusCode == http.StatusTooManyRequests
		})
	}
	resp, m = checkCost(a, "sk-free-1", "free", 1)
	require.Equal(t, reset, resp.Header.Get("X-RateLimit-Reset"))
	require.Equal(t, strconv.FormatInt(next.Unix()-clock.Now().Unix(), 10), resp.Header.Get("Retry-After"))
	require.EqualValues(t, next.Unix(), m["reset"])
	require.EqualValues(t, next.Unix()-clock.Now().Unix(), m["retry_after"])

	// The pro plan: its own limit, its own window.
	resp, m = checkCost(a, "sk-pro-1", "pro", 5_000_000)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", m)
	require.EqualValues(t, 10_000_000, m["limit"])

	// Berlin's next month: every budget is whole again.
	clock.Set(next.Add(time.Hour))
	resp, m = checkCost(a, "sk-free-1", "free", 60_000)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", m)
	require.Equal(t, strconv.FormatInt(testutil.MonthStart(time.Now(), loc, 3).Unix(), 10), resp.Header.Get("X-RateLimit-Reset"))
}

// The example's Envoy door: the same budget by the rules, checked at the
// start of a request (hits_addend 0) and charged with the tokens at the
// stream's end (apply_on_stream_done, a domain of edge.rls.charge_at_end),
// in full even past the budget; both edges then deny the key until
// Berlin's next first of the month. On the wall clock: an overdraft is
// the accountant's to apply, and it places events by its own.
func TestLLMBudgetExampleThroughEnvoy(t *testing.T) {
	f := llmBudget(t)
	loc := berlin(t)
	pl := newPipeline(t)
	atEnd := map[string]bool{}
	for _, d := range f.Edge.RLS.ChargeAtEnd {
		atEnd[d] = true
	}
	example := func(o *edge.Options) { o.Limits, o.Descriptors, o.RLS.ChargeAtEnd = f.Limits(), f.Descriptors(), atEnd }
	ca, cb := rls(t, pl.edge(example)), rls(t, pl.edge(example))
	start := func(c rlsv3.RateLimitServiceClient, plan, key string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		return ask(t, c, "llm", withHits(desc("plan", plan, "api_key", key), 0)).OverallCode
	}
	before := time.Now()
	require.Equal(t, ok, start(ca, "free", "sk-envoy-1"))
	end := ask(t, ca, "llm", withHits(desc("plan", "free", "api_key", "sk-envoy-1"), 80_000))
	require.Equal(t, ok, end.OverallCode)
	require.EqualValues(t, 20_000, end.Statuses[0].LimitRemaining)
	next := testutil.MonthStart(before, loc, 1)
	if after := testutil.MonthStart(time.Now(), loc, 1); !after.Equal(next) { // the month turned during the test
		next = after
	}
	require.InDelta(t, time.Until(next).Seconds(), end.Statuses[0].DurationUntilReset.AsDuration().Seconds(), 2,
		"to the next first of the month in Berlin")
	require.Equal(t, ok, ask(t, cb, "llm", withHits(desc("plan", "free", "api_key", "sk-envoy-1"), 30_000)).OverallCode,
		"a charge at the end is never denied")
	for _, c := range []rlsv3.RateLimitServiceClient{ca, cb} {
		testutil.WaitFor(t, "the month spent on both edges", func() bool { return start(c, "free", "sk-envoy-1") == over })
	}
	require.Equal(t, ok, start(cb, "pro", "sk-envoy-1"), "another plan's budget")
}

// The guide shows the example's files as they are: its policy, the edge's
// doors and the rules.
func TestLLMBudgetGuideShowsTheFiles(t *testing.T) {
	guide, err := os.ReadFile("../../docs/llm-budgets.md")
	require.NoError(t, err)
	shown := 0
	for _, name := range []string{"tally.yaml", "rules/llm.yaml"} {
		b, err := os.ReadFile(filepath.Join(llmExample, name))
		require.NoError(t, err)
		for _, block := range strings.Split(string(b), "\n\n") { // the guide quotes a file by its parts
			block = strings.TrimSpace(block)
			if strings.HasPrefix(block, "policies:") || strings.HasPrefix(block, "edge:") || strings.HasPrefix(block, "domain:") {
				require.Contains(t, string(guide), block, "%s, in docs/llm-budgets.md", name)
				shown++
			}
		}
	}
	require.Equal(t, 3, shown)
}
