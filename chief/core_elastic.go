package chief

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/report"
)

// Elastic workers (docs/elastic.md): the worker count of a sync run may
// change while it trains, by Scale (`pstrain scale`) or by a worker
// registering with the next index. A change takes effect at the next
// epoch boundary of the data plan, which in a sync run is a step
// boundary:
//
//  1. the core picks the boundary (DataPlan.Boundary past the shards'
//     versions) and orders a hold there (SetMembership.HoldAt): the
//     shards complete the step before it under the old membership and
//     answer no worker's pull at it. A shard already there refuses the
//     hold (MembershipRefused) and the core tries the next boundary;
//  2. once every shard took the hold, the new plan (one more era) is
//     published: heartbeats and registrations carry it, and each worker
//     loads its new data shard before it acknowledges it;
//  3. when every shard is at the boundary, every live worker of the new
//     era acknowledged the plan and every joining worker registered (or
//     StartupTimeout passed), the core releases the hold with the new
//     membership: members, the removed workers (their pulls answer done:
//     they exit 0), the replicas to aggregate and the run's new last
//     step (the same number of samples as before).

// ErrScale is matched by the errors of a refused Scale.
var ErrScale = errors.New("cannot scale")

// change is a membership change under way.
type change struct {
	from, to  int
	at, epoch int64     // the boundary: step, and data epoch starting there
	asked     time.Time // when it was asked for
	held      bool      // every shard took the hold
	heldAt    time.Time
	plan      dataset.DataPlan // the plan with the new era (published once held)
}

// workers is the run's worker count in effect (the data plan's last era).
func (c *Core) workers() int { return c.st.Plan.Last().Workers }

// elastic says the membership differs from the run's start (or is
// changing): SetMembership then carries the whole of it.
func (c *Core) elastic() bool {
	return len(c.st.Plan.Eras) > 1 || c.change != nil || c.ach != nil || c.psHoldAt() > 0
}

// Scale asks for workers workers. It takes effect at an epoch boundary
// (see above); asking again before then replaces the target.
func (c *Core) Scale(workers int, now time.Time) error {
	r := c.p.Run
	switch {
	case workers < 1:
		return fmt.Errorf("%w: --workers must be at least 1, got %d", ErrScale, workers)
	case workers > r.WorkerSlots():
		return fmt.Errorf("%w: --workers %d is more than the run's --max-workers %d", ErrScale, workers, r.WorkerSlots())
	case c.phase >= stopping:
		return fmt.Errorf("%w: the run is stopping", ErrScale)
	}
	if workers != c.target {
		c.log.Info("scale asked", "workers", workers, "now", c.workers())
		c.target, c.targetAsked = workers, now
	}
	return nil
}

// Target is the worker count asked for (the count in effect when none
// was).
func (c *Core) Target() int { return c.target }

// DataSlots is, for a run whose data plan has changed (more than one
// era), the most workers any era had: the data positions a checkpoint of
// this run records cover at most that many. 0 for a run that never
// scaled (the positions are then one per --workers).
func (c *Core) DataSlots() int {
	if len(c.st.Plan.Eras) <= 1 {
		return 0
	}
	n := 0
	for _, e := range c.st.Plan.Eras {
		n = max(n, e.Workers)
	}
	return n
}

// Plan is the data plan workers are to use: the next one once a change
// is held (workers load it before the release), else the current one.
func (c *Core) Plan() dataset.DataPlan {
	if c.change != nil && c.change.held {
		return c.change.plan
	}
	if h := c.asyncHold(); h > 0 {
		p := c.st.Plan
		p.Hold = h
		return p
	}
	return c.st.Plan
}

// tickElastic advances a membership change; called when the shards
// answered a poll and no restore or rollback is under way.
func (c *Core) tickElastic(now time.Time) []Action {
	if c.asyncElastic() {
		return c.tickElasticAsync(now)
	}
	c.m.Workers.Set(float64(c.workers()))
	ch := c.change
	switch {
	case ch == nil && c.target != c.workers() && c.psChange == nil:
		return c.beginChange(now)
	case ch == nil || !ch.held:
		return nil
	case ch.heldAt.IsZero():
		ch.heldAt = now
	}
	for _, v := range c.versions {
		if v < ch.at {
			return nil
		}
	}
	if waiting := c.notReady(now, ch); len(waiting) > 0 {
		if now.Sub(c.lastNag) >= 5*time.Second {
			c.lastNag = now
			c.log.Info("membership change: waiting for workers", "step", ch.at, "workers", waiting)
		}
		return nil
	}
	return c.release(now)
}

