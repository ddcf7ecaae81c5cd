// Package figures draws a sweep's plots (PNG and SVG, with gonum/plot) from
// its output directory: results.csv plus each run's report.json (the
// evaluation curve) and samples.csv (resources over time).
//
// Build turns the data into plot models (Figure: named series of points),
// which is pure and tested on its own; Render draws one model to files.
package figures

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"

	"github.com/pstrain/pstrain/lab/sweep"
	"github.com/pstrain/pstrain/observe/report"
)

// Kind is how a series is drawn.
type Kind int

// Series kinds.
const (
	Line    Kind = iota // points joined in order, with markers
	Scatter             // markers only
	Bars                // bars at X, stacked on the figure's earlier Bars series
)

// Series is one legend entry of a figure.
type Series struct {
	Label string
	Kind  Kind
	X, Y  []float64
	// YLo and YHi, when set (as long as Y), are the range drawn as a
	// whisker at each point: the min and max over repeats.
	YLo, YHi []float64
}

// Figure is the model of one plot.
type Figure struct {
	Name   string // file name without extension, e.g. "error_vs_step"
	Title  string
	XLabel string
	YLabel string
	// XTicks, when set, makes the x axis categorical: X values are indices
	// into XTicks, drawn as its labels.
	XTicks []string
	// YFromZero starts the y axis at 0 (for amounts, where a cut axis
	// would magnify differences).
	YFromZero bool
	Series    []Series
}

// Input is what the figures are built from.
type Input struct {
	Rows    []sweep.Row
	Evals   map[string][]report.Eval  // by run ID
	Samples map[string][]sweep.Sample // by run ID
}

// Build returns the sweep-level figures for in: test error against step and
// against seconds (one series per run); for each varied cluster-shape or
// data parameter, time, throughput or accuracy against it (one series per
// SGD mode, medians over the runs); host load and total memory over time
// (one series per run); and test accuracy against CPU seconds with its
// Pareto front. Only finished runs count. Figures with nothing to show are
// left out.
func Build(in Input) []Figure {
	var ok []sweep.Row
	for _, r := range in.Rows {
		if r.Status == sweep.StatusOK {
			ok = append(ok, r)
		}
	}
	varied := sweep.VariedKeys(in.Rows)
	legendKeys := slices.DeleteFunc(slices.Clone(varied), func(k string) bool { return k == "seed" })
	runLabel := func(r sweep.Row) string {
		return fmt.Sprintf("%s #%d", sweep.Label(r.Params, legendKeys), r.Repeat)
	}
	var figs []Figure
	add := func(f Figure) {
		if len(f.Series) > 0 {
			figs = append(figs, f)
		}
	}

	bySteps := Figure{Name: "error_vs_step", Title: "Test error vs global step", XLabel: "global step", YLabel: "test error %"}
	bySecs := Figure{Name: "error_vs_seconds", Title: "Test error vs training time", XLabel: "seconds since the first step", YLabel: "test error %"}
	for _, r := range ok {
		ev := in.Evals[r.RunID]
		if len(ev) == 0 {
			continue
		}
		a, b := Series{Label: runLabel(r)}, Series{Label: runLabel(r)}
		for _, e := range ev {
			err := 100 * (1 - e.TestAccuracy)
			a.X, a.Y = append(a.X, float64(e.Step)), append(a.Y, err)
			b.X, b.Y = append(b.X, e.Seconds), append(b.Y, err)
		}
		bySteps.Series = append(bySteps.Series, a)
		bySecs.Series = append(bySecs.Series, b)
	}
	add(bySteps)
	add(bySecs)

	for _, p := range legendKeys {
		others := slices.DeleteFunc(slices.Clone(legendKeys), func(k string) bool { return k == p })
		for _, m := range paramMetrics() {
			add(ParamFigure(ok, p, others, m))
		}
	}
	add(BottleneckFigure(ok, legendKeys))

	load := Figure{Name: "load_over_time", Title: "Host load average (1 min, lags the run) during each run", XLabel: "seconds since the run started", YLabel: "load1"}
	mem := Figure{Name: "memory_over_time", Title: "Resident memory of all processes of each run", XLabel: "seconds since the run started", YLabel: "RSS, sum over processes (MiB)"}
	for _, r := range ok {
		ticks := byTick(in.Samples[r.RunID])
		if len(ticks) == 0 {
			continue
		}
		l, m := Series{Label: runLabel(r)}, Series{Label: runLabel(r)}
		for _, t := range ticks {
			if !math.IsNaN(t.load) {
				l.X, l.Y = append(l.X, t.secs), append(l.Y, t.load)
			}
			m.X, m.Y = append(m.X, t.secs), append(m.Y, t.rss/(1<<20))
		}
		if len(l.X) > 0 {
			load.Series = append(load.Series, l)
		}
		mem.Series = append(mem.Series, m)
	}
	add(load)
	add(mem)
	add(paretoFigure(ok))
	return figs
}

