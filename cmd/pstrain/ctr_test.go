package main

import (
	"cmp"
	"context"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/observe/report"
)

// ctrAUCGap is how far below the planted model's AUC two epochs over
// 20000 synthetic samples may end: measured 0.040 (sync, AUC 0.788 for
// a planted 0.828) and 0.034 (async). The model after a quarter of its
// steps scores 0.64, an untrained one about 0.5: both fail.
const ctrAUCGap = 0.06

// `pstrain run --model ctr` trains the CTR model over 2 PS and 2 worker
// processes, its tables sharded on the PS, on a small synthetic set the
// test writes: it stops by epochs, its AUC comes within ctrAUCGap of the
// planted model's, the final checkpoint holds the rows (emb/C1...), and
// `pstrain eval` of it scores the report's AUC. The same run with ps/1
// killed after its second checkpoint ends with the same model
// (checkRestoredRun).
func TestRunCTRTrainsAndItsCheckpointEvaluates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, data, ckdir := runCTR(t, ctx)
	// 20000 samples, 2 workers x 128 per sync step: 79 steps an epoch.
	if rep.StoppedBy != "epochs" || rep.GlobalSteps != 157 {
		t.Errorf("stopped by %s after %d steps, want epochs after 157", rep.StoppedBy, rep.GlobalSteps)
	}
	checkCTRScores(t, rep)
	ck, err := checkpoint.NewStore(checkpoint.OSFS{}, ckdir, 0).Load(newestCheckpoint(t, ckdir).Path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sh := range ck.Manifest.Shards {
		names = append(names, sh.Tensors...)
	}
	if !slices.Contains(names, "emb/C1") || !slices.Contains(names, "emb/C1/keys") {
		t.Errorf("final checkpoint has no rows of emb/C1: %v", names)
	}
	if auc := evalAUC(t, ctx, ckdir, data); math.Abs(auc-rep.AUC) > 1e-4 {
		t.Errorf("pstrain eval scores the final checkpoint's auc %.4f, the report says %.4f", auc, rep.AUC)
	}
	// ps/1 dies once the second checkpoint (every 10 steps) is
	// committed: about step 25 of 157 however fast the machine is, with
	// a checkpoint to restore it from.
	killed, _, _ := runCTR(t, ctx, "--checkpoint-every", "10", "--fault", "ps/1@checkpoint:2")
	checkRestoredRun(t, killed, 20, rep.AUC)
}

// A CTR run given far more epochs than its small set bears overfits its
// tables, and --patience stops it: stopped by plateau, it hands back the
// model of its best evaluation (the lowest test loss of those before the
// final one), from the checkpoint taken of it, and `pstrain eval` of the
// run's checkpoints scores that model as the report does. The final
// score may differ from the best evaluation's in the fourth digit (a
// CTR evaluation during training reads the live rows: docs/semantics.md).
func TestRunCTRStoppedByPlateauHandsBackTheBest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, data, ckdir := runCTR(t, ctx, "--epochs", "40", "--patience", "2")
	if rep.StoppedBy != "plateau" || len(rep.Evals) < 4 {
		t.Fatalf("stopped by %s after %d steps and %d evaluations, want plateau", rep.StoppedBy, rep.GlobalSteps, len(rep.Evals))
	}
	training, final := rep.Evals[:len(rep.Evals)-1], rep.Evals[len(rep.Evals)-1]
	best := slices.MinFunc(training, func(a, b report.Eval) int { return cmp.Compare(a.TestLoss, b.TestLoss) })
	t.Logf("best evaluation: step %d, loss %.4f, auc %.4f; handed back step %d, auc %.4f, of %d steps trained",
		best.Step, best.TestLoss, best.AUC, rep.FinalStep, rep.AUC, rep.GlobalSteps)
	switch {
	case rep.FinalStep != best.Step || final.Step != best.Step:
		t.Errorf("handed back the model of step %d (final evaluation of step %d), want the best's, %d", rep.FinalStep, final.Step, best.Step)
	case rep.FinalStep >= rep.GlobalSteps:
		t.Errorf("handed back step %d of %d: not an earlier model", rep.FinalStep, rep.GlobalSteps)
	case math.Abs(rep.AUC-best.AUC) > 0.003 || rep.AUC <= training[len(training)-1].AUC-0.0005 && best.AUC > training[len(training)-1].AUC:
		t.Errorf("handed back auc %.4f; the best evaluation scored %.4f, the last %.4f", rep.AUC, best.AUC, training[len(training)-1].AUC)
	}
	if newest := newestCheckpoint(t, ckdir); newest.Step != rep.FinalStep {
		t.Errorf("newest checkpoint is of step %d, want the model handed back, %d", newest.Step, rep.FinalStep)
	}
	if auc := evalAUC(t, ctx, ckdir, data); math.Abs(auc-rep.AUC) > 1e-4 {
		t.Errorf("pstrain eval scores the final checkpoint's auc %.4f, the report says %.4f", auc, rep.AUC)
	}
}

