package chief

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/report"
)

// Elastic workers in async and ssp runs (docs/elastic.md). There is no
// lockstep, so a change cannot wait for a step boundary: the new era of
// the data plan starts at a global epoch E that each worker enters when
// it has read its epoch E-1, whenever that is.
//
//  1. Hold. The plan with Hold = E (E past every epoch a worker said it
//     reads) is what heartbeat answers and registrations hand out. A
//     worker that has read no batch of epoch E takes it and reads no
//     batch of E until the next plan; one that has refuses it, and the
//     core moves E past it.
//  2. Publish. Once every live member of the current era took the hold
//     (its heartbeat says so; StartupTimeout bounds the wait), the plan
//     with the new era from epoch E on is the run's: a worker reaching E
//     reads its new shard; an added worker is admitted by the shards at
//     once and reads its shard of epoch E; a removed worker reads the
//     rest of its old shard up to E. The report records the change here.
//  3. Retire. A removed worker that has read all its batches waits (its
//     heartbeat says so, and every gradient it sent was answered); the
//     core retires it: the shards take it out of the live set (ssp's
//     bound no longer waits for it) and its heartbeat answer says stop,
//     so it ends with status 0. The change is over once every removed
//     worker is retired (or dead).
//
// The shards' members only grow in these modes (the most workers any
// era had): a removed worker's last gradients count wherever they
// arrive, and retired says who is gone.

// asyncChange is an async or ssp membership change under way.
type asyncChange struct {
	from, to     int
	epoch        int64     // the global epoch the new era starts at (the hold)
	asked, began time.Time // asked for; the hold first published
	published    bool      // the new era is in the run's plan
	leaving      []int     // removed workers that have not read all their batches
}

// dataRead is what a worker's last heartbeat said of its reading.
type dataRead struct {
	pos     int64 // the position of the next batch it reads
	hold    int64 // the hold of the plan it uses
	waiting bool  // its reading waits for the chief
	// rate is the batches a second it read over the last window of at
	// least rateWindow heartbeat intervals, from (fromPos, from): one
	// pair of heartbeats a CPU-starved process sent late and then at
	// once would make it many times too high.
	rate     float64
	fromPos  int64
	from, at time.Time
	// want is the unread batches the data queue last meant it to hold
	// (core_queue.go).
	want int64
}

// rateWindow is the heartbeat intervals a worker's reading rate is
// measured over.
const rateWindow = 4

// DataRead records what worker's heartbeat at now says of its reading
// (HeartbeatRequest.data_position, plan_hold, data_waiting).
func (c *Core) DataRead(worker int, pos, hold int64, waiting bool, now time.Time) {
	if c.reads == nil {
		c.reads = map[int]dataRead{}
	}
	r, ok := c.reads[worker]
	if !ok || pos < r.fromPos {
		r.fromPos, r.from = pos, now
	}
	if dt := now.Sub(r.from); dt >= rateWindow*heartbeatEvery(c.p.Run.HeartbeatTimeout) {
		r.rate = float64(pos-r.fromPos) / dt.Seconds()
		r.fromPos, r.from = pos, now
	}
	r.pos, r.hold, r.waiting, r.at = pos, hold, waiting, now
	c.reads[worker] = r
}

// asyncElastic says changes follow this file's protocol.
func (c *Core) asyncElastic() bool { return c.p.Run.Mode != config.Sync }

// asyncHold is the hold the plan handed out carries (0: none).
func (c *Core) asyncHold() int64 {
	if ch := c.ach; ch != nil && !ch.published {
		return ch.epoch
	}
	return 0
}

// tickElasticAsync advances an async or ssp change; called when the
// shards answered a poll and no restore or rollback is under way.
func (c *Core) tickElasticAsync(now time.Time) []Action {
	c.m.Workers.Set(float64(c.workers()))
	ch := c.ach
	switch {
	case ch == nil && c.target != c.workers() && c.psChange == nil && c.st.Plan.Queued():
		return c.scaleQueue(now)
	case ch == nil && c.target != c.workers() && c.psChange == nil:
		c.beginAsync(now)
		return nil
	case ch == nil:
		return nil
	case !ch.published:
		return c.placeHold(now)
	}
	return c.retireLeaving(now)
}

// beginAsync publishes a hold past every epoch a worker said it reads.
func (c *Core) beginAsync(now time.Time) {
	epoch := max(c.st.Plan.Last().Epoch+1, c.readEpoch())
	if c.pastEnd(epoch) {
		return
	}
	c.ach = &asyncChange{from: c.workers(), to: c.target, epoch: epoch, asked: c.targetAsked, began: now}
	c.log.Info("membership change: holding the workers at the next epoch", "from", c.workers(), "to", c.target, "epoch", epoch)
}

// pastEnd says a change at epoch would come after the run's last epoch
// (--epochs), and logs so once: the worker count stays.
func (c *Core) pastEnd(epoch int64) bool {
	if float64(epoch) < c.p.Run.Epochs {
		return false
	}
	if !c.endNoted {
		c.endNoted = true
		c.log.Info("the run ends before the next epoch boundary: the worker count stays", "workers", c.workers(), "asked", c.target, "epoch", epoch)
	}
	return true
}

// readEpoch is an epoch no member of the current era will have read a
// batch of before it hears of a hold there: past the epoch each said
// it reads (DataPlan.NextEpoch of its last heartbeat) by the epochs it
// reads, at its last rate, in three heartbeat intervals (the hold's
// way to it, its acknowledgement's, the new plan's). Epochs of minutes
// make that the next epoch; a run of short epochs holds further ahead.
func (c *Core) readEpoch() int64 {
	p := c.st.Plan
	e := p.Last().Epoch
	ahead := 3 * heartbeatEvery(c.p.Run.HeartbeatTimeout).Seconds()
	for w, r := range c.reads {
		e = max(e, p.NextEpoch(w, r.pos+int64(math.Ceil(r.rate*ahead))))
	}
	return e
}

