package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/tools/figures"
	"github.com/pstrain/pstrain/tools/sweep"
)

// cmdSweep runs an experiment grid: `pstrain sweep --grid SPEC --out DIR`.
// Each run executes this binary as `pstrain run`.
func cmdSweep(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	return runSweep(ctx, exe, args, stdout, stderr)
}

// runSweep is cmdSweep with the pstrain binary to run given.
func runSweep(ctx context.Context, exe string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sweep", "sweep --grid SPEC --out DIR [flags]", "Run a grid of pstrain run configurations and write results.csv, summary.md and plots.")
	grid := fs.String("grid", "", "grid of pstrain run flags, e.g. 'mode=sync,async;workers=1,2;data-fraction=0.3,1' (hidden layers: hidden=800,256+128; model=mlp,cnn; cpus=1,2 pins each run's processes to that many CPUs with taskset)")
	repeat := fs.Int("repeat", 1, "runs per configuration (repeat r uses seed+r)")
	out := fs.String("out", "", "output directory (results.csv, summary.md, plots, runs/); re-running resumes it")
	dataDir := fs.String("data-dir", "data", "directory holding the data sets")
	every := fs.Duration("sample-every", time.Second, "how often each process's /metrics is sampled")
	logLevel := fs.String("log-level", "warn", "log level of the runs' tasks")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *grid == "" || *out == "" {
		return usagef("need --grid SPEC and --out DIR")
	}
	if *repeat < 1 {
		return usagef("--repeat must be at least 1, got %d", *repeat)
	}
	g, err := sweep.ParseGrid(*grid)
	if err != nil {
		return err
	}
	cpus, err := sweep.OwnCPUs()
	if err != nil {
		return fmt.Errorf("sweep: the CPUs runs may be pinned to: %w", err)
	}
	configs, err := g.Expand(resolveRun, len(cpus))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "pstrain sweep: %d configurations x %d repeats = %d runs into %s\n", len(configs), *repeat, len(configs)**repeat, *out)
	_, runErr := sweep.Run(ctx, sweep.Options{Exe: exe, Dir: *out, DataDir: *dataDir, Configs: configs, Repeat: *repeat,
		ExtraArgs: []string{"--log-level=" + *logLevel}, Progress: stdout, SampleEvery: *every, CPUs: cpus})
	if _, err := os.Stat(filepath.Join(*out, sweep.ResultsFile)); err != nil {
		return errors.Join(runErr, err)
	}
	// Plots for whatever finished, even after an interruption.
	figs, err := figures.DrawAll(*out)
	if err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Fprintf(stdout, "results: %s, %s, %d plots in %s\n", sweep.ResultsFile, sweep.SummaryFile, len(figs), *out)
	return runErr
}

// cmdPlot re-draws a sweep's plots from its files: `pstrain plot DIR`.
func cmdPlot(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plot", "plot SWEEP_DIR", "Re-draw a sweep's plots (PNG and SVG) from its results.csv.")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want one sweep directory, got %d arguments", fs.NArg())
	}
	dir := fs.Arg(0)
	figs, err := figures.DrawAll(dir)
	if err != nil {
		return err
	}
	var names []string
	for _, f := range figs {
		names = append(names, f.Name)
	}
	fmt.Fprintf(stdout, "drew %d plots (PNG and SVG) in %s: %s\n", len(figs), dir, strings.Join(names, ", "))
	return nil
}

// resolveRun is the sweep.Resolver of `pstrain run`: it applies the grid's
// values to the default configuration through the run flags, validates the
// result and returns every sweepable flag's value (cpus is the sweep's).
func resolveRun(params map[string]string) (map[string]string, error) {
	fs := flag.NewFlagSet("grid", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	r := config.Default()
	mf := bindRunFlags(fs, &r)
	return resolveWith(fs, func() error { mf.defaultLR(); return r.Validate() }, func() []string { return runArgs(r) }, params)
}

// resolveWith is resolveRun over a bound flag set, its validation and the
// flags it renders. A flag set without --model (a build with only the MLP)
// resolves model=mlp and refuses other models.
func resolveWith(fs *flag.FlagSet, validate func() error, args func() []string, params map[string]string) (map[string]string, error) {
	model := "mlp"
	if f := fs.Lookup("model"); f != nil {
		model = f.Value.String()
	}
	for _, k := range sweep.Keys() {
		v, ok := params[k]
		if !ok {
			continue
		}
		if k == "model" && fs.Lookup(k) == nil {
			if v != "mlp" {
				return nil, fmt.Errorf("model=%s: this pstrain has no --model flag (it trains only the MLP)", v)
			}
			continue
		}
		if k == sweep.KeyCPUs {
			return nil, fmt.Errorf("cpus is not a run flag")
		}
		if err := fs.Set(k, v); err != nil {
			return nil, fmt.Errorf("%s=%s: %w", k, v, err)
		}
		if k == "model" {
			model = v
		}
	}
	for k := range params {
		if fs.Lookup(k) == nil && k != "model" {
			return nil, fmt.Errorf("unknown key %q", k)
		}
	}
	if err := validate(); err != nil {
		return nil, err
	}
	out := map[string]string{"model": model}
	for _, a := range args() {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if slices.Contains(sweep.Keys(), k) {
			out[k] = v
		}
	}
	return out, nil
}
