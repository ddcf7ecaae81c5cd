package main

// The multi-process test of parameter servers added and removed live
// (docs/elastic.md, "Parameter servers"): `pstrain scale --ps` 2 -> 3 -> 1
// during one sync run of the real binary, then its final checkpoint
// restored onto 2 PS.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/launcher"
	"github.com/pstrain/pstrain/observe/bottleneck"
	"github.com/pstrain/pstrain/observe/report"
)

// psChanges counts the PS changes of a chief state.
func psChanges(st elasticState) int {
	n := 0
	for _, c := range st.Changes {
		if c.Role == "ps" {
			n++
		}
	}
	return n
}

func TestScalePS(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ckdir := filepath.Join(dir, "ck")
	run := startRun(t, ctx, dir, "--mode", "sync", "--batch", "64", "--data-fraction", "0.1", "--epochs", "12",
		"--lr", "0.05", "--lr-schedule", "constant", "--checkpoint-dir", ckdir, "--checkpoint-every", "0s", "--max-ps", "3")
	run.waitTraining(60 * time.Second)
	checkPSRefusals(t, run, dir)
	rep := scalePS3Then1(t, run)

	got := checkPSChanges(t, rep, 12)
	checkRemovedPS(t, run, rep)
	// The boundaries' checkpoints verify; the final one is of 1 shard.
	store := checkpoint.NewStore(checkpoint.OSFS{}, ckdir, 0)
	for i, c := range got {
		if err := store.Verify(store.Path(c.Step)); err != nil {
			t.Errorf("the checkpoint of change %d's boundary (step %d): %v", i, c.Step, err)
		}
	}
	final := newestCheckpoint(t, ckdir)
	if final.Manifest == nil || final.Manifest.NumShards != 1 || !final.Manifest.Final {
		t.Fatalf("the final checkpoint %+v: want 1 shard", final.Manifest)
	}
	restoreOnto2PS(t, ctx, ckdir, final, rep.FinalStep, "12.2")
	for _, c := range got {
		t.Logf("ps %d -> %d at step %d (asked at %.2f s, done at %.2f s): pause %.3f s, %d steps lost", c.From, c.To, c.Step,
			c.AskedSeconds, c.Seconds, *c.PauseSeconds, *c.StepsLost)
	}
	t.Logf("%d steps, %.2f%%, training %.1f s", rep.GlobalSteps, 100*rep.TestAccuracy, rep.TrainSeconds)
}

// pauseGoal is the longest pause a PS change may take in the run of
// rep: 1 s (docs/elastic.md, "The pause"), stretched on a machine so
// loaded that the run's tasks wait for a core. The pause is CPU work (the
// boundary checkpoint, the new shards' Inits) that such a machine slows
// down: measured 0.29-0.34 s with the machine to itself, 0.31-0.47 s at
// load 4-11, up to 1.22 s at load 22-35 on 2 cores. Up to
// quietLoadPerCore runnable tasks per core the goal is 1 s; past it, 1 s
// times the load per core over quietLoadPerCore, the load being the
// highest 1-minute load the run's own monitor saw (the report's
// bottleneck). A change that waits for a timeout or a poll it need not
// (seconds) still fails on any machine with cores to spare.
func pauseGoal(rep *report.Report) (goal float64, why string) {
	const quietLoadPerCore = 4
	perCore := 0.0
	if b := rep.Bottleneck; b != nil {
		for _, h := range b.Hosts {
			if h.Cores > 0 {
				perCore = max(perCore, h.Load1/float64(h.Cores))
			}
		}
	}
	goal = max(1, perCore/quietLoadPerCore)
	return goal, fmt.Sprintf("%.1f s at a load of %.1f per core", goal, perCore)
}

