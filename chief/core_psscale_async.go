package chief

import (
	"slices"
	"time"
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
//  2. once every shard took it the new count is published at once;
//     a worker that hears it ends its training loop after the pushes
//     under way are answered (its pulls are held: it starts no other
//     step), switches layouts and says so;
//  3. when every live worker did (or StartupTimeout passed), no gradient
//     is on its way to the old layout: each shard snapshots at once, at
//     its own version, with the workers' data positions;
//  4. the new layout is initialised from that checkpoint at the highest
//     version a shard snapshotted, so the learning-rate schedule and the
//     run's end (the first shard at MaxSteps ends the run) go on from
//     where the furthest shard was; no gradient is lost or applied twice,
//     and each worker goes on from its position.
//
// A failed checkpoint drops the change: the count in effect is
// published again, the workers switch back, and the hold is released.

// psHoldAsync orders the hold of every shard at once, unless the run
// ends first: each live worker may push one more gradient after it.
func (c *Core) psHoldAsync(now time.Time, ch *psChange) []Action {
	if slices.Max(c.versions)+int64(c.workers())+2 >= c.MaxSteps() {
		c.log.Info("the run ends before a PS count change could take effect", "ps", c.psCount, "asked", ch.to)
		c.psChange, c.psTarget = nil, c.psCount
		return nil
	}
	ch.at = max(1, slices.Min(c.versions))
	ch.heldAt = now
	c.log.Info("PS count change: holding every shard's pulls (async: at the versions they are at)", "from", ch.from, "to", ch.to, "versions", slices.Clone(c.versions))
	return c.membership(now)
}

// tickPSAsync advances a held async or ssp change: the count is
// published, then the shards snapshot once every worker switched.
func (c *Core) tickPSAsync(now time.Time, ch *psChange) []Action {
	switch {
	case !ch.published:
		ch.published, ch.publishedAt = true, now
		c.psAcks = map[int]int{}
		c.log.Info("PS count change: every shard holds the pulls; workers switch layouts once their pushes are answered", "ps", ch.to)
		return nil
	case ch.snapping || (now.Sub(ch.publishedAt) < c.p.StartupTimeout && !c.PSSwitchReady(now)):
		return nil
	}
	ch.snapping = true
	c.ckptBusy = true
	step := max(slices.Max(c.versions), c.st.LatestCheckpoint+1)
	return []Action{SnapshotShards{Step: step, Latest: c.st.LatestCheckpoint, To: ch.to, Own: true}}
}

// psSnapshottedAsync orders the switch once the shards' checkpoint is
// written (res.Version: the highest version a shard snapshotted).
func (c *Core) psSnapshottedAsync(now time.Time, ch *psChange, res CheckpointResult) []Action {
	ch.reached = res.Version
	ch.switching = true
	c.st.Generation++
	c.log.Info("PS count change: every shard's checkpoint is written; switching layouts", "step", res.Step, "version", res.Version, "ps", ch.to)
	return []Action{c.save(), SwitchLayout{From: ch.from, To: ch.to, Step: res.Step, Generation: c.st.Generation}}
}
