package main

import (
	"bytes"
	"context"
	"flag"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/tools/figures"
	"github.com/pstrain/pstrain/tools/sweep"
)

func TestResolveRun(t *testing.T) {
	p, err := resolveRun(map[string]string{"mode": "async", "hidden": "256,128", "lr": "0.05"})
	if err != nil {
		t.Fatal(err)
	}
	if p["mode"] != "async" || p["hidden"] != "256,128" || p["lr"] != "0.05" || p["workers"] != "2" || p["eval-every"] != "1s" {
		t.Errorf("resolved %v", p)
	}
	if _, ok := p[sweep.KeyCPUs]; len(p) != len(sweep.Keys())-1 || ok || p["model"] != "mlp" {
		t.Errorf("%d keys, want every key but cpus (%d): %v", len(p), len(sweep.Keys())-1, p)
	}
	for params, want := range map[string]string{
		"workers=abc":             "workers=abc: ",
		"mode=fast":               "--mode must be sync, async or ssp",
		"data-fraction=2":         "--data-fraction must be in (0, 1]",
		"hidden=0":                "hidden",
		"replicas-to-aggregate=5": "--replicas-to-aggregate 5 is more than --workers 2",
		"batch=0":                 "batch",
		"optimizer=lbfgs":         "optimizer",
		"staleness=-1":            "staleness",
		"cpus=1":                  "cpus is not a run flag",
	} {
		k, v, _ := strings.Cut(params, "=")
		if _, err := resolveRun(map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", params, err, want)
		}
	}
}

