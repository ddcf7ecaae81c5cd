package chief

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/pstrain/pstrain/observe/report"
)

// A ruined model is never handed back (docs/semantics.md, "A ruined
// model is never handed back"). When the final evaluation finds the
// model ruined (worse than the initial one, or diverged and not rolled
// back), the chief restores an earlier model onto the stopped shards
// (HandBack), scores it on the whole test set, and makes it the run's
// final checkpoint instead. It starts from the newest model known good
// (this generation's last good evaluation, else the newest checkpoint)
// and goes further back while the restored model scores worse than the
// initial one, down to the initial weights. The run still ends ruined
// (exit status 4): the report says why, and which model it handed back.

// maxHandBackTries is how many checkpoints a hand-back restores and
// scores before it goes straight to the initial weights.
const maxHandBackTries = 3

// HandBack restores every shard, in Generation, from the newest valid
// checkpoint at or before step AtMost (the initial weights if there is
// none; the later ones are moved aside as a Rollback does) and stops
// the shards again. Answered by Core.HandedBack.
type HandBack struct {
	AtMost     int64
	Generation int64
	// Best: the model handed back is the run's best (a plateau stop,
	// core_best.go), and the checkpoints after it are deleted rather than
	// moved aside: they are the run's own, superseded, not a diverged
	// model's.
	Best bool
}

func (HandBack) action() {}

func (a HandBack) String() string {
	s := fmt.Sprintf("hand-back at-most-step=%d generation=%d", a.AtMost, a.Generation)
	if a.Best {
		s += " best"
	}
	return s
}

// HandBackResult is the outcome of a HandBack: the step restored,
// whether from a checkpoint (else the initial weights), the shards'
// versions after the stop (nil if one did not answer), or the error.
type HandBackResult struct {
	Step           int64
	FromCheckpoint bool
	Versions       []int64
	Err            error
}

// startMargin is how far above the initial model's test loss a model's
// must be to count as worse than it. The initial loss is scored on the
// routine evaluation's subset and a final model on the whole test set:
// for the same weights the two differ by a few parts in ten thousand, and
// a model that was not trained at all must not be called ruined for it.
const startMargin = 1.01

// worseThanStart says why the evaluated model e is worse than the one
// training started from ("": it is not): its test loss is above the
// initial model's (by more than startMargin), or not finite.
func (c *Core) worseThanStart(e *report.Eval) string {
	l := c.p.InitialLoss
	switch {
	case e.TestLoss >= math.MaxFloat64:
		return fmt.Sprintf("the final model (step %d) has a test loss that is not finite", e.Step)
	case l > 0 && e.TestLoss > l*startMargin:
		return fmt.Sprintf("the final model (step %d, test loss %.4g) is worse than the initial one (%.4g)", e.Step, e.TestLoss, l)
	}
	return ""
}

// ruinedWhy says why the final model evaluated is not a success ("": it
// is): worse than the initial one, or the run ended with a divergence it
// did not roll back; with the suspect worker, if any.
func (c *Core) ruinedWhy() string {
	var why []string
	if c.st.GaveUp != "" {
		why = append(why, c.st.GaveUp)
	}
	if e := c.finalEval; e != nil {
		if w := c.worseThanStart(e); w != "" {
			why = append(why, w)
		}
	}
	if n := len(c.st.Divergences); n > 0 && c.st.Divergences[n-1].RolledBackTo < 0 && c.st.GaveUp == "" {
		d := c.st.Divergences[n-1]
		why = append(why, fmt.Sprintf("the model diverged at step %d (test loss %.4g) and was not rolled back", d.AtStep, d.TestLoss))
	}
	if len(why) == 0 {
		return ""
	}
	if s := c.st.Suspects; len(s) > 0 {
		why = append(why, "suspect "+s[len(s)-1].Worker)
	} else if n := len(c.st.Divergences); n > 0 && c.st.Divergences[n-1].SuspectWorker != "" {
		why = append(why, "suspect "+c.st.Divergences[n-1].SuspectWorker)
	}
	return strings.Join(why, "; ")
}

// ruined says why the run's model is not a success ("": it is), and
// after a hand-back which model the run handed back instead.
func (c *Core) ruined() string {
	hb := c.st.HandedBack
	switch {
	case hb == nil:
		return c.ruinedWhy()
	case hb.Err != "":
		return hb.Why + "; handing back an earlier model failed: " + hb.Err
	case !hb.FromCheckpoint:
		return hb.Why + "; handed back the initial model instead"
	}
	return hb.Why + fmt.Sprintf("; handed back the model of step %d instead", hb.Step)
}

// handingBack says a hand-back began: evaluations score the model
// restored, not the run's.
func (c *Core) handingBack() bool { return c.st.HandedBack != nil }

