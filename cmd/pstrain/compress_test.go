package main

import (
	"context"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
)

// TestCompressedRunsTrainOnFewerBytes runs one epoch of a quarter of
// MNIST uncompressed and with --compress topk:0.01 (sync, TCP data
// plane), int8 (async, gRPC) and topk:0.01/int8 (sync, a codec for each
// direction): the compressed runs train to a modest
// accuracy and their reports say their pushes and pulls carried a
// fraction of the uncompressed run's bytes per step.
func TestCompressedRunsTrainOnFewerBytes(t *testing.T) {
	d := testbin.MNIST(t)
	run := func(t *testing.T, args ...string) *report.Report {
		tmp := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		rp := filepath.Join(tmp, "r.json")
		out, err := pstrain(t, ctx, append([]string{"run", "--data-dir", d, "--data-fraction", "0.25", "--epochs", "1",
			"--target-accuracy", "0", "--run-dir", tmp, "--sd-dir", "", "--report", rp}, args...)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		rep, err := report.Read(rp)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	f32 := run(t)
	if f32.Wire.Compress != "none" || f32.Wire.Steps == 0 {
		t.Fatalf("uncompressed run: wire %+v", f32.Wire)
	}
	// The default model's 636010 float32 parameters, pushed and pulled
	// whole every step (a sync step may push or pull a shard twice, to
	// catch up with the others, and a pull sent ahead counts with the
	// step before).
	const model = 4 * 636010
	if math.Abs(f32.Wire.PushBytesPerStep-model) > 0.01*model || math.Abs(f32.Wire.PullBytesPerStep-model) > 0.02*model {
		t.Errorf("uncompressed run: wire %+v, want %d bytes per step each way", f32.Wire, model)
	}
	for _, c := range []struct {
		args               []string
		pushFrac, pullFrac float64 // of the uncompressed run's bytes, at most
		accuracy           float64 // at least
	}{
		// top-k sends 1% of the values as 8 bytes each (2%); its pulls
		// add the first, whole answer per worker and shard.
		{[]string{"--compress", "topk:0.01"}, 0.05, 0.05, 0.60},
		// int8: 1 byte per value and one per 256 values.
		{[]string{"--compress", "int8", "--mode", "async", "--data-plane", "grpc", "--optimizer", "sgd", "--lr", "0.1"}, 0.27, 0.27, 0.80},
		// A codec for each direction.
		{[]string{"--compress", "topk:0.01/int8"}, 0.05, 0.27, 0.80},
	} {
		t.Run(c.args[1], func(t *testing.T) {
			rep := run(t, c.args...)
			w := rep.Wire
			push, pull := w.PushBytesPerStep/f32.Wire.PushBytesPerStep, w.PullBytesPerStep/f32.Wire.PullBytesPerStep
			t.Logf("%v: accuracy %.4f, push %.0f B/step (%.3f of f32), pull %.0f B/step (%.3f)", c.args, rep.TestAccuracy,
				w.PushBytesPerStep, push, w.PullBytesPerStep, pull)
			if w.Compress != c.args[1] || w.Steps == 0 || push > c.pushFrac || pull > c.pullFrac || push <= 0 || pull <= 0 {
				t.Errorf("wire %+v: push %.3f, pull %.3f of the uncompressed run's, want (0, %v] and (0, %v]", w, push, pull, c.pushFrac, c.pullFrac)
			}
			if rep.TestAccuracy < c.accuracy {
				t.Errorf("test accuracy %.4f, want >= %v", rep.TestAccuracy, c.accuracy)
			}
			if rep.GlobalSteps == 0 || rep.StoppedBy != "epochs" {
				t.Errorf("steps %d, stopped by %s", rep.GlobalSteps, rep.StoppedBy)
			}
		})
	}
}
