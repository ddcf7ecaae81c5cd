package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Series is one time series of a range query result.
type Series struct {
	Labels map[string]string
	T, V   []float64 // unix seconds, values (NaN for NaN/±Inf samples)
}

// promClient evaluates range queries with Prometheus' HTTP API.
type promClient struct {
	base   string
	client *http.Client
}

// queryRange evaluates expr with /api/v1/query_range.
func (c *promClient) queryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]Series, error) {
	form := url.Values{
		"query": {expr},
		"start": {strconv.FormatFloat(float64(start.UnixMilli())/1e3, 'f', -1, 64)},
		"end":   {strconv.FormatFloat(float64(end.UnixMilli())/1e3, 'f', -1, 64)},
		"step":  {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(c.base, "/")+"/api/v1/query_range", strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("query_range: HTTP %s: %w", resp.Status, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query_range: %s: %s", body.ErrorType, body.Error)
	}
	if body.Data.ResultType != "matrix" {
		return nil, fmt.Errorf("query_range: result type %q, want matrix", body.Data.ResultType)
	}
	out := make([]Series, 0, len(body.Data.Result))
	for _, r := range body.Data.Result {
		s := Series{Labels: r.Metric}
		for _, tv := range r.Values {
			t, ok := tv[0].(float64)
			vs, ok2 := tv[1].(string)
			if !ok || !ok2 {
				return nil, fmt.Errorf("query_range: malformed sample %v", tv)
			}
			v, err := strconv.ParseFloat(vs, 64)
			if err != nil || math.IsInf(v, 0) {
				v = math.NaN()
			}
			s.T = append(s.T, t)
			s.V = append(s.V, v)
		}
		out = append(out, s)
	}
	return out, nil
}

// legendName formats a series name the way Grafana does: the legend format
// with {{label}} replaced, or the series' label set when there is none.
func legendName(format string, labels map[string]string) string {
	if format == "" || format == "__auto" {
		keys := make([]string, 0, len(labels))
		for k := range labels {
			if k != "__name__" {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + strconv.Quote(labels[k])
		}
		return labels["__name__"] + "{" + strings.Join(parts, ", ") + "}"
	}
	var b strings.Builder
	for {
		i := strings.Index(format, "{{")
		if i < 0 {
			b.WriteString(format)
			break
		}
		j := strings.Index(format[i:], "}}")
		if j < 0 {
			b.WriteString(format)
			break
		}
		b.WriteString(format[:i])
		b.WriteString(labels[strings.TrimSpace(format[i+2:i+j])])
		format = format[i+j+2:]
	}
	return strings.TrimSpace(b.String())
}
