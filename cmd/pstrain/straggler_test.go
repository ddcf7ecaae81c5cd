package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
)

// stragglerRun trains the default sync cluster for 2 epochs of MNIST
// (about 7 s undisturbed on 2 cores) with the given --fault, and returns
// its report and output.
func stragglerRun(t *testing.T, fault string) (*report.Report, string) {
	t.Helper()
	d, tmp := testbin.MNIST(t), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rp := filepath.Join(tmp, "report.json")
	out, err := pstrain(t, ctx, "run", "--data-dir", d, "--epochs", "2", "--target-accuracy", "0", "--eval-every", "0",
		"--run-dir", filepath.Join(tmp, "run"), "--sd-dir", filepath.Join(tmp, "targets"), "--report", rp, "--fault", fault)
	if err != nil {
		t.Fatalf("pstrain run --fault %q: %v\n%s", fault, err, out)
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	return rep, out
}

// A worker slowed to a third of its speed from 2 s into a sync run is
// named as the straggler within 10 s, with its slowdown; an undisturbed
// run names none.
func TestStragglerNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("two runs of the default cluster")
	}
	const at = 2.0 // seconds: the slowdown's start
	rep, out := stragglerRun(t, "slow:worker/1@2s:3")
	t.Logf("stragglers %+v; bottleneck: %s", rep.Stragglers, rep.Bottleneck)
	if len(rep.Stragglers) != 1 || rep.Stragglers[0].Task != "worker/1" {
		t.Fatalf("stragglers %+v, want worker/1 alone\n%s", rep.Stragglers, out)
	}
	s := rep.Stragglers[0]
	if s.Slowdown < 1.7 || s.Slowdown > 4.5 {
		t.Errorf("worker/1's slowdown %.2f, want 1.7..4.5 (slowed 3x; the others speed up on the CPU it gives up)", s.Slowdown)
	}
	if s.DetectedAtSeconds < at || s.DetectedAtSeconds > at+10 {
		t.Errorf("worker/1 counted at %.1f s, want within 10 s of the slowdown at %.0f s", s.DetectedAtSeconds, at)
	}
	if !strings.Contains(out, "straggler at ") || !strings.Contains(out, ": worker/1 is ") {
		t.Errorf("the progress does not name worker/1 as a straggler:\n%s", out)
	}
	if !strings.Contains(out, "\nstraggler: worker/1, ") {
		t.Errorf("the summary does not name worker/1 as a straggler:\n%s", out)
	}

	rep, out = stragglerRun(t, "")
	if rep.Stragglers == nil || len(rep.Stragglers) != 0 || strings.Contains(out, "straggler at ") || strings.Contains(out, "\nstraggler: ") {
		t.Errorf("undisturbed run: stragglers %+v, want none (an empty list)\n%s", rep.Stragglers, out)
	}
}
