package chief

import (
	"fmt"
	"math"
	"time"

	"github.com/pstrain/pstrain/observe/report"
)

// The divergence rule (docs/security.md, "The divergence guard").
const (
	// DivergeFactor and DivergeMargin: an evaluation diverged when its
	// test loss is not finite, or above max(DivergeFactor x best,
	// best + DivergeMargin), best being the lowest test loss of the run's
	// earlier evaluations.
	DivergeFactor = 4
	DivergeMargin = 1.0
	// MaxRollbacks is how many times the chief rolls a diverged model
	// back before it gives up and fails the run.
	MaxRollbacks = 5
)

// Diverged applies the divergence rule to a test loss, best being the
// lowest test loss so far (ok false: none yet, and only a non-finite
// loss is a divergence).
func Diverged(loss, best float64, ok bool) bool {
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return true
	}
	return ok && loss > max(DivergeFactor*best, best+DivergeMargin)
}

// bestLoss is the loss an evaluation of the current generation is
// judged against: the lowest test loss of the model's own history. That
// is the initial model's (when known), the evaluations of this
// generation, and those of the restored model's past: the steps up to
// the one this generation began at. Evaluations of the steps a recovery
// or a rollback threw away are another model's, never the yardstick of
// the restored one.
func (c *Core) bestLoss() (float64, bool) {
	best, ok := math.Inf(1), false
	if l := c.p.InitialLoss; l > 0 && finite(l) {
		best, ok = l, true
	}
	for i, e := range c.st.Evals {
		if c.ownHistory(i, e) && e.TestLoss < best {
			best, ok = e.TestLoss, true
		}
	}
	return best, ok
}

// ownHistory says whether e, the i-th evaluation recorded, is of the
// current model's history: of this generation, or of a step it grew
// from (not one a recovery or a rollback threw away).
func (c *Core) ownHistory(i int, e report.Eval) bool {
	return i >= c.genEvals || e.Step <= c.genStart
}

// lossAt is the test loss known of the model at step, of the current
// generation's past (NaN: none): the initial model's at step 0.
func (c *Core) lossAt(step int64) float64 {
	for i := len(c.st.Evals) - 1; i >= 0; i-- {
		if e := c.st.Evals[i]; e.Step == step {
			return e.TestLoss
		}
	}
	if step == 0 && c.p.InitialLoss > 0 {
		return c.p.InitialLoss
	}
	return math.NaN()
}

// lrFactor is the learning rate's factor (1 until a rollback halves it).
func (c *Core) lrFactor() float64 {
	if c.st.LRFactor == 0 {
		return 1
	}
	return c.st.LRFactor
}

// LRFactor is the factor the shards scale the learning rate by (1 until
// a rollback after a divergence halves it); Init sends it.
func (c *Core) LRFactor() float64 { return c.lrFactor() }

// beginGeneration records that the shards' state was replaced at step:
// the divergence bookkeeping of the generation starts afresh.
func (c *Core) beginGeneration(step int64, rollback bool) {
	c.genStart, c.genFromRollback, c.lastGood = step, rollback, -1
	c.genEvals, c.winLoss = len(c.st.Evals), c.lossAt(step)
	c.st.GenStart, c.st.GenEvals = c.genStart, c.genEvals
	c.forgetBestPast(step)
	for s := range c.outliers {
		c.outliers[s] = -1
	}
	c.refusedGrads.markGeneration()
	c.nonFiniteGrads.markGeneration()
}

// noteGuard records a poll's refusal counts and first outlier (shard s's,
// since its last Init).
func (c *Core) noteGuard(s int, x ShardStatus) {
	c.refusedGrads.note(s, x.Refused)
	c.nonFiniteGrads.note(s, x.NonFinite)
	if x.Outlier >= 0 && c.outliers[s] < 0 {
		c.outliers[s] = x.Outlier
	}
}

// shardCounts are per-worker counters that every shard keeps since its
// last Init, accumulated by the chief through the shards'
// re-initialisations: by shard, by worker, the count at the last poll,
// the total, and the total when the generation began.
type shardCounts struct {
	seen, total, atGen [][]int64
}

func newShardCounts(shards, workers int) shardCounts {
	var c shardCounts
	for range shards {
		c.seen = append(c.seen, make([]int64, workers))
		c.total = append(c.total, make([]int64, workers))
		c.atGen = append(c.atGen, make([]int64, workers))
	}
	return c
}

