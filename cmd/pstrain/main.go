// Command pstrain trains neural networks with parameter servers.
// Run `pstrain help` for the subcommands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/launcher"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/task"
)

const usage = `pstrain — parameter-server training

Usage:
  pstrain run [flags]                 start a local cluster (chief, PS, workers) and train
  pstrain chief|ps|worker [flags]     run one task of a cluster (--cluster FILE or TF_CONFIG)
  pstrain data fetch [--dataset mnist|fashion-mnist|mnist-x4] [--data-dir data]
  pstrain checkpoint ls|verify|inspect DIR
                                      look at checkpoints
  pstrain eval --checkpoint DIR       test accuracy of a checkpoint
  pstrain top [--targets FILE | --cluster FILE] [--once]
                                      live view of every task: steps/s, phases, CPU, RSS, load
  pstrain bench [--json] [--quick]    performance ratios against this machine's limits
  pstrain sweep --grid SPEC --out DIR experiment grids: runs, results.csv, summary.md, plots
  pstrain plot DIR                    re-draw a sweep's plots from its CSV
  pstrain certs --cluster FILE --out DIR
                                      a CA and a certificate per task, for --tls-dir
  pstrain version

Run 'pstrain COMMAND -h' for a command's flags.
`

func main() {
	ctx, sig := watchSignals()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, errInterrupted):
		// Stopped cleanly on a signal (the summary is printed): the shell's
		// convention for a death by that signal.
		os.Exit(sig.exitCode())
	case err != nil && sig.received() != nil:
		fmt.Fprintln(os.Stderr, "pstrain: interrupted:", err)
		os.Exit(sig.exitCode())
	case err != nil:
		fmt.Fprintln(os.Stderr, "pstrain:", err)
		os.Exit(1)
	}
}

// errInterrupted is returned by a command that stopped cleanly on SIGINT
// or SIGTERM: main exits with 130 or 143 and no error message.
var errInterrupted = errors.New("interrupted")

// signals records the first SIGINT or SIGTERM. The first one cancels the
// context: commands stop cleanly (`pstrain run` and the chief write a
// final checkpoint and the report). A second one stops at once: abort is
// closed, and the process exits unless a command that must clean up
// (`pstrain run`, whose tasks run in their own process groups) has
// claimed it.
type signals struct {
	mu      sync.Mutex
	first   os.Signal
	abort   chan struct{}
	claimed bool
}

func watchSignals() (context.Context, *signals) {
	ctx, cancel := context.WithCancelCause(context.Background())
	s := &signals{abort: make(chan struct{})}
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		first := <-ch
		s.mu.Lock()
		s.first = first
		s.mu.Unlock()
		cancel(fmt.Errorf("%v", first))
		<-ch
		s.mu.Lock()
		claimed := s.claimed
		s.mu.Unlock()
		close(s.abort)
		if !claimed {
			os.Exit(s.exitCode())
		}
		// The claimant kills its tasks and returns; if it cannot, exit.
		time.Sleep(10 * time.Second)
		os.Exit(s.exitCode())
	}()
	return context.WithValue(ctx, signalsKey{}, s), s
}

type signalsKey struct{}

// claimAbort returns the channel closed by a second signal and stops
// that signal from exiting the process: the caller must then stop
// promptly by itself. Nil when main did not set signals up (tests).
func claimAbort(ctx context.Context) <-chan struct{} {
	s, _ := ctx.Value(signalsKey{}).(*signals)
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claimed = true
	return s.abort
}

func (s *signals) received() os.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// exitCode is 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM.
func (s *signals) exitCode() int {
	if n, ok := s.received().(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 1
}

// errUsage marks a command-line mistake (exit status 2 would be
// conventional; 1 keeps scripts simple).
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("%w: no command", errUsage)
	}
	switch args[0] {
	case "run":
		return cmdRun(ctx, args[1:], stdout, stderr)
	case "chief", "ps", "worker":
		return cmdTask(ctx, args[0], args[1:], stdout, stderr)
	case "data":
		return cmdData(ctx, args[1:], stderr)
	case "checkpoint":
		return cmdCheckpoint(ctx, args[1:], stdout, stderr)
	case "eval":
		return cmdEval(ctx, args[1:], stdout, stderr)
	case "top":
		return cmdTop(ctx, args[1:], stdout, stderr)
	case "bench":
		return cmdBench(ctx, args[1:], stdout, stderr)
	case "sweep":
		return cmdSweep(ctx, args[1:], stdout, stderr)
	case "plot":
		return cmdPlot(ctx, args[1:], stdout, stderr)
	case "certs":
		return cmdCerts(ctx, args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "pstrain", task.Version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("%w: unknown command %q", errUsage, args[0])
}

func newLogger(w io.Writer, level string, attrs ...any) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})).With(attrs...), nil
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return nil
}

