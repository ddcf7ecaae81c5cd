package main

// The multi-process test of rebalancing (docs/elastic.md,
// "Rebalancing"): one PS of a sync run of the real binary slowed 4x,
// `pstrain scale --rebalance` moves rows away from it, and the final
// checkpoint, written by the rebalanced layout, evaluates to the report's
// accuracy and restores onto 2 even PS.

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/report"
)

func TestRebalancePS(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ckdir := filepath.Join(dir, "ck")
	checkRebalanceRefusals(t, dir)
	run, rep, c, out := rebalancedRun(t, ctx, dir)
	final := newestCheckpoint(t, ckdir)
	if final.Manifest == nil || !final.Manifest.Final || !slices.Equal(final.Manifest.ShardWeights, c.Weights) {
		t.Fatalf("the final checkpoint %+v: want the rebalanced layout's weights %v", final.Manifest, c.Weights)
	}
	acc, _ := evalCheckpoint(t, ctx, ckdir, testbin.MNIST(t))
	if acc < rep.TestAccuracy-1e-4 || acc > rep.TestAccuracy+1e-4 {
		t.Errorf("pstrain eval of the final checkpoint: %.4f, the report's accuracy %.4f", acc, rep.TestAccuracy)
	}
	restoreOnto2PS(t, ctx, ckdir, final, rep.FinalStep, "20.2")
	if !strings.Contains(run.out.String(), "parameter servers: 2 rebalanced to weights") {
		t.Errorf("the summary does not name the rebalance:\n%s", run.out)
	}
	t.Logf("%s", out)
	t.Logf("rebalanced at step %d (asked at %.2f s, done at %.2f s): weights %v, imbalance %.2f, %d parameters moved, pause %.3f s",
		c.Step, c.AskedSeconds, c.Seconds, c.Weights, c.Imbalance, c.MovedParameters, *c.PauseSeconds)
}

// TestRebalancePSWithStandbys: the same rebalance with a hot standby
// for each shard (--ps-replicas 1): the switch initialises every shard
// of the weighted layout, each primary attaches its standby afresh, and
// the run ends with 0 steps lost and no rollback.
func TestRebalancePSWithStandbys(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, _, c, _ := rebalancedRun(t, ctx, t.TempDir(), "--ps-replicas", "1")
	t.Logf("rebalanced with standbys at step %d: weights %v, imbalance %.2f, pause %.3f s",
		c.Step, c.Weights, c.Imbalance, *c.PauseSeconds)
}

// rebalancedRun runs 20 epochs of a tenth of MNIST in sync with ps/0
// slowed 4x (and args), checkpoints in dir/ck, asks for a rebalance once
// it can be measured, and checks the one it made (checkRebalance). It
// returns the run, its report, the rebalance and the scale command's
// output.
func rebalancedRun(t *testing.T, ctx context.Context, dir string, args ...string) (*liveRun, *report.Report, report.MembershipChange, string) {
	t.Helper()
	run := startRun(t, ctx, dir, append([]string{"--mode", "sync", "--batch", "64", "--data-fraction", "0.1", "--epochs", "20",
		"--lr", "0.05", "--lr-schedule", "constant", "--checkpoint-dir", filepath.Join(dir, "ck"), "--checkpoint-every", "0s",
		"--fault", "slow:ps/0@0s:4"}, args...)...)
	run.waitTraining(60 * time.Second)
	out := rebalanceWhenMeasured(t, run)
	waitPSChanges(run, 1)
	rep := run.finish(2 * time.Minute)
	return run, rep, checkRebalance(t, rep, 20), out
}

// checkRebalanceRefusals: --rebalance with another change is a usage
// error (exit 2), and no run in the directory exits 1.
func checkRebalanceRefusals(t *testing.T, noRun string) {
	t.Helper()
	for _, c := range []struct {
		args []string
		code int
	}{{[]string{"--rebalance", "--ps", "3"}, 2}, {[]string{"--rebalance"}, 1}} {
		out, err := runPstrain(t, append([]string{"scale", "--run-dir", noRun}, c.args...)...)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != c.code {
			t.Errorf("pstrain scale %v in %s: %v, want exit status %d\n%s", c.args, noRun, err, c.code, out)
		}
	}
}

