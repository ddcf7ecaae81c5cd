package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/launcher"
	"github.com/pstrain/pstrain/ml/blas"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/observe/webconfig"
	"github.com/pstrain/pstrain/worker"
)

const runAbout = `Start a local cluster (a chief, --ps parameter servers and, with --ps-replicas 1, a hot standby for each, --workers workers) and train.

SIGINT (Ctrl-C) or SIGTERM stops the run cleanly: the model is scored and
checkpointed, the summary and report are written, and pstrain exits with 130
or 143, normally within a few seconds; a supervisor should allow 30 s before
SIGKILL. Signals within 1 s of the first are the same interruption (timeout
and supervisors signal the process and its group); a Ctrl-C a second or more
later kills every task at once, with no final checkpoint.`

// runCmd is `pstrain run`'s command line: the run's configuration and
// the launcher's flags.
type runCmd struct {
	fs *flag.FlagSet
	r  config.Run
	mf *modelFlags

	reportPath, faults, faultGradient, dir, sdDir string
	logLevel, tlsDir, tokenFile                   string
	webConfig                                     *string
	maxRestarts, portBase                         int
	connectTimeout, taskTimeout, timerSlack       time.Duration
	killStale, dryRun                             bool

	faultList []launcher.Fault // --fault, parsed by check
	slowList  []launcher.Slowdown
}

// newRunCmd registers `pstrain run`'s flags.
func newRunCmd() *runCmd {
	c := &runCmd{fs: newFlagSet("run", "run [flags]", runAbout), r: config.Default()}
	fs := c.fs
	c.r.CheckpointDir = filepath.Join("run", "checkpoints")
	c.mf = bindRunFlags(fs, &c.r)
	fs.StringVar(&c.reportPath, "report", "", "write the run report (JSON) here")
	fs.StringVar(&c.faults, "fault", "", "kill -9 tasks at times after start, e.g. ps/1@8s,worker/0@12s,chief@20s, or when the run gets there: TASK@step:N (the chief's global step reaches N), TASK@checkpoint:N (N checkpoints committed), either with +DELAY after it, e.g. ps/1@checkpoint:1+300ms; slow:worker/N@TIME:FACTOR makes a worker FACTOR times slower from then on (stopped for part of every 100 ms), e.g. slow:worker/1@5s:3 (resilience and straggler demos and tests)")
	fs.StringVar(&c.faultGradient, "fault-gradient", "", "testing: poison gradients, e.g. worker/1@30:1e6 (worker 1's gradient times 1e6 once, at global step 30) or worker/3@every:-4 (every step); demos and tests of the divergence guard")
	fs.IntVar(&c.maxRestarts, "max-restarts", 5, "restarts allowed per task before the run fails")
	fs.StringVar(&c.dir, "run-dir", "run", "where the cluster file and the task logs go")
	fs.StringVar(&c.sdDir, "sd-dir", "run/targets", "where the Prometheus file_sd target file goes")
	fs.IntVar(&c.portBase, "metrics-port-base", 0, "metrics ports: chief on BASE, ps/i on BASE+1+i, worker/i after them, then standby/i (--ps-replicas 1) after every worker slot (0 = free ports)")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", time.Minute, "how long tasks wait for each other before giving up")
	fs.DurationVar(&c.taskTimeout, "task-timeout", 10*time.Second, "a task whose /healthz answers nothing this long is killed and restarted; a task exiting 0 mid-run is restarted after this long")
	fs.DurationVar(&c.timerSlack, "timer-slack", launcher.TaskTimerSlack, "how late the kernel may wake a task's sleeping thread (Linux timer slack; 0 = leave the launcher's own, normally the kernel's 50µs): 1ms wakes the Go runtime's monitor thread in a worker ~3x less often")
	fs.BoolVar(&c.killStale, "kill-stale", false, "kill processes of an earlier run still alive on --run-dir (default: refuse to start beside them)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.tlsDir, "tls-dir", "", "run every task over mutual TLS with certificates in this directory (made there if missing)")
	fs.StringVar(&c.tokenFile, "auth-token-file", "", "the run's secret (default: a new one in --run-dir for every launch)")
	fs.BoolVar(&c.dryRun, "dry-run", false, "check the flags, print every run flag's resolved value (one --flag=value a line) and exit without starting anything")
	c.webConfig = bindWebConfigFlag(fs, ": every task gets a copy in --run-dir that also admits the launcher's health checks")
	return c
}

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newRunCmd()
	if err := parse(c.fs, args, stdout); err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	if c.dryRun {
		fmt.Fprintln(stdout, strings.Join(runArgs(c.r), "\n"))
		return nil
	}
	return c.execute(ctx, stdout, stderr)
}

