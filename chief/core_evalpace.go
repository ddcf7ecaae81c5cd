package chief

import (
	"time"
)

// EvalBudget is how many test samples the chief may score per training
// sample of an MLP: never more (up to budgetCap x --eval-every between
// evaluations), and as many as that while the target is in sight.
// Scoring a sample is one forward pass; training on it is a forward and
// a backward pass, about three forward passes of work, so at 0.3 the
// chief's evaluations cost about a tenth of what the workers compute
// (docs/semantics.md, "Evaluation, and what it costs").
const EvalBudget = 0.3

// EvalBudgetCNN is EvalBudget for a CNN, whose scoring costs the chief
// 0.35-0.38 of what training costs a worker per sample
// (BenchmarkCNNScoreAndTrain in ml/nn: a forward pass at the chief's
// batch of 1,000 against a worker's step at 64), so that its
// evaluations too cost about a tenth of what the workers compute.
const EvalBudgetCNN = 0.26

// inSight is how close (in accuracy) the last score must be to the
// target for the chief to evaluate as often as EvalBudget allows: half a
// point, where the hold usually begins within a few seconds (the MLP's
// score moves from 97.0% to 97.5% over about two).
const inSight = 0.005

// evalPace is what paces the evaluations: the test samples the next
// wait pays for (charge), those scored and not yet paid for (debt), the
// samples of the last evaluation that scored its subset alone (routine),
// and the generation the last one was ordered in.
type evalPace struct {
	charge, debt, routine int
	orderGen              int64
}

// ordered records that an evaluation was ordered in generation.
func (p *evalPace) ordered(generation int64) { p.orderGen = generation }

// ended records an evaluation that scored scored test samples, whole
// when it went on to the whole set. One wait pays for at most two
// routine evaluations' samples; the rest of a whole-set confirmation's is
// paid by the waits after it, so a confirmation that failed delays the
// next evaluation by two routine waits rather than by all it cost, and
// over the run the chief scores no more than the budget pays for.
func (p *evalPace) ended(scored int, whole bool) {
	if !whole && scored > 0 {
		p.routine = scored
	}
	p.debt += scored
	p.charge = p.debt
	if p.routine > 0 {
		p.charge = min(p.debt, 2*p.routine)
	}
	p.debt -= p.charge
}

// evalWaited says whether the next routine evaluation may start: once
// the time that pays at EvalBudget for the samples charged to this wait
// (evalPace) has passed since the last one was ordered (budgetGap, at
// most budgetCap x --eval-every; the evaluation's own duration counts,
// and a rollback, which moves lastEval, lets the restored model train
// first), and, while the target is out of sight, --eval-every too.
func (c *Core) evalWaited(now time.Time) bool {
	since := now.Sub(c.lastEval)
	gap, ok := c.budgetGap(now)
	if ok && since < min(gap, budgetCap*c.p.Run.EvalEvery) {
		return false
	}
	return (ok && c.targetInSight()) || since >= c.p.Run.EvalEvery
}

// budgetCap bounds the wait for the budget to budgetCap x --eval-every,
// so a low rate so far (a slow start) never stops evaluations for long.
const budgetCap = 10

// targetInSight says whether the last score is within inSight of the
// target.
func (c *Core) targetInSight() bool {
	return c.p.target() > 0 && c.phase == training && len(c.st.Evals) > 0 && c.lastScore() >= c.p.target()-inSight
}

// budgetGap is the time from one evaluation's order to the next's that
// keeps the chief's scoring within EvalBudget (EvalBudgetCNN) of the
// training rate: the samples charged to the wait (evalPace) over the
// budget times the samples trained per second since training started (the whole run's rate: a
// rate over the last interval alone falls while the evaluation itself
// takes CPU from the workers, and would stretch the pause it pays for).
// ok is false while nothing tells the cost or the rate, and in a new
// generation (a rollback or a restore moved the step back) until its
// first evaluation.
func (c *Core) budgetGap(now time.Time) (gap time.Duration, ok bool) {
	trained := now.Sub(c.start).Seconds()
	samples := c.samplesAt(c.step)
	if c.pace.charge <= 0 || trained <= 0 || samples <= 0 || c.st.Generation != c.pace.orderGen {
		return 0, false
	}
	budget := EvalBudget
	if c.p.Run.Model.IsCNN() {
		budget = EvalBudgetCNN
	}
	return time.Duration(float64(c.pace.charge) / (budget * samples / trained) * float64(time.Second)), true
}