// readPast says a worker said it has read a batch of epoch or later.
func (c *Core) readPast(epoch int64) bool {
	for w, r := range c.reads {
		if c.st.Plan.NextEpoch(w, r.pos) > epoch {
			return true
		}
	}
	return false
}

// heartbeatEvery is how often a worker sends a heartbeat
// (worker.Heartbeats).
func heartbeatEvery(timeout time.Duration) time.Duration {
	return max(timeout/4, 50*time.Millisecond)
}

// placeHold moves the hold past any worker that read beyond it and
// publishes the new era once every live member took it.
func (c *Core) placeHold(now time.Time) []Action {
	ch := c.ach
	if c.target != ch.to {
		ch.to = c.target
		if ch.to == ch.from {
			c.log.Info("membership change dropped: the count asked for is the count in effect", "workers", ch.from)
			c.ach = nil
			return nil
		}
	}
	if c.readPast(ch.epoch) {
		e := c.readEpoch()
		c.log.Info("membership change: a worker read past the hold; holding at a later epoch", "epoch", e, "was", ch.epoch)
		ch.epoch = e
		if c.pastEnd(e) {
			c.ach = nil // (the plan handed out has no hold any more)
			return nil
		}
	}
	var waiting []int
	for _, w := range c.members.Live(now) {
		if w < c.workers() && !c.retired[w] && !c.isQuarantined(w) && c.reads[w].hold != ch.epoch {
			waiting = append(waiting, w)
		}
	}
	if len(waiting) > 0 && now.Sub(ch.began) < c.p.StartupTimeout {
		if now.Sub(c.lastNag) >= 5*time.Second {
			c.lastNag = now
			c.log.Info("membership change: waiting for workers to take the hold", "epoch", ch.epoch, "workers", waiting)
		}
		return nil
	}
	return c.publish(now)
}

// publish makes the new era the run's.
func (c *Core) publish(now time.Time) []Action {
	ch := c.ach
	at := max(c.st.Plan.Last().Step, slices.Max(c.versions))
	c.st.Plan = c.st.Plan.Scale(at, ch.epoch, ch.to)
	ch.published = true
	for w := ch.from; w < ch.to; w++ {
		delete(c.retired, w)
	}
	for w := ch.to; w < ch.from; w++ {
		ch.leaving = append(ch.leaving, w)
	}
	chg := report.MembershipChange{Step: at, Epoch: ch.epoch, Seconds: c.seconds(now), AskedSeconds: c.seconds(ch.asked),
		From: ch.from, To: ch.to}
	c.st.Membership = append(c.st.Membership, chg)
	c.m.MembershipChanges.Inc()
	c.m.Workers.Set(float64(ch.to))
	c.log.Warn("workers changed", "from", ch.from, "to", ch.to, "step", at, "epoch", ch.epoch,
		"hold_seconds", fmt.Sprintf("%.2f", now.Sub(ch.began).Seconds()))
	if len(ch.leaving) == 0 {
		c.ach = nil
	}
	return append(c.membership(now), c.save())
}

// retireLeaving retires the removed workers that read all their
// batches (or died), and ends the change when none is left.
func (c *Core) retireLeaving(now time.Time) []Action {
	ch := c.ach
	live := c.members.Live(now)
	var left []int
	for _, w := range ch.leaving {
		end, _ := c.st.Plan.Ends(w)
		r := c.reads[w]
		switch done := r.waiting && r.pos >= end; {
		case done:
			c.log.Info("removed worker read all its batches: retired", "worker", w, "position", r.pos)
		case !slices.Contains(live, w):
			c.log.Warn("removed worker gone before reading all its batches: the rest of its shard is not trained this epoch",
				"worker", w, "position", r.pos, "end", end)
		default:
			left = append(left, w)
			continue
		}
		c.retired[w] = true
	}
	ch.leaving = left
	if len(left) == 0 {
		c.ach = nil
		c.log.Info("membership change complete", "workers", ch.to)
	}
	return c.membership(now)
}

// asyncMembership completes a SetMembership in an async or ssp elastic
// run: members are the most workers any era had, the retired workers
// (but those being added back) are out of the live set.
func (c *Core) asyncMembership(a SetMembership) SetMembership {
	for _, e := range c.st.Plan.Eras {
		a.Members = max(a.Members, e.Workers)
	}
	a.MaxVersion = c.MaxSteps()
	for w := range c.retired {
		if !c.beingAdded(w) {
			a.Retired = append(a.Retired, int32(w))
		}
	}
	slices.Sort(a.Retired)
	a.Live = slices.DeleteFunc(slices.Clone(a.Live), func(w int32) bool { return slices.Contains(a.Retired, w) })
	a.HoldAt = c.psHoldAt() // (a change of the PS count: core_psscale_async.go)
	return a
}

// beingAdded says worker is one the async or ssp change under way adds
// back (removed earlier): not retired any more.
func (c *Core) beingAdded(worker int) bool {
	ch := c.ach
	return ch != nil && !ch.published && worker >= ch.from && worker < ch.to
}

// stopRetired says an async or ssp run's worker is retired: its
// heartbeat answer tells it to stop (it waits past its last batch).
func (c *Core) stopRetired(worker int) bool {
	return c.asyncElastic() && c.retired[worker] && !c.beingAdded(worker)
}
