// Integration test: evaluate every query of the pstrain Grafana dashboard
// against a real Prometheus that scrapes a real pstrain cluster.
//
// TestPanelQueriesAgainstPrometheus is skipped unless PSTRAIN_PROM_URL is set.
// For each panel target it substitutes the Grafana template variables
// (PanelQueries: $__rate_interval=30s, $job=pstrain, $instance=.*,
// $worker=.*, ...), sends the expression to GET /api/v1/query, and fails if
// Prometheus answers with an error (bad PromQL, a type error, a timeout) or
// if the result has no series (a metric that is never exported, a label that
// does not exist, a role filter that matches nothing).
//
// How it is meant to run (CI or by hand):
//
//  1. Start a cluster with `pstrain run` (a chief, at least one parameter
//     server and two workers). It writes Prometheus file_sd target files,
//     labelled role and task, into run/targets.
//  2. Start Prometheus on it: `PROM_PORT=9090 scripts/monitor.sh` (job name
//     "pstrain", scrape interval 2s, targets from ${SD_DIR:-run/targets}).
//  3. Let it train for at least 45s, so that every target has been scraped
//     over a whole 30s rate window, and make sure the run exercises the
//     fault panels: at least one checkpoint written and one task restarted
//     (kill a worker and let the chief restart it). Otherwise list those
//     panels in PSTRAIN_PROM_ALLOW_EMPTY.
//  4. Run, while the cluster is still up (Prometheus marks the series of
//     vanished targets stale, so queries at "now" return nothing once the run
//     has ended; use PSTRAIN_PROM_TIME to evaluate at an earlier instant):
//
//     PSTRAIN_PROM_URL=http://127.0.0.1:9090 go test ./dashboard -run TestPanelQueriesAgainstPrometheus -v
//
// Environment:
//
//	PSTRAIN_PROM_URL          base URL of Prometheus; the test is skipped if unset.
//	PSTRAIN_PROM_JOB          scrape job name, if not "pstrain" (the value of $job).
//	PSTRAIN_PROM_TIME         evaluation time, RFC 3339 or Unix seconds (default: now).
//	PSTRAIN_PROM_WAIT         how long to keep retrying queries whose result is
//	                          still empty, e.g. "90s" while a fresh cluster warms up
//	                          (default: no retry).
//	PSTRAIN_PROM_ALLOW_EMPTY  comma-separated queries allowed to return no series,
//	                          each "Panel title" (all its targets) or
//	                          "Panel title#RefID"; "*" allows every query to be empty,
//	                          which turns the test into a syntax and evaluation check
//	                          (e.g. against a Prometheus without targets). Errors
//	                          always fail.
//
// In a run without failures, the series of "Task restarts", the
// "rejected" query of "RPC retries and rejections" (#B), "Requests refused
// by reason", "Connections closed by plane and reason" and "Gradients
// refused by worker and reason" do not exist, and "Checkpoint age" is
// empty until the first checkpoint.

package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// promResponse is the envelope of Prometheus' HTTP API.
type promResponse struct {
	Status    string   `json:"status"`
	ErrorType string   `json:"errorType"`
	Error     string   `json:"error"`
	Warnings  []string `json:"warnings"`
	Data      struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	} `json:"data"`
}

// series returns the number of series (vector or matrix) or 1 for a scalar
// or string result.
func (r *promResponse) series() (int, error) {
	switch r.Data.ResultType {
	case "scalar", "string":
		return 1, nil
	case "vector", "matrix":
		var rs []json.RawMessage
		if err := json.Unmarshal(r.Data.Result, &rs); err != nil {
			return 0, fmt.Errorf("decoding %s result: %w", r.Data.ResultType, err)
		}
		return len(rs), nil
	default:
		return 0, fmt.Errorf("unexpected result type %q", r.Data.ResultType)
	}
}

