// Command render draws a picture of pstrain's Grafana dashboard without
// Grafana: it reads scripts/grafana/dashboards/pstrain.json, evaluates every
// panel query over a time range with Prometheus' /api/v1/query_range, and
// draws the panels with gonum/plot into one PNG laid out like the dashboard
// (rows, and panels placed by their gridPos on Grafana's 24-column grid).
//
//	go run ./lab/render --prom-url http://127.0.0.1:9090 --last 5m --out docs/img/dashboard.png
//
// It is pstrain's own rendering of the dashboard's panels and queries, not a
// Grafana screenshot: time series, stacked series, the heatmap and a few
// field overrides (negative-Y, dashed lines, line width) are drawn; other
// Grafana options (thresholds, tooltips, legend tables) are not.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pstrain/pstrain/tools/dashboard"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

// varFlags collects repeated --var name=value flags.
type varFlags map[string]string

func (v varFlags) String() string { return "" }

func (v varFlags) Set(s string) error {
	name, val, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("want name=value, got %q", s)
	}
	v[strings.TrimPrefix(name, "$")] = val
	return nil
}

// options are the parsed flags.
type options struct {
	dashboard    string
	promURL      string
	start, end   time.Time
	step         time.Duration
	rateInterval time.Duration
	out          string
	width        int
	vars         map[string]string
	timeout      time.Duration
}

// parseTime accepts RFC 3339 or unix seconds.
func parseTime(s string) (time.Time, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return time.UnixMilli(int64(f * 1e3)), nil
	}
	return time.Parse(time.RFC3339, s)
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{vars: map[string]string{}}
	extra := varFlags{}
	fs.StringVar(&o.dashboard, "dashboard", dashboard.File, "dashboard JSON")
	fs.StringVar(&o.promURL, "prom-url", "http://127.0.0.1:9090", "Prometheus base URL")
	start := fs.String("start", "", "range start, RFC 3339 or unix seconds (with --end)")
	end := fs.String("end", "", "range end, RFC 3339 or unix seconds (default now)")
	last := fs.Duration("last", 5*time.Minute, "range: the last this long before --end (when --start is not set)")
	fs.DurationVar(&o.step, "step", time.Second, "query resolution step")
	fs.DurationVar(&o.rateInterval, "rate-interval", 5*time.Second, "value of $__rate_interval (at least 4 scrape intervals)")
	fs.StringVar(&o.out, "out", "docs/img/dashboard.png", "PNG to write")
	fs.IntVar(&o.width, "width", 1800, "picture width in pixels")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "timeout of each query")
	fs.Var(extra, "var", "dashboard variable `name=value` (repeatable), e.g. --var worker=worker/0")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.end = time.Now()
	if *end != "" {
		t, err := parseTime(*end)
		if err != nil {
			return nil, fmt.Errorf("--end: %w", err)
		}
		o.end = t
	}
	if *start != "" {
		t, err := parseTime(*start)
		if err != nil {
			return nil, fmt.Errorf("--start: %w", err)
		}
		o.start = t
	} else {
		o.start = o.end.Add(-*last)
	}
	if !o.start.Before(o.end) {
		return nil, errors.New("the range is empty: --start must be before --end")
	}
	if o.step <= 0 || o.rateInterval <= 0 {
		return nil, errors.New("--step and --rate-interval must be positive")
	}
	if o.width < 600 {
		return nil, errors.New("--width must be at least 600")
	}
	rng := o.end.Sub(o.start)
	o.vars = dashboard.DefaultVariables()
	o.vars["__rate_interval"] = promDuration(o.rateInterval)
	o.vars["__interval"] = promDuration(o.step)
	o.vars["__interval_ms"] = strconv.FormatInt(o.step.Milliseconds(), 10)
	o.vars["__range"] = promDuration(rng)
	o.vars["__range_s"] = strconv.FormatInt(int64(rng.Seconds()), 10)
	o.vars["__range_ms"] = strconv.FormatInt(rng.Milliseconds(), 10)
	for k, v := range extra {
		o.vars[k] = v
	}
	return o, nil
}

// promDuration formats d as a PromQL duration ("5s", "1500ms").
func promDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// titleVars are the variable values shown in titles and the header: "All"
// for the match-everything regexps.
func titleVars(vars map[string]string) map[string]string {
	out := make(map[string]string, len(vars))
	for k, v := range vars {
		if v == ".*" || v == ".+" {
			v = "All"
		}
		out[k] = v
	}
	return out
}

// panelData is a panel with its query results.
type panelData struct {
	*Panel
	results [][]Series // by query
	errs    []string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	d, err := loadDashboard(o.dashboard, o.vars, titleVars(o.vars))
	if err != nil {
		return err
	}
	pc := &promClient{base: o.promURL, client: &http.Client{}}
	var data []*panelData
	nq, nfail, nempty, nseries := 0, 0, 0, 0
	var lastErr error
	for i := range d.Panels {
		pd := &panelData{Panel: &d.Panels[i]}
		data = append(data, pd)
		for _, q := range pd.Queries {
			qctx, cancel := context.WithTimeout(ctx, o.timeout)
			res, err := pc.queryRange(qctx, q.Expr, o.start, o.end, o.step)
			cancel()
			nq++
			if err != nil {
				nfail++
				lastErr = err
				pd.errs = append(pd.errs, q.RefID+": "+err.Error())
				fmt.Fprintf(stderr, "render: %s: %v\n", q, err)
			}
			if err == nil && len(res) == 0 {
				nempty++
			}
			nseries += len(res)
			pd.results = append(pd.results, res)
		}
	}
	if nq > 0 && nfail == nq {
		return fmt.Errorf("every query failed (last: %w)", lastErr)
	}
	img := drawDashboard(d, data, o)
	var buf bytes.Buffer
	if err := encodePNG(&buf, img); err != nil {
		return err
	}
	if dir := filepath.Dir(o.out); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(o.out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	b := img.Bounds()
	fmt.Fprintf(stdout, "%s: %dx%d, %d KB; %d panels, %d queries (%d failed, %d empty), %d series, %s to %s\n",
		o.out, b.Dx(), b.Dy(), (buf.Len()+1023)/1024, countPanels(d), nq, nfail, nempty, nseries,
		o.start.UTC().Format(time.RFC3339), o.end.UTC().Format(time.RFC3339))
	return nil
}

func countPanels(d *Dashboard) int {
	n := 0
	for _, p := range d.Panels {
		if p.Type != "row" {
			n++
		}
	}
	return n
}
