package main

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
)

// `pstrain run --model cnn` trains the CNN across 2 PS and 2 worker
// processes: on 15% of MNIST for two epochs (71 sync steps) it passes 90%
// (about 93-95% measured; the MLP's e2e test asks the same of a quarter
// of the data), its final checkpoint names the kernels by output-channel
// range, `checkpoint inspect` shows a CNN, and `pstrain eval` of that
// checkpoint scores what the run reported.
func TestRunCNNTrainsAndItsCheckpointEvaluates(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rp, ckdir := filepath.Join(tmp, "report.json"), filepath.Join(tmp, "ckpt")
	out, err := pstrain(t, ctx, "run", "--model", "cnn", "--batch", "128", "--lr", "0.05", "--warmup-steps", "20", "--data-dir", d,
		"--data-fraction", "0.15", "--epochs", "2", "--target-accuracy", "0", "--eval-every", "0", "--checkpoint-dir", ckdir,
		"--run-dir", filepath.Join(tmp, "run"), "--sd-dir", filepath.Join(tmp, "targets"), "--report", rp)
	if err != nil {
		t.Fatalf("pstrain run: %v\n%s", err, out)
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Model != "cnn 28x28x1-c16-c32-256-10" || !slices.Equal(rep.Hidden, []int{256}) {
		t.Errorf("report model %q hidden %v, want the default CNN", rep.Model, rep.Hidden)
	}
	// 9000 samples, 2 workers x 128 per sync step: ceil(9000/256) = 36 per epoch.
	if rep.GlobalSteps != 71 || rep.StoppedBy != "epochs" {
		t.Errorf("global steps %d (%s), want 71 (epochs)", rep.GlobalSteps, rep.StoppedBy)
	}
	t.Logf("CNN test accuracy %.4f after %d steps, %.1f s training", rep.TestAccuracy, rep.GlobalSteps, rep.TrainSeconds)
	if rep.TestAccuracy < 0.90 {
		t.Errorf("test accuracy %.4f after two epochs of 15%% of MNIST, want >= 0.90", rep.TestAccuracy)
	}

	info := newestCheckpoint(t, ckdir)
	ck, err := checkpoint.NewStore(checkpoint.OSFS{}, ckdir, 0).Load(info.Path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sh := range ck.Manifest.Shards {
		names = append(names, sh.Tensors...)
	}
	for _, want := range []string{"conv0/w[0:16]", "conv1/w[0:32]", "conv0/w[0:16]/momentum"} {
		if !slices.Contains(names, want) {
			t.Errorf("final checkpoint has no tensor %q: %v", want, names)
		}
	}
	inspect, err := pstrain(t, ctx, "checkpoint", "inspect", ckdir)
	if err != nil || !strings.Contains(inspect, `"kind":"cnn"`) || !strings.Contains(inspect, "--model=cnn --conv=16,32 --hidden=256") ||
		!strings.Contains(inspect, "conv1/w[0:32]") {
		t.Errorf("checkpoint inspect: %v\n%s", err, inspect)
	}
	acc, _ := evalCheckpoint(t, ctx, ckdir, d)
	if math.Abs(acc-rep.TestAccuracy) > 1e-4 {
		t.Errorf("pstrain eval scores the final checkpoint %.4f, the report says %.4f", acc, rep.TestAccuracy)
	}
}
