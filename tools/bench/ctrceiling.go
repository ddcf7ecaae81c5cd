package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/pstrain/pstrain/ml/ctr"
	"github.com/pstrain/pstrain/ml/ctrdata"
)

// ctrWarmup is the fraction of the training set the in-process run
// trains before it is timed, as the cluster's window leaves out its
// first steps (TrainingWindow's skip).
const ctrWarmup = 0.2

// CTRCeiling is the samples/s of the plan's model trained in this
// process (ctr.Trainer: its tables an embed.Local, no wire) on the set
// in dataDir, at the cluster's per-worker batch: the batches after the
// first ctrWarmup of the set are timed, up to p.Ceiling or the set's end.
func CTRCeiling(ctx context.Context, p EmbeddingsPlan, dataDir string) (float64, error) {
	set, err := ctrdata.OpenSynth(filepath.Join(dataDir, ctrdata.SynthName))
	if err != nil {
		return 0, err
	}
	defer set.Close()
	tr, err := ctr.NewTrainer(ctr.TrainConfig{Spec: p.Spec, Batch: p.Batch, Epochs: 1, Seed: p.Seed, Dense: p.Dense, Rows: p.Rows})
	if err != nil {
		return 0, err
	}
	st, err := set.Train.Open(0, set.Train.Len())
	if err != nil {
		return 0, err
	}
	defer st.Close()
	b := ctrdata.NewBatch(set.Train.Schema(), p.Batch)
	warm := int(ctrWarmup * float64(set.Train.Len()))
	var seen, timed int
	timing := false
	start := p.Now()
	for ctx.Err() == nil {
		if err := st.Next(b); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return 0, err
		}
		if !timing && seen >= warm {
			timing, start = true, p.Now()
		}
		if err := tr.Step(ctx, b); err != nil {
			return 0, err
		}
		seen += b.N
		if timing {
			timed += b.N
			if p.Now().Sub(start) >= p.Ceiling {
				break
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	secs := p.Now().Sub(start).Seconds()
	if timed == 0 || secs <= 0 {
		return 0, fmt.Errorf("bench: the in-process CTR run timed no batch (%d samples, warm-up %d)", seen, warm)
	}
	return float64(timed) / secs, nil
}