// The model key maps to --model when the run flags have it; a build
// without it (only the MLP) resolves model=mlp and refuses the others.
func TestResolveModel(t *testing.T) {
	newFS := func(withModel bool) (*flag.FlagSet, *string) {
		fs := flag.NewFlagSet("grid", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		model := "mlp"
		if withModel {
			fs.StringVar(&model, "model", model, "")
		}
		fs.Int("workers", 2, "")
		return fs, &model
	}
	ok := func() error { return nil }
	fs, _ := newFS(false)
	if _, err := resolveWith(fs, ok, func() []string { return nil }, map[string]string{"model": "cnn"}); err == nil || !strings.Contains(err.Error(), "no --model flag") {
		t.Errorf("model=cnn without --model: %v", err)
	}
	fs, _ = newFS(false)
	if p, err := resolveWith(fs, ok, func() []string { return []string{"--workers=2"} }, map[string]string{"model": "mlp"}); err != nil || p["model"] != "mlp" || p["workers"] != "2" {
		t.Errorf("model=mlp without --model: %v %v", p, err)
	}
	fs, model := newFS(true)
	args := func() []string { return []string{"--model=" + *model, "--workers=2"} }
	if p, err := resolveWith(fs, ok, args, map[string]string{"model": "cnn"}); err != nil || p["model"] != "cnn" || *model != "cnn" {
		t.Errorf("model=cnn with --model: %v %v (flag %q)", p, err, *model)
	}
	// The real flags: whatever this build has, mlp resolves.
	if p, err := resolveRun(map[string]string{"model": "mlp"}); err != nil || p["model"] != "mlp" {
		t.Errorf("resolveRun model=mlp: %v %v", p, err)
	}
}

// A bad grid is refused before anything runs or is written.
func TestSweepBadGrid(t *testing.T) {
	out := filepath.Join(t.TempDir(), "s")
	for grid, want := range map[string]string{
		"mode=sync,async;workers=2,0": "workers=0",
		"mode=sync;wrkers=2":          `unknown key "wrkers"`,
		"lr=0.1,fast":                 "lr=fast",
		"model=mlp,svm":               "model=svm",
		"cpus=1,4096":                 "cpus=4096: this machine lets the sweep use only",
	} {
		var stdout, stderr bytes.Buffer
		err := runSweep(context.Background(), "/nonexistent/pstrain", []string{"--grid", grid, "--out", out}, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("grid %q: err = %v, want it to name %q", grid, err, want)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused grid created %s: %v", out, err)
	}
	if err := runSweep(context.Background(), "x", []string{"--grid", "mode=sync"}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Error("missing --out accepted")
	}
}

// A tiny real sweep: two configurations (sync and async) of a small
// cluster on 5% of MNIST, end to end through the real binary.
func TestSweepEndToEnd(t *testing.T) {
	d := testbin.MNIST(t)
	exe := bin.Path(t)
	out := filepath.Join(t.TempDir(), "tiny")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// Plain SGD: async with momentum 0.9 over 24 updates is unstable
	// (stale gradients and momentum compound; docs/semantics.md).
	args := []string{"--grid", "mode=sync,async;workers=2;ps=1;hidden=64;optimizer=sgd;lr=0.2;data-fraction=0.05;epochs=1;eval-every=500ms;target-accuracy=0",
		"--out", out, "--data-dir", d, "--sample-every", "250ms"}
	var stdout, stderr bytes.Buffer
	if err := runSweep(ctx, exe, args, &stdout, &stderr); err != nil {
		t.Fatalf("sweep: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{"2 configurations x 1 repeats = 2 runs", "[1/2]", "[2/2]", "ETA", "ok in"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, stdout.String())
		}
	}
	rows, err := sweep.ReadResults(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2", len(rows))
	}
	for i, mode := range []string{"sync", "async"} {
		r := rows[i]
		if r.Status != sweep.StatusOK || r.Params["mode"] != mode || r.Params["hidden"] != "64" || r.Params["data-fraction"] != "0.05" {
			t.Errorf("row %d: %+v", i, r)
		}
		// 3000 samples: sync steps take 2x32... batch 128 per worker.
		if r.GlobalSteps <= 0 || r.TestAccuracy < 0.5 || r.TrainSeconds <= 0 || r.SamplesPerSecond <= 0 {
			t.Errorf("%s: steps %d accuracy %.3f train %.2fs", mode, r.GlobalSteps, r.TestAccuracy, r.TrainSeconds)
		}
		if r.CPUWorker <= 0 || r.CPUPS <= 0 || r.CPUChief <= 0 || r.RSSWorker <= 0 || r.RSSPS <= 0 {
			t.Errorf("%s: resources %+v", mode, r)
		}
		if !(r.Load1Max >= 0) || r.WallSeconds < r.TrainSeconds {
			t.Errorf("%s: load max %v wall %v (no metrics samples?)", mode, r.Load1Max, r.WallSeconds)
		}
		samples, err := sweep.ReadRunSamples(out, r.RunID)
		if err != nil || len(samples) < 4 {
			t.Errorf("%s: %d samples: %v", mode, len(samples), err)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, sweep.SummaryFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 runs finished", "## By mode", "| mode=sync | 1 |", "| async | 1 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("summary lacks %q:\n%s", want, md)
		}
	}

	// The plot model: what each figure must show for this sweep.
	in, err := figures.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"error_vs_step": 2, "error_vs_seconds": 2, "load_over_time": 2, "memory_over_time": 2, "accuracy_vs_cpu": 2}
	figs := figures.Build(in)
	if len(figs) != len(want) {
		t.Errorf("%d figures, want %d", len(figs), len(want))
	}
	for _, f := range figs {
		if n, ok := want[f.Name]; !ok || len(f.Series) != n {
			t.Errorf("figure %s: %d series, want %d", f.Name, len(f.Series), n)
		}
		for _, s := range f.Series {
			if len(s.X) == 0 {
				t.Errorf("figure %s: series %q is empty", f.Name, s.Label)
			}
		}
		b, err := os.ReadFile(filepath.Join(out, f.Name+".png"))
		if err != nil {
			t.Error(err)
			continue
		}
		if _, err := png.Decode(bytes.NewReader(b)); err != nil {
			t.Errorf("%s.png: %v", f.Name, err)
		}
	}

	// Re-running resumes: nothing runs again; `pstrain plot` re-draws.
	stdout.Reset()
	os.Remove(filepath.Join(out, "error_vs_step.png"))
	if err := runSweep(ctx, "/nonexistent/pstrain", args, &stdout, &stderr); err != nil {
		t.Fatalf("resume: %v\n%s", err, stdout.String())
	}
	if !strings.Contains(stdout.String(), "2 of 2 runs already finished") {
		t.Errorf("resume output:\n%s", stdout.String())
	}
	stdout.Reset()
	os.Remove(filepath.Join(out, "error_vs_step.png"))
	if err := cmdPlot(ctx, []string{out}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "error_vs_step.png")); err != nil || !strings.Contains(stdout.String(), "drew 5 plots") {
		t.Errorf("plot: %v\n%s", err, stdout.String())
	}
}