// check completes the configuration (the default learning rate, the
// checkpoint directory under --run-dir) and checks every flag: a mistake
// is a usage error.
func (c *runCmd) check() error {
	c.mf.defaultLR()
	if err := c.r.Validate(); err != nil {
		return asUsage(err)
	}
	if err := checkRunFlags(c.r, c.portBase, c.connectTimeout); err != nil {
		return err
	}
	if err := positive("task-timeout", c.taskTimeout); err != nil {
		return err
	}
	if c.timerSlack < 0 {
		return usagef("--timer-slack must be >= 0, got %v", c.timerSlack)
	}
	if c.r.DataPlanePrivacy == config.Integrity && c.tlsDir == "" {
		return usagef("--data-plane-privacy integrity needs --tls-dir: its MAC keys come from the TLS handshake (without TLS the data plane is plaintext)")
	}
	if !flagSet(c.fs, "checkpoint-dir") && c.dir != "run" {
		c.r.CheckpointDir = filepath.Join(c.dir, "checkpoints")
	}
	var err error
	if c.faultList, err = launcher.ParseFaults(c.faults, c.r); err != nil {
		return asUsage(err)
	}
	if c.slowList, err = launcher.ParseSlowdowns(c.faults, c.r); err != nil {
		return asUsage(err)
	}
	if _, err := worker.ParseGradientFaults(c.faultGradient, c.r.Workers); err != nil {
		return asUsage(err)
	}
	if c.maxRestarts < 0 {
		return usagef("--max-restarts must be >= 0")
	}
	if *c.webConfig != "" {
		// Refused here rather than by every task at start.
		if _, err := webconfig.Read(*c.webConfig); err != nil {
			return asUsage(err)
		}
	}
	return nil
}

// execute runs the checked configuration: it fetches the data set if
// needed, launches the cluster and prints the summary.
func (c *runCmd) execute(ctx context.Context, stdout, stderr io.Writer) error {
	// Log lines (stderr) and the progress (stdout) share the terminal:
	// whole lines only, one at a time.
	var con console
	stdoutLines, stderrLines := con.lines(stdout), con.lines(stderr)
	defer stdoutLines.Flush()
	defer stderrLines.Flush()
	stdout = stdoutLines
	log, err := newLogger(stderrLines, c.logLevel)
	if err != nil {
		return err
	}
	r := c.r
	if err := blas.Check(); err != nil {
		// Every worker and the chief load it: without it each would be
		// restarted in vain. Said before a download.
		return err
	}
	if dataset.Fetchable(r.Dataset) {
		// A fresh checkout has no data: fetch it (verified) before starting.
		if err := dataset.Fetch(ctx, r.DataDir, r.Dataset, func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...)) }); err != nil {
			return err
		}
	}
	shape, err := checkRun(r)
	if err != nil {
		return err
	}
	warnGuard(log, r)
	lc, err := c.launchConfig(ctx, log, stdout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "pstrain: %s SGD, %s, %d workers, %s, batch %d, lr %s, %s\n", r.Mode, psText(r), r.Workers,
		modelText(specOf(r, shape)), r.Batch, lrText(r), r.Optimizer)
	rep, err := launcher.Run(ctx, lc)
	if errors.Is(err, launcher.ErrChiefGaveUp) {
		return &exitError{code: launcher.ExitChiefGaveUp, err: err}
	}
	if err != nil {
		return err
	}
	printSummary(stdout, rep)
	if c.reportPath != "" {
		if err := rep.Write(c.reportPath); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "report:", c.reportPath)
	}
	return runEnd(rep)
}

// launchConfig is the launcher's configuration for the run; with
// --tls-dir it makes the certificates the tasks need.
func (c *runCmd) launchConfig(ctx context.Context, log *slog.Logger, progress io.Writer) (launcher.Config, error) {
	childArgs, err := runTLSArgs(c.tlsDir, c.r, log)
	if err != nil {
		return launcher.Config{}, err
	}
	if c.faultGradient != "" {
		childArgs = append(childArgs, "--fault-gradient="+c.faultGradient) // every task gets it; only the worker named acts on it
	}
	exe, err := os.Executable()
	if err != nil {
		return launcher.Config{}, err
	}
	extra := append([]string{"--connect-timeout=" + c.connectTimeout.String(), "--log-level=" + c.logLevel, "--summary=false"}, childArgs...)
	return launcher.Config{Run: c.r, Exe: exe, Dir: c.dir, SDDir: c.sdDir, MetricsPortBase: c.portBase,
		ChildArgs: runArgs, ExtraArgs: extra,
		Progress: progress, Log: log, Faults: c.faultList, Slowdowns: c.slowList, MaxRestarts: c.maxRestarts, BottleneckEvery: 10 * time.Second,
		Abort: claimAbort(ctx), TaskTimeout: c.taskTimeout, KillStale: c.killStale, AuthTokenFile: c.tokenFile,
		TimerSlack: c.timerSlack, WebConfigFile: *c.webConfig}, nil
}

// runEnd is the error a finished run's report calls for: an
// interruption, a ruined model, a failed final checkpoint, or none.
func runEnd(rep *report.Report) error {
	if rep.StoppedBy == chief.StopInterrupted {
		return errInterrupted
	}
	if err := ruinedRun(rep); err != nil {
		return err
	}
	return finalCheckpointFailed(rep)
}