// checkPSChanges: the report has the two PS changes, each with 0 steps
// lost and a pause within pauseGoal (1 s unless the machine is
// overloaded), and no rollback: the run trained its epochs, each step
// once, and its data ledger is empty (no sample read twice or skipped).
func checkPSChanges(t *testing.T, rep *report.Report, epochs float64) []report.MembershipChange {
	t.Helper()
	goal, why := pauseGoal(rep)
	t.Logf("pause goal: %s", why)
	got := rep.MembershipChanges
	if len(got) != 2 || got[0].From != 2 || got[0].To != 3 || got[1].From != 3 || got[1].To != 1 || rep.FinalPS != 1 {
		t.Fatalf("membership changes %+v, final PS %d; want ps 2 -> 3 -> 1", got, rep.FinalPS)
	}
	for _, c := range got {
		if c.Role != "ps" || c.StepsLost == nil || c.PauseSeconds == nil {
			t.Fatalf("change %+v: want a PS change with its pause and steps lost", c)
		}
		if *c.StepsLost != 0 || *c.PauseSeconds > goal || c.Seconds < c.AskedSeconds {
			t.Errorf("change %+v: %d steps lost, pause %.3f s; want 0 and at most %s", c, *c.StepsLost, *c.PauseSeconds, why)
		}
	}
	checkNoRollback(t, rep, epochs)
	return got
}

// checkNoRollback: the run trained its epochs, each step once (it
// stopped by epochs at its last step, no divergence), and its data
// ledger is empty (no sample read twice or skipped).
func checkNoRollback(t *testing.T, rep *report.Report, epochs float64) {
	t.Helper()
	if rep.StoppedBy != "epochs" || rep.FinalStep != rep.GlobalSteps || len(rep.Divergences) > 0 {
		t.Errorf("stopped by %s at step %d of %d (divergences %+v); want epochs at the last step", rep.StoppedBy, rep.FinalStep, rep.GlobalSteps, rep.Divergences)
	}
	if d := rep.EpochsDone - epochs; d < -0.01 || d > 0.05 {
		t.Errorf("%.3f epochs trained, want %g", rep.EpochsDone, epochs)
	}
	if rep.DataLedger == nil || len(rep.DataLedger) > 0 {
		t.Errorf("data ledger %+v, want [] (no sample read twice or skipped)", rep.DataLedger)
	}
}

// scalePS3Then1 scales run's parameter servers 2 -> 3 -> 1, each change
// once the last took effect, and returns the run's report.
func scalePS3Then1(t *testing.T, run *liveRun) *report.Report {
	t.Helper()
	out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--ps", "3")
	if err != nil || !strings.Contains(out, "for 3 parameter servers (was 2)") {
		t.Fatalf("pstrain scale --ps 3: %v\n%s", err, out)
	}
	waitPSChanges(run, 1)
	if out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--ps", "1"); err != nil {
		t.Fatalf("pstrain scale --ps 1: %v\n%s", err, out)
	}
	waitPSChanges(run, 2)
	return run.finish(2 * time.Minute)
}

// checkPSRefusals: beyond --max-ps exits 1 (cannot scale), as does no
// run in the directory.
func checkPSRefusals(t *testing.T, run *liveRun, noRun string) {
	t.Helper()
	for _, c := range []struct{ dir, ps string }{{run.dir, "4"}, {noRun, "2"}} {
		out, err := runPstrain(t, "scale", "--run-dir", c.dir, "--ps", c.ps)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("pstrain scale --ps %s in %s: %v, want exit status 1\n%s", c.ps, c.dir, err, out)
		}
	}
	if _, err := launcher.RequestScalePS(run.dir, 4); !errors.Is(err, launcher.ErrBadScale) {
		t.Errorf("scale to 4 of --max-ps 3: %v, want ErrBadScale", err)
	}
}

// checkRemovedPS: no PS was restarted; the removed ones (ps/1, ps/2)
// exited when told to, and the summary has both changes.
func checkRemovedPS(t *testing.T, run *liveRun, rep *report.Report) {
	t.Helper()
	var ended []string
	for _, r := range rep.Restarts {
		if r.Cause != launcher.CauseRemoved || r.BackAtSeconds != nil {
			t.Errorf("restart %+v: want only removed parameter servers, ended", r)
		}
		ended = append(ended, r.Task)
	}
	slices.Sort(ended)
	if !slices.Equal(ended, []string{"ps/1", "ps/2"}) {
		t.Errorf("ended %v, want the removed ps/1 and ps/2", ended)
	}
	for _, line := range []string{"parameter servers: 2 -> 3 at step", "parameter servers: 3 -> 1 at step",
		`msg="removed parameter server exited" task=ps/1`, `msg="removed parameter server exited" task=ps/2`} {
		if !strings.Contains(run.out.String(), line) {
			t.Errorf("the output has no %q:\n%s", line, run.out)
		}
	}
}

