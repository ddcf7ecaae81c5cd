package chief

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"

	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/partition"
)

// Evaluator computes test accuracy and mean cross-entropy of a set of
// weights on a data set, in fixed-size batches (the last one padded and
// masked), on the whole set or on a stratified sample of it.
type Evaluator struct {
	net    *nn.Net
	test   *dataset.Dataset
	sample dataset.Sample
	ctr    *ctrEval // a CTR model's instead (eval_ctr.go)
}

// NewEvaluator builds a forward-only net for spec. seed fixes the samples
// Score and ScoreAt draw (the run's --seed).
func NewEvaluator(spec model.Spec, test *dataset.Dataset, batch int, seed int64) (*Evaluator, error) {
	if test.N == 0 {
		return nil, fmt.Errorf("eval: empty test set")
	}
	n, err := nn.New(spec, min(batch, test.N), false)
	if err != nil {
		return nil, err
	}
	return &Evaluator{net: n, test: test, sample: dataset.NewSample(test.Labels, test.Classes, seed)}, nil
}

// Params are the buffers to write the weights into before Eval.
func (e *Evaluator) Params() [][]float32 {
	if e.ctr != nil {
		return e.ctr.net.Params()
	}
	return e.net.Params()
}

// Eval returns accuracy in [0,1] and mean loss over the whole test set.
func (e *Evaluator) Eval() (acc, loss float64, err error) {
	acc, loss, _, err = e.Score(1)
	return acc, loss, err
}

// Score is Eval over fraction of the test set: the whole set at 1 or
// more, else a sample stratified by class (dataset.Sample: the same for
// the same fraction, a smaller fraction's part of a larger one's, its
// accuracy an unbiased estimate of the whole set's). It also returns how
// many samples it scored.
func (e *Evaluator) Score(fraction float64) (acc, loss float64, n int, err error) {
	return e.ScoreAt(fraction, 0)
}

// ScoreAt is Score on the k-th sample of fraction of the test set
// (dataset.Sample.TakeAt: successive k score different images, each
// sample stratified as Score's, which is k = 0's).
func (e *Evaluator) ScoreAt(fraction float64, k int) (acc, loss float64, n int, err error) {
	if e.ctr != nil {
		return e.ctr.score(false)
	}
	var idx []int
	if fraction < 1 {
		idx = e.sample.TakeAt(fraction, k)
	} else {
		idx = make([]int, e.test.N)
		for i := range idx {
			idx[i] = i
		}
	}
	if len(idx) == 0 {
		return 0, 0, 0, fmt.Errorf("eval: a %.3g sample of %d test samples is empty", fraction, e.test.N)
	}
	return e.score(idx)
}

// Complete turns a score over the sample Score(fraction) drew (acc and
// loss over n samples) into the whole set's by scoring the rest of the
// set alone; it returns the whole set's accuracy, loss and size, and the
// samples it scored.
func (e *Evaluator) Complete(fraction, acc, loss float64, n int) (wholeAcc, wholeLoss float64, total, scored int, err error) {
	return e.CompleteAt(fraction, 0, acc, loss, n)
}

// CompleteAt is Complete for the sample ScoreAt(fraction, k) drew.
func (e *Evaluator) CompleteAt(fraction float64, k int, acc, loss float64, n int) (wholeAcc, wholeLoss float64, total, scored int, err error) {
	if e.ctr != nil {
		return acc, loss, n, 0, nil // Score scored the whole set
	}
	if fraction <= 0 || fraction >= 1 {
		wholeAcc, wholeLoss, total, err = e.Score(1)
		return wholeAcc, wholeLoss, total, total, err
	}
	rest := e.sample.RestAt(fraction, k)
	if len(rest) == 0 {
		return acc, loss, n, 0, nil
	}
	restAcc, restLoss, m, err := e.score(rest)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	total = n + m
	wholeAcc = (acc*float64(n) + restAcc*float64(m)) / float64(total)
	wholeLoss = (loss*float64(n) + restLoss*float64(m)) / float64(total)
	return wholeAcc, wholeLoss, total, m, nil
}

// score scores the test samples idx.
func (e *Evaluator) score(idx []int) (acc, loss float64, n int, err error) {
	b, dim := e.net.Batch(), e.test.Dim
	correct := 0
	sumLoss := 0.0
	labels := make([]uint8, 0, b)
	for start := 0; start < len(idx); start += b {
		x := e.net.Input()
		labels = labels[:0]
		for k, i := range idx[start:min(start+b, len(idx))] {
			e.test.Sample(i, x[k*dim:(k+1)*dim])
			labels = append(labels, e.test.Labels[i])
		}
		clear(x[len(labels)*dim:])
		if _, err := e.net.Step(); err != nil {
			return 0, 0, 0, err
		}
		c, l := e.tally(labels)
		correct += c
		sumLoss += l
	}
	return float64(correct) / float64(len(idx)), sumLoss / float64(len(idx)), len(idx), nil
}

