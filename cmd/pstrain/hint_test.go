package main

import (
	"strings"
	"testing"

	"github.com/pstrain/pstrain/observe/report"
)

// A run that trained every epoch below its target says where it stopped
// and what to try; one that was interrupted says only that it stopped
// short; one that held its target says nothing of the kind. One stopped
// by --patience says where its loss was lowest.
func TestSummarySaysBelowTarget(t *testing.T) {
	ttt := 9.5
	for _, c := range []struct {
		rep       report.Report
		want, not string
	}{
		{report.Report{Mode: "async", Workers: 2, Model: "784-800-10", LR: 0.2, Epochs: 10, EpochsDone: 10, TestAccuracy: 0.9691, TargetAccuracy: 0.975, StoppedBy: "epochs"},
			"stopped after 10 epochs at 96.91%, below the 97.50% target: try --lr 0.1 (the default for async with 2 workers) or --epochs 20\n", ""},
		{report.Report{Mode: "sync", Workers: 2, Model: "cnn 28x28x1-c16-c32-256-10", Batch: 64, LR: 0.05, Epochs: 4, EpochsDone: 4, TestAccuracy: 0.988, TargetAccuracy: 0.99, StoppedBy: "epochs"},
			"stopped after 4 epochs at 98.80%, below the 99.00% target: try --lr 0.025 or --epochs 8\n", ""},
		{report.Report{Mode: "sync", Workers: 2, Model: "cnn 28x28x1-c16-c32-256-10", Batch: 128, LR: 0.05, Epochs: 10, EpochsDone: 10, TestAccuracy: 0.9892, TargetAccuracy: 0.99, StoppedBy: "epochs"},
			"stopped after 10 epochs at 98.92%, below the 99.00% target: try --batch 64 (the CNN's default) or --lr 0.025 or --epochs 20\n", ""},
		{report.Report{Mode: "async", Workers: 2, Model: "cnn 28x28x1-c16-c32-256-10", Batch: 64, LR: 0.025, Epochs: 10, EpochsDone: 10, TestAccuracy: 0.9908, TargetAccuracy: 0.99, TargetHold: 3, StoppedBy: "epochs"},
			"stopped after 10 epochs at 99.08%, the 99.00% target never held for 3 evaluations in a row: try --epochs 20\n", "below"},
		{report.Report{Mode: "sync", Workers: 2, EpochsDone: 1.5, TestAccuracy: 0.95, TargetAccuracy: 0.975, StoppedBy: "interrupted"},
			"target 97.50% not reached (stopped after 1.5 epochs at 95.00%, below the 97.50% target)\n", "try"},
		{report.Report{Mode: "sync", Workers: 2, TestAccuracy: 0.976, TargetAccuracy: 0.975, StoppedBy: "target", TimeToTargetSeconds: &ttt},
			"time to 97.50% held for 0 evaluations: 9.50 s", "below"},
		{report.Report{Mode: "sync", Workers: 2, Model: "ctr", Patience: 3, FinalStep: 2910, StoppedBy: "plateau", Evals: []report.Eval{
			{Step: 1600, TestLoss: 0.4403}, {Step: 2910, TestLoss: 0.4382}, {Step: 3300, TestLoss: 0.4384}, {Step: 3700, TestLoss: 0.4385},
			{Step: 4237, TestLoss: 0.4386}, {Step: 2910, TestLoss: 0.4381}}},
			"the test loss stopped falling: none of the last 3 evaluations went below 0.4382, of step 2910; the model handed back is of step 2910\n", "target"},
	} {
		var b strings.Builder
		printSummary(&b, &c.rep)
		if !strings.Contains(b.String(), c.want) || (c.not != "" && strings.Contains(b.String(), c.not)) {
			t.Errorf("summary:\n%s\nwant %q, without %q", b.String(), c.want, c.not)
		}
	}
}
