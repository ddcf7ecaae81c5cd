package figures

import (
	"bytes"
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/lab/sweep"
	"github.com/pstrain/pstrain/observe/report"
)

// synth is a sweep of mode x workers, 2 repeats, with evals and samples.
func synth() Input {
	in := Input{Evals: map[string][]report.Eval{}, Samples: map[string][]sweep.Sample{}}
	i := 0
	for _, mode := range []string{"sync", "async"} {
		for _, w := range []string{"1", "2", "4"} {
			for rep := 0; rep < 2; rep++ {
				p := map[string]string{}
				for _, k := range sweep.Keys() {
					p[k] = "1"
				}
				p["mode"], p["workers"] = mode, w
				id := fmt.Sprintf("%s-%s-r%d", mode, w, rep)
				in.Rows = append(in.Rows, sweep.Row{RunID: id, Repeat: rep, Status: sweep.StatusOK, Params: p,
					TrainSeconds: float64(10 + i), SamplesPerSecond: 1000 * float64(i+1), TestAccuracy: 0.9 + 0.001*float64(i),
					CPUTotal: float64(20 + (i*7)%11)})
				in.Evals[id] = []report.Eval{{Step: 10, Seconds: 1, TestAccuracy: 0.8}, {Step: 20, Seconds: 2, TestAccuracy: 0.9}}
				in.Samples[id] = []sweep.Sample{
					{Seconds: 0, Task: "chief", RSSBytes: 1 << 20, Load1: 1},
					{Seconds: 0, Task: "worker/0", RSSBytes: 2 << 20, Load1: 1},
					{Seconds: 1, Task: "chief", RSSBytes: 3 << 20, Load1: 2},
				}
				i++
			}
		}
	}
	// A failed run is not drawn.
	in.Rows = append(in.Rows, sweep.Row{RunID: "bad", Status: sweep.StatusFailed, Params: in.Rows[0].Params})
	return in
}

func TestBuild(t *testing.T) {
	figs := Build(synth())
	counts := map[string]int{}
	for _, f := range figs {
		counts[f.Name] = len(f.Series)
	}
	want := map[string]int{
		"error_vs_step": 12, "error_vs_seconds": 12, // one per run
		"load_over_time": 12, "memory_over_time": 12,
		"accuracy_vs_cpu": 2, // runs + front
	}
	// Every metric against each varied key: one series per value of the
	// other (2 modes; 3 worker counts).
	for _, m := range paramMetrics() {
		want[m.Column+"_vs_workers"] = 2
		want[m.Column+"_vs_mode"] = 3
	}
	if !reflect.DeepEqual(counts, want) {
		t.Errorf("figures %v\nwant %v", counts, want)
	}
	for _, f := range figs {
		switch f.Name {
		case "error_vs_step":
			s := f.Series[0]
			if s.Label != "mode=sync workers=1 #0" || !reflect.DeepEqual(s.X, []float64{10, 20}) || math.Abs(s.Y[0]-20) > 1e-9 {
				t.Errorf("error curve %+v", s)
			}
		case "train_seconds_vs_workers":
			// sync, workers=1: runs 0 and 1 have 10 and 11 train seconds.
			s := f.Series[0]
			if s.Label != "mode=sync" || !reflect.DeepEqual(s.X, []float64{1, 2, 4}) || s.Y[0] != 10.5 || s.YLo[0] != 10 || s.YHi[0] != 11 {
				t.Errorf("param series %+v", s)
			}
		case "train_seconds_vs_mode":
			// Categorical: sync at 0, async at 1; workers=4 async is
			// runs 10 and 11.
			s := f.Series[2]
			if !reflect.DeepEqual(f.XTicks, []string{"sync", "async"}) || s.Label != "workers=4" ||
				!reflect.DeepEqual(s.X, []float64{0, 1}) || s.Y[1] != 20.5 {
				t.Errorf("categorical figure %+v", f)
			}
		case "memory_over_time":
			s := f.Series[0]
			if !reflect.DeepEqual(s.X, []float64{0, 1}) || !reflect.DeepEqual(s.Y, []float64{3, 3}) {
				t.Errorf("memory %+v", s)
			}
		}
	}
}