// rebalanceWhenMeasured runs `pstrain scale --rebalance` until the
// launcher has measured enough gradients to answer, and an imbalance: a
// refusal saying it cannot measure yet, or (on a host so loaded that
// every process waits for a core, and ps/0's quota binds less) that the
// imbalance is below the threshold, is retried for up to 20 s; any other
// answer fails the test. It returns the output of the one that asked.
func rebalanceWhenMeasured(t *testing.T, run *liveRun) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--rebalance")
		switch {
		case err == nil && strings.Contains(out, "asked the run in"):
			return out
		case (strings.Contains(out, "cannot be measured") || strings.Contains(out, "no measurable imbalance")) && time.Now().Before(deadline):
			t.Logf("refused, asking again: %s", out)
			time.Sleep(500 * time.Millisecond) // (the launcher scrapes once a second)
			continue
		}
		t.Fatalf("pstrain scale --rebalance: %v\n%s\n%s", err, out, run.out)
	}
}

// checkRebalance: the report has one PS change, a rebalance of the 2
// shards that took rows off the slowed ps/0, with 0 steps lost and a
// pause within pauseGoal, and no rollback: the run trained its epochs,
// each step once, its data ledger empty.
func checkRebalance(t *testing.T, rep *report.Report, epochs float64) report.MembershipChange {
	t.Helper()
	goal, why := pauseGoal(rep)
	got := rep.MembershipChanges
	if len(got) != 1 || got[0].Kind != "rebalance" || got[0].From != 2 || got[0].To != 2 || rep.FinalPS != 2 {
		t.Fatalf("membership changes %+v, final PS %d; want one rebalance of 2 PS", got, rep.FinalPS)
	}
	c := got[0]
	if len(c.Weights) != 2 || c.Weights[0] >= c.Weights[1] || c.Imbalance < partition.MinImbalance || c.MovedParameters <= 0 {
		t.Errorf("rebalance %+v: want fewer rows on the slowed ps/0, an imbalance of at least partition.MinImbalance, rows moved", c)
	}
	if c.StepsLost == nil || c.PauseSeconds == nil || *c.StepsLost != 0 || *c.PauseSeconds > goal {
		t.Errorf("rebalance %+v: want 0 steps lost and a pause of at most %s", c, why)
	}
	checkNoRollback(t, rep, epochs)
	return c
}

// TestMembershipTextOfALayoutChange: the summary names a count change, a
// rebalance with its weights, and --ps at the count evening a rebalanced
// layout (no weights, no imbalance measured) as what each is.
func TestMembershipTextOfALayoutChange(t *testing.T) {
	zero, pause := int64(0), 0.3
	for _, c := range []struct {
		chg  report.MembershipChange
		want string
	}{
		{report.MembershipChange{Role: "ps", From: 2, To: 3}, "parameter servers: 2 -> 3 at"},
		{report.MembershipChange{Role: "ps", From: 2, To: 2, Kind: "rebalance", Weights: []int{323, 677}, Imbalance: 2.11, MovedParameters: 112800},
			"parameter servers: 2 rebalanced to weights 323:677 (2.11x imbalance, 112800 parameters moved) at"},
		{report.MembershipChange{Role: "ps", From: 2, To: 2, Kind: "rebalance", MovedParameters: 112800},
			"parameter servers: 2 made even again (112800 parameters moved) at"},
	} {
		c.chg.StepsLost, c.chg.PauseSeconds = &zero, &pause
		if got := membershipText(c.chg); !strings.HasPrefix(got, c.want) {
			t.Errorf("membershipText(%+v) = %q, want it to begin %q", c.chg, got, c.want)
		}
	}
}
