package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/lab/figures"
	"github.com/pstrain/pstrain/lab/sweep"
)

// binaries are pstrain and pstrain-lab, built side by side once per test
// process, as make build leaves them.
type binaries struct {
	once sync.Once
	dir  string
	err  error
}

var bins binaries

func TestMain(m *testing.M) {
	code := m.Run()
	if bins.dir != "" {
		os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

// paths returns the pstrain and pstrain-lab binaries' paths.
func (b *binaries) paths(t *testing.T) (pstrain, lab string) {
	t.Helper()
	b.once.Do(func() {
		root, err := testbin.ModuleRoot()
		if err != nil {
			b.err = err
			return
		}
		if b.dir, b.err = os.MkdirTemp("", "pstrain-lab-test"); b.err != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", b.dir+string(filepath.Separator), "./cmd/pstrain", "./cmd/pstrain-lab")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return filepath.Join(b.dir, "pstrain"), filepath.Join(b.dir, "pstrain-lab")
}

// The real binary checks and completes each configuration: defaults
// filled in, and its own message for a bad value.
func TestResolveWithTheBinary(t *testing.T) {
	exe, _ := bins.paths(t)
	resolve := sweep.RunResolver(context.Background(), exe)
	p, err := resolve(map[string]string{"mode": "async", "hidden": "256,128", "lr": "0.05"})
	if err != nil {
		t.Fatal(err)
	}
	if p["mode"] != "async" || p["hidden"] != "256,128" || p["lr"] != "0.05" || p["workers"] != "2" || p["eval-every"] != "1s" {
		t.Errorf("resolved %v", p)
	}
	if _, ok := p[sweep.KeyCPUs]; len(p) != len(sweep.Keys())-1 || ok || p["model"] != "mlp" {
		t.Errorf("%d keys, want every key but cpus (%d): %v", len(p), len(sweep.Keys())-1, p)
	}
	if p, err := resolve(map[string]string{"model": "cnn"}); err != nil || p["model"] != "cnn" || p["conv"] == "" {
		t.Errorf("model=cnn: %v %v", p, err)
	}
	for params, want := range map[string]string{
		"workers=abc":             `invalid value "abc" for flag -workers`,
		"mode=fast":               "--mode must be sync, async or ssp",
		"data-fraction=2":         "--data-fraction must be in (0, 1]",
		"hidden=0":                "hidden",
		"replicas-to-aggregate=5": "--replicas-to-aggregate 5 is more than --workers 2",
		"batch=0":                 "batch",
		"optimizer=lbfgs":         "optimizer",
		"staleness=-1":            "staleness",
	} {
		k, v, _ := strings.Cut(params, "=")
		if _, err := resolve(map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", params, err, want)
		}
	}
}

// A bad grid is refused before anything runs or is written.
func TestSweepBadGrid(t *testing.T) {
	exe, _ := bins.paths(t)
	out := filepath.Join(t.TempDir(), "s")
	for grid, want := range map[string]string{
		"mode=sync,async;workers=2,0": "workers=0",
		"mode=sync;wrkers=2":          `unknown key "wrkers"`,
		"lr=0.1,fast":                 "lr=fast",
		"model=mlp,svm":               "model=svm",
		"cpus=1,4096":                 "cpus=4096: this machine lets the sweep use only",
	} {
		var stdout, stderr bytes.Buffer
		err := runSweep(context.Background(), "pstrain", exe, []string{"--grid", grid, "--out", out}, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("grid %q: err = %v, want it to name %q", grid, err, want)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused grid created %s: %v", out, err)
	}
	err := runSweep(context.Background(), "pstrain", "x", []string{"--grid", "mode=sync"}, &bytes.Buffer{}, &bytes.Buffer{})
	var ue *usageError
	if !errors.As(err, &ue) {
		t.Errorf("missing --out: %v, want a usage error", err)
	}
}

// e2eAxes are the axes TestSweepEndToEnd varies; every assertion is
// written over their cross product.
var e2eAxes = []struct {
	key    string
	values []string
}{
	{"cpus", []string{"1", "2"}},
	{"model", []string{"mlp", "cnn"}},
}

// A tiny real sweep over e2eAxes (cpus=1,2: the whole cluster pinned to
// one CPU, then two; the MLP and the CNN) of a small cluster on 5% of MNIST, end to end through
// the real binary: the pinning is checked on the run's own processes.
func TestSweepEndToEnd(t *testing.T) {
	own, err := sweep.OwnCPUs()
	if err != nil || len(own) < 2 {
		t.Skipf("needs 2 CPUs to pin to (have %v, %v)", own, err)
	}
	d := testbin.MNIST(t)
	exe, _ := bins.paths(t)
	out := filepath.Join(t.TempDir(), "tiny")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	grid := "mode=sync;workers=2;ps=1;hidden=64;optimizer=sgd;lr=0.2;warmup-steps=0;data-fraction=0.05;epochs=1;eval-every=500ms;target-accuracy=0"
	runs := 1
	for _, ax := range e2eAxes {
		grid += ";" + ax.key + "=" + strings.Join(ax.values, ",")
		runs *= len(ax.values)
	}
	args := []string{"--grid", grid, "--out", out, "--data-dir", d, "--sample-every", "100ms"} // (a run now trains in ~0.5 s: 250 ms gave 2 samples)
	var stdout, stderr bytes.Buffer
	if err := runSweep(ctx, "pstrain", exe, args, &stdout, &stderr); err != nil {
		t.Fatalf("sweep: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{fmt.Sprintf("%d configurations x 1 repeats = %d runs", runs, runs), "[1/", fmt.Sprintf("[%d/%d]", runs, runs), "ETA", "ok in"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, stdout.String())
		}
	}
	rows, err := sweep.ReadResults(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != runs {
		t.Fatalf("%d rows, want %d", len(rows), runs)
	}
	for _, r := range rows {
		name := sweep.Label(r.Params, sweep.VariedKeys(rows))
		if r.Status != sweep.StatusOK || r.Params["hidden"] != "64" || r.Params["data-fraction"] != "0.05" {
			t.Errorf("%s: %+v", name, r)
		}
		if r.GlobalSteps <= 0 || r.TestAccuracy < 0.5 || r.TrainSeconds <= 0 || r.SamplesPerSecond <= 0 {
			t.Errorf("%s: steps %d accuracy %.3f train %.2fs", name, r.GlobalSteps, r.TestAccuracy, r.TrainSeconds)
		}
		if r.CPUWorker <= 0 || r.CPUPS <= 0 || r.CPUChief <= 0 || r.RSSWorker <= 0 || r.RSSPS <= 0 {
			t.Errorf("%s: resources %+v", name, r)
		}
		if !(r.Load1Max >= 0) || r.WallSeconds < r.TrainSeconds {
			t.Errorf("%s: load max %v wall %v (no metrics samples?)", name, r.Load1Max, r.WallSeconds)
		}
		// The pinning holds on the run's processes (read from
		// /proc/PID/status while it ran): cpus=N allows the first N.
		n, _ := strconv.Atoi(r.Params["cpus"])
		if want := sweep.FormatCPUList(own[:n]); r.CPUsAllowed != want {
			t.Errorf("%s: the run's processes were allowed on CPUs %q, want %q", name, r.CPUsAllowed, want)
		}
		// The run's own CPU (rusage of pstrain run and every task it
		// reaped) covers what the tasks report, plus the launcher.
		if !(r.RunCPUSeconds >= 0.9*r.CPUTotal) || !(r.HostCPUSeconds >= 0.9*r.RunCPUSeconds) || !(r.RunQueueMean >= 0) {
			t.Errorf("%s: run CPU %v, tasks' CPU %v, host CPU %v, run queue %v", name, r.RunCPUSeconds, r.CPUTotal, r.HostCPUSeconds, r.RunQueueMean)
		}
		samples, err := sweep.ReadRunSamples(out, r.RunID)
		t.Logf("%s: %d metrics samples over %.2f s", name, len(samples), r.WallSeconds)
		if err != nil || len(samples) < 4 {
			t.Errorf("%s: %d samples: %v", name, len(samples), err)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, sweep.SummaryFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, ax := range e2eAxes {
		if !strings.Contains(string(md), "## By "+ax.key) {
			t.Errorf("summary lacks a table by %s:\n%s", ax.key, md)
		}
	}

	// The plot model: per run curves, and every metric against each
	// varied key with one series per combination of the others.
	in, err := figures.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"error_vs_step": runs, "error_vs_seconds": runs, "load_over_time": runs, "memory_over_time": runs, "accuracy_vs_cpu": 2}
	for _, ax := range e2eAxes {
		for _, m := range []string{"test_accuracy", "train_seconds", "samples_per_second", "cpu_seconds_run", "peak_rss_bytes_total", "run_queue_mean"} {
			want[m+"_vs_"+ax.key] = runs / len(ax.values)
		}
	}
	figs := figures.Build(in)
	got := map[string]int{}
	for _, f := range figs {
		got[f.Name] = len(f.Series)
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
	for name, n := range want {
		if got[name] != n {
			t.Errorf("figure %s: %d series, want %d (figures: %v)", name, got[name], n, got)
		}
	}

	// Re-running resumes: nothing runs again; `pstrain plot` re-draws.
	stdout.Reset()
	os.Remove(filepath.Join(out, "error_vs_step.png"))
	if err := runSweep(ctx, "pstrain", exe, args, &stdout, &stderr); err != nil {
		t.Fatalf("resume: %v\n%s", err, stdout.String())
	}
	if !strings.Contains(stdout.String(), fmt.Sprintf("%d of %d runs already finished", runs, runs)) {
		t.Errorf("resume output:\n%s", stdout.String())
	}
	stdout.Reset()
	os.Remove(filepath.Join(out, "error_vs_step.png"))
	if err := cmdPlot(ctx, "pstrain", []string{out}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "error_vs_step.png")); err != nil || !strings.Contains(stdout.String(), fmt.Sprintf("drew %d plots", len(figs))) {
		t.Errorf("plot: %v\n%s", err, stdout.String())
	}
}
