package main

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/launcher"
)

// TestRuinedRunHandsBackAnEarlierModel: a run whose last steps are
// poisoned beyond rescue (worker/1's gradient of step 44 of 47 times
// 1e4, the norm guard off, no routine evaluation to catch it while
// training) ends ruined, exit status 4, but the model it hands back is
// not the ruined one: the final checkpoint is an earlier model that
// scores no worse than the initial one, `pstrain eval` of the checkpoint
// directory gives the accuracy the report says, and the report and the
// summary say which step's model was handed back and why.
func TestRuinedRunHandsBackAnEarlierModel(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	data := testbin.MNIST(t)
	bin.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ck := filepath.Join(dir, "ckpt")
	// 20% of MNIST, 2 workers x 128 samples: 47 sync steps.
	rep, out := faultRunExit(t, ctx, dir, launcher.ExitChiefGaveUp, "--workers", "2", "--data-fraction", "0.2", "--epochs", "1",
		"--checkpoint-dir", ck, "--checkpoint-every", "10", "--heartbeat-timeout", "10s",
		"--norm-guard", "0", "--nan-policy", "skip", "--fault-gradient", "worker/1@44:1e4")
	hb := rep.HandedBack
	if rep.Ruined == "" || hb == nil {
		t.Fatalf("the poisoned run is not reported ruined with a model handed back: ruined %q, handed back %+v\n%s", rep.Ruined, hb, out)
	}
	t.Logf("ruined: %s; handed back %+v; %.2f%% at step %d", rep.Ruined, *hb, 100*rep.TestAccuracy, rep.FinalStep)
	if hb.RuinedStep < 45 || hb.RuinedTestAccuracy > 0.5 {
		t.Errorf("the ruined model: step %d, %.2f%%; want the poisoned one of step 45 or later (is the poison applied?)",
			hb.RuinedStep, 100*hb.RuinedTestAccuracy)
	}
	if hb.Err != "" || !hb.FromCheckpoint || rep.FinalStep != hb.Step || rep.FinalStep > 44 || rep.FinalStep <= 0 {
		t.Errorf("handed back %+v, final step %d: want a checkpoint of a step before the poison", hb, rep.FinalStep)
	}
	if rep.TestAccuracy < 0.8 {
		t.Errorf("the model handed back scores %.2f%%, want that of a model before the poison (80%% or more)", 100*rep.TestAccuracy)
	}
	if !strings.Contains(out, "RUINED: ") || !strings.Contains(out, "handed back the model of step") {
		t.Errorf("the summary does not say which model was handed back:\n%s", out)
	}
	final := newestCheckpoint(t, ck)
	acc, version := evalCheckpoint(t, ctx, ck, data)
	if final.Step != rep.FinalStep && version != rep.FinalStep {
		t.Errorf("the final checkpoint is %s (version %d), want the model of step %d", final.Path, version, rep.FinalStep)
	}
	if math.Abs(acc-rep.TestAccuracy) > 1e-3 {
		t.Errorf("pstrain eval of what the run hands back: %.2f%%, the report says %.2f%%", 100*acc, 100*rep.TestAccuracy)
	}
}
