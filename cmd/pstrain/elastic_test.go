package main

// The multi-process test of elastic workers (docs/elastic.md):
// `pstrain scale` 2 -> 4 -> 1 during one sync run of the real binary.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/launcher"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/report"
)

// elasticState is what the test reads of the chief's state file.
type elasticState struct {
	Plan    dataset.DataPlan          `json:"data_plan"`
	Changes []report.MembershipChange `json:"membership_changes"`
	Live    []report.LiveWorkers      `json:"live_workers"`
}

// waitChanges waits until the chief's state records n membership changes.
func (r *liveRun) waitChanges(n int, within time.Duration) elasticState {
	r.t.Helper()
	return r.waitState(func(st elasticState) bool { return len(st.Changes) >= n }, fmt.Sprintf("%d membership changes", n), within)
}

// waitLive waits until the chief's state records n live workers.
func (r *liveRun) waitLive(n int, within time.Duration) {
	r.t.Helper()
	r.waitState(func(st elasticState) bool { return len(st.Live) > 0 && st.Live[len(st.Live)-1].Workers == n },
		fmt.Sprintf("%d live workers", n), within)
}

// waitState waits until the chief's state satisfies ok.
func (r *liveRun) waitState(ok func(elasticState) bool, what string, within time.Duration) elasticState {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var st elasticState
		b, err := os.ReadFile(filepath.Join(r.dir, "chief-state.json"))
		if err == nil && json.Unmarshal(b, &st) == nil && ok(st) {
			return st
		}
		select {
		case <-r.done:
			r.t.Fatalf("the run ended before %s (state %s):\n%s", what, b, r.out)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no %s within %v (state %s):\n%s", what, within, b, r.out)
		}
	}
}

func TestScaleWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ckdir := filepath.Join(dir, "ck")
	run := startRun(t, ctx, dir, "--mode", "sync", "--hidden", "64", "--batch", "32", "--data-fraction", "0.5",
		"--epochs", "20", "--lr", "0.05", "--lr-schedule", "constant", "--checkpoint-dir", ckdir, "--max-workers", "4")
	run.waitTraining(60 * time.Second)

	// Refusals first: beyond --max-workers, and no run in a directory.
	if _, err := launcher.RequestScale(run.dir, 5); !errors.Is(err, launcher.ErrBadScale) {
		t.Errorf("scale to 5 of --max-workers 4: %v, want ErrBadScale", err)
	}
	if _, err := launcher.RequestScale(dir, 3); !errors.Is(err, launcher.ErrNoRun) {
		t.Errorf("scale where no run is: %v, want ErrNoRun", err)
	}
	// One rule for the exit status: a count the user gives that the run
	// cannot take is a usage error (2), like --workers 0; no run is a
	// failure (1).
	for _, c := range []struct {
		dir, workers string
		code         int
	}{{run.dir, "1000", 2}, {run.dir, "0", 2}, {dir, "3", 1}} {
		out, err := runPstrain(t, "scale", "--run-dir", c.dir, "--workers", c.workers)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != c.code {
			t.Errorf("pstrain scale --workers %s in %s: %v, want exit status %d\n%s", c.workers, c.dir, err, c.code, out)
		}
	}
	out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--workers", "4")
	if err != nil || !strings.Contains(out, "for 4 workers (was 2)") {
		t.Fatalf("pstrain scale --workers 4: %v\n%s", err, out)
	}
	run.waitChanges(1, 60*time.Second)
	if out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--workers", "1"); err != nil {
		t.Fatalf("pstrain scale --workers 1: %v\n%s", err, out)
	}
	st := run.waitChanges(2, 60*time.Second)
	rep := run.finish(2 * time.Minute)

	// The report lists the changes, each at an epoch boundary of the plan.
	got := rep.MembershipChanges
	if len(got) != 2 || got[0].From != 2 || got[0].To != 4 || got[1].From != 4 || got[1].To != 1 || rep.FinalWorkers != 1 {
		t.Fatalf("membership changes %+v, final workers %d; want 2 -> 4 -> 1", got, rep.FinalWorkers)
	}
	plan := st.Plan
	if len(plan.Eras) != 3 {
		t.Fatalf("data plan %+v, want 3 eras", plan)
	}
	for i, c := range got {
		e := plan.Eras[i+1]
		if c.Step != e.Step || c.Epoch != e.Epoch || c.Seconds < c.AskedSeconds {
			t.Errorf("change %+v, plan's era %+v", c, e)
		}
		prev := plan.Eras[i]
		if (c.Step-prev.Step)%plan.PerEpoch(i) != 0 || (c.Step-prev.Step)/plan.PerEpoch(i) != c.Epoch-prev.Epoch {
			t.Errorf("change %+v is not at an epoch boundary of era %+v (%d batches an epoch)", c, prev, plan.PerEpoch(i))
		}
	}
	if rep.StoppedBy != "epochs" || rep.FinalStep != rep.GlobalSteps {
		t.Errorf("stopped by %s at step %d of %d; want epochs at the last step", rep.StoppedBy, rep.FinalStep, rep.GlobalSteps)
	}
	// No restart; the workers removed by the scale to 1 ended, each
	// recorded with its cause and never back.
	var ended []string
	for _, r := range rep.Restarts {
		if r.Cause != launcher.CauseRemoved || r.BackAtSeconds != nil {
			t.Errorf("restart %+v: want only removed workers, ended", r)
		}
		ended = append(ended, r.Task)
	}
	slices.Sort(ended)
	if !slices.Equal(ended, []string{"worker/1", "worker/2", "worker/3"}) {
		t.Errorf("ended %v, want the removed workers 1, 2 and 3", ended)
	}
	for _, w := range ended {
		if got := rep.Tasks[w].Ended; got != launcher.CauseRemoved {
			t.Errorf("tasks[%s] %+v: ended %q, want %q", w, rep.Tasks[w], got, launcher.CauseRemoved)
		}
	}
	// The number of workers training went up to 4, then down to 1; the
	// summary's worker count says so.
	lw := rep.LiveWorkers
	if len(lw) < 2 || lw[len(lw)-1].Workers != 1 || !slices.ContainsFunc(lw, func(c report.LiveWorkers) bool { return c.Workers == 4 }) ||
		!strings.Contains(run.out.String(), fmt.Sprintf("2 workers, %d from ", lw[0].Workers)) || !strings.Contains(run.out.String(), ", 1 from ") {
		t.Errorf("live workers %+v: want 4 then 1, in the summary too\n%s", lw, run.out)
	}
	if d := rep.EpochsDone - 20; d < -0.01 || d > 0.05 {
		t.Errorf("%.3f epochs trained, want 20 (the samples of the run as asked)", rep.EpochsDone)
	}

	// Exactly once: the final checkpoint's data positions are each
	// worker's batches of every step of its eras (a sync step takes one
	// batch of each member), so every member read each epoch of its
	// era's shard once; and they add up to the samples trained.
	latest, _, err := checkpoint.NewStore(checkpoint.OSFS{}, ckdir, 0).Latest()
	if err != nil {
		t.Fatal(err)
	}
	m := latest.Manifest
	if m == nil || !m.Final || m.Version != rep.FinalStep || len(m.DataPositions) < 4 {
		t.Fatalf("the newest checkpoint is %+v, want the final one at step %d with 4 positions", m, rep.FinalStep)
	}
	var batches int64
	for w := range 4 {
		var want int64
		for k, e := range plan.Eras {
			end := rep.FinalStep
			if k+1 < len(plan.Eras) {
				end = plan.Eras[k+1].Step
			}
			if w < e.Workers {
				want += end - e.Step
			}
		}
		if pos := m.DataPositions[w]; pos != want {
			t.Errorf("worker/%d's data position %d, want %d (one batch per step of its eras %+v)", w, pos, want, plan.Eras)
		}
		batches += m.DataPositions[w]
	}
	if n := float64(batches*int64(plan.Batch)) / float64(plan.N); n-rep.EpochsDone > 1e-6 || rep.EpochsDone-n > 1e-6 {
		t.Errorf("the positions hold %.4f epochs of samples, the report %.4f", n, rep.EpochsDone)
	}
	// The removed workers exited 0 when their shards said done.
	for _, w := range []string{"worker/1", "worker/2", "worker/3"} {
		if !strings.Contains(run.out.String(), `msg="removed worker exited" task=`+w) {
			t.Errorf("%s did not exit cleanly:\n%s", w, run.out)
		}
	}
	for _, line := range []string{"workers: 2 -> 4 at step", "workers: 4 -> 1 at step"} {
		if !strings.Contains(run.out.String(), line) {
			t.Errorf("the summary has no %q:\n%s", line, run.out)
		}
	}
	t.Logf("changes %+v; %d steps, %.2f%%, startup %.1f s, training %.1f s", got, rep.GlobalSteps, 100*rep.TestAccuracy, rep.StartupSeconds, rep.TrainSeconds)
}

// runPstrain runs the binary with args and returns its combined output.
func runPstrain(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(bin.Path(t), args...).CombinedOutput()
	return string(out), err
}
