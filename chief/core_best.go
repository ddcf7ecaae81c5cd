package chief

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/report"
)

// Stopped by plateau (docs/semantics.md): with --patience P, a run stops
// once P evaluations in a row scored no lower test loss than the model's
// best, and hands back that best model. To have it, every routine
// evaluation asks the shards to retain the state it reads, and one that
// scores a new best has them checkpoint that state (a checkpoint named
// after the evaluation's step: Checkpoint.Retained, not Final). At the
// stop the chief restores that checkpoint onto the stopped shards
// (HandBack), scores it on the whole test set and marks it the final
// checkpoint. Without checkpoints the run hands back the model the
// shards hold when stopped.

// ErrNothingRestored says a plateau stop's HandBack restored nothing
// (the best model's checkpoint is gone or damaged, or the later ones
// could not be deleted): the shards hold the stopped model.
var ErrNothingRestored = errors.New("nothing restored")

// BestModel is the checkpoint of the best model evaluated so far, and
// whether a plateau stop restored it onto the shards.
type BestModel struct {
	Checkpoint int64       `json:"checkpoint"`
	Eval       report.Eval `json:"eval"`
	Restored   bool        `json:"restored,omitempty"`
}

// keepsBest says the run checkpoints its best model to hand it back at a
// plateau stop.
func (c *Core) keepsBest() bool {
	return c.p.Run.Patience > 0 && c.p.Checkpoints && c.p.Evaluate
}

// keepGood is the step whose newest checkpoint at or before it the store
// keeps beyond its retention (Checkpoint.KeepGood): a rollback's bound,
// or the best model's checkpoint if that is older.
func (c *Core) keepGood() int64 {
	b := c.rollbackBound()
	if c.st.Best != nil {
		b = min(b, c.st.Best.Checkpoint)
	}
	return b
}

// sinceBest is how many evaluations of the model's history (as bestLoss
// reads it: this generation's, and those of the steps it grew from) came
// after the one of the lowest test loss, that one, and whether the last
// evaluation recorded counts. A loss no lower than the best does not
// reset the count: a flat loss is a plateau too; an evaluation of the
// step the one before it scored does not count.
func (c *Core) sinceBest() (since int, best report.Eval, counted bool) {
	best, last := report.Eval{TestLoss: math.Inf(1)}, int64(-1)
	for i, e := range c.st.Evals {
		counted = false
		switch {
		case !c.ownHistory(i, e):
			continue // a step thrown away by a recovery or a rollback
		case e.Step == last:
			continue // no step trained since (a stall): nothing to judge
		}
		last, counted = e.Step, true
		switch {
		case e.TestLoss < best.TestLoss:
			since, best = 0, e
		default:
			since++
		}
	}
	return since, best, counted
}

// patience applies --patience to the training evaluation ev, just
// recorded: the stop once the loss stopped falling, else the checkpoint
// of a new best (when none is under way, and the evaluation read one
// version of every shard: not mixed).
func (c *Core) patience(now time.Time, ev report.Eval, mixed bool) []Action {
	p := c.p.Run.Patience
	if p <= 0 {
		return nil
	}
	since, best, counted := c.sinceBest()
	switch {
	case !counted:
		return nil
	case since >= p:
		c.log.Info("the test loss stopped falling; stopping", "evaluations", since, "best_loss", fmt.Sprintf("%.4f", best.TestLoss),
			"best_step", best.Step, "test_loss", fmt.Sprintf("%.4f", ev.TestLoss))
		return c.beginStop(now, StopPlateau)
	case since > 0 || !c.keepsBest():
		return nil
	case mixed:
		c.log.Info("best model so far not checkpointed: its evaluation read shards at different versions", "step", ev.Step)
		return nil
	case c.p.Run.Mode == config.Sync && ev.Step == c.st.LatestCheckpoint:
		// The newest checkpoint is of that version of every shard.
		c.st.Best = &BestModel{Checkpoint: ev.Step, Eval: ev}
		return nil
	case c.ckptBusy || ev.Step <= c.st.LatestCheckpoint:
		c.log.Info("best model so far not checkpointed: a checkpoint is under way, or one of a later step exists", "step", ev.Step)
		return nil
	}
	c.ckptBusy, c.lastCkpt, c.st.BestPending = true, now, &ev
	return []Action{Checkpoint{Versions: slices.Clone(c.versions), Latest: c.st.LatestCheckpoint, Retained: true, Step: ev.Step, KeepGood: c.keepGood()}}
}

