package main

import (
	"context"
	"encoding/json"
	"flag"
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

// benchCmd is `pstrain bench`'s command line.
type benchCmd struct {
	fs                                           *flag.FlagSet
	asJSON, quick                                bool
	sections, batches, dataDir, workDir          string
	cpuProfile, memProfile, predict, calibration string
	budget                                       time.Duration
	rounds, blasThreads                          int
	seed                                         uint64
	mr                                           config.Run
}

// newBenchCmd registers `pstrain bench`'s flags.
func newBenchCmd() *benchCmd {
	c := &benchCmd{fs: newFlagSet("bench", "bench [flags]", "Measure performance ratios against this machine's limits (see docs/scaling.md),\nor with --predict, print the scaling model's prediction for a cluster."),
		mr: config.Default()}
	fs := c.fs
	fs.BoolVar(&c.asJSON, "json", false, "print the result as JSON instead of a table")
	fs.BoolVar(&c.quick, "quick", false, "shorter timings and a smaller end_to_end grid")
	fs.StringVar(&c.sections, "sections", strings.Join(bench.Sections(), ","), "comma list of sections to measure (also: network, across emulated links, only when named; docs/scaling.md)")
	fs.DurationVar(&c.budget, "duration", 0, "time per measurement loop (default 1.5s, 0.4s with --quick)")
	fs.IntVar(&c.rounds, "rounds", 0, "alternating measurement rounds per section; the best counts (default 3, 2 with --quick)")
	fs.StringVar(&c.batches, "batches", "128,512", "compute batch sizes; the first is also ps_overhead's")
	fs.StringVar(&c.dataDir, "data-dir", "data", "data sets for cluster and end_to_end runs")
	fs.StringVar(&c.workDir, "work-dir", "", "where cluster and end_to_end runs keep reports and logs (default: a temporary directory, removed)")
	fs.IntVar(&c.blasThreads, "blas-threads", 1, "OpenBLAS threads for compute, wire and ps_overhead")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (not of end_to_end's children) here")
	fs.StringVar(&c.memProfile, "memprofile", "", "write an allocation profile of this process here at the end")
	fs.Uint64Var(&c.seed, "seed", 1, "seed for weights and synthetic data")
	bindModelFlags(fs, &c.mr)
	fs.StringVar(&c.predict, "predict", "", "print the scaling model's prediction for workers=N,ps=M,net=10gbit[,latency=50us] instead of measuring")
	fs.StringVar(&c.calibration, "calibration", "", "--predict: calibrate from this file, the output of pstrain bench --json (default: the built-in reference figures; docs/scaling.md)")
	return c
}

// cmdBench measures performance ratios in one run (see docs/scaling.md).
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newBenchCmd()
	if err := parse(c.fs, args, stdout); err != nil {
		return err
	}
	if c.predict != "" {
		return benchPredict(c.predict, c.calibration, c.asJSON, stdout)
	}
	cfg, err := c.config(stderr)
	if err != nil {
		return err
	}
	if cfg.NeedsRunner() {
		cleanup, err := c.runners(&cfg)
		if err != nil {
			return err
		}
		defer cleanup()
	}
	if c.cpuProfile != "" {
		stop, err := startCPUProfile(c.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	res, runErr := bench.Run(ctx, cfg)
	if c.memProfile != "" {
		if err := writeHeapProfile(c.memProfile); err != nil {
			return err
		}
	}
	if res != nil {
		if err := c.print(stdout, res); err != nil {
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

// config checks the flags (a mistake is a usage error), fills in the
// defaults, sets OpenBLAS up and returns the bench's configuration.
func (c *benchCmd) config(progress io.Writer) (bench.Config, error) {
	secs, err := c.parseSections()
	if err != nil {
		return bench.Config{}, err
	}
	bs, err := model.ParseHidden(c.batches) // a comma list of positive ints
	if err != nil || len(bs) == 0 {
		return bench.Config{}, usagef("--batches %q: want a comma list of positive batch sizes", c.batches)
	}
	if c.budget < 0 || c.rounds < 0 {
		return bench.Config{}, usagef("--duration and --rounds must not be negative")
	}
	if c.budget == 0 {
		c.budget = 1500 * time.Millisecond
		if c.quick {
			c.budget = 400 * time.Millisecond
		}
	}
	if c.rounds == 0 {
		c.rounds = 3
		if c.quick {
			c.rounds = 2
		}
	}
	if err := blas.Setup(c.blasThreads); err != nil {
		return bench.Config{}, err
	}
	if err := c.mr.Validate(); err != nil {
		return bench.Config{}, asUsage(err)
	}
	spec := c.benchSpec()
	return bench.Config{Sections: secs, Quick: c.quick, Spec: spec,
		Batches: bs, BLAS: gorgonia.WhichBLAS(), BLASName: blas.Describe(), Budget: c.budget, Rounds: c.rounds, Seed: c.seed,
		Embeddings: c.embeddingsPlan(spec), Progress: progress}, nil
}

// runners sets cfg up for the sections that run this binary (cluster,
// end_to_end, tls, network): in --work-dir, or in a temporary directory
// that cleanup removes. The network section keeps a journal of its
// finished runs there, so that a bench with the same --work-dir resumes
// it.
func (c *benchCmd) runners(cfg *bench.Config) (cleanup func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, cleanup := c.workDir, func() {}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "pstrain-bench-"); err != nil {
			return nil, err
		}
		cleanup = func() { os.RemoveAll(dir) }
	}
	runner := &bench.ExecRunner{Exe: exe, Dir: dir, DataDir: c.dataDir}
	if c.mr.Model.IsCNN() { // the cluster runs train the model compute measured
		runner.Model = []string{"--model=cnn", "--conv=" + sizesText(&c.mr.Conv), "--hidden=" + sizesText(&c.mr.Hidden)}
	}
	c.setEmbeddingsRunner(cfg, runner, dir)
	cfg.Runner = runner
	cfg.TLSDir = filepath.Join(dir, "tls-certs")
	cfg.TLSLink = &bench.NetlabLink{Exe: exe, Dir: dir, DataDir: c.dataDir}
	cfg.Load = hostLoad1
	netlab := &bench.NetlabCluster{Exe: exe, Dir: filepath.Join(dir, "network"), DataDir: c.dataDir}
	journal := "network-runs.jsonl"
	if c.quick {
		journal = "network-runs-quick.jsonl"
	}
	cfg.Network, cfg.NetworkJournal = netlab, filepath.Join(dir, journal)
	removeDir := cleanup
	return func() { netlab.Close(); removeDir() }, nil
}

// print writes the result as a table, or as JSON with --json.
func (c *benchCmd) print(stdout io.Writer, res *bench.Result) error {
	if !c.asJSON {
		return bench.WriteTable(stdout, res)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// startCPUProfile profiles this process's CPU into path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
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