// rowsOf makes finished rows from parameter maps, with a metric value.
func rowsOf(params []map[string]string, acc []float64) []sweep.Row {
	var rows []sweep.Row
	for i, p := range params {
		full := map[string]string{}
		for _, k := range sweep.Keys() {
			full[k] = "1"
		}
		for k, v := range p {
			full[k] = v
		}
		rows = append(rows, sweep.Row{RunID: fmt.Sprint(i), Status: sweep.StatusOK, Params: full, TestAccuracy: acc[i],
			PhaseCompute: math.NaN()})
	}
	return rows
}

// One series per value of the other varied key, never pooled; repeats
// become the median and a min-max whisker; unmeasured runs are left out.
func TestParamFigureGroups(t *testing.T) {
	var params []map[string]string
	var acc []float64
	for _, df := range []string{"0.5", "1"} {
		for _, ep := range []string{"1", "3"} {
			for rep := 0; rep < 3; rep++ {
				params = append(params, map[string]string{"data-fraction": df, "epochs": ep})
				v := 0.9
				if df == "1" {
					v += 0.04
				}
				if ep == "3" {
					v += 0.02
				}
				acc = append(acc, v+0.001*float64(rep))
			}
		}
	}
	rows := rowsOf(params, acc)
	rows[0].TestAccuracy = math.NaN()
	f := ParamFigure(rows, "data-fraction", []string{"epochs"}, Metric{"test_accuracy", "acc", 100, false})
	if f.Name != "test_accuracy_vs_data-fraction" || f.XTicks != nil || len(f.Series) != 2 {
		t.Fatalf("figure %+v", f)
	}
	one, three := f.Series[0], f.Series[1]
	if one.Label != "epochs=1" || three.Label != "epochs=3" {
		t.Errorf("labels %q %q", one.Label, three.Label)
	}
	near := func(a, b []float64) bool {
		if len(a) != len(b) {
			return false
		}
		for i := range a {
			if math.Abs(a[i]-b[i]) > 1e-9 {
				return false
			}
		}
		return true
	}
	// epochs=1 at 0.5: the NaN run left out, median of 90.1 and 90.2.
	if !near(one.X, []float64{0.5, 1}) || !near(one.Y, []float64{90.15, 94.1}) || !near(one.YLo, []float64{90.1, 94}) || !near(one.YHi, []float64{90.2, 94.2}) {
		t.Errorf("epochs=1 series %+v", one)
	}
	if !near(three.Y, []float64{92.1, 96.1}) {
		t.Errorf("epochs=3 series %+v", three)
	}
	// No other varied key: one series of all runs.
	if f := ParamFigure(rows, "epochs", nil, Metric{"test_accuracy", "acc", 1, false}); len(f.Series) != 1 || f.Series[0].Label != "all runs" {
		t.Errorf("single series %+v", f.Series)
	}
}

func TestAxis(t *testing.T) {
	rows := rowsOf([]map[string]string{{"hidden": "800"}, {"hidden": "256,128"}, {"hidden": "800"}, {"cpus": "all"}}, []float64{1, 1, 1, 1})
	a := NewAxis(rows, "hidden")
	if !reflect.DeepEqual(a.Ticks, []string{"800", "256,128", "1"}) || a.X("256,128") != 1 || a.X("1") != 2 {
		t.Errorf("categorical axis %+v", a)
	}
	b := NewAxis(rows[:1], "hidden")
	if b.Ticks != nil || b.X("800") != 800 {
		t.Errorf("numeric axis %+v", b)
	}
	c := NewAxis(rows, "cpus") // "1", "1", "1", "all": not all numbers
	if !reflect.DeepEqual(c.Ticks, []string{"1", "all"}) {
		t.Errorf("cpus axis %+v", c)
	}
}

