package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/pstrain/pstrain/observe/report"
)

// Runner runs `pstrain run` with extra flags and returns its report and
// wall-clock time (process start to exit).
type Runner interface {
	Run(ctx context.Context, args []string) (*report.Report, time.Duration, error)
}

// ExecRunner runs the real binary: Exe run --report ... in a fresh
// directory under Dir per run, with its output in that directory's
// run.log. It is not safe for concurrent use (runs are numbered).
type ExecRunner struct {
	Exe     string
	Dir     string
	DataDir string
	// Model holds the flags choosing the model every run trains (e.g.
	// --model=cnn), given before each run's own; nil: the default MLP.
	Model []string
	Now   Clock
	n     int
}

// Run implements Runner. On ctx's end the cluster is interrupted (SIGINT,
// so the launcher stops its tasks) and killed 10 s later.
func (e *ExecRunner) Run(ctx context.Context, args []string) (*report.Report, time.Duration, error) {
	return e.run(ctx, args, nil)
}

// run is Run with watch (unless nil) called in a goroutine of its own
// while the cluster runs, given the run's directory; its context ends
// when the cluster's process has exited, and run waits for it to return.
func (e *ExecRunner) run(ctx context.Context, args []string, watch func(ctx context.Context, runDir string)) (*report.Report, time.Duration, error) {
	now := e.Now
	if now == nil {
		now = time.Now
	}
	e.n++
	dir := filepath.Join(e.Dir, fmt.Sprintf("run%02d", e.n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, 0, fmt.Errorf("bench: %w", err)
	}
	logPath := filepath.Join(dir, "run.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, 0, fmt.Errorf("bench: %w", err)
	}
	defer logf.Close()
	repPath := filepath.Join(dir, "report.json")
	full := append([]string{"run", "--report", repPath, "--run-dir", dir, "--sd-dir", filepath.Join(dir, "targets"),
		"--data-dir", e.DataDir}, append(slices.Clone(e.Model), args...)...)
	cmd := exec.CommandContext(ctx, e.Exe, full...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 10 * time.Second
	start := now()
	err = runWatched(ctx, cmd, dir, watch)
	wall := now().Sub(start)
	if err != nil {
		return nil, wall, fmt.Errorf("bench: pstrain %v failed (%w); log: %s", args, err, logPath)
	}
	rep, err := report.Read(repPath)
	if err != nil {
		return nil, wall, fmt.Errorf("bench: %w (log: %s)", err, logPath)
	}
	return rep, wall, nil
}

// E2EConfig says which runs the end_to_end section makes.
type E2EConfig struct {
	Runner     Runner
	Target     bool     // run the default cluster to its target accuracy
	Modes      []string // grid of short fixed runs
	PS         []int
	Workers    []int
	GridEpochs float64
}

// E2ERun is one run of the grid.
type E2ERun struct {
	Mode             string  `json:"mode"`
	PS               int     `json:"ps"`
	Workers          int     `json:"workers"`
	Epochs           float64 `json:"epochs"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	// TrainSeconds is the chief's first-step-to-end time, which
	// SamplesPerSecond divides by: the chief notices the end on its
	// status poll, so short runs carry that poll's granularity.
	TrainSeconds   float64 `json:"train_seconds"`
	GlobalSteps    int64   `json:"global_steps"`
	WallSeconds    float64 `json:"wall_seconds"`
	StartupSeconds float64 `json:"startup_seconds"`
	TestAccuracy   float64 `json:"test_accuracy"`
	Error          string  `json:"error,omitempty"`
}

// E2EResult is the end_to_end section. The top-level figures are the
// default cluster's run to the target accuracy.
type E2EResult struct {
	TargetAccuracy      float64  `json:"target_accuracy"`
	TimeToTargetSeconds *float64 `json:"time_to_target_seconds"` // null if never reached
	WallSeconds         float64  `json:"wall_seconds"`
	StartupSeconds      float64  `json:"startup_seconds"`
	TrainSeconds        float64  `json:"train_seconds"`
	SamplesPerSecond    float64  `json:"samples_per_second"`
	TestAccuracy        float64  `json:"test_accuracy"`
	GlobalSteps         int64    `json:"global_steps"`
	// SamplesToTarget is what the target run had trained when it held the
	// target; IdealSeconds is that over Cores x one process's BLAS ceiling
	// (CeilingSamplesPerSecond, at the run's batch, measured in the same
	// bench run), and TimeToTargetOverIdeal is TimeToTargetSeconds over
	// IdealSeconds (null if the target was not reached).
	SamplesToTarget         int64    `json:"samples_to_target"`
	Cores                   int      `json:"cores"`
	CeilingSamplesPerSecond float64  `json:"ceiling_samples_per_second"`
	IdealSeconds            float64  `json:"ideal_seconds"`
	TimeToTargetOverIdeal   *float64 `json:"time_to_target_over_ideal"`
	Runs                    []E2ERun `json:"runs"`
}

// setIdeal sets the ideal-time figures of the target run rep (nothing
// without one) against the ceiling at rep's batch.
func (e *E2EResult) setIdeal(ctx context.Context, c ComputeConfig, compute *ComputeResult, rep *report.Report, cores int) error {
	if rep == nil {
		return nil
	}
	ceil, err := ceilingFor(ctx, c, compute, rep.Batch)
	if err != nil {
		return err
	}
	e.SamplesToTarget, e.Cores, e.CeilingSamplesPerSecond = SamplesToTarget(rep), cores, ceil
	e.IdealSeconds, e.TimeToTargetOverIdeal = TimeToTargetOverIdeal(rep.TimeToTargetSeconds, e.SamplesToTarget, cores, ceil)
	return nil
}

// EndToEnd makes the runs. It returns the target run's report too (nil
// without Target), which Memory reads. A failing grid run is recorded in
// its row; a failing target run is an error.
func EndToEnd(ctx context.Context, c E2EConfig) (*E2EResult, *report.Report, error) {
	if c.Runner == nil {
		return nil, nil, errors.New("bench: end_to_end needs a runner")
	}
	res := &E2EResult{}
	var target *report.Report
	if c.Target {
		rep, wall, err := c.Runner.Run(ctx, nil)
		if err != nil {
			return nil, nil, err
		}
		target = rep
		res.TargetAccuracy, res.TimeToTargetSeconds = rep.TargetAccuracy, rep.TimeToTargetSeconds
		res.WallSeconds, res.StartupSeconds, res.TrainSeconds = wall.Seconds(), rep.StartupSeconds, rep.TrainSeconds
		res.SamplesPerSecond, res.TestAccuracy, res.GlobalSteps = rep.SamplesPerSecond, rep.TestAccuracy, rep.GlobalSteps
	}
	for _, mode := range c.Modes {
		for _, p := range c.PS {
			for _, w := range c.Workers {
				if err := ctx.Err(); err != nil {
					return nil, nil, err
				}
				row := E2ERun{Mode: mode, PS: p, Workers: w, Epochs: c.GridEpochs}
				rep, wall, err := c.Runner.Run(ctx, GridArgs(mode, p, w, c.GridEpochs))
				row.WallSeconds = wall.Seconds()
				if err != nil {
					row.Error = err.Error()
				} else {
					row.SamplesPerSecond, row.StartupSeconds, row.TestAccuracy = rep.SamplesPerSecond, rep.StartupSeconds, rep.TestAccuracy
					row.TrainSeconds, row.GlobalSteps = rep.TrainSeconds, rep.GlobalSteps
				}
				res.Runs = append(res.Runs, row)
			}
		}
	}
	return res, target, nil
}

// asyncLR is the grid's learning rate for async and ssp runs: at the
// default 0.1 with momentum 0.9, four async workers diverge (a NaN
// gradient is refused by the PS and the run fails). Throughput does not
// depend on it.
const asyncLR = "0.05"

// GridArgs are the flags of one short fixed run: all epochs, no target,
// one evaluation at the end; async and ssp use asyncLR.
func GridArgs(mode string, ps, workers int, epochs float64) []string {
	args := []string{"--mode", mode, "--ps", strconv.Itoa(ps), "--workers", strconv.Itoa(workers),
		"--epochs", strconv.FormatFloat(epochs, 'g', -1, 64), "--target-accuracy", "0", "--eval-every", "0s"}
	if mode != "sync" {
		args = append(args, "--lr", asyncLR)
	}
	return args
}
