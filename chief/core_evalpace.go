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

// evalPace is what paces the evaluations while the target is in sight:
// the test samples the last one scored.
type evalPace struct {
	lastScored int
}

// ended records an evaluation that scored scored test samples.
func (p *evalPace) ended(scored int) { p.lastScored = scored }

// evalWaited says whether the next routine evaluation may start: once
// --eval-every has passed since the last one was ordered, or, with the
// target in sight, once the time that pays for the last one's samples at
// EvalBudget has (sightGap; the evaluation's own duration counts, and a
// rollback, which moves lastEval, lets the restored model train first).
func (c *Core) evalWaited(now time.Time) bool {
	since := now.Sub(c.lastEval)
	if since >= c.p.Run.EvalEvery {
		return true
	}
	gap, ok := c.sightGap(now)
	return ok && since >= gap
}

// sightGap is the time from one evaluation's order to the next's, with
// the target in sight, that keeps the chief's scoring within EvalBudget
// of the training rate so far: the samples the last one scored over
// EvalBudget times the samples trained per second. ok is false when the
// target is not in sight or nothing tells the rate yet.
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