// TestCTRRowsOverEveryPlaneTrainTheSameModel: a worker's rows travel on
// the TCP data plane (plain and under mutual TLS) or over gRPC
// (--data-plane grpc, and under --data-plane-privacy integrity), and
// sync training is the same whichever carries them: the same steps and
// the same AUC.
func TestCTRRowsOverEveryPlaneTrainTheSameModel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tcp, _, _ := runCTR(t, ctx)
	checkCTRScores(t, tcp)
	for _, c := range []struct {
		name  string
		flags []string
	}{
		{"grpc", []string{"--data-plane", "grpc"}},
		{"mutual TLS", []string{"--tls-dir", filepath.Join(t.TempDir(), "tls")}},
		// (whose rows stay on gRPC: the mode would send their keys in the clear)
		{"integrity-only", []string{"--tls-dir", filepath.Join(t.TempDir(), "tls"), "--data-plane-privacy", "integrity"}},
	} {
		rep, _, _ := runCTR(t, ctx, c.flags...)
		if rep.GlobalSteps != tcp.GlobalSteps || math.Abs(rep.AUC-tcp.AUC) > 1e-6 {
			t.Errorf("%s: %d steps, auc %.6f; on the TCP data plane %d steps, auc %.6f", c.name, rep.GlobalSteps, rep.AUC, tcp.GlobalSteps, tcp.AUC)
		}
	}
}

// checkRestoredRun checks the report of the same run with a PS killed
// mid-run: it is restored from the last checkpoint (of a step of at
// least minStep, the last one committed before the kill), its rows with it,
// while the workers ride through (their row calls wait for the shard as
// their dense calls do), and sync training replays to the same model:
// the same AUC as the run without the fault (lost rows would start
// again from their initial values and end elsewhere).
func checkRestoredRun(t *testing.T, rep *report.Report, minStep int64, wantAUC float64) {
	t.Helper()
	if rep.StoppedBy != "epochs" {
		t.Errorf("stopped by %s, want epochs", rep.StoppedBy)
	}
	restored := false
	for _, r := range rep.Restarts {
		switch {
		case r.Task == "ps/1" && r.RestoredStep >= minStep && r.RestoredStep < rep.GlobalSteps:
			restored = true
			t.Logf("ps/1 killed at %.2f s, restored from step %d of %d", r.KilledAtSeconds, r.RestoredStep, rep.GlobalSteps)
		case r.Task != "ps/1":
			t.Errorf("%s restarted (%s): the workers should ride through the PS's restart", r.Task, r.Cause)
		}
	}
	if !restored {
		t.Errorf("ps/1 was not restored from a checkpoint of a step in [%d, %d): %+v", minStep, rep.GlobalSteps, rep.Restarts)
	}
	if math.Abs(rep.AUC-wantAUC) > 1e-4 {
		t.Errorf("auc %.4f after ps/1 was killed and restored, %.4f without: the replay did not train the same model", rep.AUC, wantAUC)
	}
}

