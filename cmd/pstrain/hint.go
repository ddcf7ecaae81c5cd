package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/report"
)

// belowTarget is the summary's line for a run that ended without holding
// its target: where it stopped and, when it trained every epoch, what to
// try ("stopped after 10 epochs at 96.91%, below the 97.50% target: try
// --lr 0.1 (the default for async with 2 workers) or --epochs 20"). A
// final model at the target that was never held there says so, and only
// more epochs are worth a try.
func belowTarget(rep *report.Report) string {
	s := fmt.Sprintf("stopped after %.3g epochs at %.2f%%, below the %.2f%% target", rep.EpochsDone, 100*rep.TestAccuracy, 100*rep.TargetAccuracy)
	if rep.TestAccuracy >= rep.TargetAccuracy {
		s = fmt.Sprintf("stopped after %.3g epochs at %.2f%%, the %.2f%% target never held for %d evaluations in a row",
			rep.EpochsDone, 100*rep.TestAccuracy, 100*rep.TargetAccuracy, max(1, rep.TargetHold))
	}
	switch {
	case rep.StoppedBy != "epochs":
		return fmt.Sprintf("target %.2f%% not reached (%s)", 100*rep.TargetAccuracy, s)
	case rep.TestAccuracy >= rep.TargetAccuracy:
		return s + ": try --epochs " + strconv.FormatFloat(2*rep.Epochs, 'g', 3, 64)
	}
	return s + ": try " + strings.Join(targetHints(rep), " or ")
}

// targetHints are the flags worth a try after a run trained every epoch
// below its target: a CNN's default batch if it ran with another one, the
// default learning rate for its model, mode and workers if it ran with
// another one (else half its rate), and twice the epochs.
func targetHints(rep *report.Report) []string {
	g := func(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }
	kind := config.ModelKind("")
	var hints []string
	if strings.HasPrefix(rep.Model, "cnn") {
		kind = config.ModelKind("cnn")
		if rep.Batch != config.DefaultCNNBatch {
			hints = append(hints, fmt.Sprintf("--batch %d (the CNN's default)", config.DefaultCNNBatch))
		}
	}
	mode := config.Mode(rep.Mode)
	def := config.DefaultLR(kind, mode, rep.Workers)
	var lr string
	switch {
	case rep.LR > def*1.01 || rep.LR < def*0.99:
		lr = fmt.Sprintf("--lr %s (the default for %s with %d workers)", g(def), mode, rep.Workers)
	default:
		lr = "--lr " + g(rep.LR/2)
	}
	return append(hints, lr, "--epochs "+g(2*rep.Epochs))
}

// stopLines are the summary's lines on the stop rules: the time to the
// target held, or how far below it the run ended; and where the test
// loss was lowest in a run stopped by --patience.
func stopLines(rep *report.Report) []string {
	var lines []string
	if rep.TimeToTargetSeconds != nil {
		lines = append(lines, fmt.Sprintf("time to %.2f%% held for %d evaluations: %.2f s of training", 100*rep.TargetAccuracy, rep.TargetHold, *rep.TimeToTargetSeconds))
	} else if rep.TargetAccuracy > 0 {
		lines = append(lines, belowTarget(rep))
	}
	if rep.StoppedBy == chief.StopPlateau {
		lines = append(lines, plateauText(rep))
	}
	return lines
}

// plateauText is the summary's line for a run stopped by --patience:
// the lowest test loss its training evaluations scored, and where ("the
// test loss stopped falling: none of the last 3 evaluations went below
// 0.4382, of step 2910; the model handed back is of step 2910"). The
// last evaluation is the final model's.
func plateauText(rep *report.Report) string {
	evals := rep.Evals[:max(0, len(rep.Evals)-1)]
	best := -1
	for i, e := range evals {
		if best < 0 || e.TestLoss < evals[best].TestLoss {
			best = i
		}
	}
	if best < 0 {
		return fmt.Sprintf("the test loss stopped falling for %d evaluations", rep.Patience)
	}
	return fmt.Sprintf("the test loss stopped falling: none of the last %d evaluations went below %.4f, of step %d; the model handed back is of step %d",
		rep.Patience, evals[best].TestLoss, evals[best].Step, rep.FinalStep)
}
