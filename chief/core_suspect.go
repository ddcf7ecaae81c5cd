package chief

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/pstrain/pstrain/observe/report"
)

// Attribution (docs/security.md, "Attribution"): which worker pulls the
// model the wrong way. Every shard sums each worker's accepted gradients
// between two evaluation pulls and says, with the pull, how each sum
// lines up with the parameters' change over that window (ps.Agreement).
// The chief adds the shards' figures up into a cosine over the whole
// model and signs it with what its two evaluations say of the change:
// along a change that made the test loss fall, a worker agrees; along
// one that made it rise, it disagrees. Honest workers' gradients make
// up the change, so they agree with it whenever it helped; a worker
// whose gradients point away from the others' is singled out whichever
// of them the change followed, with two workers as with more.
const (
	// AgreeThreshold: the other workers must agree by more than this
	// for one below zero to be singled out (honest workers' cosines with
	// a change they are half of are about 0.7, with one they are a third
	// of 0.58, lower once the model has converged and their gradients
	// are mostly noise: 0.24 to 0.5 measured late in a 3-worker run).
	AgreeThreshold = 0.2
	// Strikes is how many windows in a row must single a worker out
	// before it is quarantined; a window that ended with the model
	// diverged is enough on its own.
	Strikes = 2
)

// Window is the shards' attribution figures for one evaluation window,
// added up over the shards (see ps.Window): by worker, its gradient
// sum's dot product with the model's descent and its squared norm; the
// descent's squared norm.
type Window struct {
	From     int64 // the version the earliest shard's window began at
	Dot, Sq  []float64
	UpdateSq float64
}

// Agreements are each worker's agreement with the model's progress
// over w, its loss going from before to after: the cosine of the
// worker's gradient sum with the descent, negated if the loss rose. NaN
// for a worker without gradients in the window, and for every worker
// when the loss did not move or the model did not.
func Agreements(w Window, before, after float64) []float64 {
	out := make([]float64, len(w.Dot))
	for i := range out {
		out[i] = math.NaN()
	}
	if w.UpdateSq <= 0 || !finite(before) || after == before {
		return out
	}
	sign := 1.0
	if !(after < before) { // risen, or not finite
		sign = -1
	}
	for i, d := range w.Dot {
		if i < len(w.Sq) && w.Sq[i] > 0 {
			out[i] = sign * d / math.Sqrt(w.Sq[i]*w.UpdateSq)
		}
	}
	return out
}

// singledOut is the one worker the agreements single out: below zero
// (pointing away from the model's progress) while every other worker
// with gradients in the window (at least one; skip's are left out) is
// above +AgreeThreshold. An honest worker's gradients are part of the
// descent, so its agreement with a change that helped is positive
// however noisy they are (its own share of the descent, about
// 1/sqrt(workers) of it, dominates the cross terms in so many
// dimensions); a worker pulling the other way is at or below zero even
// once the honest gradients are mostly noise and its own are
// independent of the descent. -1: none.
func singledOut(agree []float64, skip func(int) bool) int {
	out, others := -1, 0
	for w, a := range agree {
		switch {
		case math.IsNaN(a) || skip(w):
		case a < 0 && out < 0:
			out = w
		case a > AgreeThreshold:
			others++
		default:
			return -1 // undecided, or a second one against: no single culprit
		}
	}
	if others == 0 {
		return -1
	}
	return out
}

// attribute weighs the window res closed against the loss it began at
// and quarantines a worker singled out Strikes times in a row (once, if
// the model diverged). It reports whether it quarantined one.
func (c *Core) attribute(res EvalResult, diverged bool) bool {
	before := c.winLoss
	c.winLoss = res.Loss
	if res.Window == nil || c.phase != training {
		return false
	}
	agree := Agreements(*res.Window, before, res.Loss)
	w := singledOut(agree, c.isQuarantined)
	c.log.Debug("attribution window", "step", res.Step, "agreements", fmtAgreements(agree), "loss_before", before, "loss_after", res.Loss)
	for i := range c.strikes {
		if i != w {
			c.strikes[i] = 0
		}
	}
	if w < 0 || w >= len(c.strikes) {
		return false
	}
	c.strikes[w]++
	c.log.Warn("attribution: one worker's gradients point away from the model's progress", "worker", w,
		"agreements", fmtAgreements(agree), "loss_before", before, "loss_after", res.Loss, "strikes", c.strikes[w])
	if c.strikes[w] < Strikes && !diverged {
		return false
	}
	reason := fmt.Sprintf("its gradients pointed away from the model's progress while the others' agreed (agreement %s over %d window(s), test loss %.4g -> %.4g)",
		fmtAgreements(agree), c.strikes[w], before, res.Loss)
	return c.quarantine(w, reason, res.Step)
}

// quarantine quarantines worker w unless that would leave the run
// without an honest majority (at most (workers-1)/2 quarantined, one in
// a run of two) or without a worker. It reports whether it did.
func (c *Core) quarantine(w int, reason string, step int64) bool {
	name := fmt.Sprintf("worker/%d", w)
	c.st.Suspects = append(c.st.Suspects, report.Suspect{Worker: name, Reason: reason, AtStep: step})
	c.strikes[w] = 0
	n := c.workers()
	if len(c.st.Quarantined)+1 > max(1, (n-1)/2) || len(c.st.Quarantined)+1 >= n {
		c.log.Error("attribution names a worker, but quarantining it would leave too few: it trains on", "worker", name, "reason", reason)
		return false
	}
	c.st.Quarantined = append(c.st.Quarantined, w)
	slices.Sort(c.st.Quarantined)
	c.lastSent = nil // tell the shards
	c.m.Quarantined.Inc()
	c.log.Error("worker quarantined: its gradients are refused from now on", "worker", name, "at_step", step, "reason", reason)
	return true
}

// isQuarantined says worker w is quarantined.
func (c *Core) isQuarantined(w int) bool { return slices.Contains(c.st.Quarantined, w) }

// QuarantineReason is why worker w was quarantined ("": it is not).
func (c *Core) QuarantineReason(w int) string {
	if !c.isQuarantined(w) {
		return ""
	}
	name := fmt.Sprintf("worker/%d", w)
	for i := len(c.st.Suspects) - 1; i >= 0; i-- {
		if s := c.st.Suspects[i]; s.Worker == name {
			return fmt.Sprintf("quarantined at step %d: %s", s.AtStep, s.Reason)
		}
	}
	return "quarantined"
}

// quarantinedNames are the quarantined workers as the report names them.
func (c *Core) quarantinedNames() []string {
	out := []string{}
	for _, w := range c.st.Quarantined {
		out = append(out, fmt.Sprintf("worker/%d", w))
	}
	return out
}

func fmtAgreements(a []float64) string {
	s := make([]string, len(a))
	for i, x := range a {
		s[i] = fmt.Sprintf("%.2f", x)
	}
	return "[" + strings.Join(s, " ") + "]"
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
