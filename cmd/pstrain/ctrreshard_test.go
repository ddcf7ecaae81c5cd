package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/observe/report"
)

// TestCTRCheckpointRestoresOntoThreePS: a CTR run over 2 PS checkpoints
// as it goes; with its checkpoints after step 80 removed (the final one
// among them: a final checkpoint starts a new run), `--resume` over 3 PS
// loads every row of the step-80 checkpoint onto the shard it falls on
// among 3 and replays the rest, sync, to the same model: the 2-PS run's
// AUC. `pstrain eval` of the final checkpoint the 3 shards wrote gives
// that AUC too.
func TestCTRCheckpointRestoresOntoThreePS(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	data, ckdir := smallCTRData(t, tmp), filepath.Join(tmp, "ckpt")
	two := runCTRInto(t, ctx, tmp, "two", data, ckdir, "--ps", "2", "--checkpoint-every", "40", "--keep-checkpoints", "0")
	kept := keepCheckpointsUpTo(t, ckdir, 80)
	three := runCTRInto(t, ctx, tmp, "three", data, ckdir, "--ps", "3", "--checkpoint-every", "40")
	if three.PS != 3 || three.StoppedBy != "epochs" || three.GlobalSteps != two.GlobalSteps {
		t.Errorf("resumed run: %d PS, stopped by %s at step %d; want 3 PS, epochs, step %d", three.PS, three.StoppedBy, three.GlobalSteps, two.GlobalSteps)
	}
	t.Logf("2 PS: auc %.4f; resumed from step %d over 3 PS: auc %.4f", two.AUC, kept, three.AUC)
	if math.Abs(three.AUC-two.AUC) > 1e-4 {
		t.Errorf("auc %.4f resumed over 3 PS from step %d, %.4f over 2: the rows were not restored where the 3 shards look for them", three.AUC, kept, two.AUC)
	}
	info := newestCheckpoint(t, ckdir)
	if n := len(info.Manifest.Shards); n != 3 {
		t.Errorf("final checkpoint %s of %d shards, want 3", info.Path, n)
	}
	if auc := evalAUC(t, ctx, ckdir, data); math.Abs(auc-three.AUC) > 1e-4 {
		t.Errorf("pstrain eval of the 3 shards' final checkpoint: auc %.4f, the report says %.4f", auc, three.AUC)
	}
}

// runCTRInto runs `pstrain run --model ctr` with 2 workers for 2 epochs
// on data, checkpointing into ckdir, its run directory and report under
// tmp/name.
func runCTRInto(t *testing.T, ctx context.Context, tmp, name, data, ckdir string, extra ...string) *report.Report {
	t.Helper()
	dir := filepath.Join(tmp, name)
	rp := filepath.Join(dir, "report.json")
	args := append([]string{"run", "--model", "ctr", "--workers", "2", "--epochs", "2", "--patience", "0", "--data-dir", data,
		"--checkpoint-dir", ckdir, "--run-dir", filepath.Join(dir, "run"), "--sd-dir", filepath.Join(dir, "targets"), "--report", rp}, extra...)
	out, err := pstrain(t, ctx, args...)
	if err != nil {
		t.Fatalf("pstrain run: %v\n%s", err, out)
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// keepCheckpointsUpTo removes ckdir's checkpoints after step (the final
// one among them) and returns the newest step left.
func keepCheckpointsUpTo(t *testing.T, ckdir string, step int64) int64 {
	t.Helper()
	infos, err := checkpoint.NewStore(checkpoint.OSFS{}, ckdir, 0).List()
	if err != nil {
		t.Fatal(err)
	}
	kept := int64(-1)
	for _, in := range infos {
		if in.Step > step {
			if err := os.RemoveAll(in.Path); err != nil {
				t.Fatal(err)
			}
			continue
		}
		kept = max(kept, in.Step)
	}
	if kept <= 0 {
		t.Fatalf("no checkpoint of a step in (0, %d] among %d", step, len(infos))
	}
	return kept
}