// handBackDue decides, once the final model is scored, whether an
// earlier model must be handed back in its place, and orders it (nil:
// the model scored is the run's). It needs a store to restore from and
// to write the final checkpoint to.
func (c *Core) handBackDue() []Action {
	if !c.p.Checkpoints || c.finalEval == nil || c.handBackBusy {
		return nil
	}
	hb := c.st.HandedBack
	switch {
	case hb == nil:
		why := c.ruinedWhy()
		if why == "" {
			return nil
		}
		c.st.HandedBack = &report.HandedBack{Step: -1, RuinedStep: c.finalEval.Step, RuinedTestAccuracy: c.finalEval.TestAccuracy, Why: why}
		c.log.Error("the final model is ruined: handing back an earlier one", "why", why)
		return c.orderHandBack(c.handBackBound(), false)
	case hb.Err != "":
		return nil
	case hb.Step < 0:
		// Ordered by a chief that then restarted: order it again.
		return c.orderHandBack(c.handBackBound(), false)
	case !hb.FromCheckpoint || c.worseThanStart(c.finalEval) == "":
		return nil // the initial model, or one no worse
	}
	c.log.Warn("the model restored scores worse than the initial one too: going further back",
		"step", hb.Step, "test_loss", c.finalEval.TestLoss, "initial_loss", c.p.InitialLoss)
	hb.Tried = append(hb.Tried, hb.Step)
	atMost := hb.Step - 1
	if len(hb.Tried) >= maxHandBackTries {
		atMost = -1
	}
	hb.Step = -1
	return c.orderHandBack(atMost, false)
}

// handBackBound is the newest step a hand-back restores first: before
// any is restored, this generation's last good evaluation, else the
// newest checkpoint (scored once restored); after one, the step before
// the last tried.
func (c *Core) handBackBound() int64 {
	if hb := c.st.HandedBack; hb != nil && len(hb.Tried) > 0 {
		if len(hb.Tried) >= maxHandBackTries {
			return -1
		}
		return hb.Tried[len(hb.Tried)-1] - 1
	}
	if c.lastGood >= 0 {
		return c.lastGood
	}
	return max(c.st.LatestCheckpoint, c.rollbackBound())
}

func (c *Core) orderHandBack(atMost int64, best bool) []Action {
	c.st.Generation++
	c.handBackBusy = true
	c.initEpochs(allShards(len(c.versions)))
	c.log.Warn("restoring an earlier model onto the stopped shards to hand it back", "at_most_step", atMost, "generation", c.st.Generation)
	return []Action{c.save(), HandBack{AtMost: atMost, Generation: c.st.Generation, Best: best}}
}

// HandedBack says the HandBack is done: the shards hold the model of
// res.Step, stopped. It is scored next; a failure ends the run with the
// ruined model and no final checkpoint of what the shards hold.
func (c *Core) HandedBack(now time.Time, res HandBackResult) []Action {
	c.handBackBusy = false
	hb := c.st.HandedBack
	if hb == nil {
		if b := c.st.Best; b != nil && !b.Restored && c.stopReason == StopPlateau {
			return c.bestHandedBack(now, res)
		}
		return nil
	}
	if res.Err != nil {
		hb.Err = res.Err.Error()
		c.handBackFailed("handing back an earlier model: " + hb.Err)
		c.log.Error("could not hand back an earlier model; the run ends with the ruined one and no final checkpoint", "err", res.Err)
		return c.wind(now)
	}
	hb.Step, hb.FromCheckpoint = res.Step, res.FromCheckpoint
	c.restoredForHandBack(res)
	c.log.Warn("restored an earlier model to hand back; scoring it", "step", res.Step, "from_checkpoint", res.FromCheckpoint)
	return append([]Action{c.save()}, c.wind(now)...)
}

// handBackFailed records a hand-back that failed as the final
// checkpoint's failure (why: the report's last error): the shards hold
// no model to checkpoint.
func (c *Core) handBackFailed(why string) {
	c.finalCkptAsked = true
	c.st.Checkpoints.Failed++
	c.st.Checkpoints.LastError = why
	c.st.Checkpoints.FinalFailed = true
}

// restoredForHandBack records that the stopped shards hold the model of
// res.Step, restored to be handed back in a new generation: it is scored
// next.
func (c *Core) restoredForHandBack(res HandBackResult) {
	c.versionsStopped = len(res.Versions) == len(c.versions)
	for s := range c.versions {
		c.versions[s] = res.Step
		if c.versionsStopped {
			c.versions[s] = res.Versions[s]
		}
	}
	c.st.LatestCheckpoint = -1
	if res.FromCheckpoint {
		c.st.LatestCheckpoint = res.Step
	}
	c.beginGeneration(res.Step, true)
	c.finalEval, c.finalEvalAsked, c.st.FinalEval = nil, false, nil
}
