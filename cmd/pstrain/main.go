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
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/cli"
	"github.com/pstrain/pstrain/launcher"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/preflight"
	"github.com/pstrain/pstrain/task"
)

const usage = `pstrain — parameter-server training

Usage:
  pstrain run [flags]                 start a local cluster (chief, PS, workers) and train
  pstrain chief|ps|standby|worker [flags]
                                      run one task of a cluster (--cluster FILE or TF_CONFIG)
  pstrain task [flags]                run the task TF_CONFIG names (chief, master, ps, standby or worker)
  pstrain data fetch [--dataset mnist|fashion-mnist|mnist-x4] [--data-dir data]
  pstrain data synth-ctr [--out data/synth-ctr] [--seed N] [--train N] [--test N] [--zipf 1.1]
                                      write the synthetic click-through-rate set
  pstrain checkpoint ls|verify|inspect DIR
                                      look at checkpoints
  pstrain eval --checkpoint DIR       test accuracy of a checkpoint
  pstrain top [--targets FILE | --cluster FILE] [--once]
                                      live view of every task: steps/s, phases, CPU, RSS, load
  pstrain scale --run-dir DIR --workers N
                                      add or remove workers of a running sync run
  pstrain bench [--json] [--quick]    performance ratios against this machine's limits
  pstrain sweep --grid SPEC --out DIR experiment grids: runs, results.csv, summary.md, plots
  pstrain plot DIR                    re-draw a sweep's plots from its CSV
                                      (sweep and plot run pstrain-lab, built beside pstrain)
  pstrain certs --cluster FILE --out DIR
                                      a CA and a certificate per task, for --tls-dir
  pstrain token FILE                  a run's secret, for --auth-token-file
  pstrain version                     the version (also --version)

Run 'pstrain COMMAND -h' (or 'pstrain help COMMAND') for a command's flags.
A bad value given by the user (on the command line, in TF_CONFIG or in a
cluster file) exits with status 2, a failure with status 1; a run whose
final checkpoint failed (the model is not saved) with status 3; a run
whose model is ruined (worse than the initial model, or diverged and not
rolled back) or that the chief gave up on, with status 4.
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
	case errors.Is(err, errUsage):
		printUsageError(os.Stderr, err)
		os.Exit(2)
	case errors.As(err, new(*exitError)):
		fmt.Fprintln(os.Stderr, "pstrain:", err)
		os.Exit(exitCode(err))
	case err != nil:
		fmt.Fprintln(os.Stderr, "pstrain:", err)
		os.Exit(1)
	}
}

// errUsage marks a command-line mistake: an unknown command or flag, a
// bad value, a missing argument. main prints the error and a one-line
// hint (not the whole usage) and exits with status 2, as Go's tools do;
// other errors exit with status 1.
var errUsage = errors.New("usage")

// usageError is a command-line mistake of the command cmd ("run", "data
// fetch"; "" for pstrain itself). It matches errUsage.
type usageError struct {
	cmd string
	err error
	// full: print the whole usage instead of the error and the hint
	// (`pstrain` alone).
	full bool
}

func (e *usageError) Error() string        { return e.err.Error() }
func (e *usageError) Unwrap() error        { return e.err }
func (e *usageError) Is(target error) bool { return target == errUsage }

// usagef returns a usage error; run names the command.
func usagef(format string, a ...any) error {
	return &usageError{err: fmt.Errorf(format, a...)}
}

// asUsage marks err (a bad flag value found after parsing) as a usage error.
func asUsage(err error) error {
	if err == nil || errors.Is(err, errUsage) {
		return err
	}
	return &usageError{err: err}
}

// printUsageError prints a usage error and the one-line hint:
//
//	pstrain run: flag provided but not defined: -bogus
//	run 'pstrain run -h' for usage
//
// `pstrain` alone gets the whole usage instead, as Go's tools do.
func printUsageError(w io.Writer, err error) {
	cmd := ""
	var ue *usageError
	if errors.As(err, &ue) {
		if ue.full {
			fmt.Fprint(w, usage)
			return
		}
		cmd = ue.cmd
	}
	if cmd == "" {
		fmt.Fprintf(w, "pstrain: %v\nrun 'pstrain -h' for usage\n", err)
		return
	}
	fmt.Fprintf(w, "pstrain %s: %v\nrun 'pstrain %s -h' for usage\n", cmd, err, cmd)
}

// command is a subcommand: args are those after its name.
type command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// commands are pstrain's subcommands.
var commands = map[string]command{
	"run":        cmdRun,
	"token":      cmdToken,
	"chief":      taskCommand(cluster.Chief),
	"ps":         taskCommand(cluster.PS),
	"standby":    taskCommand(cluster.Standby),
	"worker":     taskCommand(cluster.Worker),
	"task":       taskCommand(""),
	"data":       cmdData,
	"checkpoint": cmdCheckpoint,
	"eval":       cmdEval,
	"top":        cmdTop,
	"scale":      cmdScale,
	"bench":      cmdBench,
	"sweep":      labCommand("sweep"),
	"plot":       labCommand("plot"),
	"certs":      cmdCerts,
}

func taskCommand(role string) command {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return cmdTask(ctx, role, args, stdout, stderr)
	}
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// run runs the command line args (without the program name). Help goes
// to stdout and returns nil or flag.ErrHelp; a command-line mistake
// returns an error matching errUsage, printed by main.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return &usageError{err: errors.New("no command given"), full: true}
	}
	if handled, err := runBuiltin(ctx, args, stdout, stderr); handled {
		return err
	}
	err := commands[args[0]](ctx, args[1:], stdout, stderr)
	var ue *usageError
	if errors.As(err, &ue) && ue.cmd == "" {
		ue.cmd = args[0]
	}
	return err
}

// runBuiltin handles a command line that names no command: version,
// help, or an unknown name or flag. It says whether it handled args.
func runBuiltin(ctx context.Context, args []string, stdout, stderr io.Writer) (bool, error) {
	switch name := args[0]; {
	case name == "version" || name == "-version" || name == "--version":
		return true, cmdVersion(args[1:], stdout)
	case isHelp(name) && len(args) > 1 && (commands[args[1]] != nil || args[1] == "version"):
		// pstrain help COMMAND: the command's own help.
		return true, run(ctx, []string{args[1], "-h"}, stdout, stderr)
	case isHelp(name) && len(args) > 1 && !isHelp(args[1]):
		return true, usagef("unknown command %q", args[1])
	case isHelp(name):
		fmt.Fprint(stdout, usage)
		return true, nil
	case commands[name] == nil && strings.HasPrefix(name, "-"):
		return true, usagef("unknown flag %q (flags go after the command)", name)
	case commands[name] == nil:
		return true, usagef("unknown command %q", name)
	}
	return false, nil
}

// cmdVersion prints the version (`pstrain version`, `pstrain --version`).
func cmdVersion(args []string, stdout io.Writer) error {
	switch {
	case len(args) == 1 && isHelp(args[0]):
		fmt.Fprint(stdout, "usage: pstrain version\n\nPrint pstrain's version (also pstrain --version).\n")
		return flag.ErrHelp
	case len(args) > 0:
		return &usageError{cmd: "version", err: fmt.Errorf("unexpected argument %q: version takes none", args[0])}
	}
	fmt.Fprintln(stdout, "pstrain", task.Version)
	return nil
}

func newLogger(w io.Writer, level string, attrs ...any) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})).With(attrs...), nil
}

// newFlagSet returns the flag set of the command name ("run", "data
// fetch"), parsed by parse: -h prints "usage: pstrain SYNOPSIS", about
// and the flags to stdout; a mistake becomes a usage error, printed by
// main with a one-line hint instead of the flag list.
func newFlagSet(name, synopsis, about string) *flag.FlagSet {
	return cli.NewFlagSet("pstrain", name, synopsis, about)
}

// parseFlags parses args with fs (from newFlagSet). -h prints the help to
// stdout and returns flag.ErrHelp (main exits 0); a parse error returns a
// usage error naming the command.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	err := cli.Parse(fs, args, stdout)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		return &usageError{cmd: fs.Name(), err: err}
	}
	return err
}

// parse is parseFlags for commands that take no arguments besides flags.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{cmd: fs.Name(), err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// psText says how many PS processes a run has: "2 PS", or with hot
// standbys "2 PS + 2 standbys".
func psText(r config.Run) string {
	if n := r.Standbys(); n > 0 {
		return fmt.Sprintf("%d PS + %d standbys", r.PS, n)
	}
	return fmt.Sprintf("%d PS", r.PS)
}

// positive checks that the duration flag name is > 0 (a usage error).
func positive(name string, d time.Duration) error {
	return asUsage(preflight.Positive("--"+name, d))
}

// warnGuard warns of a norm guard likely to refuse honest gradients:
// with tiny batches one sample's gradient dominates, and honest norms
// spread far more (docs/security.md measures batch 4 at up to 18.1 times
// the median, batch 1 at 57).
func warnGuard(log *slog.Logger, r config.Run) {
	if r.NormGuard > 0 && r.Batch < 8 {
		log.Warn("with a batch this small honest gradient norms spread widely; --norm-guard may refuse some (consider --norm-guard 100, or 0 to turn it off)",
			"batch", r.Batch, "norm_guard", r.NormGuard)
	}
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
	fmt.Fprintf(w, "mode %s, %d PS, %s, model %s, batch %d, lr %s, %s, BLAS %s\n", rep.Mode, rep.PS, workersText(rep), rep.Model, rep.Batch, lr, rep.Optimizer, rep.BLAS)
	fmt.Fprintf(w, "stopped by: %s after %d global steps (%.2f epochs)\n", rep.StoppedBy, rep.GlobalSteps, rep.EpochsDone)
	for _, c := range rep.MembershipChanges {
		fmt.Fprintln(w, membershipText(c))
	}
	if t := queueText(rep.DataQueue); t != "" {
		fmt.Fprintln(w, t)
	}
	if t := ledgerText(rep.DataLedger); t != "" {
		fmt.Fprintln(w, t)
	}
	fmt.Fprintf(w, "test accuracy: %.2f%% (the model of step %d; best %.2f%%)\n", 100*rep.TestAccuracy, rep.FinalStep, 100*rep.BestTestAccuracy)
	if rep.AUC > 0 {
		fmt.Fprintln(w, ctrScoresText(rep))
	}
	for _, line := range stopLines(rep) {
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "startup %.2f s, training %.2f s, %.0f samples/s, stale gradients dropped %d\n", rep.StartupSeconds, rep.TrainSeconds, rep.SamplesPerSecond, rep.StaleGradientsDropped)
	if wr := rep.Wire; wr.Steps > 0 {
		fmt.Fprintf(w, "wire (--compress %s): push %.1f kB, pull %.1f kB per worker step\n", wr.Compress, wr.PushBytesPerStep/1e3, wr.PullBytesPerStep/1e3)
	}
	if c := rep.Checkpoints; c.FinalFailed {
		last, _, _ := strings.Cut(c.LastError, "\n")
		fmt.Fprintf(w, "checkpoints: %d committed, %d FAILED, the final one too: the trained model is NOT saved (last: %s)\n", c.Committed, c.Failed, last)
	} else if c.Failed > 0 {
		last, _, _ := strings.Cut(c.LastError, "\n")
		fmt.Fprintf(w, "checkpoints: %d committed, %d FAILED (last: %s)\n", c.Committed, c.Failed, last)
	} else if c.Committed > 0 {
		fmt.Fprintf(w, "checkpoints: %d committed\n", c.Committed)
	}
	if rep.Bottleneck != nil {
		fmt.Fprintf(w, "where the time went: %s\n", rep.Bottleneck)
	}
	for _, st := range rep.Stragglers {
		fmt.Fprintln(w, stragglerLine(st))
	}
	printGuard(w, rep)
	for _, rs := range rep.Restarts {
		fmt.Fprintln(w, restartLine(rs))
	}
	for _, name := range sortedTasks(rep.Tasks) {
		t := rep.Tasks[name]
		fmt.Fprintf(w, "  %-9s peak RSS %6.1f MiB  CPU %6.2f s\n", name, float64(t.PeakRSSBytes)/(1<<20), t.CPUSeconds)
	}
}

// workersText is the run's worker count with every change of the
// number of workers training (a worker that died or froze, came back,
// was quarantined, added or removed), on the chief's clock:
// "2 workers, 1 from 6.20 s".
func workersText(rep *report.Report) string {
	s := fmt.Sprintf("%d workers", rep.Workers)
	for _, c := range rep.LiveWorkers {
		s += fmt.Sprintf(", %d from %.2f s", c.Workers, c.Seconds)
	}
	return s
}

// restartLine is a restart in the summary, on the report's clock
// (seconds since the run started): a restore from a checkpoint (with the
// steps it lost, if any), or a hot standby's failover:
//
//	restart: ps/1      died at 6.05 s (unresponsive), back at 8.20 s, restored step 380, 20 steps lost
//	restart: ps/0      died at 4.01 s, standby/0 took over in 0.12 s at step 372, 0 steps lost
func restartLine(rs report.Restart) string {
	if rs.BackAtSeconds == nil && (rs.Cause == launcher.CauseQuarantined || rs.Cause == launcher.CauseRemoved || rs.Cause == launcher.CauseKilledAtEnd) {
		return fmt.Sprintf("ended:   %-9s at %.2f s (%s), not restarted", rs.Task, rs.KilledAtSeconds, rs.Cause)
	}
	died := fmt.Sprintf("died at %.2f s", rs.KilledAtSeconds)
	if rs.Cause != "" {
		died += " (" + rs.Cause + ")"
	}
	if rs.TookOver != "" {
		return fmt.Sprintf("restart: %-9s %s, %s took over in %.2f s at step %d, %s", rs.Task, died, rs.TookOver,
			rs.FailoverSeconds, rs.RestoredStep, stepsLost(rs.StepsLost))
	}
	back := "never back"
	if rs.BackAtSeconds != nil {
		back = fmt.Sprintf("back at %.2f s", *rs.BackAtSeconds)
	}
	step := "not back in training before the end"
	if rs.RestoredStep >= 0 {
		step = fmt.Sprintf("restored step %d", rs.RestoredStep)
		if rs.StepsLost > 0 {
			step += ", " + stepsLost(rs.StepsLost)
		}
	}
	return fmt.Sprintf("restart: %-9s %s, %s, %s", rs.Task, died, back, step)
}

func stepsLost(n int64) string {
	if n == 1 {
		return "1 step lost"
	}
	return fmt.Sprintf("%d steps lost", n)
}

// unnamedRefused is the workers with gradients refused by the norm guard
// that no divergence and no attribution named as suspects, sorted.
func unnamedRefused(rep *report.Report) []string {
	named := map[string]bool{}
	for _, d := range rep.Divergences {
		named[d.SuspectWorker] = true
	}
	for _, x := range rep.Suspects {
		named[x.Worker] = true
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(rep.RefusedGradients)) {
		if !named[k] && rep.RefusedGradients[k] > 0 {
			out = append(out, k)
		}
	}
	return out
}

// printGuard prints what the divergence guard did: the gradients
// refused by worker, and each divergence with its rollback and suspect.
func printGuard(w io.Writer, rep *report.Report) {
	for _, c := range []struct {
		what   string
		counts map[string]int64
	}{{"gradients refused by the norm guard", rep.RefusedGradients}, {"non-finite gradients (never applied)", rep.NonFiniteGradients}} {
		if len(c.counts) == 0 {
			continue
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(c.counts)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, c.counts[k]))
		}
		fmt.Fprintf(w, "%s: %s\n", c.what, strings.Join(parts, ", "))
	}
	if honest := unnamedRefused(rep); len(rep.Divergences) > 0 && len(honest) > 0 {
		fmt.Fprintf(w, "  (%s not suspected: a diverging model's gradients are large from every worker, so the guard refuses honest ones too until the rollback)\n", strings.Join(honest, ", "))
	}
	for _, d := range rep.Divergences {
		back := "not rolled back (training had ended)"
		switch {
		case d.RolledBackTo > 0:
			back = fmt.Sprintf("rolled back to step %d, lr x%g", d.RolledBackTo, d.LRFactor)
		case d.RolledBackTo == 0:
			back = fmt.Sprintf("rolled back to the initial weights, lr x%g", d.LRFactor)
		}
		suspect := "no worker stood out"
		if d.SuspectWorker != "" {
			suspect = "suspect " + d.SuspectWorker + ": " + d.Evidence
		}
		fmt.Fprintf(w, "divergence: the model of step %d (test loss %.4g, best %.4g); %s; %s\n", d.AtStep, d.TestLoss, d.BestLoss, back, suspect)
	}
	for _, x := range rep.Suspects {
		q := "not quarantined (too few workers left)"
		if slices.Contains(rep.Quarantined, x.Worker) {
			q = "quarantined"
		}
		fmt.Fprintf(w, "suspect: %s at step %d, %s: %s\n", x.Worker, x.AtStep, q, x.Reason)
	}
	if rep.Ruined != "" {
		fmt.Fprintf(w, "RUINED: %s; the model is not a success (exit status %d)\n", rep.Ruined, launcher.ExitChiefGaveUp)
	}
}

// ruinedRun is the error of a run whose model is ruined (nil if it is
// not): worse than the initial one, or diverged and not rolled back.
// The chief and `pstrain run` exit with launcher.ExitChiefGaveUp (4),
// after the report and the summary are written.
func ruinedRun(rep *report.Report) error {
	if rep.Ruined == "" {
		return nil
	}
	return &exitError{code: launcher.ExitChiefGaveUp, err: fmt.Errorf("the model is ruined: %s", rep.Ruined)}
}

func sortedTasks(m map[string]report.Task) []string {
	var out []string
	for _, t := range []string{"chief"} {
		if _, ok := m[t]; ok {
			out = append(out, t)
		}
	}
	for _, prefix := range []string{"ps/", "standby/", "worker/"} {
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

func cmdData(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	switch {
	case len(args) == 0:
		return usagef("missing subcommand: fetch or synth-ctr")
	case isHelp(args[0]):
		return parseFlags(dataFetchFlags(new(string), new(string)), []string{"-h"}, stdout)
	case args[0] == "synth-ctr":
		return cmdSynthCTR(args[1:], stdout)
	case args[0] != "fetch":
		return usagef("unknown subcommand %q: want fetch or synth-ctr", args[0])
	}
	var name, dir string
	fs := dataFetchFlags(&name, &dir)
	if err := parse(fs, args[1:], stdout); err != nil {
		return err
	}
	return dataset.Fetch(ctx, dir, name, func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) })
}

func dataFetchFlags(name, dir *string) *flag.FlagSet {
	fs := newFlagSet("data fetch", "data fetch [flags]", "Download a data set into --data-dir and check it against its published checksums.\n(pstrain data synth-ctr -h: the synthetic click-through-rate set.)")
	fs.StringVar(name, "dataset", "mnist", "data set to fetch: mnist, fashion-mnist or mnist-x4")
	fs.StringVar(dir, "data-dir", "data", "where to put it")
	return fs
}

// modelText names a model for a header line: "MLP 784-800-10" or
// "cnn 28x28x1-c16-c32-256-10" (a CNN's spec says its kind).
func modelText(s model.Spec) string {
	if s.IsCNN() || s.IsCTR() {
		return s.String()
	}
	return "MLP " + s.String()
}

// membershipText is the summary's line for a change of the worker or
// the parameter server count (docs/elastic.md).
// queueText is the summary's line for the data queue ("": none).
func queueText(q *report.DataQueue) string {
	if q == nil || q.ChunksPerEpoch == 0 {
		return ""
	}
	return fmt.Sprintf("data queue: %d chunks of %d batches an epoch, %d handed out (%.2f epochs); batches read by worker: %s",
		q.ChunksPerEpoch, q.ChunkBatches, q.ChunksHandedOut, float64(q.ChunksHandedOut)/float64(q.ChunksPerEpoch), joinInts(q.BatchesRead))
}

// joinInts is xs as "1, 2, 3".
func joinInts(xs []int64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

func membershipText(c report.MembershipChange) string {
	if c.Role != "ps" {
		return fmt.Sprintf("workers: %d -> %d at step %d (epoch %d) at %.2f s, asked at %.2f s", c.From, c.To, c.Step, c.Epoch, c.Seconds, c.AskedSeconds)
	}
	var pause float64
	var lost int64
	if c.PauseSeconds != nil {
		pause = *c.PauseSeconds
	}
	if c.StepsLost != nil {
		lost = *c.StepsLost
	}
	what := fmt.Sprintf("%d -> %d", c.From, c.To)
	switch {
	case c.Kind == "rebalance" && len(c.Weights) == 0: // (chief.KindRebalance): --ps at the count, back to even
		what = fmt.Sprintf("%d made even again (%d parameters moved)", c.To, c.MovedParameters)
	case c.Kind == "rebalance":
		what = fmt.Sprintf("%d rebalanced to weights %s (%.2fx imbalance, %d parameters moved)", c.To, weightsText(c.Weights), c.Imbalance, c.MovedParameters)
	}
	return fmt.Sprintf("parameter servers: %s at step %d at %.2f s, asked at %.2f s, pause %.2f s, %d steps lost",
		what, c.Step, c.Seconds, c.AskedSeconds, pause, lost)
}
