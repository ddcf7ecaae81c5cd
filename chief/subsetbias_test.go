package chief

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/blas"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
)

// TestSubsetBias measures what a routine evaluation's subset reads
// against the whole test set, on the checkpoints of a real run (the
// newest 20 of PSTRAIN_SUBSET_BIAS_DIR; skipped without it, and in
// -short): for each, the subset's accuracy minus the whole set's, for
// the fixed every-fifth-image subset the chief used to score and for the
// stratified sample it scores (the run's seed, and seeds 1-10). It fails
// if the stratified sample's mean difference, over seeds and models, is
// more than three standard errors from zero. BENCHMARKS.md has the
// figures; run it with (PSTRAIN_SUBSET_BIAS_DATA: the data directory,
// default ../data)
//
//	pstrain run --epochs 4 --target-accuracy 0 --checkpoint-every 45 --keep-checkpoints 0 --checkpoint-dir DIR
//	PSTRAIN_SUBSET_BIAS_DIR=DIR go test ./chief -run SubsetBias -v
func TestSubsetBias(t *testing.T) {
	dir := os.Getenv("PSTRAIN_SUBSET_BIAS_DIR")
	if dir == "" || testing.Short() {
		t.Skip("PSTRAIN_SUBSET_BIAS_DIR names no checkpoint directory")
	}
	infos, err := checkpoint.NewStore(checkpoint.OSFS{}, dir, 0).List()
	if err != nil {
		t.Fatal(err)
	}
	infos = infos[:min(20, len(infos))]
	slices.Reverse(infos)
	if err := blas.Setup(1); err != nil {
		t.Fatal(err)
	}
	const seeds = 10
	var stride, strat, run []float64
	for _, info := range infos {
		ev, r := biasEvaluator(t, info.Path)
		whole, _, _, err := ev.Score(1)
		if err != nil {
			t.Fatal(err)
		}
		var every5 []int
		for i := 0; i < ev.test.N; i += 5 {
			every5 = append(every5, i)
		}
		s5 := biasScore(t, ev, every5)
		stride = append(stride, s5-whole)
		line := fmt.Sprintf("step %5d whole %.4f every-5th %+.4f stratified:", info.Step, whole, s5-whole)
		for seed := int64(1); seed <= seeds; seed++ {
			d := biasScore(t, ev, dataset.NewSample(ev.test.Labels, ev.test.Classes, seed).Take(DefaultEvalSubset)) - whole
			strat = append(strat, d)
			if seed == r.Seed {
				run = append(run, d)
			}
			line += fmt.Sprintf(" %+.4f", d)
		}
		t.Log(line)
		ev.Close()
	}
	for _, c := range []struct {
		name string
		d    []float64
	}{{"every 5th image (before)", stride}, {"stratified, the run's seed", run}, {fmt.Sprintf("stratified, seeds 1-%d", seeds), strat}} {
		m, sd := meanSD(c.d)
		t.Logf("%-28s subset minus whole set over %d evaluations: mean %+.4f, sd %.4f, min %+.4f, max %+.4f",
			c.name, len(c.d), m, sd, slices.Min(c.d), slices.Max(c.d))
	}
	// Each seed's sample is fixed for all models, so the seeds, not the
	// models, are the independent draws.
	perSeed := make([]float64, seeds)
	for i, d := range strat {
		perSeed[i%seeds] += d / float64(len(infos))
	}
	if m, sd := meanSD(perSeed); math.Abs(m) > 3*sd/math.Sqrt(seeds) {
		t.Errorf("stratified samples read %+.4f from the whole set on average over %d seeds (sd %.4f): biased", m, seeds, sd)
	}
}

// biasEvaluator is an evaluator holding the model of the checkpoint at
// path, over its run's test set, with the run's seed.
func biasEvaluator(t *testing.T, path string) (*Evaluator, config.Run) {
	t.Helper()
	ck, err := checkpoint.NewStore(checkpoint.OSFS{}, "", 0).Load(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := config.Parse(ck.Manifest.RunConfig)
	if err != nil {
		t.Fatal(err)
	}
	var spec model.Spec
	if err := json.Unmarshal(ck.Manifest.ModelSpec, &spec); err != nil {
		t.Fatal(err)
	}
	data := os.Getenv("PSTRAIN_SUBSET_BIAS_DATA")
	if data == "" {
		data = "../data" // the repository's, from the package directory
	}
	test, _, err := dataset.LoadEval(data, r.Dataset)
	if err != nil {
		t.Fatal(err)
	}
	st, err := shardckpt.Read(ck, spec, r.Optimizer)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := NewEvaluator(spec, test, 1000, r.Seed)
	if err != nil {
		t.Fatal(err)
	}
	for v, dst := range ev.Params() {
		copy(dst, st.Vars[v])
	}
	return ev, r
}

func biasScore(t *testing.T, ev *Evaluator, idx []int) float64 {
	t.Helper()
	acc, _, _, err := ev.score(idx)
	if err != nil {
		t.Fatal(err)
	}
	return acc
}

func meanSD(x []float64) (mean, sd float64) {
	for _, v := range x {
		mean += v
	}
	mean /= float64(len(x))
	for _, v := range x {
		sd += (v - mean) * (v - mean)
	}
	return mean, math.Sqrt(sd / float64(max(1, len(x)-1)))
}