// note records shard s's counts; one lower than the last seen means the
// shard was re-initialised and counts afresh.
func (c shardCounts) note(s int, counts []int64) {
	seen, total := c.seen[s], c.total[s]
	for w := range min(len(counts), len(seen)) {
		n := counts[w]
		if n < seen[w] {
			seen[w] = 0
		}
		total[w] += n - seen[w]
		seen[w] = n
	}
}

func (c shardCounts) markGeneration() {
	for s := range c.total {
		copy(c.atGen[s], c.total[s])
	}
}

// byWorker is each worker's count, the most any shard counted (each
// judges its own slice of the same gradient), since the run began (gen
// false) or this generation did.
func (c shardCounts) byWorker(workers int, gen bool) []int64 {
	out := make([]int64, workers)
	for s, total := range c.total {
		for w, n := range total {
			if gen {
				n -= c.atGen[s][w]
			}
			out[w] = max(out[w], n)
		}
	}
	return out
}

// refused is each worker's gradients refused by the norm guard (see
// shardCounts.byWorker).
func (c *Core) refused(gen bool) []int64 { return c.refusedGrads.byWorker(c.p.Run.Workers, gen) }

// suspect names the worker whose gradients stood out in this
// generation: the one that pushed the first out-of-line gradient a shard
// saw (the cause: once a model diverged, every worker's gradients are
// out of line, and non-finite ones, never applied, are symptoms), else
// the one with the most gradients refused by the norm guard, else none
// ("": the model diverged with no gradient out of line, e.g. from too
// high a learning rate).
func (c *Core) suspect() (worker, evidence string) {
	refused := c.refused(true)
	for s, w := range c.outliers {
		if w >= 0 && w < len(refused) {
			return fmt.Sprintf("worker/%d", w), fmt.Sprintf("it pushed the first out-of-line gradient ps/%d saw; %d of its gradients refused by the norm guard", s, refused[w])
		}
	}
	best, most := -1, int64(0)
	for w, n := range refused {
		if n > most {
			best, most = w, n
		}
	}
	if best >= 0 {
		return fmt.Sprintf("worker/%d", best), fmt.Sprintf("%d of its gradients refused by the norm guard", most)
	}
	return "", ""
}

// rollbackBound is the newest step a rollback may go back to: this
// generation's last good evaluation, or without one since the generation
// began, its start (a generation begun by a rollback goes further back
// than that rollback's checkpoint: it may hold what diverged, e.g. in the
// optimizer's momentum). Checkpoint actions carry it, so that retention
// never deletes the one checkpoint a rollback could use.
func (c *Core) rollbackBound() int64 {
	if c.lastGood >= 0 {
		return c.lastGood
	}
	if c.genFromRollback {
		return c.genStart - 1
	}
	return c.genStart
}

