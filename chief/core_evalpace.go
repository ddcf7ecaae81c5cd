package chief

import (
	"time"
)

// EvalBudget is how many test samples the chief may score per training
// sample while the target is in sight. Scoring a sample is one forward
// pass; training on it is a forward and a backward pass, about three
// forward passes of work, so at 0.3 the chief's evaluations cost about a
// tenth of what the workers compute (docs/semantics.md, "Evaluation,
// and what it costs").
const EvalBudget = 0.3

// inSight is how close (in accuracy) the last score must be to the
// target for the chief to evaluate as often as EvalBudget allows.
const inSight = 0.01

// evalPace is when the evaluations after the first run while the target
// is in sight: the end of the last one and the samples it scored.
type evalPace struct {
	lastEnd    time.Time
	lastScored int
}

// ended records an evaluation that ended at now after scoring scored
// test samples.
func (p *evalPace) ended(now time.Time, scored int) {
	p.lastEnd, p.lastScored = now, scored
}

// evalWaited says whether the next routine evaluation may start: once
// --eval-every has passed since the last one was ordered, or, with the
// target in sight, once the pause that pays for the last one's samples at
// EvalBudget has (see sightGap).
func (c *Core) evalWaited(now time.Time) bool {
	if now.Sub(c.lastEval) >= c.p.Run.EvalEvery {
		return true
	}
	gap, ok := c.sightGap(now)
	// From the later of the last end and the last order: a rollback
	// orders none but moves lastEval, to let the restored model train.
	from := c.pace.lastEnd
	if c.lastEval.After(from) {
		from = c.lastEval
	}
	return ok && now.Sub(from) >= gap
}

// sightGap is the pause after an evaluation, with the target in sight,
// that keeps the chief's scoring within EvalBudget of the training
// rate so far: the samples it scored over EvalBudget times the samples
// trained per second. ok is false when the target is not in sight or
// nothing tells the rate yet.
func (c *Core) sightGap(now time.Time) (gap time.Duration, ok bool) {
	r := c.p.Run
	if r.TargetAccuracy <= 0 || c.phase != training || len(c.st.Evals) == 0 || c.pace.lastScored <= 0 ||
		c.lastScore() < r.TargetAccuracy-inSight {
		return 0, false
	}
	trained := now.Sub(c.start).Seconds()
	samples := c.samplesAt(c.step)
	if trained <= 0 || samples <= 0 {
		return 0, false
	}
	perSecond := samples / trained
	return time.Duration(float64(c.pace.lastScored) / (EvalBudget * perSecond) * float64(time.Second)), true
}
