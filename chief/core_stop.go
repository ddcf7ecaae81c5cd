package chief

import (
	"fmt"
	"github.com/pstrain/pstrain/ml/binmetric"
	"math"
	"slices"
	"time"

	"github.com/pstrain/pstrain/observe/report"
)

// Why a run stopped (report.Report.StoppedBy).
const (
	StopTarget      = "target"      // the target accuracy was held
	StopEpochs      = "epochs"      // every epoch was trained
	StopInterrupted = "interrupted" // SIGINT or SIGTERM
	StopFailed      = "failed"      // the model kept diverging: the chief gave up
	StopPlateau     = "plateau"     // the test loss stopped falling (--patience)
)

// evalDue orders a routine evaluation when the interval has passed.
//
// The stop rule (docs/semantics.md, "Stopped by target"): a run stops by
// target when TargetHold evaluations in a row score at least the target,
// the last of them on the whole test set, and it hands back the model of
// that last evaluation. A routine evaluation scores a stratified subset of
// the test set (EvalSubset of it: cheap; each evaluation the next window,
// Evaluator.ScoreAt); the whole set is scored only when
// the subset's score would complete the hold. Without a target only the
// subset is scored, and the final model is always scored on the whole
// set.
func (c *Core) evalDue(now time.Time) (Action, bool) {
	r := c.p.Run
	if !c.p.Evaluate || r.EvalEvery <= 0 || c.evalBusy || !c.evalWaited(now) || c.step <= 0 || c.keepsBest() && c.ckptBusy {
		// (With --patience an evaluation's pull replaces the state the
		// shards retained, which a checkpoint may be writing.)
		return nil, false
	}
	a := Evaluate{Generation: c.st.Generation, Subset: c.p.EvalSubset, ConfirmAbove: 2, // 2: never the whole set
		Retain: c.mayHoldTarget() || c.keepsBest()}
	switch {
	case c.p.EvalSubset >= 1:
		a.ConfirmAbove = 0
	case c.p.target() > 0 && c.hold+1 >= c.targetHold():
		a.ConfirmAbove = c.p.target()
	case c.p.target() > 0 && c.lastScore() < c.p.target()-0.01:
		// Far from the target a quarter of the subset tells as much.
		a.Subset /= 4
	}
	return c.orderEval(now, a), true
}

// lastScore is the latest evaluation's accuracy (0 before the first).
func (c *Core) lastScore() float64 {
	if n := len(c.st.Evals); n > 0 {
		return c.st.Evals[n-1].TestAccuracy
	}
	return 0
}

func (c *Core) targetHold() int { return max(1, c.p.Run.TargetHold) }

// mayHoldTarget says whether the next evaluation may complete the
// target's hold, or is not a training one: the shards then keep the
// state it reads (Evaluate.Retain), which costs a CTR shard a copy of
// every block of rows written until they drop it.
func (c *Core) mayHoldTarget() bool {
	return c.phase != training || c.p.target() > 0 && c.hold+1 >= c.targetHold()
}

func (c *Core) orderEval(now time.Time, a Evaluate) Action {
	c.evalSeq++
	a.Seq = c.evalSeq
	c.evalBusy, c.lastEval = true, now
	c.pace.ordered(c.st.Generation)
	return a
}

// EvalResult is the outcome of an Evaluate.
type EvalResult struct {
	Seq, Generation int64
	Step            int64 // the lowest shard version evaluated
	// Mixed says a sync evaluation read shards at different versions (one
	// stalled behind the others): its retained state is no checkpoint a
	// sync run could restore and train on.
	Mixed          bool
	At             time.Time // when the weights were pulled
	Duration       time.Duration
	Accuracy, Loss float64
	Samples        int  // test samples Accuracy is over
	Scored         int  // test samples scored, a subset pass before the whole set's too (0: Samples)
	Full           bool // the whole test set
	Err            error
	// Window is the shards' attribution figures for the window this
	// evaluation's pull closed (nil: none).
	Window *Window
	// Binary is a CTR model's scores (AUC, log loss, normalized
	// entropy); nil for other models.
	Binary *binmetric.Scores
}