// runCTR writes a synthetic set of 20000 training and 5000 test samples
// and runs `pstrain run --model ctr` on it over 2 PS and 2 workers for 2
// epochs without --patience, with extra flags; it returns the report, the data directory
// and the checkpoint directory.
func runCTR(t *testing.T, ctx context.Context, extra ...string) (*report.Report, string, string) {
	t.Helper()
	tmp := t.TempDir()
	data := smallCTRData(t, tmp)
	rp, ckdir := filepath.Join(tmp, "report.json"), filepath.Join(tmp, "ckpt")
	// (--patience 0: these runs stop by epochs, at a step that does not
	// depend on when the chief evaluates.)
	args := append([]string{"run", "--model", "ctr", "--ps", "2", "--workers", "2", "--epochs", "2", "--patience", "0", "--data-dir", data,
		"--checkpoint-dir", ckdir, "--run-dir", filepath.Join(tmp, "run"), "--sd-dir", filepath.Join(tmp, "targets"), "--report", rp}, extra...)
	out, err := pstrain(t, ctx, args...)
	if err != nil {
		t.Fatalf("pstrain run: %v\n%s", err, out)
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	return rep, data, ckdir
}

// checkCTRScores checks a CTR run's report: its AUC within ctrAUCGap of
// the planted model's, and a log loss better than the base rate's.
func checkCTRScores(t *testing.T, rep *report.Report) {
	t.Helper()
	t.Logf("CTR auc %.4f logloss %.4f normalized entropy %.4f, planted auc %.4f, %.1f s training",
		rep.AUC, rep.LogLoss, rep.NormalizedEntropy, rep.PlantedAUC, rep.TrainSeconds)
	if rep.PlantedAUC < 0.7 || rep.AUC < rep.PlantedAUC-ctrAUCGap || rep.AUC > rep.PlantedAUC+0.02 {
		t.Errorf("auc %.4f, planted %.4f: want within %.2f below it", rep.AUC, rep.PlantedAUC, ctrAUCGap)
	}
	if !(rep.NormalizedEntropy > 0 && rep.NormalizedEntropy < 0.9) || rep.LogLoss <= 0 {
		t.Errorf("logloss %.4f normalized entropy %.4f: want a model better than the base rate", rep.LogLoss, rep.NormalizedEntropy)
	}
}

// A CTR run with hot standbys (--ps-replicas 1) loses nothing when a
// primary is killed: ps/1 dies at a step about a quarter into the run,
// with no checkpoint to restore it from (--checkpoint-every 0), and its
// standby takes over with 0 steps lost; the tables travelled with the
// dense shard, so the sync run ends with the model of a run without
// standbys or faults: the same steps and the same AUC.
func TestRunCTRWithStandbysLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	base, _, _ := runCTR(t, ctx, "--checkpoint-every", "0")
	rep, _, _ := runCTR(t, ctx, "--checkpoint-every", "0", "--ps-replicas", "1", "--fault", "ps/1@step:40")
	tookOver := false
	for _, r := range rep.Restarts {
		t.Logf("%s died at %.2f s, %q took over in %.3f s at step %d, %d steps lost", r.Task, r.KilledAtSeconds, r.TookOver, r.FailoverSeconds, r.RestoredStep, r.StepsLost)
		if r.StepsLost != 0 {
			t.Errorf("restart %+v lost %d steps, want 0", r, r.StepsLost)
		}
		if r.Task == "ps/1" && r.TookOver == "standby/1" {
			tookOver = true
		}
	}
	if !tookOver {
		t.Errorf("standby/1 did not take over from ps/1: %+v", rep.Restarts)
	}
	if rep.StoppedBy != "epochs" || rep.GlobalSteps != base.GlobalSteps || math.Abs(rep.AUC-base.AUC) > 1e-6 {
		t.Errorf("with ps/1 failed over: stopped by %s after %d steps, auc %.6f; undisturbed without standbys: %d steps, auc %.6f",
			rep.StoppedBy, rep.GlobalSteps, rep.AUC, base.GlobalSteps, base.AUC)
	}
}

// evalAUC is the test AUC `pstrain eval` gives the newest checkpoint in
// ckdir, scored on data.
func evalAUC(t *testing.T, ctx context.Context, ckdir, data string) float64 {
	t.Helper()
	ev, err := pstrain(t, ctx, "eval", "--checkpoint", ckdir, "--data-dir", data)
	if err != nil {
		t.Fatalf("pstrain eval: %v\n%s", err, ev)
	}
	m := regexp.MustCompile(`test auc ([0-9.]+)`).FindStringSubmatch(ev)
	if m == nil {
		t.Fatalf("no auc in pstrain eval's output:\n%s", ev)
	}
	auc, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("auc %q in pstrain eval's output: %v", m[1], err)
	}
	return auc
}

// smallCTRData writes a synthetic CTR set of 20000 training and 5000
// test samples (the default seed and vocabularies) under dir and returns
// the --data-dir that reads it.
func smallCTRData(t *testing.T, dir string) string {
	t.Helper()
	cfg := ctrdata.DefaultConfig()
	cfg.Train, cfg.Test = 20000, 5000
	data := filepath.Join(dir, "data")
	if _, err := ctrdata.Generate(filepath.Join(data, ctrdata.SynthName), cfg); err != nil {
		t.Fatal(err)
	}
	return data
}
