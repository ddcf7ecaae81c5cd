package ctr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/pstrain/pstrain/ml/binmetric"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/optim"
)

// TrainConfig is a single-process training run of a CTR model.
type TrainConfig struct {
	Spec   model.Spec
	Batch  int
	Epochs int
	Seed   uint64
	// Dense trains the dense layers (one optimizer per variable, as a PS
	// shard applies it to its slice); Rows trains the tables' rows.
	Dense optim.Config
	Rows  embed.Rule
	// EvalBatch is the evaluation's batch size (0: 4096).
	EvalBatch int
	// Log, if set, is told each epoch's held-out scores.
	Log func(format string, a ...any)
}

// Result is what a training run reached.
type Result struct {
	Steps   int64 `json:"steps"`
	Samples int64 `json:"samples"`
	// Seconds is training's wall time (evaluations excluded).
	Seconds          float64          `json:"seconds"`
	SamplesPerSecond float64          `json:"samples_per_second"`
	Scores           binmetric.Scores `json:"scores"` // held out, after the last epoch
	Rows             int              `json:"rows"`   // rows in all tables at the end
}

// Trainer trains a CTR model in one process: its tables are an
// embed.Local, its dense layers updated in place by optimizers (the
// in-process ceiling a cluster's speed is compared with).
type Trainer struct {
	cfg    TrainConfig
	net    *Net
	eval   *Net
	tables *embed.Local
	opts   []optim.Optimizer
	step   int64
}

// NewTrainer builds the model with its initial weights (the spec's
// seeded initialisation, rows created by embed.InitRow on first touch).
func NewTrainer(cfg TrainConfig) (*Trainer, error) {
	if cfg.EvalBatch <= 0 {
		cfg.EvalBatch = 4096
	}
	if cfg.Epochs < 1 {
		return nil, fmt.Errorf("ctr: epochs must be at least 1, got %d", cfg.Epochs)
	}
	net, err := New(cfg.Spec, cfg.Batch, true)
	if err != nil {
		return nil, err
	}
	eval, err := New(cfg.Spec, cfg.EvalBatch, false)
	if err != nil {
		return nil, err
	}
	var tcs []embed.TableConfig
	for _, t := range cfg.Spec.Tables() {
		tcs = append(tcs, embed.TableConfig{Name: t.Name, Dim: t.Dim, Seed: cfg.Seed, Rule: cfg.Rows})
	}
	tables, err := embed.NewLocal(tcs)
	if err != nil {
		return nil, err
	}
	tr := &Trainer{cfg: cfg, net: net, eval: eval, tables: tables}
	for i, p := range cfg.Spec.Init(cfg.Seed) {
		copy(net.Params()[i], p)
		o, err := optim.New(cfg.Dense, len(p))
		if err != nil {
			return nil, err
		}
		tr.opts = append(tr.opts, o)
	}
	return tr, nil
}

// Tables are the trainer's embedding tables.
func (tr *Trainer) Tables() *embed.Local { return tr.tables }

// Params are the dense layers' current weights.
func (tr *Trainer) Params() [][]float32 { return tr.net.Params() }

// Train runs the configured epochs over train, evaluating on test after
// each, and returns the last evaluation's scores.
func (tr *Trainer) Train(ctx context.Context, train, test ctrdata.Source) (*Result, error) {
	res := &Result{}
	b := ctrdata.NewBatch(train.Schema(), tr.cfg.Batch)
	for epoch := 1; epoch <= tr.cfg.Epochs; epoch++ {
		start := time.Now()
		n, err := tr.epoch(ctx, train, b)
		res.Seconds += time.Since(start).Seconds()
		res.Samples += n
		if err != nil {
			return nil, err
		}
		if res.Scores, err = tr.Evaluate(ctx, test); err != nil {
			return nil, err
		}
		if tr.cfg.Log != nil {
			tr.cfg.Log("epoch %d: step %d, %.0f samples/s, held-out auc %.4f logloss %.4f normalized_entropy %.4f",
				epoch, tr.step, float64(n)/time.Since(start).Seconds(), res.Scores.AUC, res.Scores.LogLoss, res.Scores.NormalizedEntropy)
		}
	}
	res.Steps = tr.step
	res.SamplesPerSecond = float64(res.Samples) / res.Seconds
	for _, s := range tr.tables.Stats() {
		res.Rows += s.Rows
	}
	return res, nil
}