// Evaluated records an evaluation and applies the stop rule.
func (c *Core) Evaluated(now time.Time, res EvalResult) []Action {
	c.evalBusy = false
	c.pace.ended(max(res.Scored, res.Samples), res.Full)
	switch {
	case res.Err != nil:
		// A shard restarting: skipped, not fatal (only the poll loop can
		// bring that shard back). Some shards' attribution windows may
		// have closed: the next one's start is unknown.
		c.log.Warn("evaluation skipped", "err", res.Err)
		c.winLoss = math.NaN()
		return c.wind(now)
	case res.Generation != c.st.Generation:
		c.log.Info("evaluation of a rolled-back model ignored", "step", res.Step, "generation", res.Generation)
		c.winLoss = math.NaN()
		return c.wind(now)
	}
	divActs, decided := c.judge(now, res)
	ev := report.Eval{Step: res.Step, Seconds: c.seconds(res.At), TestAccuracy: res.Accuracy, TestLoss: jsonLoss(res.Loss), TestSamples: res.Samples, Subset: !res.Full}
	if b := res.Binary; b != nil {
		ev.AUC, ev.NormalizedEntropy = b.AUC, jsonLoss(b.NormalizedEntropy)
	}
	c.st.Evals = append(c.st.Evals, ev)
	c.st.TestSeconds += res.Duration.Seconds()
	c.m.EvalAccuracy.Set(res.Accuracy)
	c.m.EvalLoss.Set(res.Loss)
	c.log.Info("evaluation", "step", ev.Step, "seconds", fmt.Sprintf("%.2f", ev.Seconds), "samples", res.Samples,
		"test_accuracy", fmt.Sprintf("%.4f", ev.TestAccuracy), "test_loss", fmt.Sprintf("%.4f", ev.TestLoss))
	switch {
	case decided:
		// A rollback (ordered, or waiting for a checkpoint under way), or
		// the stop of a run that diverged too often.
		return append([]Action{c.save()}, divActs...)
	case c.phase == stopping:
		if res.Full && c.finalEvalAsked && c.finalEval == nil {
			c.finalEval = &ev
		}
		return append([]Action{c.save()}, c.wind(now)...)
	case c.phase != training:
		return []Action{c.save()}
	case c.targetHeld(res):
		c.st.TimeToTargetSeconds = ptr(ev.Seconds)
		c.finalEval = &ev
		c.log.Info("target accuracy held; stopping", "evaluations", c.hold, "step", ev.Step, "test_accuracy", fmt.Sprintf("%.4f", ev.TestAccuracy))
		return append([]Action{c.save()}, c.beginStop(now, StopTarget)...)
	}
	more := c.patience(now, ev, res.Mixed) // (the state saved holds what it decided)
	return append([]Action{c.save()}, more...)
}

// targetHeld counts an evaluation toward the target's hold and says
// whether it completed it.
func (c *Core) targetHeld(res EvalResult) bool {
	if c.p.target() <= 0 {
		return false
	}
	if res.Accuracy >= c.p.target() {
		c.hold++
	} else {
		c.hold = 0
	}
	return c.hold >= c.targetHold() && res.Full
}

// judge applies the divergence rule to an evaluation (a model restored
// to be handed back is judged by the hand-back instead). decided says a
// divergence decided what comes next: a rollback, or the stop of a run
// that diverged too often (acts); one found by the final evaluation
// decides nothing (the stop goes on).
func (c *Core) judge(now time.Time, res EvalResult) (acts []Action, decided bool) {
	if c.handingBack() {
		return nil, false
	}
	acts, diverged := c.checkDivergence(now, res)
	return acts, diverged && (c.phase != stopping || len(acts) > 0)
}

// Interrupt stops the run on a signal: the shards stop, the model they
// hold is evaluated and checkpointed, and the report says interrupted.
// Before training started there is nothing to save.
func (c *Core) Interrupt(now time.Time) []Action {
	switch c.phase {
	case registering, starting:
		c.stopReason, c.trainEnd = StopInterrupted, now
		return c.finish()
	case training:
		return c.beginStop(now, StopInterrupted)
	}
	return nil
}

func (c *Core) beginStop(now time.Time, reason string) []Action {
	c.phase, c.stopReason, c.trainEnd, c.steps = stopping, reason, now, c.step
	c.st.StoppedBy, c.st.StopSteps, c.st.TrainSeconds, c.st.FinalEval = reason, c.steps, c.seconds(now), c.finalEval
	return []Action{c.save(), StopShards{}}
}

// resumeStop goes on with a stop a previous chief began (Adopt).
func (c *Core) resumeStop(now time.Time) []Action {
	// (A hand-back may have restored the shards to an earlier step since.)
	c.phase, c.stopReason, c.finalEval, c.steps = stopping, c.st.StoppedBy, c.st.FinalEval, max(c.step, c.st.StopSteps)
	c.trainEnd = c.start.Add(time.Duration(c.st.TrainSeconds * float64(time.Second)))
	c.log.Warn("the previous chief was stopping the run; finishing the stop", "stopped_by", c.stopReason)
	return []Action{c.save(), StopShards{}}
}

