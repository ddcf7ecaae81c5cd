package main

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pstrain/pstrain/launcher"
	"github.com/pstrain/pstrain/observe/report"
)

// TestFrozenWorkerEndsWithItsCause: a worker frozen (SIGSTOP) in the
// middle of a run leaves the live set once its heartbeats stop, the run
// goes on with the other, and the launcher kills the frozen process
// after training. The report says so three ways: the task's "ended"
// cause, an ended record in restarts[], and the change of the number of
// workers training (live_workers); the summary's worker count shows it
// ("2 workers, 1 from ...").
func TestFrozenWorkerEndsWithItsCause(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := startRun(t, ctx, t.TempDir(), "--workers", "2", "--data-fraction", "1", "--epochs", "2")
	run.waitTraining(60 * time.Second)
	if err := syscall.Kill(run.pid("worker/1"), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	rep := run.finish(2 * time.Minute)
	out := run.out.String()
	if got := rep.Tasks["worker/1"].Ended; got != launcher.CauseKilledAtEnd {
		t.Errorf("tasks[worker/1] %+v: ended %q, want %q", rep.Tasks["worker/1"], got, launcher.CauseKilledAtEnd)
	}
	if !hasEnded(rep, "worker/1", launcher.CauseKilledAtEnd) || !strings.Contains(out, "ended:   worker/1") {
		t.Errorf("restarts %+v: want worker/1 ended, %s, in the report and the summary\n%s", rep.Restarts, launcher.CauseKilledAtEnd, out)
	}
	if rep.Tasks["worker/0"].Ended != "" || hasEnded(rep, "worker/0", launcher.CauseKilledAtEnd) {
		t.Errorf("worker/0 recorded as ended: %+v, restarts %+v", rep.Tasks["worker/0"], rep.Restarts)
	}
	if !slices.ContainsFunc(rep.LiveWorkers, func(c report.LiveWorkers) bool { return c.Workers == 1 }) ||
		!strings.Contains(out, "2 workers, 1 from ") {
		t.Errorf("live workers %+v: want the run to show 1 worker from the freeze on, in the summary too\n%s", rep.LiveWorkers, out)
	}
	t.Logf("live workers %+v; worker/1 %+v", rep.LiveWorkers, rep.Tasks["worker/1"])
}
