package main

// The multi-process test of parameter servers added and removed live in
// an async run (docs/elastic.md, "Parameter servers"): `pstrain scale
// --ps` 2 -> 3 -> 1 during one run of the real binary.

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
)

func TestScalePSAsync(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, mode := range []string{"async", "ssp"} {
		t.Run(mode, func(t *testing.T) { scalePSAsync(t, mode) })
	}
}

// scalePSAsync runs mode on 2 PS, scales to 3 and then to 1, and checks
// the changes, the checkpoints the new layouts started from, and the
// final checkpoint's `pstrain eval` score against the run's.
func scalePSAsync(t *testing.T, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ckdir := filepath.Join(dir, "ck")
	// 16 epochs: about 4 s of training on an idle machine, of which the
	// first 1.2 s pass before the first progress line, and the two
	// changes take about 1.5 s more.
	const epochs = 16
	run := startRun(t, ctx, dir, "--mode", mode, "--staleness", "4", "--batch", "64", "--data-fraction", "0.1", "--epochs", "16",
		"--lr", "0.02", "--lr-schedule", "constant", "--checkpoint-dir", ckdir, "--checkpoint-every", "0s", "--keep-checkpoints", "0",
		"--max-ps", "3")
	run.waitTraining(60 * time.Second)
	rep := scalePS3Then1(t, run)

	got := checkPSChanges(t, rep, epochs)
	checkRemovedPS(t, run, rep)
	checkBoundaries(t, ckdir, got, rep.RefusedGradients)
	final := newestCheckpoint(t, ckdir)
	if final.Manifest == nil || final.Manifest.NumShards != 1 || !final.Manifest.Final {
		t.Fatalf("the final checkpoint %+v: want 1 shard", final.Manifest)
	}
	acc, version := evalCheckpoint(t, ctx, ckdir, testbin.MNIST(t))
	if math.Abs(acc-rep.TestAccuracy) > 1e-4 || version != rep.FinalStep {
		t.Errorf("pstrain eval of the final checkpoint: %.4f at version %d; the run's final model %.4f at step %d", acc, version, rep.TestAccuracy, rep.FinalStep)
	}
	// Restored onto 2 PS, it scores the same (16 epochs of batch 64 are
	// as many versions as a sync run of 2 workers has steps in 32).
	restoreOnto2PS(t, ctx, ckdir, final, rep.FinalStep, "32.2")
	for _, c := range got {
		t.Logf("ps %d -> %d at version %d (asked at %.2f s, done at %.2f s): pause %.3f s, %d steps lost", c.From, c.To, c.Step,
			c.AskedSeconds, c.Seconds, *c.PauseSeconds, *c.StepsLost)
	}
	t.Logf("%d gradients, %.2f%% (pstrain eval of the final checkpoint %.2f%%), training %.1f s", rep.GlobalSteps, 100*rep.TestAccuracy, 100*acc, rep.TrainSeconds)
	if t.Failed() {
		logPSChangeLines(t, run)
	}
}

// logPSChangeLines logs the chief's lines about the PS changes, with
// their times: where a pause went.
func logPSChangeLines(t *testing.T, run *liveRun) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(run.dir, "logs", "chief.log"))
	if err != nil {
		t.Log(err)
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "PS count change") || strings.Contains(line, "parameter servers changed") {
			t.Log(line)
		}
	}
}

// checkBoundaries: each change's checkpoint (the one the new layout was
// initialised from: its highest shard version is the change's) verifies,
// every shard of it is at that version (no gradient of the old layout
// missing from a shard), and its data positions add up to it (an async
// version is one gradient of one batch: no batch lost or counted twice).
// The norm guard must have refused nothing for the last to hold.
func checkBoundaries(t *testing.T, ckdir string, changes []report.MembershipChange, refused map[string]int64) {
	t.Helper()
	store := checkpoint.NewStore(checkpoint.OSFS{}, ckdir, 0)
	infos, err := store.List()
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range changes {
		var m *checkpoint.Manifest
		for _, in := range infos {
			if in.Manifest != nil && !in.Manifest.Final && in.Step <= c.Step && len(in.Manifest.Shards) == c.From && shardsAt(in.Manifest, c.Step) {
				m = in.Manifest
				if err := store.Verify(in.Path); err != nil {
					t.Errorf("the checkpoint of change %d (%s): %v", i, in.Path, err)
				}
				break
			}
		}
		if m == nil {
			t.Errorf("change %d (%+v): no checkpoint of %d shards all at version %d among %d", i, c, c.From, c.Step, len(infos))
			continue
		}
		var sum int64
		for _, p := range m.DataPositions {
			sum += p
		}
		if sum != c.Step {
			t.Errorf("change %d at version %d: the data positions %v add up to %d (refused gradients: %v)", i, c.Step, m.DataPositions, sum, refused)
		}
		t.Logf("change %d: its checkpoint of step %d has %d shards at version %d, data positions %v", i, m.Step, len(m.Shards), c.Step, m.DataPositions)
	}
}

// shardsAt says every shard of m is at version v.
func shardsAt(m *checkpoint.Manifest, v int64) bool {
	for _, s := range m.Shards {
		if s.Version != v {
			return false
		}
	}
	return true
}