// ShardsStopped says every shard was told to stop; versions are their
// versions after it (nil if a shard did not answer).
func (c *Core) ShardsStopped(now time.Time, versions []int64) []Action {
	if len(versions) > 0 {
		// Training went on since the last poll; a shard that restarted
		// meanwhile (version 0) does not undo the steps trained.
		lo := slices.Min(versions)
		c.steps = max(c.steps, lo)
		c.st.StopSteps = c.steps
		copy(c.versions, versions)
		c.versionsStopped = true
	}
	return c.wind(now)
}

// wind orders the next step of the stop once the evaluation and
// checkpoint under way are done: the final model's evaluation (unless a
// target stop evaluated it already), its checkpoint, then the report.
func (c *Core) wind(now time.Time) []Action {
	if c.phase != stopping || c.evalBusy || c.ckptBusy {
		return nil
	}
	if acts := c.bestHandBackDue(); len(acts) > 0 || c.handBackBusy {
		return acts
	}
	if c.finalEval == nil && c.p.Evaluate && !c.finalEvalAsked {
		c.finalEvalAsked = true
		return []Action{c.orderEval(now, Evaluate{Generation: c.st.Generation, Subset: 1, Retain: true})}
	}
	if acts := c.handBackDue(); len(acts) > 0 || c.handBackBusy {
		return acts
	}
	if c.p.Checkpoints && !c.finalCkptAsked {
		c.finalCkptAsked, c.ckptBusy = true, true
		return []Action{Checkpoint{Versions: append([]int64(nil), c.versions...), Latest: c.st.LatestCheckpoint,
			Final: true, Retained: c.stopReason == StopTarget && !c.handingBack(), Stopped: c.versionsStopped, KeepGood: c.keepGood()}}
	}
	return c.finish()
}

// Reinitialised says Reinit is done: checkpoint what the shards now
// hold.
func (c *Core) Reinitialised(now time.Time) []Action {
	return []Action{c.save(), Checkpoint{Versions: append([]int64(nil), c.versions...), Latest: c.st.LatestCheckpoint, Final: true, KeepGood: c.keepGood()}}
}

// CheckpointResult is the outcome of a Checkpoint.
type CheckpointResult struct {
	Final    bool // it was the final checkpoint
	Retained bool // it was of the retained state
	Step     int64
	Bytes    int64
	Pause    time.Duration // the longest lock hold among the shards
	Duration time.Duration
	Skipped  string // why nothing was written, if so
	// Reused says the newest checkpoint (Step) held the final state and
	// was marked final instead of written again.
	Reused bool
	Err    error
	// Positions are the data positions the checkpoint holds; Version
	// the highest version a shard wrote.
	Positions []int64
	Version   int64
}

// CheckpointDone records a checkpoint attempt.
func (c *Core) CheckpointDone(now time.Time, res CheckpointResult) []Action {
	c.ckptBusy = false
	c.bestCheckpointed(res)
	switch {
	case c.lostRetained(res):
		// A shard lost what it retained (it restarted): put the scored
		// model back on every shard and checkpoint that.
		c.log.Error("the shards' retained model is gone; re-initialising them with the model the chief scored", "err", res.Err)
		c.reinitAsked, c.ckptBusy = true, true
		c.st.Generation++
		c.initEpochs(allShards(len(c.versions)))
		return []Action{Reinit{Generation: c.st.Generation, Version: c.finalEval.Step}}
	case res.Err != nil && c.phase == stopping && !res.Final:
		// A routine checkpoint waiting for a version the stopped shards
		// never reach: the final checkpoint covers the end.
		c.log.Info("checkpoint cut short by the stop", "step", res.Step, "why", res.Err)
	case res.Err != nil:
		c.ckptFailedAt = now
		c.st.Checkpoints.Failed++
		c.st.Checkpoints.LastError = res.Err.Error()
		c.st.Checkpoints.FinalFailed = res.Final
		c.m.CheckpointFailures.Inc()
		if res.Final {
			c.log.Error("the final checkpoint failed: the trained model is not saved", "step", res.Step, "err", res.Err)
		} else {
			c.log.Warn("checkpoint failed; training goes on, the next one is tried at the next interval", "step", res.Step, "err", res.Err)
		}
	case res.Skipped != "":
		c.log.Info("checkpoint skipped", "step", res.Step, "why", res.Skipped)
	case res.Reused:
		c.st.Checkpoints.FinalFailed = false
		c.log.Info("the newest checkpoint holds the final state; marked it final", "step", res.Step)
	default:
		c.st.Checkpoints.FinalFailed = false
		c.st.Checkpoints.Committed++
		c.st.LatestCheckpoint = res.Step
		c.noteCheckpointPositions(res.Step, res.Positions)
		c.m.CheckpointDuration.Observe(res.Duration.Seconds())
		c.m.CheckpointSize.Set(float64(res.Bytes))
		c.m.CheckpointLastSuccess.Set(float64(now.UnixNano()) / 1e9)
		c.log.Info("checkpoint committed", "step", res.Step, "bytes", res.Bytes,
			"seconds", fmt.Sprintf("%.3f", res.Duration.Seconds()), "max_pause", res.Pause.Round(time.Microsecond))
	}
	acts := append(c.wind(now), c.sendRollback()...)
	if len(acts) > 0 {
		if _, ok := acts[0].(SaveState); ok {
			return acts // finish saves
		}
	}
	return append([]Action{c.save()}, acts...)
}

