package main

// What `pstrain run` and each task check before anything starts
// (package preflight), the chief's warnings on the terminal, and the
// exit status of a run whose final checkpoint failed.

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/launcher"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/preflight"
)

// procRoot is where the machine's memory is read (/proc/meminfo).
const procRoot = "/proc"

// checkRunFlags checks what `pstrain run`'s flags say on their own:
// usage errors.
func checkRunFlags(r config.Run, metricsPortBase int, connectTimeout time.Duration) error {
	if err := preflight.Positive("--connect-timeout", connectTimeout); err != nil {
		return asUsage(err)
	}
	n := 1 + r.PS + r.Workers
	if r.Standbys() > 0 {
		n = 1 + r.PSSlots() + r.WorkerSlots() + r.StandbySlots() // the standbys' ports follow every PS and worker slot's
	}
	return asUsage(preflight.CheckPortRange("--metrics-port-base", metricsPortBase, n))
}

// checkRun checks, before `pstrain run` starts any process, what would
// make its tasks fail or be restarted in vain: the data files (every task
// loads them), the memory the whole cluster needs on this machine (a
// usage error: the flags ask too much), and a resume that would find
// only damaged checkpoints. It returns the data's shape. (The BLAS
// library is checked before the data is fetched: runCmd.execute.)
func checkRun(r config.Run) (dataset.Shape, error) {
	shape, err := inspectData(r)
	if err != nil {
		return shape, err
	}
	if err := specOf(r, shape).Validate(); err != nil { // a CNN on data that is no image, or too small for its convolutions
		return shape, asUsage(fmt.Errorf("%s: %w", r.Dataset, err))
	}
	if avail, err := preflight.MemAvailable(procRoot); err == nil {
		what := fmt.Sprintf("the run (a chief, %s and %d workers, model %s, batch %d)", psText(r), r.Workers, specOf(r, shape), r.Batch)
		f := preflight.Estimate(r, specOf(r, shape), shape)
		if err := preflight.CheckMemory(what, f.Run(r)+float64(r.Standbys())*f.PS, avail, preflight.Fewer(r)); err != nil { // a standby holds what its primary does
			return shape, asUsage(err)
		}
	}
	if r.Resume && r.CheckpointDir != "" {
		if err := chief.ResumeRefusal(checkpoint.NewStore(checkpoint.OSFS{}, r.CheckpointDir, 0)); err != nil {
			return shape, err
		}
	}
	return shape, nil
}

// checkTask checks one task before it starts: the cluster's addresses
// (no two the same listener under two names), this task's own listeners,
// and the memory its role needs on this machine. A PS needs no data; it
// checks its memory only when it can read the data set's shape. (Its
// flags on their own were checked right after parsing.)
func checkTask(r config.Run, spec cluster.Spec, tk cluster.Task, metricsAddr, dataAddr string) error {
	var all []preflight.Addr
	for _, t := range spec.Tasks() {
		a, _ := spec.Addr(t)
		all = append(all, preflight.Addr{Name: t.String(), Addr: a})
	}
	if err := preflight.CheckAddrs(all, false); err != nil {
		return asUsage(fmt.Errorf("cluster: %w", err))
	}
	own, _ := spec.Addr(tk)
	mine := []preflight.Addr{{Name: tk.String(), Addr: own}}
	if metricsAddr != "" {
		mine = append(mine, preflight.Addr{Name: tk.String() + " --metrics-addr", Addr: metricsAddr})
	}
	if dataAddr != "" {
		mine = append(mine, preflight.Addr{Name: tk.String() + " --data-addr", Addr: dataAddr})
	}
	if err := preflight.CheckAddrs(mine, true); err != nil {
		return asUsage(err)
	}
	shape, err := inspectData(r)
	switch {
	case err != nil && (tk.Type == cluster.PS || tk.Type == cluster.Standby):
		return nil
	case err != nil:
		return err
	}
	if err := specOf(r, shape).Validate(); err != nil {
		return asUsage(fmt.Errorf("%s: %w", r.Dataset, err))
	}
	avail, err := preflight.MemAvailable(procRoot)
	if err != nil {
		return nil // not Linux: nothing to compare with
	}
	f := preflight.Estimate(r, specOf(r, shape), shape)
	need := map[string]float64{cluster.Chief: f.Chief, cluster.PS: f.PS, cluster.Standby: f.PS, cluster.Worker: f.Worker}[tk.Type]
	what := fmt.Sprintf("%s (model %s, batch %d)", tk, specOf(r, shape), r.Batch)
	return asUsage(preflight.CheckMemory(what, need, avail, preflight.Fewer(r)))
}

// taskLogger is a task's logger: everything to stderr (its log file
// under `pstrain run`) and, with --progress, its warnings and errors also
// to stdout, which `pstrain run` shows on the terminal: a failed
// checkpoint, a damaged one skipped, a shard unreachable.
func taskLogger(stderr, stdout io.Writer, level string, progress bool, attrs ...any) (*slog.Logger, error) {
	log, err := newLogger(stderr, level)
	if err != nil {
		return nil, err
	}
	if progress {
		var l slog.Level
		_ = l.UnmarshalText([]byte(level)) // newLogger parsed it
		warn := slog.NewTextHandler(stdout, &slog.HandlerOptions{Level: max(l, slog.LevelWarn)})
		log = slog.New(slog.NewMultiHandler(log.Handler(), warn))
	}
	return log.With(attrs...), nil
}

// exitError is a failure with its own exit status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// exitCode is the exit status an error from a command asks for (1 unless
// it is an exitError).
func exitCode(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	return 1
}

// finalCheckpointFailed is the error of a run whose final checkpoint
// failed (nil if it did not): the model trained is not saved. The chief
// and `pstrain run` exit with launcher.ExitFinalCheckpointFailed.
func finalCheckpointFailed(rep *report.Report) error {
	if !rep.Checkpoints.FinalFailed {
		return nil
	}
	last, _, _ := strings.Cut(rep.Checkpoints.LastError, "\n")
	return &exitError{code: launcher.ExitFinalCheckpointFailed,
		err: fmt.Errorf("the final checkpoint failed, so the trained model is not saved: %s", last)}
}