// beginChange orders a hold at the next epoch boundary the shards have
// not reached.
func (c *Core) beginChange(now time.Time) []Action {
	at, epoch := c.st.Plan.Boundary(slices.Max(c.versions) + 2)
	if at >= c.MaxSteps() {
		if !c.endNoted {
			c.endNoted = true
			c.log.Info("the run ends before the next epoch boundary: the worker count stays", "workers", c.workers(), "asked", c.target)
		}
		return nil
	}
	c.change = &change{from: c.workers(), to: c.target, at: at, epoch: epoch, asked: c.targetAsked}
	live := c.members.Live(now)
	for w := c.workers(); w < c.target; w++ {
		// Joining: the release waits for each to register, again for one
		// removed earlier that is not heard from (its process exited).
		if c.retired[w] && !slices.Contains(live, w) {
			c.workerSeen[w] = false
		}
	}
	c.log.Info("membership change: holding the shards at the next epoch boundary", "from", c.workers(), "to", c.target, "step", at, "epoch", epoch)
	return c.membership(now)
}

// MembershipRefused says a shard refused the hold (it had reached the
// boundary): every shard is told to drop it, and the next tick picks a
// later boundary.
func (c *Core) MembershipRefused(now time.Time) []Action {
	if ch := c.psChange; ch != nil && ch.at > 0 && !ch.held {
		return c.psHoldRefused(now)
	}
	if c.change == nil || c.change.held {
		return nil
	}
	c.log.Info("membership change: a shard was past the boundary; trying the next one", "step", c.change.at)
	c.change = nil
	// Some shards may have taken the refused request: until the next one
	// is heard by all, any of them may retire what it retired.
	if c.pending != nil {
		c.retiredHeard = mergeRetired(c.retiredHeard, c.pending.Retired)
	}
	c.lastSent = nil
	return c.membership(now)
}