func TestBottleneckFigure(t *testing.T) {
	rows := rowsOf([]map[string]string{{"workers": "1"}, {"workers": "1"}, {"workers": "2"}, {"workers": "2"}, {"workers": "4"}},
		[]float64{1, 1, 1, 1, 1})
	set := func(r *sweep.Row, verdict string, c, push, pull, bw float64) {
		r.Bottleneck, r.PhaseCompute, r.PhasePush, r.PhasePull, r.PhaseBarrier, r.PhaseWait = verdict, c, push, pull, bw, 0
	}
	set(&rows[0], "compute-bound", 0.8, 0.1, 0.1, 0)
	set(&rows[1], "compute-bound", 0.6, 0.1, 0.1, 0.2)
	set(&rows[2], "CPU-bound", 0.5, 0.2, 0.2, 0.1)
	set(&rows[3], "barrier", 0.4, 0.2, 0.2, 0.2)
	// rows[4] has no breakdown: left out.
	f := BottleneckFigure(rows, []string{"workers"})
	if !reflect.DeepEqual(f.XTicks, []string{"workers=1 (compute-bound 2/2)", "workers=2 (CPU-bound 1/2)"}) {
		t.Errorf("ticks %q", f.XTicks)
	}
	var labels []string
	for _, s := range f.Series {
		labels = append(labels, s.Label)
		if s.Kind != Bars {
			t.Errorf("series %q is not bars", s.Label)
		}
	}
	if !reflect.DeepEqual(labels, []string{"compute", "push", "pull", "barrier wait"}) {
		t.Errorf("phases %v (wait is 0 everywhere and must be left out)", labels)
	}
	if c := f.Series[0]; math.Abs(c.Y[0]-70) > 1e-9 || math.Abs(c.Y[1]-45) > 1e-9 {
		t.Errorf("compute shares %v, want mean 70 and 45", c.Y)
	}
	for i := range f.XTicks {
		var sum float64
		for _, s := range f.Series {
			sum += s.Y[i]
		}
		if math.Abs(sum-100) > 1e-9 {
			t.Errorf("configuration %d stacks to %v%%", i, sum)
		}
	}
}

func TestParetoFront(t *testing.T) {
	x := []float64{5, 1, 3, 2, 4, 3}
	y := []float64{99, 90, 95, 89, 94, 95}
	if got := ParetoFront(x, y); !reflect.DeepEqual(got, []int{1, 2, 0}) {
		t.Errorf("front %v, want [1 2 0]", got)
	}
	if got := ParetoFront(nil, nil); len(got) != 0 {
		t.Errorf("empty front %v", got)
	}
}

func TestRunMemory(t *testing.T) {
	f := RunMemory("x", []sweep.Sample{
		{Seconds: 0, Task: "worker/0", RSSBytes: 1 << 20}, {Seconds: 0, Task: "ps/10", RSSBytes: 1 << 20},
		{Seconds: 0, Task: "ps/2", RSSBytes: 1 << 20}, {Seconds: 0, Task: "chief", RSSBytes: 1 << 20},
		{Seconds: 1, Task: "chief", RSSBytes: 2 << 20}, {Seconds: 1, Task: "ps/2", RSSBytes: math.NaN()},
	})
	var labels []string
	for _, s := range f.Series {
		labels = append(labels, s.Label)
	}
	if !reflect.DeepEqual(labels, []string{"chief", "ps/2", "ps/10", "worker/0"}) || len(f.Series[0].Y) != 2 || len(f.Series[1].Y) != 1 {
		t.Errorf("series %v: %+v", labels, f.Series)
	}
}

