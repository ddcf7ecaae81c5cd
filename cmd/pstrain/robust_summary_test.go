package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/launcher"
	"github.com/pstrain/pstrain/observe/report"
)

// The summary says who was suspected and quarantined, that the worker
// count changed when, and that a ruined run is not a success.
func TestSummaryOfAQuarantine(t *testing.T) {
	var b bytes.Buffer
	printSummary(&b, &report.Report{Workers: 2, Mode: "sync", LiveWorkers: []report.LiveWorkers{{Seconds: 6.2, Workers: 1}},
		Restarts:    []report.Restart{{Task: "worker/1", Cause: launcher.CauseQuarantined, KilledAtSeconds: 6.2, RestoredStep: -1}},
		Suspects:    []report.Suspect{{Worker: "worker/1", Reason: "its gradients pointed away", AtStep: 40}},
		Quarantined: []string{"worker/1"}})
	out := b.String()
	for _, want := range []string{"2 workers, 1 from 6.20 s", "suspect: worker/1 at step 40, quarantined: its gradients pointed away",
		"ended:   worker/1  at 6.20 s (quarantined), not restarted"} {
		if !strings.Contains(out, want) {
			t.Errorf("the summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "RUINED") {
		t.Errorf("a run with a good model called ruined:\n%s", out)
	}
	b.Reset()
	rep := &report.Report{Workers: 2, Ruined: "the final model (step 12, test loss 9792) is worse than the initial one (2.308); suspect worker/1"}
	printSummary(&b, rep)
	if !strings.Contains(b.String(), "RUINED: the final model (step 12, test loss 9792) is worse than the initial one (2.308); suspect worker/1") {
		t.Errorf("the summary of a ruined run:\n%s", b.String())
	}
	if err := ruinedRun(rep); exitCode(err) != launcher.ExitChiefGaveUp {
		t.Errorf("a ruined run: %v, exit status %d, want %d", err, exitCode(err), launcher.ExitChiefGaveUp)
	}
	if err := ruinedRun(&report.Report{}); err != nil {
		t.Errorf("a good run: %v", err)
	}
}

// After a divergence the summary says why a worker no one suspects had
// gradients refused too; without one, or for the suspect alone, it adds
// nothing.
func TestSummaryExplainsHonestRefusals(t *testing.T) {
	const hint = "(worker/0 not suspected: a diverging model's gradients are large from every worker"
	div := []report.Divergence{{AtStep: 75, TestLoss: 1.5e15, BestLoss: 2.31, RolledBackTo: 0, LRFactor: 1, SuspectWorker: "worker/1", Evidence: "pointed away"}}
	for _, c := range []struct {
		name    string
		refused map[string]int64
		div     []report.Divergence
		want    bool
	}{
		{"both refused after a divergence", map[string]int64{"worker/0": 59, "worker/1": 59}, div, true},
		{"the suspect alone", map[string]int64{"worker/1": 59}, div, false},
		{"no divergence", map[string]int64{"worker/0": 1}, nil, false},
	} {
		var b bytes.Buffer
		printGuard(&b, &report.Report{RefusedGradients: c.refused, Divergences: c.div})
		if got := strings.Contains(b.String(), hint); got != c.want {
			t.Errorf("%s: hint %t, want %t:\n%s", c.name, got, c.want, b.String())
		}
	}
}
