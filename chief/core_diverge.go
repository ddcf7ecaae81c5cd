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

// bestLoss is the lowest test loss of the run's evaluations so far.
func (c *Core) bestLoss() (float64, bool) {
	best, ok := math.Inf(1), false
	for _, e := range c.st.Evals {
		if e.TestLoss < best {
			best, ok = e.TestLoss, true
		}
	}
	return best, ok
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
	for s := range c.outliers {
		c.outliers[s] = -1
	}
	for s := range c.refusedTotal {
		c.refusedAtGen[s] = append(c.refusedAtGen[s][:0], c.refusedTotal[s]...)
	}
}

// noteRefusals records a poll's refusal counts and first outliers (shard
// s's, counted since its last Init: a count lower than the last one seen
// means the shard was re-initialised).
func (c *Core) noteRefusals(s int, x ShardStatus) {
	if len(c.refusedSeen) == 0 {
		return
	}
	seen, total := c.refusedSeen[s], c.refusedTotal[s]
	for w := range min(len(x.Refused), len(seen)) {
		n := x.Refused[w]
		if n < seen[w] {
			seen[w] = 0
		}
		total[w] += n - seen[w]
		seen[w] = n
	}
	if x.Outlier >= 0 && c.outliers[s] < 0 {
		c.outliers[s] = x.Outlier
	}
}

// refused is each worker's refused gradients, the most any shard
// refused, since the run began (gen false) or this generation did.
func (c *Core) refused(gen bool) []int64 {
	out := make([]int64, c.p.Run.Workers)
	for s, total := range c.refusedTotal {
		for w, n := range total {
			if gen {
				n -= c.refusedAtGen[s][w]
			}
			out[w] = max(out[w], n)
		}
	}
	return out
}

// suspect names the worker whose gradients stood out in this
// generation: the one that pushed the first out-of-line gradient a shard
// saw (the cause: once a model diverged, every worker's gradients are
// out of line), else the one with the most refused gradients, else none
// ("").
func (c *Core) suspect() (worker, evidence string) {
	refused := c.refused(true)
	for s, w := range c.outliers {
		if w >= 0 && w < len(refused) {
			return fmt.Sprintf("worker/%d", w), fmt.Sprintf("it pushed the first out-of-line gradient ps/%d saw; %d of its gradients refused", s, refused[w])
		}
	}
	best, most := -1, int64(0)
	for w, n := range refused {
		if n > most {
			best, most = w, n
		}
	}
	if best >= 0 {
		return fmt.Sprintf("worker/%d", best), fmt.Sprintf("%d of its gradients refused", most)
	}
	return "", ""
}

// checkDivergence applies the divergence rule to an evaluation of the
// current generation, before it is recorded. A divergence during
// training decides a rollback (returning the action once it may be
// sent) or, past MaxRollbacks, ends the run; one found by the final
// evaluation is only reported. It returns those actions (the caller
// saves the state first) and whether the evaluation diverged.
func (c *Core) checkDivergence(now time.Time, res EvalResult) ([]Action, bool) {
	best, ok := c.bestLoss()
	if !Diverged(res.Loss, best, ok) {
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
	c.m.Divergences.Inc()
	if c.phase != training || c.restoring != nil || c.rollback != nil {
		c.st.Divergences = append(c.st.Divergences, d)
		c.log.Error("the model diverged, but training has ended or a recovery is under way: not rolled back",
			"step", res.Step, "test_loss", res.Loss, "best_loss", best, "suspect", d.SuspectWorker, "evidence", d.Evidence)
		return nil, true
	}
	if len(c.st.Divergences) >= MaxRollbacks {
		c.st.Divergences = append(c.st.Divergences, d)
		c.phase = finished
		return []Action{Finish{Err: fmt.Errorf("chief: the model diverged %d times (test loss %.4g at step %d, best %.4g); each rollback halved the learning rate: giving up",
			len(c.st.Divergences), res.Loss, res.Step, best)}}, true
	}
	// Roll back to the newest checkpoint of a model known good: at or
	// before this generation's last good evaluation. Without one since
	// the generation began, a generation begun by a rollback goes further
	// back than that rollback's checkpoint (it may hold what diverged,
	// e.g. in the optimizer's momentum).
	atMost := c.lastGood
	if atMost < 0 {
		atMost = c.genStart
		if c.genFromRollback {
			atMost--
		}
	}
	d.LRFactor = c.lrFactor() / 2
	c.st.LRFactor = d.LRFactor
	c.st.Divergences = append(c.st.Divergences, d)
	c.st.Generation++
	c.hold = 0
	c.rollback = &Rollback{AtMost: max(atMost, -1), Generation: c.st.Generation, LRFactor: d.LRFactor}
	c.log.Error("the model diverged: rolling back to the last good checkpoint with half the learning rate",
		"step", res.Step, "test_loss", res.Loss, "best_loss", best, "at_most_step", c.rollback.AtMost,
		"lr_factor", d.LRFactor, "generation", c.st.Generation, "suspect", d.SuspectWorker, "evidence", d.Evidence)
	return c.sendRollback(), true
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
