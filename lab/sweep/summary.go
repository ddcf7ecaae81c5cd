package sweep

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Spread is the median and range of a set of values.
type Spread struct {
	N                int // values that are not NaN
	Median, Min, Max float64
}

// SpreadOf summarises vs, ignoring NaNs (which mark "not measured" or "not
// reached"). With no values the fields are NaN and N is 0.
func SpreadOf(vs []float64) Spread {
	var xs []float64
	for _, v := range vs {
		if !math.IsNaN(v) {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return Spread{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	slices.Sort(xs)
	n := len(xs)
	med := xs[n/2]
	if n%2 == 0 {
		med = (xs[n/2-1] + xs[n/2]) / 2
	}
	return Spread{N: n, Median: med, Min: xs[0], Max: xs[n-1]}
}

// summaryMetric is one column of the summary tables.
type summaryMetric struct {
	title  string
	column string  // results.csv column
	scale  float64 // multiply by this for display
	digits int
}

func summaryMetrics() []summaryMetric {
	return []summaryMetric{
		{"train s", "train_seconds", 1, 1},
		{"wall s", "wall_seconds", 1, 1},
		{"samples/s", "samples_per_second", 1, 0},
		{"test acc %", "test_accuracy", 100, 2},
		{"best acc %", "best_test_accuracy", 100, 2},
		{"time to target s", "time_to_target_seconds", 1, 1},
		{"start-up % of wall", "startup_share", 100, 0},
		{"CPU s (run)", "cpu_seconds_run", 1, 1},
		{"other CPU s", "other_cpu_seconds", 1, 1},
		{"peak RSS MiB (sum)", "peak_rss_bytes_total", 1.0 / (1 << 20), 0},
		{"run queue", "run_queue_mean", 1, 1},
	}
}

// cell renders a spread as "median (min–max)", or just the value when all
// agree; "–" when nothing was measured. For time to target it also says how
// many of the runs reached it.
func (m summaryMetric) cell(s Spread, runs int) string {
	if s.N == 0 {
		return "–"
	}
	f := func(v float64) string { return fmt.Sprintf("%.*f", m.digits, v*m.scale) }
	out := f(s.Median)
	if lo, hi := f(s.Min), f(s.Max); lo != hi {
		out += " (" + lo + "–" + hi + ")"
	}
	if m.column == "time_to_target_seconds" && s.N < runs {
		out += fmt.Sprintf(" [%d/%d]", s.N, runs)
	}
	return out
}

// Group is a set of rows sharing a label.
type Group struct {
	Label string
	Rows  []Row
}

// GroupBy groups rows by key(row), in order of first appearance.
func GroupBy(rows []Row, key func(Row) string) []Group {
	var gs []Group
	at := map[string]int{}
	for _, r := range rows {
		k := key(r)
		i, ok := at[k]
		if !ok {
			i = len(gs)
			at[k] = i
			gs = append(gs, Group{Label: k})
		}
		gs[i].Rows = append(gs[i].Rows, r)
	}
	return gs
}

// WriteSummary writes summary.md: a table per configuration (median and
// min–max over its repeats) and a table per varied parameter (over every
// run with that value, the other parameters pooled). Failed runs are
// counted but not summarised.
func WriteSummary(w io.Writer, rows []Row) {
	var ok []Row
	failed := 0
	for _, r := range rows {
		if r.Status == StatusOK {
			ok = append(ok, r)
		} else {
			failed++
		}
	}
	varied := VariedKeys(rows)
	fmt.Fprintf(w, "# Sweep summary\n\n%d runs finished", len(ok))
	if failed > 0 {
		fmt.Fprintf(w, ", %d failed", failed)
	}
	fmt.Fprintf(w, ". Cells are the median over runs, with the range (min–max) in brackets when the runs differ; ")
	fmt.Fprintf(w, "time to target shows [reached/runs] when some runs did not reach it.\n\n")
	if len(rows) > 0 {
		var fixed []string
		for _, k := range Keys() {
			if !slices.Contains(varied, k) {
				fixed = append(fixed, fixedText(rows, varied, k))
			}
		}
		fmt.Fprintf(w, "Fixed parameters: %s\n\n", strings.Join(fixed, " "))
	}
	if len(ok) == 0 {
		return
	}
	fmt.Fprintf(w, "## By configuration (over repeats)\n\n")
	writeTable(w, "configuration", GroupBy(ok, func(r Row) string { return Label(r.Params, varied) }))
	for _, k := range varied {
		fmt.Fprintf(w, "\n## By %s (other parameters pooled)\n\n", k)
		writeTable(w, k, GroupBy(ok, func(r Row) string { return r.Params[k] }))
	}
}

func writeTable(w io.Writer, first string, gs []Group) {
	ms := summaryMetrics()
	head := []string{first, "runs"}
	for _, m := range ms {
		head = append(head, m.title)
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
	for _, g := range gs {
		cells := []string{g.Label, fmt.Sprint(len(g.Rows))}
		for _, m := range ms {
			vs := make([]float64, len(g.Rows))
			for i := range g.Rows {
				vs[i], _ = g.Rows[i].Metric(m.column)
			}
			cells = append(cells, m.cell(SpreadOf(vs), len(g.Rows)))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// fixedText describes a parameter that is not an axis: its one value, or,
// for one that follows a varied key (model=cnn brings its own lr), its
// value with each of that key's values.
func fixedText(rows []Row, varied []string, k string) string {
	values := map[string]bool{}
	for _, r := range rows {
		values[r.Params[k]] = true
	}
	if len(values) == 1 {
		return k + "=" + rows[0].Params[k]
	}
	cs := configsOf(rows)
	for _, j := range varied {
		if !determines(cs, j, k) {
			continue
		}
		var with []string
		seen := map[string]bool{}
		for _, r := range rows {
			if v := r.Params[j]; !seen[v] {
				seen[v] = true
				val := r.Params[k]
				if val == "" {
					val = "none"
				}
				with = append(with, fmt.Sprintf("%s with %s=%s", val, j, v))
			}
		}
		return k + "=(" + strings.Join(with, ", ") + ")"
	}
	return k + "=" + rows[0].Params[k]
}