// epoch trains on every sample of train once, in order, in batches (the
// last one may be short); it returns the samples trained on.
func (tr *Trainer) epoch(ctx context.Context, train ctrdata.Source, b *ctrdata.Batch) (int64, error) {
	st, err := train.Open(0, train.Len())
	if err != nil {
		return 0, err
	}
	defer st.Close()
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		err := st.Next(b)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if err := tr.Step(ctx, b); err != nil {
			return n, err
		}
		n += int64(b.N)
	}
}

// Step trains on one batch: the rows' gradients pushed into the tables,
// the dense gradients applied by the optimizers.
func (tr *Trainer) Step(ctx context.Context, b *ctrdata.Batch) error {
	tr.step++
	if _, err := tr.net.Step(ctx, tr.tables, tr.step, b); err != nil {
		return err
	}
	for v, g := range tr.net.Grads() {
		tr.opts[v].Apply(tr.net.Params()[v], g, 1)
	}
	return nil
}

// Evaluate scores the current model on every sample of test, reading
// rows without creating any (an unseen key reads its initial row).
func (tr *Trainer) Evaluate(ctx context.Context, test ctrdata.Source) (binmetric.Scores, error) {
	for v, p := range tr.net.Params() {
		copy(tr.eval.Params()[v], p)
	}
	return Evaluate(ctx, tr.eval, PeekRows{tr.tables}, test)
}

// Evaluate runs net (its dense weights already in Params) over every
// sample of test, pulling rows through rows, and scores its predictions.
func Evaluate(ctx context.Context, net *Net, rows embed.Rows, test ctrdata.Source) (binmetric.Scores, error) {
	probs, labels, err := Predict(ctx, net, rows, test)
	if err != nil {
		return binmetric.Scores{}, err
	}
	return binmetric.Score(probs, labels)
}

// Predict runs net (its dense weights already in Params) over every
// sample of test, pulling rows through rows, and returns its click
// probabilities beside the labels.
func Predict(ctx context.Context, net *Net, rows embed.Rows, test ctrdata.Source) ([]float32, []uint8, error) {
	st, err := test.Open(0, test.Len())
	if err != nil {
		return nil, nil, err
	}
	defer st.Close()
	b := ctrdata.NewBatch(test.Schema(), net.Batch())
	probs, labels := make([]float32, 0, test.Len()), make([]uint8, 0, test.Len())
	buf := make([]float32, net.Batch())
	for {
		err := st.Next(b)
		if errors.Is(err, io.EOF) {
			return probs, labels, nil
		}
		if err != nil {
			return nil, nil, err
		}
		if _, err := net.Step(ctx, rows, 0, b); err != nil {
			return nil, nil, err
		}
		probs = append(probs, net.Probs(buf)...)
		labels = append(labels, b.Labels[:b.N]...)
	}
}

// Peeker reads rows without creating them (embed.Local.Peek).
type Peeker interface {
	Peek(table string, keys []uint64, out []float32) error
}

// PeekRows is the embed.Rows an evaluation reads through: its pulls
// create no rows (Peek) and it refuses pushes.
type PeekRows struct{ P Peeker }

// Pull implements embed.Rows.
func (r PeekRows) Pull(_ context.Context, _ int64, table string, keys []uint64, out []float32) error {
	return r.P.Peek(table, keys, out)
}

// Push implements embed.Rows: an evaluation does not train.
func (r PeekRows) Push(context.Context, int64, string, []uint64, []float32) error {
	return fmt.Errorf("ctr: evaluation rows take no gradients")
}
