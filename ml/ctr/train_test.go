package ctr

import (
	"context"
	"os"
	"testing"

	"github.com/pstrain/pstrain/ml/blas"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/optim"
)

// defaultTrainConfig is the default model (--model ctr) and its
// learning rates.
func defaultTrainConfig(epochs int) TrainConfig {
	return TrainConfig{
		Spec:   model.Spec{Kind: model.KindCTR, Input: 13, Fields: 26, EmbeddingDim: 16, Hidden: []int{128, 64}, Classes: 1},
		Batch:  256,
		Epochs: epochs,
		Seed:   1,
		Dense:  optim.Config{Name: "momentum", LR: 0.05, Momentum: 0.9},
		Rows:   embed.DefaultAdagrad(2),
	}
}

// TestTrainReachesPlantedAUC trains on a small synthetic set and
// reaches the planted model's held-out AUC minus 0.01.
// trainSet trains the default model 2 epochs on the synthetic set in dir.
func trainSet(t *testing.T, dir string) (*ctrdata.Set, TrainConfig, *Result) {
	t.Helper()
	set, err := ctrdata.OpenSynth(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	cfg := defaultTrainConfig(2)
	cfg.Log = t.Logf
	tr, err := NewTrainer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := tr.Train(context.Background(), set.Train, set.Test)
	if err != nil {
		t.Fatal(err)
	}
	return set, cfg, res
}

func TestTrainReachesPlantedAUC(t *testing.T) {
	c := ctrdata.DefaultConfig()
	c.Train, c.Test = 200_000, 20_000
	for f, v := range c.Vocab { // up to 10^5 keys a field: fewer samples suffice
		c.Vocab[f] = min(v, 100_000)
	}
	dir := t.TempDir()
	if _, err := ctrdata.Generate(dir, c); err != nil {
		t.Fatal(err)
	}
	set, _, res := trainSet(t, dir)
	t.Logf("%+v; planted auc %.4f", *res, set.Meta.PlantedAUC)
	if res.Scores.AUC < set.Meta.PlantedAUC-0.01 {
		t.Errorf("held-out AUC %.4f, want at least the planted %.4f - 0.01", res.Scores.AUC, set.Meta.PlantedAUC)
	}
	if res.Samples != 2*int64(c.Train) || res.Steps != 2*((int64(c.Train)+255)/256) {
		t.Errorf("trained %d samples in %d steps", res.Samples, res.Steps)
	}
}

// TestTrainDefaultSet measures the default model on a set written by
// `pstrain data synth-ctr` (the default set: 500,000 training samples),
// named by PSTRAIN_CTR_SET; skipped without it:
//
//	bin/pstrain data synth-ctr --out /tmp/synth-ctr
//	PSTRAIN_CTR_SET=/tmp/synth-ctr go test -run TestTrainDefaultSet -v ./ml/ctr
func TestTrainDefaultSet(t *testing.T) {
	dir := os.Getenv("PSTRAIN_CTR_SET")
	if dir == "" {
		t.Skip("PSTRAIN_CTR_SET names no set")
	}
	if err := blas.Setup(1); err != nil {
		t.Fatal(err)
	}
	set, cfg, res := trainSet(t, dir)
	t.Logf("%s: %d samples in %.1fs (%.0f samples/s), %d rows; held-out auc %.4f (planted %.4f, gap %.4f) logloss %.4f normalized_entropy %.4f",
		cfg.Spec, res.Samples, res.Seconds, res.SamplesPerSecond, res.Rows, res.Scores.AUC, set.Meta.PlantedAUC,
		set.Meta.PlantedAUC-res.Scores.AUC, res.Scores.LogLoss, res.Scores.NormalizedEntropy)
}
