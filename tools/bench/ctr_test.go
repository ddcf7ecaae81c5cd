package bench

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/pstrain/pstrain/ml/model"
)

func snap(sec float64, steps float64, shards ...ShardReading) Snapshot {
	return Snapshot{At: time.Unix(0, 0).Add(time.Duration(sec * float64(time.Second))), WorkerSteps: steps, WorkerSamples: 128 * steps, Shards: shards}
}

// TestTrainingWindow: the window starts once the workers did the skipped
// fraction of their steps and ends at the last snapshot after which they
// still stepped (after it, only the chief's final evaluation ran).
func TestTrainingWindow(t *testing.T) {
	snaps := []Snapshot{snap(0, 0), snap(1, 10), snap(2, 30), snap(3, 60), snap(4, 100), snap(5, 100), snap(6, 100)}
	from, to, err := TrainingWindow(snaps, 0.2)
	if err != nil {
		t.Fatal(err)
	}
	if from.WorkerSteps != 30 || to.WorkerSteps != 60 {
		t.Errorf("window from %g to %g steps, want 30 to 60", from.WorkerSteps, to.WorkerSteps)
	}
	for _, bad := range [][]Snapshot{nil, {snap(0, 5)}, {snap(0, 0), snap(1, 0), snap(2, 0)}, {snap(0, 0), snap(1, 100), snap(2, 100)}} {
		if _, _, err := TrainingWindow(bad, 0.2); !errors.Is(err, ErrNoWindow) {
			t.Errorf("%d snapshots %v: err %v, want ErrNoWindow", len(bad), bad, err)
		}
	}
}

// TestMeasureWindow: the figures are the window's differences per
// worker step; the rows are the last snapshot's; the unique keys are
// the pushed ones (the chief's evaluations pull too).
func TestMeasureWindow(t *testing.T) {
	from := snap(10, 100, ShardReading{PullKeys: 1000, PushKeys: 900, RowBytes: 5000, DenseBytes: 8000, CPUSeconds: 1},
		ShardReading{PullKeys: 2000, PushKeys: 1900, RowBytes: 6000, DenseBytes: 8000, CPUSeconds: 2})
	to := snap(12, 150, ShardReading{PullKeys: 1600, PushKeys: 1500, RowBytes: 65000, DenseBytes: 58000, CPUSeconds: 1.5},
		ShardReading{PullKeys: 2400, PushKeys: 2300, RowBytes: 46000, DenseBytes: 58000, CPUSeconds: 2.5})
	from.WorkerCPUSeconds, to.WorkerCPUSeconds = 10, 11.5
	last := snap(13, 150, ShardReading{Rows: 70, TableBytes: 700}, ShardReading{Rows: 30, TableBytes: 300})
	var r EmbeddingsRun
	measureWindow(&r, from, to, last, 16)
	want := map[string][2]float64{
		"steps/s":           {r.StepsPerSecond, 25},
		"samples/s":         {r.SamplesPerSecond, 25 * 128},
		"row bytes/step":    {r.RowBytesPerStep, 2000},
		"dense bytes/step":  {r.DenseBytesPerStep, 2000},
		"bytes/step":        {r.BytesPerStep, 4000},
		"unique keys/step":  {r.UniqueKeysPerStep, 20},
		"shard 0 share":     {r.ShardRequestShare[0], 1200.0 / 2000},
		"shard 1 share":     {r.ShardRequestShare[1], 800.0 / 2000},
		"rows":              {float64(r.Rows), 100},
		"parameters":        {float64(r.Parameters), 1600},
		"table bytes":       {float64(r.TableBytes), 1000},
		"measured seconds":  {r.MeasuredSeconds, 2},
		"measured steps":    {r.MeasuredSteps, 50},
		"cpu ms/step":       {r.CPUMsPerStep, 1e3 * 2.5 / 50},
		"max share / mean":  {MaxOverMean(r.ShardRequestShare), 1.2},
		"wire bound":        {WireBound(20, 16, 100), 1.1*20*16*8 + 800},
		"no shares' max":    {MaxOverMean(nil), 0},
		"equal shares' max": {MaxOverMean([]float64{0.25, 0.25, 0.25, 0.25}), 1},
	}
	for name, v := range want {
		if math.Abs(v[0]-v[1]) > 1e-9*math.Max(1, math.Abs(v[1])) {
			t.Errorf("%s = %g, want %g", name, v[0], v[1])
		}
	}
}

// TestScalePrefill: the pre-fill per table that makes every table of a
// spec hold the parameters asked for between them, rounded up.
func TestScalePrefill(t *testing.T) {
	spec := model.Spec{Kind: model.KindCTR, Input: 13, Fields: 26, EmbeddingDim: 16, Hidden: []int{8}, Classes: 1}
	for params, want := range map[int64]int64{100_000_000: 240_385, 416: 1, 417: 2, 0: 0} {
		if got := ScalePrefill(spec, params); got != want {
			t.Errorf("ScalePrefill(%d) = %d, want %d", params, got, want)
		}
	}
}

// TestEmbeddingsScale: the scale comparison is the large (pre-filled)
// run's speed over the small one's, the small one's CPU per step over
// the large one's, and the large run's memory verdicts.
func TestEmbeddingsScale(t *testing.T) {
	small := EmbeddingsRun{Parameters: 1e6, StepsPerSecond: 200, CPUMsPerStep: 5}
	large := EmbeddingsRun{Parameters: 1e8, StepsPerSecond: 170, CPUMsPerStep: 6, PrefillRows: 240385}
	mem := &MemoryResult{Roles: MemoryRoles{Worker: MemoryRole{MeetsGoal: true}, PS: MemoryRole{MeetsGoal: false}}}
	s := embeddingsScale(small, large, mem)
	if s.Ratio != 0.85 || s.MeetsGoal || math.Abs(s.CPURatio-5.0/6) > 1e-12 || s.LargePrefillRows != 240385 ||
		s.LargeParameters != 1e8 || s.SmallParameters != 1e6 || !s.MeetsWorkerMemoryGoal || s.MeetsPSMemoryGoal || s.Memory != mem {
		t.Errorf("scale %+v", s)
	}
	large.StepsPerSecond = 180
	if s := embeddingsScale(small, large, nil); !s.MeetsGoal || s.MeetsWorkerMemoryGoal {
		t.Errorf("ratio 0.9: %+v", s)
	}
}