// promQuery runs an instant query; evalTime may be empty for "now".
func promQuery(ctx context.Context, client *http.Client, base, expr, evalTime string) (*promResponse, error) {
	params := url.Values{"query": {expr}}
	if evalTime != "" {
		params.Set("time", evalTime)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/api/v1/query?"+params.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	// Prometheus answers errors (400, 422, 503) with the same JSON envelope.
	var r promResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("HTTP %s, undecodable body %.200q: %w", resp.Status, body, err)
	}
	if r.Status != "success" {
		return &r, fmt.Errorf("HTTP %s: %s: %s", resp.Status, r.ErrorType, r.Error)
	}
	return &r, nil
}

// parseEvalTime converts PSTRAIN_PROM_TIME to what /api/v1/query accepts.
func parseEvalTime(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return s, nil
	}
	ts, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return "", fmt.Errorf("PSTRAIN_PROM_TIME=%q: want RFC 3339 or Unix seconds", s)
	}
	return ts.Format(time.RFC3339Nano), nil
}

// allowEmpty reports whether the query may return no series.
func allowEmpty(list []string, q Query) bool {
	for _, a := range list {
		if a == "*" || a == q.Panel || a == q.String() {
			return true
		}
	}
	return false
}

func TestPanelQueriesAgainstPrometheus(t *testing.T) {
	base := os.Getenv("PSTRAIN_PROM_URL")
	if base == "" {
		t.Skip("PSTRAIN_PROM_URL is not set; see the top of prom_integration_test.go for how to run this test against a real cluster")
	}
	vars := DefaultVariables()
	if job := os.Getenv("PSTRAIN_PROM_JOB"); job != "" {
		vars["job"] = job
	}
	evalTime, err := parseEvalTime(os.Getenv("PSTRAIN_PROM_TIME"))
	if err != nil {
		t.Fatal(err)
	}
	var wait time.Duration
	if s := os.Getenv("PSTRAIN_PROM_WAIT"); s != "" {
		if wait, err = time.ParseDuration(s); err != nil {
			t.Fatalf("PSTRAIN_PROM_WAIT: %v", err)
		}
	}
	var allowed []string
	for _, a := range strings.Split(os.Getenv("PSTRAIN_PROM_ALLOW_EMPTY"), ",") {
		if a = strings.TrimSpace(a); a != "" {
			allowed = append(allowed, a)
		}
	}

	queries, err := PanelQueriesWith(dashboardPath, vars)
	if err != nil {
		t.Fatal(err)
	}
	evalPanelQueries(t, base, queries, evalTime, wait, allowed, "PSTRAIN_PROM_ALLOW_EMPTY")
}

// evalPanelQueries runs each query against Prometheus at base (at evalTime,
// "" for now), as a subtest named after the query, and fails the subtest on
// an error or on an empty result, unless the query is in allowed. Empty
// results are retried every 2s for up to wait. allowedFrom names where the
// allow list comes from, for the failure message.
func evalPanelQueries(t *testing.T, base string, queries []Query, evalTime string, wait time.Duration, allowed []string, allowedFrom string) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	ctx := t.Context()
	deadline := time.Now().Add(wait)
	for _, q := range queries {
		t.Run(q.String(), func(t *testing.T) {
			for {
				r, err := promQuery(ctx, client, base, q.Expr, evalTime)
				if err != nil {
					t.Fatalf("query %s\n%v", q.Expr, err)
				}
				for _, w := range r.Warnings {
					t.Logf("warning: %s", w)
				}
				n, err := r.series()
				if err != nil {
					t.Fatalf("query %s\n%v", q.Expr, err)
				}
				switch {
				case n > 0:
					t.Logf("%d series", n)
					return
				case allowEmpty(allowed, q):
					t.Logf("no series (allowed by %s): %s", allowedFrom, q.Expr)
					return
				case time.Now().Before(deadline):
					select {
					case <-ctx.Done():
						t.Fatal(ctx.Err())
					case <-time.After(2 * time.Second):
					}
				default:
					t.Fatalf("no series for %s\n(is the cluster up and scraped? to accept an empty result, add %q to %s)",
						q.Expr, q.String(), allowedFrom)
				}
			}
		})
	}
}