func TestRenderWritesPNGAndSVG(t *testing.T) {
	dir := t.TempDir()
	f := Figure{Name: "t", Title: "T", XLabel: "x", YLabel: "y", Series: []Series{
		{Label: "a", X: []float64{1, 2}, Y: []float64{3, 4}}, {Label: "b", Kind: Scatter, X: []float64{1}, Y: []float64{2}}}}
	if err := Render(f, dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "t.png"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil || img.Bounds().Dx() < 300 {
		t.Fatalf("png: %v %v", err, img)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "t.svg"))
	if err != nil || !strings.Contains(string(svg), "<svg") {
		t.Errorf("svg: %v", err)
	}
	bad := Figure{Name: "bad", Series: []Series{{Label: "a", X: []float64{1}, Y: nil}}}
	if err := Render(bad, dir); err == nil {
		t.Error("mismatched series rendered")
	}
	bad = Figure{Name: "bad", Series: []Series{{Label: "a", X: []float64{1}, Y: []float64{1}, YLo: []float64{1}}}}
	if err := Render(bad, dir); err == nil {
		t.Error("mismatched whiskers rendered")
	}
	// The legend is outside the data area: the image is wider than the
	// plot by the legend's strip, and without a legend it is not.
	noLegend := Figure{Name: "n", Title: "N", XLabel: "x", YLabel: "y"}
	if err := Render(noLegend, dir); err != nil {
		t.Fatal(err)
	}
	nb, _ := os.ReadFile(filepath.Join(dir, "n.png"))
	nimg, err := png.Decode(bytes.NewReader(nb))
	if err != nil || img.Bounds().Dx() <= nimg.Bounds().Dx() {
		t.Errorf("with a legend %d px wide, without %d px (%v)", img.Bounds().Dx(), nimg.Bounds().Dx(), err)
	}
	// Whiskers, categorical ticks and stacked bars render.
	f = Figure{Name: "w", XTicks: []string{"a", "b"}, Series: []Series{
		{Label: "l", X: []float64{0, 1}, Y: []float64{2, 3}, YLo: []float64{1, 3}, YHi: []float64{2.5, 4}},
		{Label: "b1", Kind: Bars, X: []float64{0, 1}, Y: []float64{40, 50}}, {Label: "b2", Kind: Bars, X: []float64{0, 1}, Y: []float64{60, 50}}}}
	if err := Render(f, dir); err != nil {
		t.Fatal(err)
	}
}

func TestDrawAllFromDirectory(t *testing.T) {
	dir := t.TempDir()
	in := synth()
	var buf bytes.Buffer
	if err := sweep.WriteCSV(&buf, in.Rows); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, sweep.ResultsFile), buf.Bytes(), 0o644)
	// Only one run has stored files; the others are drawn without curves.
	id := in.Rows[0].RunID
	os.MkdirAll(sweep.RunDir(dir, id), 0o755)
	(&report.Report{Evals: in.Evals[id]}).Write(filepath.Join(sweep.RunDir(dir, id), sweep.ReportFile))
	buf.Reset()
	sweep.WriteSamples(&buf, in.Samples[id])
	os.WriteFile(filepath.Join(sweep.RunDir(dir, id), sweep.SamplesFile), buf.Bytes(), 0o644)

	figs, err := DrawAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range figs {
		if f.Name == "error_vs_step" && len(f.Series) != 1 {
			t.Errorf("error curves: %d series, want 1", len(f.Series))
		}
		for _, ext := range []string{".png", ".svg"} {
			if _, err := os.Stat(filepath.Join(dir, f.Name+ext)); err != nil {
				t.Error(err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(sweep.RunDir(dir, id), "memory.png")); err != nil {
		t.Error(err)
	}
	if _, err := DrawAll(t.TempDir()); err == nil {
		t.Error("a directory without results.csv was drawn")
	}
}

func TestDodgeStep(t *testing.T) {
	one := Figure{Series: []Series{{X: []float64{1, 4}}}}
	two := Figure{Series: []Series{{X: []float64{1, 4}}, {X: []float64{2, 3}}}}
	cat := Figure{XTicks: []string{"a", "b"}, Series: two.Series}
	if dodgeStep(one) != 0 || math.Abs(dodgeStep(two)-0.045) > 1e-12 || dodgeStep(cat) != 0.08 {
		t.Errorf("dodge %v %v %v", dodgeStep(one), dodgeStep(two), dodgeStep(cat))
	}
	if f := ParamFigure(rowsOf([]map[string]string{{"workers": "1"}}, []float64{0.9}), "workers", nil, paramMetrics()[1]); !f.YFromZero {
		t.Error("train seconds not drawn from 0")
	}
}
