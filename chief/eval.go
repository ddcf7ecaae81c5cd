package chief

import (
	"context"
	"fmt"
	"math"
	"time"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"

	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/partition"
)

// Evaluator computes test accuracy and mean cross-entropy of a set of
// weights on a data set, in fixed-size batches (the last one padded and
// masked).
type Evaluator struct {
	net  *nn.Net
	test *dataset.Dataset
}

// NewEvaluator builds a forward-only net for spec.
func NewEvaluator(spec model.Spec, test *dataset.Dataset, batch int) (*Evaluator, error) {
	if test.N == 0 {
		return nil, fmt.Errorf("eval: empty test set")
	}
	n, err := nn.New(spec, min(batch, test.N), false)
	if err != nil {
		return nil, err
	}
	return &Evaluator{net: n, test: test}, nil
}

// Params are the buffers to write the weights into before Eval.
func (e *Evaluator) Params() [][]float32 { return e.net.Params() }

// Eval returns accuracy in [0,1] and mean loss over the whole test set.
func (e *Evaluator) Eval() (acc, loss float64, err error) {
	acc, loss, _, err = e.Score(1)
	return acc, loss, err
}

// Score is Eval over every stride-th test sample (samples 0, stride,
// 2*stride, ...: a fixed subset that mixes the whole set's writers and
// classes); it also returns how many samples it scored.
func (e *Evaluator) Score(stride int) (acc, loss float64, n int, err error) {
	stride = max(1, stride)
	b, dim, classes := e.net.Batch(), e.test.Dim, e.net.Spec().Classes
	correct, total := 0, 0
	sumLoss := 0.0
	labels := make([]uint8, 0, b)
	for next := 0; next < e.test.N; {
		x := e.net.Input()
		labels = labels[:0]
		for ; next < e.test.N && len(labels) < b; next += stride {
			k := len(labels)
			e.test.Sample(next, x[k*dim:(k+1)*dim])
			labels = append(labels, e.test.Labels[next])
		}
		n := len(labels)
		clear(x[n*dim:])
		if _, err := e.net.Step(); err != nil {
			return 0, 0, 0, err
		}
		logits := e.net.Logits()
		for i := 0; i < n; i++ {
			row := logits[i*classes : (i+1)*classes]
			best, mx := 0, row[0]
			for k, v := range row {
				if v > mx {
					best, mx = k, v
				}
			}
			lse := 0.0
			for _, v := range row {
				lse += math.Exp(float64(v - mx))
			}
			label := int(labels[i])
			sumLoss += math.Log(lse) + float64(mx) - float64(row[label])
			if best == label {
				correct++
			}
			total++
		}
	}
	return float64(correct) / float64(total), sumLoss / float64(total), total, nil
}

// initialLoss is the test loss of the model training starts from: the
// seed's initial weights scored on the routine evaluation's subset (the
// baseline divergence is judged against from the first evaluation, and
// a final model is judged ruined against). Without an evaluator, or if
// scoring fails, the loss of a uniform guess, ln(classes).
func initialLoss(cfg Config, plan partition.Plan) float64 {
	uniform := math.Log(float64(max(2, cfg.Spec.Classes)))
	if cfg.Evaluator == nil {
		return uniform
	}
	init := cfg.Spec.Init(uint64(cfg.Run.Seed))
	params := cfg.Evaluator.Params()
	for s := range plan.Shards {
		flat := make([]float32, plan.Shards[s].Size)
		plan.Gather(s, init, flat)
		plan.Scatter(s, flat, params)
	}
	_, loss, _, err := cfg.Evaluator.Score(int(math.Round(1 / cfg.EvalSubset)))
	if err != nil || !finite(loss) || loss <= 0 {
		return uniform
	}
	return loss
}

// Close releases the net.
func (e *Evaluator) Close() error { return e.net.Close() }

// windows asks every shard for the attribution window its evaluation
// pull (of versions[s]) closed and adds them up (nil: a shard did not
// answer, or its last window is not the one that pull closed: it was
// re-initialised since).
func (c *Chief) windows(ctx context.Context, versions []int64) *Window {
	var w *Window
	for s, p := range c.primaries() {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := p.Client.Status(sctx, &pb.StatusRequest{})
		cancel()
		if err != nil || s >= len(versions) || st.WindowTo != versions[s] {
			c.cfg.Log.Debug("no attribution window for this evaluation", "ps", s, "err", err, "window_to", st.GetWindowTo(), "pulled", versions)
			return nil
		}
		w = addWindow(w, st)
	}
	return w
}

// addWindow adds a shard's attribution figures to w's, the sum over the
// shards before it (nil for the first). The shards' windows may begin a
// step or two apart (each closes at its own pull); over a window of
// many steps that does not matter.
func addWindow(w *Window, st *pb.StatusResponse) *Window {
	if w == nil {
		w = &Window{From: st.WindowFrom}
	}
	w.From = min(w.From, st.WindowFrom)
	for len(w.Dot) < len(st.WindowDot) {
		w.Dot, w.Sq = append(w.Dot, 0), append(w.Sq, 0)
	}
	for i, d := range st.WindowDot {
		w.Dot[i] += d
		if i < len(st.WindowSq) {
			w.Sq[i] += st.WindowSq[i]
		}
	}
	w.UpdateSq += st.WindowUpdateSq
	return w
}

// evaluate carries out an Evaluate: it pulls every shard's parameters
// (each shard retains the version it sends), then scores them, first on
// the test subset when a.ConfirmAbove asks for it.
func (c *Chief) evaluate(ctx context.Context, a Evaluate) EvalResult {
	t0 := c.cfg.Now()
	res := EvalResult{Seq: a.Seq, Generation: a.Generation, Step: math.MaxInt64}
	params := c.cfg.Evaluator.Params()
	var versions []int64
	for s, p := range c.primaries() {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := p.Client.Pull(pctx, &pb.PullRequest{Worker: -1, RunId: c.cfg.RunID, Retain: true})
		cancel()
		if err != nil {
			res.Err = fmt.Errorf("chief: pull from ps/%d at %s: %w", s, p.Addr, err)
			return res
		}
		flat, err := wire.Floats(resp.Params)
		if err == nil && len(flat) != c.plan.Shards[s].Size {
			err = fmt.Errorf("chief: ps/%d sent %d parameters, want %d", s, len(flat), c.plan.Shards[s].Size)
		}
		if err != nil {
			res.Err = err
			return res
		}
		c.plan.Scatter(s, flat, params)
		res.Step = min(res.Step, resp.Version)
		versions = append(versions, resp.Version)
	}
	res.Window = c.windows(ctx, versions)
	res.At = c.cfg.Now()
	ev := c.cfg.Evaluator
	if a.ConfirmAbove > 0 && a.Subset > 0 && a.Subset < 1 {
		res.Accuracy, res.Loss, res.Samples, res.Err = ev.Score(int(math.Round(1 / a.Subset)))
		if res.Err != nil || res.Accuracy < a.ConfirmAbove {
			res.Duration = c.cfg.Now().Sub(t0)
			return res
		}
	}
	res.Accuracy, res.Loss, res.Samples, res.Err = ev.Score(1)
	res.Full = true
	res.Duration = c.cfg.Now().Sub(t0)
	return res
}