// mergeRetired is the sorted union of two retired lists.
func mergeRetired(a, b []int32) []int32 {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// heldSent notes that every shard took the hold: the new plan is
// published.
func (c *Core) heldSent() {
	ch := c.change
	if ch == nil || ch.held || c.lastSent == nil || c.lastSent.HoldAt != ch.at {
		return
	}
	ch.held = true // (heldAt: at the next tick)
	ch.plan = c.st.Plan.Scale(ch.at, ch.epoch, ch.to)
	c.acks = map[int]int{}
}

// notReady lists the workers the release waits for, up to
// StartupTimeout after the hold: live members of the new era that have
// not acknowledged its plan, and joining workers that have not
// registered. So every live member has the plan before it pulls the
// boundary step; one that does not (a worker too old to say which plan
// it uses) is released without after the timeout.
func (c *Core) notReady(now time.Time, ch *change) []int {
	if now.Sub(ch.heldAt) >= c.p.StartupTimeout {
		return nil // (tickElastic's log named the workers waited for)
	}
	var out []int
	for _, w := range c.members.Live(now) {
		if w < ch.to && c.acks[w] < len(ch.plan.Eras) {
			out = append(out, w)
		}
	}
	for w := ch.from; w < ch.to; w++ {
		if !c.workerSeen[w] {
			out = append(out, w)
		}
	}
	return out
}

// release ends the hold with the new membership.
func (c *Core) release(now time.Time) []Action {
	ch := c.change
	c.change = nil
	r := c.p.Run
	rOld, rNew := r.ReplicasFor(ch.from), r.ReplicasFor(ch.to)
	// The same samples as the run would have trained: the steps left, at
	// the new step's size.
	left := c.MaxSteps() - ch.at
	c.st.MaxSteps = ch.at + (left*int64(rOld)+int64(rNew)-1)/int64(rNew)
	c.st.Plan = ch.plan
	for w := ch.to; w < ch.from; w++ {
		c.retired[w] = true
	}
	for w := ch.from; w < ch.to; w++ {
		delete(c.retired, w)
	}
	chg := report.MembershipChange{Step: ch.at, Epoch: ch.epoch, Seconds: c.seconds(now), AskedSeconds: c.seconds(ch.asked),
		From: ch.from, To: ch.to}
	c.st.Membership = append(c.st.Membership, chg)
	c.m.MembershipChanges.Inc()
	c.m.Workers.Set(float64(ch.to))
	c.log.Warn("workers changed", "from", ch.from, "to", ch.to, "step", ch.at, "epoch", ch.epoch,
		"max_steps", c.st.MaxSteps, "pause_seconds", fmt.Sprintf("%.2f", now.Sub(ch.heldAt).Seconds()))
	return append(c.membership(now), c.save())
}

// membershipAction is the SetMembership that says live and, in an
// elastic run, the whole membership.
func (c *Core) membershipAction(live []int32) SetMembership {
	a := SetMembership{Live: live}
	if len(c.st.Quarantined) > 0 {
		a.Live = slices.DeleteFunc(slices.Clone(live), func(w int32) bool { return c.isQuarantined(int(w)) })
		for _, w := range c.st.Quarantined {
			a.Quarantined = append(a.Quarantined, int32(w))
		}
	}
	if !c.elastic() {
		return a
	}
	if c.asyncElastic() {
		return c.asyncMembership(a)
	}
	a.Members = c.workers()
	a.Replicas = c.p.Run.ReplicasFor(a.Members)
	a.MaxVersion = c.MaxSteps()
	for w := range c.retired {
		if ch := c.change; ch != nil && w >= ch.from && w < ch.to {
			// Being added back: not retired any more, and not a member
			// until the release, so the shards hold its pulls rather than
			// answer "done" (which would end the new process at once).
			continue
		}
		a.Retired = append(a.Retired, int32(w))
	}
	slices.Sort(a.Retired)
	if c.change != nil {
		a.HoldAt = c.change.at
	} else if at := c.psHoldAt(); at > 0 {
		a.HoldAt = at
	}
	return a
}

// PlanAcked records that worker uses a data plan of eras eras (its
// heartbeat says so).
func (c *Core) PlanAcked(worker, eras int) {
	if c.acks != nil {
		c.acks[worker] = eras
	}
}

// admit checks that worker index may register: one of the run's
// --workers, one a scale-up is adding, or (sync, training) the next
// index or a later one below --max-workers, which asks for index+1
// workers.
func (c *Core) admit(index int, now time.Time) error {
	r := c.p.Run
	switch {
	case index < 0 || index >= len(c.workerSeen):
		return fmt.Errorf("%w: worker index %d out of range (the run has at most %d: --max-workers)", ErrBadTask, index, len(c.workerSeen))
	case index < r.Workers && c.phase < training:
		return nil
	case index < c.target && c.target > c.workers() && (c.retired[index] || c.shardsRetire(index)):
		// Removed before, added again: no longer retired, but until
		// every shard has heard so it would answer the new process's
		// first pull with "done" and end it; the task retries.
		delete(c.retired, index)
		if c.shardsRetire(index) {
			return fmt.Errorf("%w: the shards are being told that worker %d is back", ErrNotYet, index)
		}
		return nil
	case index < max(c.target, c.workers()) && !c.retired[index]:
		return nil
	case c.phase < training:
		return fmt.Errorf("%w: worker index %d out of range (the run has %d)", ErrBadTask, index, r.Workers)
	}
	return c.admitLate(index, now)
}

// admitLate is admit for an index past the run's workers once training
// began.
func (c *Core) admitLate(index int, now time.Time) error {
	if c.phase == training && index >= c.target {
		// A worker started by hand with the next index (or a later one:
		// pods start in any order): the run grows to index+1 workers.
		return c.Scale(index+1, now)
	}
	return fmt.Errorf("%w: worker index %d: the run has %d workers (the next index is %d)", ErrBadTask, index, c.workers(), c.target)
}

// shardsRetire says the membership every shard last heard, or the one
// ordered and maybe not heard by all yet, retires worker index.
func (c *Core) shardsRetire(index int) bool {
	if c.pending != nil && slices.Contains(c.pending.Retired, int32(index)) {
		// (Still on its way to some shard, which would answer the
		// worker's first pull "done" once it hears it.)
		return true
	}
	if c.lastSent == nil {
		// Not known (a membership to be said again after a refused hold
		// or a restore): what the shards last heard, or may have.
		return slices.Contains(c.retiredHeard, int32(index))
	}
	return slices.Contains(c.lastSent.Retired, int32(index))
}

// HeartbeatPlan records the data plan's eras worker uses and returns the
// plan it is to use when that differs (ok): other eras, another hold,
// or other chunks of the data queue (leases: those its plan has).
func (c *Core) HeartbeatPlan(worker, eras, leases int) (dataset.DataPlan, bool) {
	c.PlanAcked(worker, eras)
	p := c.planFor(worker)
	if c.phase < training {
		// A restarted chief before it adopted the cluster has a new
		// plan, not the run's: the workers keep theirs.
		return p, false
	}
	return p, eras != len(p.Eras) || c.reads[worker].hold != p.Hold || int64(leases)*int64(p.Chunk) != p.Leased(worker)
}

// adoptPlan takes the worker count from a saved state's data plan (a
// restarted chief); a change that was under way is dropped (its hold is
// released by the first SetMembership, which carries none).
func (c *Core) adoptPlan() {
	if len(c.st.Plan.Eras) == 0 {
		c.st.Plan = initialPlan(c.p)
	}
	most := 0
	for _, e := range c.st.Plan.Eras {
		most = max(most, e.Workers)
	}
	for w := c.workers(); w < most; w++ {
		c.retired[w] = true
	}
	c.target = c.workers()
	if c.elastic() {
		c.m.Workers.Set(float64(c.workers()))
	}
}

// samplesAt is the samples the model's steps up to step consumed: each
// era's steps at its step's size (SamplesPerStep with its workers).
func (c *Core) samplesAt(step int64) float64 {
	r := c.p.Run
	if r.Mode != config.Sync || len(c.st.Plan.Eras) < 2 {
		return float64(step) * float64(SamplesPerStep(r))
	}
	var n float64
	eras := c.st.Plan.Eras
	for k, e := range eras {
		end := step
		if k+1 < len(eras) {
			end = min(step, eras[k+1].Step)
		}
		if k == 0 {
			e.Step = 0
		}
		if end > e.Step {
			n += float64(end-e.Step) * float64(r.Batch*r.ReplicasFor(e.Workers))
		}
	}
	return n
}