// Metric is a results.csv column drawn against a parameter.
type Metric struct {
	Column string  // results.csv column, e.g. "train_seconds"
	Title  string  // axis title
	Scale  float64 // multiply by this for display
	Zero   bool    // draw the y axis from 0
}

// paramMetrics are the columns drawn against every varied parameter.
func paramMetrics() []Metric {
	return []Metric{
		{"test_accuracy", "test accuracy % (final model)", 100, false},
		{"train_seconds", "train seconds", 1, true},
		{"samples_per_second", "samples/s", 1, true},
		{"cpu_seconds_run", "CPU seconds, whole run (all processes)", 1, true},
		{"peak_rss_bytes_total", "peak RSS, sum over processes (MiB)", 1.0 / (1 << 20), true},
		{"run_queue_mean", "host run queue during the run (mean)", 1, true},
	}
}

// Axis is the x axis of a parameter: its values in order of first
// appearance and where each is drawn. A parameter whose values are all
// numbers is drawn at those numbers; any other is categorical, drawn at
// 0, 1, ... and labelled with Ticks.
type Axis struct {
	Values []string
	Ticks  []string // nil for a numeric axis
	at     map[string]float64
}

// NewAxis lays out the values rows take for parameter p.
func NewAxis(rows []sweep.Row, p string) Axis {
	a := Axis{at: map[string]float64{}}
	numeric := true
	for _, r := range rows {
		v := r.Params[p]
		if _, seen := a.at[v]; seen {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			numeric = false
		}
		a.at[v] = x
		a.Values = append(a.Values, v)
	}
	if !numeric {
		a.Ticks = slices.Clone(a.Values)
		for i, v := range a.Values {
			a.at[v] = float64(i)
		}
	}
	return a
}

// X is where value v is drawn.
func (a Axis) X(v string) float64 { return a.at[v] }

// ParamFigure draws metric m against parameter p: one series per
// combination of the other varied parameters (never pooled over them),
// each point the median over the repeats with their min and max as a
// whisker. Rows whose metric was not measured are left out.
func ParamFigure(rows []sweep.Row, p string, others []string, m Metric) Figure {
	f := Figure{Name: m.Column + "_vs_" + p, Title: m.Title + " vs " + p + " (median, whiskers min-max over repeats)", XLabel: p, YLabel: m.Title,
		YFromZero: m.Zero}
	var kept []sweep.Row
	for _, r := range rows {
		if y, ok := r.Metric(m.Column); ok && !math.IsNaN(y) {
			kept = append(kept, r)
		}
	}
	ax := NewAxis(kept, p)
	f.XTicks = ax.Ticks
	for _, g := range sweep.GroupBy(kept, func(r sweep.Row) string { return sweep.Label(r.Params, others) }) {
		if len(others) == 0 {
			g.Label = "all runs"
		}
		s := Series{Label: g.Label}
		var xs []float64
		at := map[float64][]float64{}
		for _, r := range g.Rows {
			x := ax.X(r.Params[p])
			if _, ok := at[x]; !ok {
				xs = append(xs, x)
			}
			y, _ := r.Metric(m.Column)
			at[x] = append(at[x], y*m.Scale)
		}
		sort.Float64s(xs)
		for _, x := range xs {
			sp := sweep.SpreadOf(at[x])
			s.X, s.Y = append(s.X, x), append(s.Y, sp.Median)
			s.YLo, s.YHi = append(s.YLo, sp.Min), append(s.YHi, sp.Max)
		}
		f.Series = append(f.Series, s)
	}
	return f
}

// BottleneckFigure stacks the workers' step-time shares (compute, push,
// pull, barrier wait, wait; the mean over the repeats, in %) for each
// configuration (labelled by keys, with its most frequent verdict). Runs
// without a breakdown are left out; a phase no run spent time in is not
// drawn.
func BottleneckFigure(rows []sweep.Row, keys []string) Figure {
	f := Figure{Name: "bottleneck", Title: "Where the workers' step time went (mean over repeats) and the verdict",
		XLabel: "configuration (verdict, runs)", YLabel: "share of step time %"}
	phases := []struct {
		label string
		get   func(sweep.Row) float64
	}{
		{"compute", func(r sweep.Row) float64 { return r.PhaseCompute }},
		{"push", func(r sweep.Row) float64 { return r.PhasePush }},
		{"pull", func(r sweep.Row) float64 { return r.PhasePull }},
		{"barrier wait", func(r sweep.Row) float64 { return r.PhaseBarrier }},
		{"wait (staleness bound)", func(r sweep.Row) float64 { return r.PhaseWait }},
	}
	var kept []sweep.Row
	for _, r := range rows {
		if !math.IsNaN(r.PhaseCompute) {
			kept = append(kept, r)
		}
	}
	groups := sweep.GroupBy(kept, func(r sweep.Row) string { return sweep.Label(r.Params, keys) })
	if len(groups) == 0 {
		return f
	}
	for _, g := range groups {
		f.XTicks = append(f.XTicks, fmt.Sprintf("%s (%s)", g.Label, verdictOf(g.Rows)))
	}
	for _, ph := range phases {
		s := Series{Label: ph.label, Kind: Bars}
		any := false
		for i, g := range groups {
			var sum float64
			for _, r := range g.Rows {
				sum += ph.get(r)
			}
			mean := 100 * sum / float64(len(g.Rows))
			any = any || mean > 0
			s.X, s.Y = append(s.X, float64(i)), append(s.Y, mean)
		}
		if any {
			f.Series = append(f.Series, s)
		}
	}
	return f
}

