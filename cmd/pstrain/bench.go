package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/prometheus/procfs"
	"gorgonia.org/gorgonia"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/blas"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/tools/bench"
)

// cmdBench measures performance ratios in one run (see docs/scaling.md).
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", "bench [flags]", "Measure performance ratios against this machine's limits (see docs/scaling.md),\nor with --predict, print the scaling model's prediction for a cluster.")
	asJSON := fs.Bool("json", false, "print the result as JSON instead of a table")
	quick := fs.Bool("quick", false, "shorter timings and a smaller end_to_end grid")
	sections := fs.String("sections", strings.Join(bench.Sections(), ","), "comma list of sections to measure")
	budget := fs.Duration("duration", 0, "time per measurement loop (default 1.5s, 0.4s with --quick)")
	rounds := fs.Int("rounds", 0, "alternating measurement rounds per section; the best counts (default 3, 2 with --quick)")
	batches := fs.String("batches", "128,512", "compute batch sizes; the first is also ps_overhead's")
	dataDir := fs.String("data-dir", "data", "data sets for cluster and end_to_end runs")
	workDir := fs.String("work-dir", "", "where cluster and end_to_end runs keep reports and logs (default: a temporary directory, removed)")
	blasThreads := fs.Int("blas-threads", 1, "OpenBLAS threads for compute, wire and ps_overhead")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (not of end_to_end's children) here")
	memProfile := fs.String("memprofile", "", "write an allocation profile of this process here at the end")
	seed := fs.Uint64("seed", 1, "seed for weights and synthetic data")
	mr := config.Default()
	bindModelFlags(fs, &mr)
	predict := fs.String("predict", "", "print the scaling model's prediction for workers=N,ps=M,net=10gbit[,latency=50us] instead of measuring")
	calibration := fs.String("calibration", "", "--predict: calibrate from this file, the output of pstrain bench --json (default: the built-in reference figures; docs/scaling.md)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *predict != "" {
		return benchPredict(*predict, *calibration, *asJSON, stdout)
	}
	secs, err := bench.ParseSections(*sections)
	if err != nil {
		return asUsage(err)
	}
	bs, err := model.ParseHidden(*batches) // a comma list of positive ints
	if err != nil || len(bs) == 0 {
		return usagef("--batches %q: want a comma list of positive batch sizes", *batches)
	}
	if *budget < 0 || *rounds < 0 {
		return usagef("--duration and --rounds must not be negative")
	}
	if *budget == 0 {
		*budget = 1500 * time.Millisecond
		if *quick {
			*budget = 400 * time.Millisecond
		}
	}
	if *rounds == 0 {
		*rounds = 3
		if *quick {
			*rounds = 2
		}
	}
	if err := blas.Setup(*blasThreads); err != nil {
		return err
	}
	if err := mr.Validate(); err != nil {
		return asUsage(err)
	}
	spec := mr.Spec(784, 10) // MNIST's shape: the sections use synthetic data of it
	cfg := bench.Config{Sections: secs, Quick: *quick, Spec: spec,
		Batches: bs, BLAS: gorgonia.WhichBLAS(), BLASName: blas.Describe(), Budget: *budget, Rounds: *rounds, Seed: *seed,
		Progress: stderr}
	if cfg.NeedsRunner() {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		dir := *workDir
		if dir == "" {
			if dir, err = os.MkdirTemp("", "pstrain-bench-"); err != nil {
				return err
			}
			defer os.RemoveAll(dir)
		}
		runner := &bench.ExecRunner{Exe: exe, Dir: dir, DataDir: *dataDir}
		if mr.Model.IsCNN() { // the cluster runs train the model compute measured
			runner.Model = []string{"--model=cnn", "--conv=" + sizesText(&mr.Conv), "--hidden=" + sizesText(&mr.Hidden)}
		}
		cfg.Runner = runner
		cfg.TLSDir = filepath.Join(dir, "tls-certs")
		cfg.TLSLink = &bench.NetlabLink{Exe: exe, Dir: dir, DataDir: *dataDir}
		cfg.Load = hostLoad1
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, runErr := bench.Run(ctx, cfg)
	if *memProfile != "" {
		if err := writeHeapProfile(*memProfile); err != nil {
			return err
		}
	}
	if res != nil {
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(res); err != nil {
				return err
			}
		} else if err := bench.WriteTable(stdout, res); err != nil {
			return err
		}
	}
	if runErr != nil {
		return runErr
	}
	if len(res.Errors) > 0 {
		return fmt.Errorf("bench: %d section(s) failed (see above)", len(res.Errors))
	}
	return nil
}

func benchPredict(scenario, calibrationFile string, asJSON bool, stdout io.Writer) error {
	sc, err := bench.ParseScenario(scenario)
	if err != nil {
		return asUsage(err)
	}
	cal := bench.ReferenceCalibration()
	if calibrationFile != "" {
		b, err := os.ReadFile(calibrationFile)
		if err != nil {
			return err
		}
		var r bench.Result
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("--calibration %s: %w", calibrationFile, err)
		}
		if cal, err = bench.CalibrationFrom(&r); err != nil {
			return fmt.Errorf("--calibration %s: %w", calibrationFile, err)
		}
	}
	p, err := bench.Predict(cal, sc)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Calibration bench.Calibration `json:"calibration"`
			Prediction  bench.Prediction  `json:"prediction"`
		}{cal, p})
	}
	fmt.Fprintf(stdout, "sync SGD, %d workers, %d PS, %.3g GB/s links, latency %v, batch %d per worker\n",
		sc.Workers, sc.PS, sc.BytesPerSecond/1e9, sc.Latency, cal.Batch)
	fmt.Fprintf(stdout, "step %.2f ms, %.0f samples/s, %.0f%% of %d x one worker's compute; bound by the %s\n",
		1e3*p.StepSeconds, p.SamplesPerSecond, 100*p.Efficiency, sc.Workers, p.Bound)
	fmt.Fprintf(stdout, "knee at %.1f workers for %d PS; PS links cap throughput at %.0f samples/s\n",
		p.KneeWorkers, sc.PS, p.CeilingSamplesPerSecond)
	return nil
}

// hostLoad1 is the host's one-minute load average (0 if unknown).
func hostLoad1() float64 {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0
	}
	l, err := fs.LoadAvg()
	if err != nil {
		return 0
	}
	return l.Load1
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
