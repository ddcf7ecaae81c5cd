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

	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/tools/sweep"
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
		"train_seconds_vs_workers": 2, "samples_per_second_vs_workers": 2, // one per mode
		"load_over_time": 12, "memory_over_time": 12,
		"accuracy_vs_cpu": 2, // runs + front
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
			if s.Label != "mode=sync" || !reflect.DeepEqual(s.X, []float64{1, 2, 4}) || s.Y[0] != 10.5 {
				t.Errorf("param series %+v", s)
			}
		case "memory_over_time":
			s := f.Series[0]
			if !reflect.DeepEqual(s.X, []float64{0, 1}) || !reflect.DeepEqual(s.Y, []float64{3, 3}) {
				t.Errorf("memory %+v", s)
			}
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