// lostRetained says the final checkpoint of the retained state failed
// (a shard lost what it retained), with no re-initialisation tried yet.
func (c *Core) lostRetained(res CheckpointResult) bool {
	return res.Err != nil && res.Retained && res.Final && !c.reinitAsked
}

// finish ends the run with its report.
func (c *Core) finish() []Action {
	c.phase = finished
	return []Action{c.save(), Finish{Report: c.report()}}
}

// byWorker names the non-zero counts by worker ("worker/1").
func byWorker(counts []int64) map[string]int64 {
	out := map[string]int64{}
	for w, n := range counts {
		if n > 0 {
			out[fmt.Sprintf("worker/%d", w)] = n
		}
	}
	return out
}

func (c *Core) report() *report.Report {
	r := c.p.Run
	rep := &report.Report{Mode: string(r.Mode), PS: r.PS, Workers: r.Workers, ReplicasToAggregate: r.Replicas(),
		Staleness: r.Staleness, Hidden: r.Hidden, Model: c.p.Model, Optimizer: r.Optimizer, Batch: r.Batch,
		LR: r.LR, LRSchedule: r.LRSchedule, WarmupSteps: r.WarmupSteps, Momentum: r.Momentum, Epochs: r.Epochs, DataFraction: r.DataFraction, Dataset: r.Dataset,
		Seed: r.Seed, TargetAccuracy: c.p.target(), TargetHold: c.targetHold(), Patience: r.Patience,
		StoppedBy: c.stopReason, GlobalSteps: c.steps, FinalStep: c.steps,
		TestSeconds: c.st.TestSeconds, Evals: c.st.Evals, TimeToTargetSeconds: c.st.TimeToTargetSeconds,
		Restarts: c.st.Restarts, TrainStartedUnix: c.st.TrainStartedUnix, Checkpoints: c.st.Checkpoints,
		Divergences: slices.Clone(c.st.Divergences), RefusedGradients: byWorker(c.refused(false)),
		InitialTestLoss: c.p.InitialLoss, Suspects: append([]report.Suspect{}, c.st.Suspects...), Quarantined: c.quarantinedNames(),
		NonFiniteGradients: byWorker(c.nonFiniteGrads.byWorker(r.Workers, false))}
	if rep.Divergences == nil {
		rep.Divergences = []report.Divergence{}
	}
	rep.MembershipChanges = append([]report.MembershipChange{}, c.st.Membership...)
	rep.LiveWorkers = append([]report.LiveWorkers{}, c.st.LiveWorkers...)
	rep.FinalWorkers = c.workers()
	rep.FinalPS = c.psCount
	rep.DataLedger = append([]report.LedgerEntry{}, c.st.Ledger...)
	rep.DataQueue = c.queueReport()
	if !c.start.IsZero() {
		rep.TrainSeconds = c.trainEnd.Sub(c.start).Seconds()
	}
	rep.StaleGradientsDropped = c.stale / int64(max(1, r.PS)) // every shard drops the same late pushes
	samples := c.samplesAt(c.steps)
	rep.EpochsDone = samples / float64(max(1, c.p.TrainN))
	if rep.TrainSeconds > 0 {
		rep.SamplesPerSecond = samples / rep.TrainSeconds
	}
	for _, e := range rep.Evals {
		if !e.Subset {
			rep.BestTestAccuracy = max(rep.BestTestAccuracy, e.TestAccuracy)
		}
	}
	if c.finalEval != nil {
		rep.TestAccuracy, rep.FinalStep = c.finalEval.TestAccuracy, c.finalEval.Step
		if c.p.Spec.IsCTR() {
			rep.AUC, rep.LogLoss, rep.NormalizedEntropy = c.finalEval.AUC, c.finalEval.TestLoss, c.finalEval.NormalizedEntropy
		}
	}
	rep.Ruined = c.ruined()
	rep.Wire = c.wireReport()
	if hb := c.st.HandedBack; hb != nil {
		if hb.Err == "" && hb.Step >= 0 {
			rep.FinalStep = hb.Step // (its evaluation may have failed)
		}
		cp := *hb
		cp.Tried = slices.Clone(hb.Tried)
		rep.HandedBack = &cp
	}
	return rep
}