// bestCheckpointed records the outcome of a checkpoint: that of the best
// model so far if it was one (retained, not final) and was committed.
func (c *Core) bestCheckpointed(res CheckpointResult) {
	if !res.Retained || res.Final {
		return
	}
	if e := c.st.BestPending; e != nil && res.Err == nil && res.Skipped == "" {
		c.st.Best = &BestModel{Checkpoint: res.Step, Eval: *e}
		c.log.Info("best model so far checkpointed", "step", res.Step, "test_loss", fmt.Sprintf("%.4f", e.TestLoss))
	}
	c.st.BestPending = nil
}

// adoptBestPending settles, for a restarted chief, the best model's
// checkpoint its predecessor had under way: committed if the store holds
// a checkpoint of its step (the only one of that step: no other starts
// while it is under way), else lost with that chief.
func (c *Core) adoptBestPending(committed []int64) {
	e := c.st.BestPending
	if e == nil {
		return
	}
	c.st.BestPending = nil
	if !slices.Contains(committed, e.Step) {
		c.log.Info("the best model's checkpoint under way at the chief's restart was not committed", "step", e.Step)
		return
	}
	c.st.Best = &BestModel{Checkpoint: e.Step, Eval: *e}
	c.st.LatestCheckpoint = max(c.st.LatestCheckpoint, e.Step)
	c.st.Checkpoints.Committed++
	c.log.Info("best model so far checkpointed (committed before the chief's restart)", "step", e.Step, "test_loss", fmt.Sprintf("%.4f", e.TestLoss))
}

// forgetBestPast forgets the best model's checkpoint if it is of a step
// a recovery or rollback to step threw away (it was moved aside).
func (c *Core) forgetBestPast(step int64) {
	if b := c.st.Best; b != nil && !b.Restored && b.Checkpoint > step {
		c.st.Best = nil
	}
}

// bestHandBackDue orders, in a plateau stop, the restore of the best
// model's checkpoint onto the stopped shards (nil: not due). A best
// that was not checkpointed (its checkpoint failed, or it mixed
// versions) leaves an older one, handed back only if it scored lower
// than the last training evaluation, the nearest to the stopped model.
func (c *Core) bestHandBackDue() []Action {
	b := c.st.Best
	if c.stopReason != StopPlateau || b == nil || b.Restored || c.handBackBusy || c.handingBack() {
		return nil
	}
	if last, ok := c.lastTrainingEval(); ok && b.Eval.TestLoss >= last.TestLoss {
		c.log.Info("the best model checkpointed scored no lower than the last evaluation: handing back the stopped model",
			"best_step", b.Eval.Step, "best_loss", fmt.Sprintf("%.4f", b.Eval.TestLoss), "last_step", last.Step, "last_loss", fmt.Sprintf("%.4f", last.TestLoss))
		b.Restored = true
		return nil
	}
	c.log.Info("handing back the best model evaluated", "step", b.Eval.Step, "checkpoint", b.Checkpoint, "test_loss", fmt.Sprintf("%.4f", b.Eval.TestLoss))
	return c.orderHandBack(b.Checkpoint, true)
}

// lastTrainingEval is the last evaluation recorded before the stop.
func (c *Core) lastTrainingEval() (report.Eval, bool) {
	if n := len(c.st.Evals); n > 0 && !c.finalEvalAsked {
		return c.st.Evals[n-1], true
	}
	return report.Eval{}, false
}

// bestHandedBack is HandedBack for the best model's restore: the shards
// hold it, stopped, and it is scored next. ErrNothingRestored leaves the
// stopped model to score; another failure ends the run with no final
// evaluation or checkpoint of what the shards hold.
func (c *Core) bestHandedBack(now time.Time, res HandBackResult) []Action {
	b := c.st.Best
	b.Restored = true
	err := res.Err
	switch {
	case errors.Is(err, ErrNothingRestored):
		c.log.Warn("could not restore the best model; handing back the stopped model", "err", err)
		return append([]Action{c.save()}, c.wind(now)...)
	case err == nil && (!res.FromCheckpoint || res.Step != b.Checkpoint):
		err = fmt.Errorf("the shards were restored to step %d, not the best model's checkpoint", res.Step)
	}
	if err != nil {
		// The shards no longer hold the stopped model, nor the best:
		// nothing to score or checkpoint.
		c.finalEvalAsked = true
		c.handBackFailed(fmt.Sprintf("handing back the best model (its checkpoint of step %d stays): %v", b.Checkpoint, err))
		c.log.Error("could not hand back the best model; the run ends with no final checkpoint", "best_checkpoint", b.Checkpoint, "err", err)
		return append([]Action{c.save()}, c.wind(now)...)
	}
	c.restoredForHandBack(res)
	return append([]Action{c.save()}, c.wind(now)...)
}
