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

	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/tools/sweep"
)

// Kind is how a series is drawn.
type Kind int

// Series kinds.
const (
	Line    Kind = iota // points joined in order, with markers
	Scatter             // markers only
)

// Series is one legend entry of a figure.
type Series struct {
	Label string
	Kind  Kind
	X, Y  []float64
}

// Figure is the model of one plot.
type Figure struct {
	Name   string // file name without extension, e.g. "error_vs_step"
	Title  string
	XLabel string
	YLabel string
	Series []Series
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

	type vs struct{ metric, title string }
	against := map[string][]vs{
		"workers":       {{"train_seconds", "train seconds"}, {"samples_per_second", "samples/s"}},
		"ps":            {{"train_seconds", "train seconds"}, {"samples_per_second", "samples/s"}},
		"data-fraction": {{"test_accuracy", "test accuracy %"}, {"train_seconds", "train seconds"}},
		"epochs":        {{"test_accuracy", "test accuracy %"}, {"train_seconds", "train seconds"}},
		"batch":         {{"train_seconds", "train seconds"}, {"test_accuracy", "test accuracy %"}},
	}
	for _, p := range []string{"workers", "ps", "data-fraction", "epochs", "batch"} {
		if !slices.Contains(varied, p) {
			continue
		}
		for _, m := range against[p] {
			add(paramFigure(ok, p, m.metric, m.title, slices.Contains(varied, "mode")))
		}
	}

	load := Figure{Name: "load_over_time", Title: "Host load average (1 min) during each run", XLabel: "seconds since the run started", YLabel: "load1"}
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

// paramFigure plots the median of metric against parameter p, one series
// per mode when byMode (otherwise one series).
func paramFigure(rows []sweep.Row, p, metric, ytitle string, byMode bool) Figure {
	f := Figure{Name: metric + "_vs_" + p, Title: ytitle + " vs " + p + " (median over runs)", XLabel: p, YLabel: ytitle}
	scale := 1.0
	if metric == "test_accuracy" {
		scale = 100
	}
	series := map[string]map[float64][]float64{}
	var order []string
	for _, r := range rows {
		x, err := strconv.ParseFloat(r.Params[p], 64)
		if err != nil {
			continue
		}
		y, ok := r.Metric(metric)
		if !ok || math.IsNaN(y) {
			continue
		}
		key := "all runs"
		if byMode {
			key = "mode=" + r.Params["mode"]
		}
		if series[key] == nil {
			series[key] = map[float64][]float64{}
			order = append(order, key)
		}
		series[key][x] = append(series[key][x], y*scale)
	}
	for _, key := range order {
		s := Series{Label: key}
		var xs []float64
		for x := range series[key] {
			xs = append(xs, x)
		}
		sort.Float64s(xs)
		for _, x := range xs {
			s.X, s.Y = append(s.X, x), append(s.Y, sweep.SpreadOf(series[key][x]).Median)
		}
		f.Series = append(f.Series, s)
	}
	return f
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