// tally counts the correct predictions of the net's last batch and sums
// their cross-entropy, for the len(labels) samples it held.
func (e *Evaluator) tally(labels []uint8) (correct int, sumLoss float64) {
	classes := e.net.Spec().Classes
	logits := e.net.Logits()
	for i, label := range labels {
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
		sumLoss += math.Log(lse) + float64(mx) - float64(row[label])
		if best == int(label) {
			correct++
		}
	}
	return correct, sumLoss
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
	var loss float64
	var err error
	if ev := cfg.Evaluator; ev.ctr != nil {
		_, loss, _, err = ev.ctr.score(true)
	} else {
		_, loss, _, err = ev.Score(cfg.EvalSubset)
	}
	if err != nil || !finite(loss) || loss <= 0 {
		return uniform
	}
	return loss
}

// Close releases the net.
func (e *Evaluator) Close() error {
	if e.net == nil {
		return nil
	}
	return e.net.Close()
}

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

// alignWait bounds how long a sync evaluation waits for a shard one
// step behind the others to reach their version.
const alignWait = time.Second

// pullForEval pulls every shard's parameters into params (each shard
// retains the version it sends if retain says so) and returns their
// versions, and those of the first pulls (the ones that closed the
// shards' attribution windows). In a sync run a shard that answered a
// version behind another's (a step completed between the pulls) is
// pulled again at the newest, until every shard answered one version or
// alignWait passed, so that the model scored, and retained, is one
// version of every shard; one that does not get there in time (a
// stalled shard) keeps its last answer.
func (c *Chief) pullForEval(ctx context.Context, retain bool, params [][]float32) (versions, first []int64, err error) {
	prim := c.primaries()
	versions = make([]int64, len(prim))
	for s := range prim {
		v, err := c.pullShardForEval(ctx, s, &pb.PullRequest{Worker: -1, RunId: c.cfg.RunID, Retain: retain}, 30*time.Second, params)
		if err != nil {
			return nil, nil, err
		}
		versions[s] = v
	}
	first = slices.Clone(versions)
	if c.cfg.Run.Mode != config.Sync {
		return versions, first, nil
	}
	actx, cancel := context.WithTimeout(ctx, alignWait)
	defer cancel()
	for actx.Err() == nil && slices.Min(versions) != slices.Max(versions) {
		hi := slices.Max(versions)
		for s, v := range versions {
			if v >= hi {
				continue
			}
			req := &pb.PullRequest{Worker: -1, RunId: c.cfg.RunID, Retain: retain, MinVersion: hi}
			if v, err := c.pullShardForEval(actx, s, req, alignWait, params); err == nil {
				versions[s] = v
			}
		}
	}
	return versions, first, nil
}

// pullShardForEval makes one evaluation pull of shard s, within timeout,
// and scatters its parameters into params; it returns their version.
func (c *Chief) pullShardForEval(ctx context.Context, s int, req *pb.PullRequest, timeout time.Duration, params [][]float32) (int64, error) {
	p := c.primary(s)
	pctx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := p.Client.Pull(pctx, req)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("chief: pull from ps/%d at %s: %w", s, p.Addr, err)
	}
	flat, err := wire.Floats(resp.Params)
	if err == nil && len(flat) != c.plan.Shards[s].Size {
		err = fmt.Errorf("chief: ps/%d sent %d parameters, want %d", s, len(flat), c.plan.Shards[s].Size)
	}
	if err != nil {
		return 0, err
	}
	c.plan.Scatter(s, flat, params)
	return resp.Version, nil
}

// evaluate carries out an Evaluate: it pulls every shard's parameters
// (each shard retains the version it sends if a.Retain says so), then
// scores them, first on the test subset when a.ConfirmAbove asks for
// it: the a.Seq-th sample of that fraction, so successive evaluations
// score different images (docs/semantics.md, "Evaluation, and what it
// costs").
func (c *Chief) evaluate(ctx context.Context, a Evaluate) EvalResult {
	t0 := c.cfg.Now()
	res := EvalResult{Seq: a.Seq, Generation: a.Generation, Step: math.MaxInt64}
	params := c.cfg.Evaluator.Params()
	versions, first, err := c.pullForEval(ctx, a.Retain, params)
	if err != nil {
		res.Err = err
		return res
	}
	res.Step = slices.Min(versions)
	res.Mixed = c.cfg.Run.Mode == config.Sync && res.Step != slices.Max(versions)
	res.Window = c.windows(ctx, first)
	res.At = c.cfg.Now()
	ev := c.cfg.Evaluator
	if a.ConfirmAbove > 0 && a.Subset > 0 && a.Subset < 1 && ev.ctr == nil { // (a CTR evaluation scores the whole set)
		k := int(a.Seq % math.MaxInt32)
		res.Accuracy, res.Loss, res.Samples, res.Err = ev.ScoreAt(a.Subset, k)
		res.Scored = res.Samples
		if res.Err != nil || res.Accuracy < a.ConfirmAbove {
			res.Duration = c.cfg.Now().Sub(t0)
			return res
		}
		// The whole set: the subset's score and the rest's.
		var rest int
		res.Accuracy, res.Loss, res.Samples, rest, res.Err = ev.CompleteAt(a.Subset, k, res.Accuracy, res.Loss, res.Samples)
		res.Scored += rest
	} else {
		res.Accuracy, res.Loss, res.Samples, res.Err = ev.Score(1)
		res.Scored = res.Samples
	}
	res.Full = true
	res.Binary = ev.Binary()
	res.Duration = c.cfg.Now().Sub(t0)
	return res
}