// waitPSChanges waits until the run's chief records n PS changes.
func waitPSChanges(run *liveRun, n int) {
	run.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if psChanges(run.waitChanges(0, time.Second)) >= n {
			return
		}
		select {
		case <-run.done:
			run.t.Fatalf("the run ended before %d PS changes:\n%s", n, run.out)
		case <-time.After(50 * time.Millisecond):
		}
	}
	run.t.Fatalf("no %d PS changes within a minute:\n%s", n, run.out)
}

// restoreOnto2PS restores the final checkpoint of a run (one shard) onto
// 2 PS and checks the model they serve scores what `pstrain eval` scores
// the checkpoint at. A final checkpoint is not resumed (the run is
// over): a copy marked not final is, by a sync run of 2 workers and
// batch 64 a few steps longer (--epochs epochs) at a learning rate too
// small to move a float32 parameter, so the model it ends with,
// checkpointed by 2 shards, is the restored one.
func restoreOnto2PS(t *testing.T, ctx context.Context, ckdir string, final checkpoint.Info, step int64, epochs string) {
	t.Helper()
	data := testbin.MNIST(t)
	want, _ := evalCheckpoint(t, ctx, ckdir, data)
	dir := t.TempDir()
	copyDir := filepath.Join(dir, "ck")
	dst := filepath.Join(copyDir, filepath.Base(final.Path))
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(final.Path)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(final.Path, e.Name()))
		if err == nil && e.Name() == checkpoint.ManifestName {
			m := *final.Manifest
			m.Final = false
			b, err = checkpoint.EncodeManifest(m)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	run := startRun(t, ctx, dir, "--mode", "sync", "--batch", "64", "--data-fraction", "0.1", "--epochs", epochs,
		"--lr", "1e-30", "--momentum", "0", "--lr-schedule", "constant", "--checkpoint-dir", copyDir, "--checkpoint-every", "0s",
		"--ps", "2", "--resume")
	rep := run.finish(2 * time.Minute)
	log, _ := os.ReadFile(filepath.Join(run.dir, "logs", "chief.log"))
	if !strings.Contains(string(log), "resuming from checkpoint") || rep.PS != 2 {
		t.Fatalf("the run on 2 PS did not resume from the final checkpoint:\n%s\n%s", run.out, log)
	}
	after := newestCheckpoint(t, copyDir)
	if after.Manifest.NumShards != 2 || after.Manifest.Version <= step {
		t.Fatalf("the resumed run's final checkpoint %+v: want 2 shards past step %d", after.Manifest, step)
	}
	got, _ := evalCheckpoint(t, ctx, copyDir, data)
	if got != want || rep.TestAccuracy < want-1e-4 || rep.TestAccuracy > want+1e-4 {
		t.Errorf("restored onto 2 PS: eval %.4f, the run's %.4f; the 1-PS checkpoint's eval %.4f", got, rep.TestAccuracy, want)
	}
	t.Logf("the final checkpoint (%d shards) scores %.4f; restored onto 2 PS %.4f (report %.4f)", final.Manifest.NumShards, want, got, rep.TestAccuracy)
}

// The pause goal is 1 s unless the run saw more than 4 runnable tasks per
// core, then in proportion to the load.
func TestPauseGoal(t *testing.T) {
	at := func(load float64, cores int) *report.Report {
		return &report.Report{Bottleneck: &bottleneck.Breakdown{Hosts: []bottleneck.Host{{Host: "127.0.0.1", Load1: load, Cores: cores}}}}
	}
	for _, c := range []struct {
		rep  *report.Report
		want float64
	}{
		{&report.Report{}, 1}, // no monitor: the goal itself
		{at(5.6, 2), 1},
		{at(8, 2), 1},
		{at(10, 2), 1.25},
		{at(30, 2), 3.75},
		{at(30, 0), 1},
	} {
		if got, why := pauseGoal(c.rep); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("pauseGoal = %.2f s (%s), want %.2f s", got, why, c.want)
		}
	}
}
