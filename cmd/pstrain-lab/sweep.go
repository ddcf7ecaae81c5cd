package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pstrain/pstrain/lab/figures"
	"github.com/pstrain/pstrain/lab/sweep"
)

// cmdSweep runs an experiment grid: `pstrain sweep --grid SPEC --out DIR`.
// Each run executes the pstrain binary beside this one as `pstrain run`,
// which also checks and completes every configuration first (--dry-run).
func cmdSweep(ctx context.Context, prog string, args []string, stdout, stderr io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return runSweep(ctx, prog, filepath.Join(filepath.Dir(self), "pstrain"), args, stdout, stderr)
}

// runSweep is cmdSweep with the default pstrain binary given.
func runSweep(ctx context.Context, prog, exe string, args []string, stdout, _ io.Writer) error {
	fs := newFlagSet(prog, "sweep", "sweep --grid SPEC --out DIR [flags]", "Run a grid of pstrain run configurations and write results.csv, summary.md and plots.")
	grid := fs.String("grid", "", "grid of pstrain run flags, e.g. 'mode=sync,async;workers=1,2;data-fraction=0.3,1' (hidden layers: hidden=800,256+128; model=mlp,cnn; cpus=1,2 pins each run's processes to that many CPUs with taskset)")
	repeat := fs.Int("repeat", 1, "runs per configuration (repeat r uses seed+r)")
	out := fs.String("out", "", "output directory (results.csv, summary.md, plots, runs/); re-running resumes it")
	dataDir := fs.String("data-dir", "data", "directory holding the data sets")
	every := fs.Duration("sample-every", time.Second, "how often each process's /metrics is sampled")
	logLevel := fs.String("log-level", "warn", "log level of the runs' tasks")
	fs.StringVar(&exe, "pstrain", exe, "the pstrain binary that checks and runs each configuration")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
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
	configs, err := g.Expand(sweep.RunResolver(ctx, exe), len(cpus))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s sweep: %d configurations x %d repeats = %d runs into %s\n", prog, len(configs), *repeat, len(configs)**repeat, *out)
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
func cmdPlot(_ context.Context, prog string, args []string, stdout, _ io.Writer) error {
	fs := newFlagSet(prog, "plot", "plot SWEEP_DIR", "Re-draw a sweep's plots (PNG and SVG) from its results.csv.")
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