func cmdTask(ctx context.Context, role string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	fs.SetOutput(stderr)
	r := config.Default()
	bindRunFlags(fs, &r)
	clusterFile := fs.String("cluster", "", "cluster file (JSON: {\"chief\":[..],\"ps\":[..],\"worker\":[..]}); default: the TF_CONFIG environment variable")
	index := fs.Int("index", -1, "this task's index (default: from TF_CONFIG)")
	metricsAddr := fs.String("metrics-addr", "", "serve /metrics and /healthz here (default: the task's port + 1000; \"off\" disables)")
	dataAddr := fs.String("data-addr", "", "ps: where the TCP data plane listens (default: the task's port + 2000)")
	connectTimeout := fs.Duration("connect-timeout", time.Minute, "how long to wait for the chief or a PS before giving up")
	maxMsgMB := fs.Int("max-message-mb", 256, "largest gRPC message accepted, in MiB")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	blasThreads := fs.Int("blas-threads", 1, "worker: OpenBLAS threads (1 avoids oversubscribing shared cores)")
	reportPath := fs.String("report", "", "chief: write the run report (JSON) here")
	progress := fs.Bool("progress", false, "chief: print a progress line every second on stdout")
	runID := fs.String("run-id", "", "chief: run identifier (default: generated; give one so that a restarted chief can adopt its running cluster)")
	statePath := fs.String("state-file", "", "chief: keep the report's history here so that a restarted chief can finish it")
	tlsF := bindTLSFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := r.Validate(); err != nil {
		return err
	}
	spec, t, err := cluster.Load(*clusterFile, os.Getenv("TF_CONFIG"))
	if err != nil {
		return err
	}
	tk := cluster.Task{Type: role, Index: *index}
	if role == cluster.Chief {
		tk.Index = 0
	} else if *index < 0 {
		if t == nil || t.Type != role {
			return fmt.Errorf("%w: pass --index (TF_CONFIG names no %s task)", errUsage, role)
		}
		tk = *t
	}
	addr, err := spec.Addr(tk)
	if err != nil {
		return err
	}
	if len(spec.PS) != r.PS || len(spec.Worker) != r.Workers {
		return fmt.Errorf("the cluster has %d ps and %d workers but --ps=%d --workers=%d; make them agree", len(spec.PS), len(spec.Worker), r.PS, r.Workers)
	}
	log, err := newLogger(stderr, *logLevel, "task", tk.String())
	if err != nil {
		return err
	}
	ma := *metricsAddr
	switch ma {
	case "off":
		ma = ""
	case "":
		if ma, err = task.DefaultMetricsAddr(addr); err != nil {
			return err
		}
	}
	o := task.Options{Cluster: spec, Task: tk, Run: r, MetricsAddr: ma, DataAddr: *dataAddr, ConnectTimeout: *connectTimeout,
		MaxMessageBytes: *maxMsgMB << 20, Log: log}
	if o.TLS, err = tlsF.load(spec, tk, log); err != nil {
		return err
	}
	switch role {
	case cluster.PS:
		return task.RunPS(ctx, o)
	case cluster.Worker:
		return task.RunWorker(ctx, o, *blasThreads)
	}
	co := task.ChiefOptions{RunID: *runID, ReportPath: *reportPath, StatePath: *statePath}
	if *progress {
		co.Progress = stdout
	}
	rep, err := task.RunChief(ctx, o, co)
	if err != nil {
		return err
	}
	if !*progress {
		printSummary(stdout, rep)
	}
	if rep.StoppedBy == chief.StopInterrupted {
		return errInterrupted
	}
	return nil
}

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	r := config.Default()
	r.CheckpointDir = filepath.Join("run", "checkpoints")
	bindRunFlags(fs, &r)
	reportPath := fs.String("report", "", "write the run report (JSON) here")
	faults := fs.String("fault", "", "kill -9 tasks at times after start, e.g. ps/1@8s,worker/0@12s,chief@20s (resilience demos and tests)")
	maxRestarts := fs.Int("max-restarts", 5, "restarts allowed per task before the run fails")
	dir := fs.String("run-dir", "run", "where the cluster file and the task logs go")
	sdDir := fs.String("sd-dir", "run/targets", "where the Prometheus file_sd target file goes")
	portBase := fs.Int("metrics-port-base", 0, "metrics ports: chief on BASE, ps/i on BASE+1+i, worker/i after them (0 = free ports)")
	connectTimeout := fs.Duration("connect-timeout", time.Minute, "how long tasks wait for each other before giving up")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	tlsDir := fs.String("tls-dir", "", "run every task over mutual TLS with certificates in this directory (made there if missing)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := r.Validate(); err != nil {
		return err
	}
	if !flagSet(fs, "checkpoint-dir") && *dir != "run" {
		r.CheckpointDir = filepath.Join(*dir, "checkpoints")
	}
	fl, err := launcher.ParseFaults(*faults, r)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *maxRestarts < 0 {
		return fmt.Errorf("%w: --max-restarts must be >= 0", errUsage)
	}
	log, err := newLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	tlsArgs, err := runTLSArgs(*tlsDir, r, log)
	if err != nil {
		return err
	}
	if dataset.Fetchable(r.Dataset) {
		// A fresh checkout has no data: fetch it (verified) before starting.
		if err := dataset.Fetch(ctx, r.DataDir, r.Dataset, func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...)) }); err != nil {
			return err
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "pstrain: %s SGD, %d PS, %d workers, MLP %s, batch %d, lr %s, %s\n", r.Mode, r.PS, r.Workers,
		r.Spec(784, 10).String(), r.Batch, lrText(r), r.Optimizer)
	rep, err := launcher.Run(ctx, launcher.Config{Run: r, Exe: exe, Dir: *dir, SDDir: *sdDir, MetricsPortBase: *portBase,
		ChildArgs: runArgs, ExtraArgs: append([]string{"--connect-timeout=" + connectTimeout.String(), "--log-level=" + *logLevel}, tlsArgs...),
		Progress: stdout, Log: log, Faults: fl, MaxRestarts: *maxRestarts, BottleneckEvery: 10 * time.Second,
		Abort: claimAbort(ctx)})
	if err != nil {
		return err
	}
	printSummary(stdout, rep)
	if *reportPath != "" {
		if err := rep.Write(*reportPath); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "report:", *reportPath)
	}
	if rep.StoppedBy == chief.StopInterrupted {
		return errInterrupted
	}
	return nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func printSummary(w io.Writer, rep *report.Report) {
	fmt.Fprintf(w, "\n== pstrain summary ==\n")
	lr := lrText(config.Run{LR: rep.LR, LRSchedule: rep.LRSchedule, WarmupSteps: rep.WarmupSteps})
	fmt.Fprintf(w, "mode %s, %d PS, %d workers, model %s, batch %d, lr %s, %s, BLAS %s\n", rep.Mode, rep.PS, rep.Workers, rep.Model, rep.Batch, lr, rep.Optimizer, rep.BLAS)
	fmt.Fprintf(w, "stopped by: %s after %d global steps (%.2f epochs)\n", rep.StoppedBy, rep.GlobalSteps, rep.EpochsDone)
	fmt.Fprintf(w, "test accuracy: %.2f%% (the model of step %d; best %.2f%%)\n", 100*rep.TestAccuracy, rep.FinalStep, 100*rep.BestTestAccuracy)
	if rep.TimeToTargetSeconds != nil {
		fmt.Fprintf(w, "time to %.2f%% held for %d evaluations: %.2f s of training\n", 100*rep.TargetAccuracy, rep.TargetHold, *rep.TimeToTargetSeconds)
	} else if rep.TargetAccuracy > 0 {
		fmt.Fprintf(w, "target %.2f%% not reached\n", 100*rep.TargetAccuracy)
	}
	fmt.Fprintf(w, "startup %.2f s, training %.2f s, %.0f samples/s, stale gradients dropped %d\n", rep.StartupSeconds, rep.TrainSeconds, rep.SamplesPerSecond, rep.StaleGradientsDropped)
	if rep.Bottleneck != nil {
		fmt.Fprintf(w, "where the time went: %s\n", rep.Bottleneck)
	}
	for _, rs := range rep.Restarts {
		back := "never"
		if rs.BackAtSeconds != nil {
			back = fmt.Sprintf("%.2f s", *rs.BackAtSeconds)
		}
		fmt.Fprintf(w, "restart: %-9s died at %.2f s, back at %s, restored step %d\n", rs.Task, rs.KilledAtSeconds, back, rs.RestoredStep)
	}
	for _, name := range sortedTasks(rep.Tasks) {
		t := rep.Tasks[name]
		fmt.Fprintf(w, "  %-9s peak RSS %6.1f MiB  CPU %6.2f s\n", name, float64(t.PeakRSSBytes)/(1<<20), t.CPUSeconds)
	}
}

func sortedTasks(m map[string]report.Task) []string {
	var out []string
	for _, t := range []string{"chief"} {
		if _, ok := m[t]; ok {
			out = append(out, t)
		}
	}
	for _, prefix := range []string{"ps/", "worker/"} {
		for i := 0; ; i++ {
			k := fmt.Sprintf("%s%d", prefix, i)
			if _, ok := m[k]; !ok {
				break
			}
			out = append(out, k)
		}
	}
	return out
}

func cmdData(ctx context.Context, args []string, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "fetch" {
		return fmt.Errorf("%w: pstrain data fetch [--dataset mnist] [--data-dir data]", errUsage)
	}
	fs := flag.NewFlagSet("data fetch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("dataset", "mnist", "data set to fetch")
	dir := fs.String("data-dir", "data", "where to put it")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	return dataset.Fetch(ctx, *dir, *name, func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) })
}