// verdictOf is the most frequent verdict of rows (the first of equals)
// with how many of them had it, e.g. "CPU-bound 3/3".
func verdictOf(rows []sweep.Row) string {
	count := map[string]int{}
	best := ""
	for _, r := range rows {
		v := r.Bottleneck
		if v == "" {
			v = "none"
		}
		count[v]++
		if best == "" || count[v] > count[best] {
			best = v
		}
	}
	return fmt.Sprintf("%s %d/%d", best, count[best], len(rows))
}

// paretoFigure scatters test accuracy against total CPU seconds and draws
// the Pareto front: the runs no other run beats on both (less CPU and
// higher accuracy).
func paretoFigure(rows []sweep.Row) Figure {
	f := Figure{Name: "accuracy_vs_cpu", Title: "Test accuracy vs CPU seconds (all processes), with Pareto front",
		XLabel: "CPU seconds", YLabel: "test accuracy %"}
	all := Series{Label: "runs", Kind: Scatter}
	type pt struct{ x, y float64 }
	var pts []pt
	for _, r := range rows {
		if math.IsNaN(r.CPUTotal) || r.CPUTotal <= 0 {
			continue
		}
		pts = append(pts, pt{r.CPUTotal, 100 * r.TestAccuracy})
		all.X, all.Y = append(all.X, r.CPUTotal), append(all.Y, 100*r.TestAccuracy)
	}
	if len(pts) == 0 {
		return f
	}
	front := Series{Label: "Pareto front", Kind: Line}
	for _, p := range ParetoFront(all.X, all.Y) {
		front.X, front.Y = append(front.X, all.X[p]), append(front.Y, all.Y[p])
	}
	f.Series = []Series{all, front}
	return f
}

// ParetoFront returns the indices of the points (cost x, value y) that no
// other point dominates (x' <= x and y' >= y, one of them strictly), by
// increasing cost. Of identical points the first is kept.
func ParetoFront(x, y []float64) []int {
	idx := make([]int, len(x))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		if x[idx[a]] != x[idx[b]] {
			return x[idx[a]] < x[idx[b]]
		}
		return y[idx[a]] > y[idx[b]]
	})
	var out []int
	best := math.Inf(-1)
	for _, i := range idx {
		if y[i] > best {
			out = append(out, i)
			best = y[i]
		}
	}
	return out
}

type tick struct {
	secs, load, rss float64
}

// byTick groups samples by sampling instant: the host load (NaN if none
// reported it) and the sum of the processes' RSS.
func byTick(samples []sweep.Sample) []tick {
	at := map[float64]int{}
	var out []tick
	for _, s := range samples {
		i, ok := at[s.Seconds]
		if !ok {
			i = len(out)
			at[s.Seconds] = i
			out = append(out, tick{secs: s.Seconds, load: math.NaN()})
		}
		if !math.IsNaN(s.Load1) {
			out[i].load = s.Load1
		}
		if !math.IsNaN(s.RSSBytes) {
			out[i].rss += s.RSSBytes
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].secs < out[b].secs })
	return out
}

// RunMemory is the figure of one run's memory: one series per process.
func RunMemory(runID string, samples []sweep.Sample) Figure {
	f := Figure{Name: "memory", Title: "Resident memory per process, run " + runID, XLabel: "seconds since the run started", YLabel: "RSS (MiB)"}
	at := map[string]int{}
	for _, s := range samples {
		if math.IsNaN(s.RSSBytes) {
			continue
		}
		i, ok := at[s.Task]
		if !ok {
			i = len(f.Series)
			at[s.Task] = i
			f.Series = append(f.Series, Series{Label: s.Task})
		}
		f.Series[i].X = append(f.Series[i].X, s.Seconds)
		f.Series[i].Y = append(f.Series[i].Y, s.RSSBytes/(1<<20))
	}
	sort.SliceStable(f.Series, func(a, b int) bool { return taskOrder(f.Series[a].Label) < taskOrder(f.Series[b].Label) })
	return f
}

// taskOrder sorts chief, then ps/i, then worker/i.
func taskOrder(task string) string {
	switch {
	case task == "chief":
		return "0"
	case len(task) > 3 && task[:3] == "ps/":
		return fmt.Sprintf("1%08s", task[3:])
	case len(task) > 7 && task[:7] == "worker/":
		return fmt.Sprintf("2%08s", task[7:])
	}
	return "3" + task
}
