package chief

import (
	"slices"
	"time"

	"github.com/pstrain/pstrain/ml/partition"
)

// A change of the PS count in an async or ssp run (docs/elastic.md,
// "Parameter servers"; the sync way is in core_psscale.go). The shards
// are at versions of their own and workers at different points of their
// steps, so there is no step boundary to hold at. Instead:
//
//  1. the hold is at the lowest version polled, which every shard has
//     reached (versions only grow between restores, and none is under
//     way): every shard holds every worker's pull from the moment it
//     hears it, and still applies the gradients of the pulls it answered
//     before (ps.Shard.held);
//  2. the moment every shard took it the new count is published; a
//     worker that hears it ends its training loop after the pushes
//     under way are answered (its pulls are held: it starts no other
//     step), switches layouts and says so;
//  3. meanwhile, at the next poll, every shard snapshots at once, at its
//     own version, with the workers' data positions: the last pushes
//     have usually landed by then;
//  4. when every live worker said it switched (or StartupTimeout
//     passed), no gradient is on its way to the old layout any more. A
//     poll begun after that which finds the shards as they were when
//     the snapshot was ordered (psPrint: versions, gradients refused
//     and dropped, generations; each only grows) proves the snapshot
//     holds everything; if they moved, they snapshot again;
//  5. the new layout is initialised from that checkpoint at the highest
//     version a shard snapshotted, so the learning-rate schedule and the
//     run's end (the first shard at MaxSteps ends the run) go on from
//     where the furthest shard was; no gradient is lost or applied twice,
//     and each worker goes on from its position.
//
// A failed checkpoint drops the change: the count in effect is
// published again, the workers switch back, and the hold released.

// psAsync is the async and ssp part of a change under way.
type psAsync struct {
	// settled: every live worker said it switched (or the wait timed
	// out) before a tick that saw it; a poll of a later tick came after
	// their last pushes.
	settled bool
	// snapped: the last snapshot is written; snapPrint is the shards'
	// print at the poll before it was ordered.
	snapped   bool
	snapPrint []int64
	// nudged: the loop was asked for a poll at once (PSPollSoon).
	nudged bool
}

// psPrint is what the shards said at a poll that any applied, refused or
// dropped gradient (or a restore) changes: by shard, its version, the
// gradients its norm guard refused, the non-finite ones, its generation.
func psPrint(shards []ShardStatus) []int64 {
	out := make([]int64, 0, 4*len(shards))
	for _, x := range shards {
		var refused, nonFinite int64
		for _, n := range x.Refused {
			refused += n
		}
		for _, n := range x.NonFinite {
			nonFinite += n
		}
		out = append(out, x.Version, refused, nonFinite, x.Generation)
	}
	return out
}

// psHoldAsync orders the hold of every shard at once, unless the run
// ends first: each live worker may push one more gradient after it.
func (c *Core) psHoldAsync(now time.Time, ch *psChange) []Action {
	if slices.Max(c.versions)+int64(c.workers())+2 >= c.MaxSteps() {
		c.log.Info("the run ends before a PS count change could take effect", "ps", c.psCount, "asked", ch.newLayout().String())
		c.keepLayout()
		return []Action{c.save()}
	}
	ch.at = max(1, slices.Min(c.versions))
	ch.heldAt = now
	c.log.Info("PS count change: holding every shard's pulls (async: at the versions they are at)", "from", ch.from, "to", ch.to, "versions", slices.Clone(c.versions))
	return c.membership(now)
}

// psPublishAsync publishes the new count the moment every shard took the
// hold (since the hold's order: the caller has no clock).
func (c *Core) psPublishAsync(ch *psChange) {
	ch.published, ch.publishedAt = true, ch.heldAt
	c.psAcks = map[int]partition.Layout{}
	c.log.Info("PS count change: every shard holds the pulls; workers switch layouts once their pushes are answered", "ps", ch.to)
}

// tickPSAsync advances a published async or ssp change (see above).
func (c *Core) tickPSAsync(now time.Time, ch *psChange) []Action {
	a := &ch.async
	settled := a.settled // (seen at an earlier tick: this tick's poll came after)
	a.settled = settled || now.Sub(ch.publishedAt) >= c.p.StartupTimeout || c.PSSwitchReady(now)
	a.nudged = false
	moved := !slices.Equal(a.snapPrint, c.print)
	switch {
	case ch.snapping:
		return nil
	case settled && a.snapped && !moved:
		c.log.Info("PS count change: every worker switched and the snapshot holds every gradient; switching layouts", "step", c.st.LatestCheckpoint, "version", ch.reached, "ps", ch.to)
		return c.orderSwitch(ch, c.st.LatestCheckpoint)
	case !a.snapped || (settled && moved):
		if a.snapped {
			c.log.Info("PS count change: the shards moved after their snapshot; snapshotting again", "was", a.snapPrint, "now", c.print)
		}
		ch.snapping, a.snapped = true, false
		a.snapPrint = slices.Clone(c.print)
		c.ckptBusy = true
		step := max(slices.Max(c.versions), c.st.LatestCheckpoint+1)
		return []Action{SnapshotShards{Step: step, Latest: c.st.LatestCheckpoint, To: ch.newLayout(), Own: true}}
	}
	return nil
}

// psSnapshottedAsync notes the shards' checkpoint written (res.Version:
// the highest version a shard snapshotted); the next tick decides
// whether it holds every gradient.
func (c *Core) psSnapshottedAsync(ch *psChange, res CheckpointResult) []Action {
	ch.snapping, ch.async.snapped = false, true
	ch.reached = res.Version
	c.log.Info("PS count change: every shard's checkpoint is written", "step", res.Step, "version", res.Version, "ps", ch.to)
	return []Action{c.save()}
}

// PSPollSoon says the loop should poll the shards at once rather than at
// its next tick: an async or ssp change has every worker switched and
// its snapshot written, and only a poll can tell it may switch. It says
// so once per tick of the change (a shard down, which stops the change's
// ticks, does not make the loop spin).
func (c *Core) PSPollSoon() bool {
	ch := c.psChange
	if ch == nil || !c.asyncElastic() || !ch.async.settled || !ch.async.snapped || ch.snapping || ch.switching || ch.async.nudged {
		return false
	}
	ch.async.nudged = true
	return true
}