// checkDivergence applies the divergence rule to an evaluation of the
// current generation, before it is recorded. A divergence during
// training decides a rollback (returning the action once it may be
// sent) or, past MaxRollbacks, ends the run; one found by the final
// evaluation is only reported. It returns those actions (the caller
// saves the state first) and whether the evaluation diverged.
func (c *Core) checkDivergence(now time.Time, res EvalResult) ([]Action, bool) {
	best, ok := c.bestLoss()
	diverged := Diverged(res.Loss, best, ok)
	culprit := c.attribute(res, diverged)
	if !diverged {
		if c.phase == training {
			c.lastGood = res.Step
		}
		return nil, false
	}
	d := report.Divergence{AtStep: res.Step, Seconds: c.seconds(res.At), TestLoss: jsonLoss(res.Loss), BestLoss: best,
		RolledBackTo: -1, LRFactor: c.lrFactor()}
	if !ok {
		d.BestLoss = 0
	}
	d.SuspectWorker, d.Evidence = c.suspect()
	if culprit {
		q := c.st.Suspects[len(c.st.Suspects)-1]
		d.SuspectWorker, d.Evidence = q.Worker, "quarantined: "+q.Reason
	}
	c.m.Divergences.Inc()
	if c.phase != training || c.restoring != nil || c.rollback != nil {
		c.st.Divergences = append(c.st.Divergences, d)
		c.log.Error("the model diverged, but training has ended or a recovery is under way: not rolled back",
			"step", res.Step, "test_loss", res.Loss, "best_loss", best, "suspect", d.SuspectWorker, "evidence", d.Evidence)
		return nil, true
	}
	if len(c.st.Divergences) >= MaxRollbacks {
		// The run fails, but it still hands back the best model there
		// was (core_handback.go): stop it, as any run ends.
		c.st.Divergences = append(c.st.Divergences, d)
		c.st.GaveUp = fmt.Sprintf("the model diverged %d times (test loss %.4g at step %d, best %.4g); each rollback halved the learning rate: giving up",
			len(c.st.Divergences), res.Loss, res.Step, best)
		c.log.Error(c.st.GaveUp+"; stopping the run", "suspect", d.SuspectWorker, "evidence", d.Evidence)
		return c.beginStop(now, StopFailed), true
	}
	// Roll back to the newest checkpoint of a model known good: at or
	// before this generation's last good evaluation. Without one since
	// the generation began, a generation begun by a rollback goes further
	// back than that rollback's checkpoint (it may hold what diverged,
	// e.g. in the optimizer's momentum).
	atMost := c.rollbackBound()
	if !culprit {
		// No worker to blame: the learning rate, probably. With the
		// culprit quarantined the rate stays.
		d.LRFactor = c.lrFactor() / 2
	}
	c.st.LRFactor = d.LRFactor
	c.st.Divergences = append(c.st.Divergences, d)
	c.st.Generation++
	c.hold = 0
	c.initEpochs(allShards(len(c.versions)))
	c.rollback = &Rollback{AtMost: max(atMost, -1), Generation: c.st.Generation, LRFactor: d.LRFactor}
	var first []Action
	if culprit {
		// The shards hear of the quarantine before the rollback
		// re-initialises them (they keep it), so none of the culprit's
		// gradients reaches the restored model.
		first = c.membership(now)
	}
	msg := "the model diverged: rolling back to the last good checkpoint with half the learning rate"
	if culprit {
		msg = "the model diverged: rolling back to the last good checkpoint; the learning rate stays (its cause is quarantined)"
	}
	c.log.Error(msg,
		"step", res.Step, "test_loss", res.Loss, "best_loss", best, "at_most_step", c.rollback.AtMost,
		"lr_factor", d.LRFactor, "generation", c.st.Generation, "suspect", d.SuspectWorker, "evidence", d.Evidence)
	return append(first, c.sendRollback()...), true
}

// sendRollback orders the rollback decided, once no checkpoint is being
// written (one under way may be of the diverged model: it must be
// committed before the rollback moves it aside, not after).
func (c *Core) sendRollback() []Action {
	if c.rollback == nil || c.rollbackSent || c.ckptBusy {
		return nil
	}
	c.rollbackSent = true
	return []Action{*c.rollback}
}

// RolledBack says the Rollback is done: the shards start again at step,
// from the checkpoint of that step (fromCheckpoint) or the initial
// weights.
func (c *Core) RolledBack(now time.Time, step int64, fromCheckpoint bool) []Action {
	rb := c.rollback
	if rb == nil {
		return nil
	}
	c.rollback, c.rollbackSent = nil, false
	c.ledgerRestore(allShards(len(c.versions)), step)
	for s := range c.versions {
		c.versions[s] = step
		c.down[s] = time.Time{}
	}
	c.step = step
	c.st.LatestCheckpoint = -1
	if fromCheckpoint {
		c.st.LatestCheckpoint = step
	}
	d := &c.st.Divergences[len(c.st.Divergences)-1]
	d.RolledBackTo = step
	c.beginGeneration(step, true)
	if c.elastic() || len(c.st.Quarantined) > 0 {
		c.lastSent = nil // the re-initialised shards start from the run's membership: say it again
	}
	c.lastEval = now // the next evaluation scores the restored model after a while of training
	c.log.Warn("rolled back after a divergence", "to_step", step, "from_checkpoint", fromCheckpoint,
		"lr_factor", rb.LRFactor, "generation", rb.Generation)
	return []Action{c.save()}
}

// jsonLoss is a loss as JSON can carry it: a non-finite one becomes the
// largest float64.
func jsonLoss(l float64) float64 {
	if math.IsNaN(l) || math.IsInf(l, 0) {
		return math.MaxFloat64
	}
	return l
}
