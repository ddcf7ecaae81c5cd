package chief

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/report"
)

// Parameter servers added and removed live (docs/elastic.md, "Parameter
// servers"): a run's PS count may change while it trains, by ScalePS
// (`pstrain scale --ps N`). The model's row blocks move to the layout of
// the new count (partition.New). In a sync run, at a step boundary:
//
//  1. the core waits for the added PS processes to register, and for no
//     evaluation or checkpoint to be under way (both read the layout);
//  2. it orders a hold two steps past the shards' versions
//     (SetMembership.HoldAt): every shard completes the steps before it
//     and answers no worker's pull at it. A shard already there refuses
//     the hold and the core tries again further on;
//  3. once every shard is at the boundary it orders SnapshotShards: a
//     checkpoint of that step (parameters, optimizer state, data
//     positions), which is also the run's newest checkpoint;
//  4. then it publishes the new PS count: heartbeat answers carry it,
//     workers stop their step (their pulls are held), switch to the new
//     layout and say so in their next heartbeat;
//  5. when every live worker did (or StartupTimeout passed), it orders
//     SwitchLayout: every shard of the new layout is initialised from
//     that checkpoint, resharded, at the boundary's version, in a new
//     generation, and the removed PS are stopped (they exit 0). The
//     held pulls are answered by the new layout and step S is its first.
//
// No step is lost (the snapshot is of the boundary, and nothing trains
// between it and the switch) and none is rolled back.
//
// An async or ssp run has no step boundary: each shard is at its own
// version. There the core (core_psscale_async.go) holds every shard at
// once (a hold at the lowest version polled, which every shard has
// reached: it answers no worker's pull from then on, and still applies
// the gradients of pulls answered before), publishes the new count at
// once and snapshots the shards; it switches once every live worker
// said it uses the new layout (a worker switches after its last pushes
// were answered) and a later poll shows the shards unchanged since the
// snapshot, which therefore holds every gradient sent to the old layout
// and each worker's data position with it. The new layout starts at the
// highest version a shard snapshotted.

// psChange is a change of the PS count under way, or a rebalance (the
// same count, other weights: core_rebalance.go).
type psChange struct {
	from, to int
	// weights are the new layout's (nil: equal shares), imbalance the
	// measured imbalance a rebalance was asked for with.
	weights   []int
	imbalance float64
	asked     time.Time
	at        int64 // the hold's step (0: not ordered yet)
	held      bool  // every shard took the hold
	// heldAt is when the pause began: sync, the first poll that saw
	// every shard at the hold; async and ssp, the hold's order.
	heldAt   time.Time
	snapping bool // SnapshotShards ordered
	// reached is, async and ssp, the highest version a shard
	// snapshotted (the new layout's version); async the rest of an async
	// or ssp change's state (core_psscale_async.go).
	reached int64
	async   psAsync
	// published: heartbeats carry the new count, since publishedAt
	// (sync: once the snapshot is written; async and ssp: once every
	// shard took the hold); switching: SwitchLayout ordered.
	published   bool
	publishedAt time.Time
	switching   bool
	// backDuring is when the primary process of a shard registered
	// again during the switch (by shard): restarted, its Init came to
	// the new process (LayoutSwitched records the restart).
	backDuring map[int]time.Time
	// before is the replicas' state before the switch readied them
	// (switchReplicas), for a switch that fails before its Inits.
	before replicasBefore
}

// replicasBefore is the core's hot-standby state of the shards before a switch.
type replicasBefore struct {
	rep      []replicaRun
	replicas []Replica
}

// psScaleState is the layout in effect (the PS count and weights), the
// one asked for, the change under way and, during it, the layout each
// worker said it uses.
type psScaleState struct {
	psCount         int
	psWeights       []int
	psTarget        int
	psTargetWeights []int
	psImbalance     float64
	psAskedAt       time.Time
	psChange        *psChange
	psAcks          map[int]partition.Layout
	// answered are the processes of slots beyond the layout that a
	// restarted chief found answering (SlotAnswers), by task.
	answered map[string]bool
}

// layout is the layout in effect.
func (c *Core) layout() partition.Layout { return partition.LayoutOf(c.psCount, c.psWeights) }

// targetLayout is the layout asked for.
func (c *Core) targetLayout() partition.Layout {
	return partition.LayoutOf(c.psTarget, c.psTargetWeights)
}

// newLayout is the layout ch changes to.
func (ch *psChange) newLayout() partition.Layout { return partition.LayoutOf(ch.to, ch.weights) }

// keepLayout drops the change under way, if any, and any asked for: the
// layout in effect stays.
func (c *Core) keepLayout() {
	c.psChange, c.psTarget, c.psTargetWeights = nil, c.psCount, c.psWeights
	c.st.PSAsked = nil
}

// AskedLayout is a layout asked for and not yet in effect, as the
// chief's state saves it (State.PSAsked).
type AskedLayout struct {
	PS        int     `json:"ps"`
	Weights   []int   `json:"weights,omitempty"`
	Imbalance float64 `json:"imbalance,omitempty"`
	AskedUnix float64 `json:"asked_unix,omitempty"` // when it was asked for (the report's asked_seconds)
}

// SnapshotShards writes the checkpoint of step Step, at which every
// shard is held, for a change of the PS count (Latest: the newest
// committed checkpoint's step). With Own (async and ssp) the shards are
// at versions of their own: each snapshots at once, and Step only names
// the checkpoint. Answered by Core.Snapshotted.
type SnapshotShards struct {
	Step   int64
	Latest int64
	// To is the new layout: the checkpoint is read back for it.
	To  partition.Layout
	Own bool
}

// SwitchLayout initialises the To shards of the new layout, in
// Generation, from the checkpoint of step Step (resharded from From
// shards), and stops the removed PS (From above To). Answered by
// Core.LayoutSwitched with the version the shards serve from.
type SwitchLayout struct {
	From       int
	To         partition.Layout
	Step       int64
	Generation int64
}

func (SnapshotShards) action() {}
func (SwitchLayout) action()   {}

func (a SnapshotShards) String() string {
	s := fmt.Sprintf("snapshot-shards step=%d latest=%d ps=%s", a.Step, a.Latest, a.To)
	if a.Own {
		s += " own-versions"
	}
	return s
}

func (a SwitchLayout) String() string {
	return fmt.Sprintf("switch-layout ps=%d->%s step=%d generation=%d", a.From, a.To, a.Step, a.Generation)
}

// PSCount is the number of parameter servers holding the model now.
func (c *Core) PSCount() int { return c.psCount }

// PSTarget is the PS count asked for.
func (c *Core) PSTarget() int { return c.psTarget }

// ScalePS asks for n parameter servers. It takes effect at a step
// boundary (see above); asking again before the hold replaces the
// target.
func (c *Core) ScalePS(n int, now time.Time) error {
	r := c.p.Run
	if err := c.layoutRefusal(); err != nil {
		return err
	}
	switch {
	case n < 1:
		return fmt.Errorf("%w: --ps must be at least 1, got %d", ErrScale, n)
	case n > r.PSSlots():
		return fmt.Errorf("%w: --ps %d is more than the run's --max-ps %d", ErrScale, n, r.PSSlots())
	}
	if !partition.Even(n).Equal(c.targetLayout()) {
		c.log.Info("PS count asked", "ps", n, "now", c.psCount)
		c.setPSTarget(n, nil, 0, now)
	}
	return nil
}

// layoutRefusal says why the run cannot change its layout (nil: it
// can).
func (c *Core) layoutRefusal() error {
	switch {
	case !c.p.Checkpoints:
		return fmt.Errorf("%w: moving the model to other parameter servers goes through a checkpoint; the run has none (--checkpoint-dir)", ErrScale)
	case c.phase >= stopping:
		return fmt.Errorf("%w: the run is stopping", ErrScale)
	}
	return nil
}

// busyForPS says an evaluation or a checkpoint reads the shards under
// the current layout, or a worker change is under way.
func (c *Core) busyForPS() bool { return c.evalBusy || c.ckptBusy || c.change != nil || c.ach != nil }

// tickPS advances a change of the PS count; called when the shards
// answered a poll and no restore or rollback is under way.
func (c *Core) tickPS(now time.Time) []Action {
	ch := c.psChange
	switch {
	case ch == nil && !c.targetLayout().Equal(c.layout()) && !c.busyForPS():
		c.psChange = &psChange{from: c.psCount, to: c.psTarget, weights: c.psTargetWeights, imbalance: c.psImbalance, asked: c.psAskedAt}
		c.log.Info("PS count change: waiting for the added parameter servers", "from", c.psCount, "to", c.psTarget)
		// The change is saved as it begins: a chief restarted during it
		// takes it up again (adoptPS). (One dropped at once saved itself.)
		acts := c.tickPS(now)
		if c.psChange == nil {
			return acts
		}
		return append(acts, c.save())
	case ch == nil:
		return nil
	case ch.at == 0:
		return c.psHold(now, ch)
	case !ch.held:
		return nil
	case c.asyncElastic():
		return c.tickPSAsync(now, ch) // core_psscale_async.go
	case !ch.snapping:
		return c.psSnapshot(now, ch)
	case ch.published && !ch.switching:
		return c.psSwitch(now, ch)
	}
	return nil
}

// tickPSUnless is tickPS, unless the replica rules acted at this poll
// (the change then waits for the next).
func (c *Core) tickPSUnless(now time.Time, replicasActed bool) []Action {
	if replicasActed {
		return nil
	}
	return c.tickPS(now)
}

// psHold orders the hold once the added PS processes (with hot
// standbys, both of each added shard) registered.
func (c *Core) psHold(now time.Time, ch *psChange) []Action {
	if ch.newLayout().Equal(c.layout()) {
		c.psChange, c.st.PSAsked = nil, nil
		return []Action{c.save()}
	}
	if missing := c.addedMissing(ch); missing != "" {
		if now.Sub(ch.asked) >= c.p.StartupTimeout {
			// (A process that never came: training, evaluations and
			// checkpoints go on under the current count.)
			c.log.Error("PS count change dropped: an added parameter server did not register", "task", missing, "waited", now.Sub(ch.asked), "ps", c.psCount)
			c.keepLayout()
			return []Action{c.save()} // (a restarted chief does not take it up)
		}
		return nil
	}
	if c.busyForPS() {
		return nil // (an evaluation or checkpoint begun while the added PS started)
	}
	if c.asyncElastic() {
		return c.psHoldAsync(now, ch)
	}
	ch.at = slices.Max(c.versions) + 2
	if ch.at >= c.MaxSteps() {
		c.log.Info("the run ends before a PS count change could take effect", "ps", c.psCount, "asked", ch.newLayout().String())
		c.keepLayout()
		return []Action{c.save()}
	}
	c.log.Info("PS count change: holding the shards at a step boundary", "from", ch.from, "to", ch.to, "step", ch.at)
	return c.membership(now)
}

// addedMissing names the first process of the shards ch adds that has
// not registered ("": none): ps/N, and with hot standbys standby/N.
func (c *Core) addedMissing(ch *psChange) string {
	for s := ch.from; s < ch.to; s++ {
		switch {
		case (s >= len(c.psSeen) || !c.psSeen[s]) && !c.answered[task(cluster.PS, s)]:
			return task(cluster.PS, s)
		case c.replicated() && (s >= len(c.standbySeen) || !c.standbySeen[s]) && !c.answered[task(cluster.Standby, s)]:
			return task(cluster.Standby, s)
		}
	}
	return ""
}

// psHoldRefused: a shard was past the hold; drop it everywhere and try
// further on.
func (c *Core) psHoldRefused(now time.Time) []Action {
	c.log.Info("PS count change: a shard was past the boundary; trying a later one", "step", c.psChange.at)
	c.psChange.at = 0
	c.lastSent = nil
	return c.membership(now)
}

// psHeldSent notes that every shard took the PS change's hold.
func (c *Core) psHeldSent() {
	ch := c.psChange
	if ch != nil && !ch.held && ch.at > 0 && c.lastSent != nil && c.lastSent.HoldAt == ch.at {
		ch.held = true
		if c.asyncElastic() {
			c.psPublishAsync(ch) // core_psscale_async.go
		}
	}
}

// PSHoldAwaited says a sync change's hold is in place at the shards and
// not every poll has found them at it yet: the workers wait from the
// moment the first shard reaches the boundary, a few steps after the
// order, so the chief polls at HoldPollEvery, not at its usual pace,
// until the snapshot is ordered. Not while a shard is down or being
// restored: the change waits for that at the usual pace.
func (c *Core) PSHoldAwaited() bool {
	ch := c.psChange
	if ch == nil || !ch.held || ch.snapping || c.asyncElastic() || c.restoring != nil || c.rollback != nil {
		return false
	}
	for _, t := range c.down {
		if !t.IsZero() {
			return false
		}
	}
	return true
}

// psSnapshot orders the snapshot once every shard is at the boundary.
func (c *Core) psSnapshot(now time.Time, ch *psChange) []Action {
	for _, v := range c.versions {
		if v != ch.at {
			return nil
		}
	}
	ch.heldAt, ch.snapping = now, true
	c.ckptBusy = true
	return []Action{SnapshotShards{Step: ch.at, Latest: c.st.LatestCheckpoint, To: ch.newLayout()}}
}

// Snapshotted is SnapshotShards's outcome: the checkpoint of the
// boundary is written (the new count is published to the workers), or
// it failed (the hold is released and the change dropped).
func (c *Core) Snapshotted(now time.Time, res CheckpointResult) []Action {
	ch := c.psChange
	c.ckptBusy = false
	if ch == nil || !ch.snapping {
		return nil
	}
	if res.Err != nil {
		c.st.Checkpoints.Failed++
		c.st.Checkpoints.LastError = res.Err.Error()
		c.m.CheckpointFailures.Inc()
		c.log.Error("PS count change dropped: the boundary's checkpoint failed (async, ssp: the workers switch back)", "step", ch.at, "err", res.Err)
		c.keepLayout()
		c.psAcks = nil
		c.lastSent = nil
		return append(c.membership(now), c.save())
	}
	c.st.Checkpoints.Committed++
	c.st.LatestCheckpoint = res.Step
	c.noteCheckpointPositions(res.Step, res.Positions) // (a later restore counts from them: core_ledger.go)
	c.m.CheckpointDuration.Observe(res.Duration.Seconds())
	c.m.CheckpointSize.Set(float64(res.Bytes))
	c.m.CheckpointLastSuccess.Set(float64(now.UnixNano()) / 1e9)
	c.lastCkpt = now
	if c.asyncElastic() {
		return c.psSnapshottedAsync(ch, res)
	}
	ch.published, ch.publishedAt = true, now
	c.psAcks = map[int]partition.Layout{}
	c.log.Info("PS count change: the boundary's checkpoint is written; workers switch layouts", "step", ch.at, "ps", ch.to)
	return []Action{c.save()}
}

// psSwitch orders the switch once every live worker uses the new layout.
func (c *Core) psSwitch(now time.Time, ch *psChange) []Action {
	if now.Sub(ch.publishedAt) < c.p.StartupTimeout && !c.PSSwitchReady(now) {
		return nil
	}
	return c.orderSwitch(ch, ch.at)
}

// orderSwitch orders ch's switch from the checkpoint of step, in a new
// generation, saved first (State.PSSwitch): a chief restarted during
// the switch does it again (resumeSwitch).
func (c *Core) orderSwitch(ch *psChange, step int64) []Action {
	ch.switching = true
	c.st.Generation++
	ch.before = replicasBefore{rep: slices.Clone(c.rep), replicas: slices.Clone(c.st.Replicas)}
	c.switchReplicas(ch)
	c.st.PSSwitch = &SwitchRecord{From: ch.from, To: ch.to, Weights: ch.weights, Step: step}
	return []Action{c.save(), SwitchLayout{From: ch.from, To: ch.newLayout(), Step: step, Generation: c.st.Generation}}
}

// SwitchRecord is a switch under way as the chief's state saves it.
type SwitchRecord struct {
	From    int   `json:"from"`
	To      int   `json:"to"`
	Weights []int `json:"weights,omitempty"`
	Step    int64 `json:"step"` // the boundary's checkpoint
}

// resumeSwitch does again the switch a chief that died during it had
// ordered (State.PSSwitch): some shards may hold the new layout, some
// the old, so every shard of the new one is initialised again from the
// boundary's checkpoint, in a new generation; the workers are told the
// new layout.
func (c *Core) resumeSwitch(now time.Time) []Action {
	r := c.st.PSSwitch
	c.log.Warn("the chief before died during a PS count change's switch: switching again", "from", r.From,
		"to", partition.LayoutOf(r.To, r.Weights).String(), "step", r.Step)
	asked := c.psAskedAt // (adoptPS's, from the state)
	if asked.IsZero() {
		asked = now
	}
	ch := &psChange{from: c.psCount, to: r.To, weights: r.Weights, asked: asked, at: r.Step, held: true, heldAt: now,
		snapping: true, reached: r.Step, published: true, publishedAt: now}
	c.psChange, c.psTarget, c.psTargetWeights = ch, r.To, r.Weights
	return c.orderSwitch(ch, r.Step)
}

// switchReplicas readies the shards' replicas for the switch to ch's
// layout (hot standbys; docs/elastic.md, "With hot standbys"): every
// shard of the new layout is initialised as in a restore, so its
// replication epoch moves on and its primary attaches its standby
// afresh, from a snapshot of the new state. A shard keeps its primary;
// an added one starts with ps/N. (The removed shards' replicas go with
// them in LayoutSwitched.)
func (c *Core) switchReplicas(ch *psChange) {
	if !c.replicated() {
		return
	}
	n := max(ch.from, ch.to)
	c.rep = resize(c.rep, n)
	for s := len(c.st.Replicas); s < n; s++ {
		c.st.Replicas = append(c.st.Replicas, Replica{Primary: cluster.PS})
	}
	c.initEpochs(allShards(ch.to))
}

// LayoutSwitched is SwitchLayout's outcome: the shards of the new layout
// serve from version (the boundary's; async and ssp, the highest a
// shard snapshotted). The change is recorded with the pause the workers
// saw (heldAt to now) and the steps lost: the boundary (async and ssp:
// the highest version a shard reached, snapshotted or polled) minus
// version.
func (c *Core) LayoutSwitched(now time.Time, version int64) []Action {
	ch := c.psChange
	if ch == nil || !ch.switching {
		return nil
	}
	c.psChange, c.psAcks, c.st.PSSwitch = nil, nil, nil
	old := c.layout()
	step, reached := ch.at, ch.at
	if c.asyncElastic() {
		step, reached = version, max(ch.reached, slices.Max(c.versions))
	}
	for s := ch.to; s < ch.from; s++ {
		// (removed: a later change waits for its new processes)
		for _, seen := range [][]bool{c.psSeen, c.standbySeen} {
			if s < len(seen) {
				seen[s] = false
			}
		}
	}
	c.resizeShards(ch.to)
	for s := range c.versions {
		c.versions[s] = version
	}
	c.step = version
	c.beginGeneration(version, false)
	c.lastSent = nil // the new shards start from the run's membership: say it again
	lost, pause := max(0, reached-version), now.Sub(ch.heldAt).Seconds()
	chg := report.MembershipChange{Role: "ps", Step: step, Epoch: int64(float64(step) / StepsPerEpoch(c.p.Run, c.p.TrainN)),
		Seconds: c.seconds(now), AskedSeconds: c.seconds(ch.asked), From: ch.from, To: ch.to,
		PauseSeconds: ptr(pause), StepsLost: ptr(lost), Weights: ch.newLayout().Weights,
		MovedParameters: c.movedParameters(old, ch.newLayout())}
	if ch.from == ch.to {
		// A rebalance, or --ps at the count making a rebalanced layout
		// even again (no weights, no imbalance measured).
		chg.Kind, chg.Imbalance = KindRebalance, ch.imbalance
		c.m.Rebalances.Inc()
	}
	c.st.Membership = append(c.st.Membership, chg)
	c.recordBackDuring(now, ch, version)
	c.psWeights = ch.newLayout().Weights
	c.st.PS, c.st.PSWeights = ch.to, c.psWeights
	if c.targetLayout().Equal(ch.newLayout()) {
		c.st.PSAsked = nil
	}
	c.m.LayoutChanges.Inc()
	c.m.PS.Set(float64(ch.to))
	c.log.Warn("parameter servers changed", "from", ch.from, "to", ch.newLayout().String(), "step", step, "steps_lost", lost,
		"generation", c.st.Generation, "pause_seconds", fmt.Sprintf("%.2f", pause))
	return append(c.membership(now), c.save())
}

// LayoutSwitchFailed is SwitchLayout's failure (err): the boundary's
// checkpoint could not be read for the new layout, or a shard of the
// new layout could not be initialised or loaded (its process never came
// back in time, or refused the checkpoint's rows). touched says whether
// any Init was sent.
//
// Untouched, every shard still holds the layout in effect, held at the
// boundary: the change is dropped as one whose checkpoint failed (the
// hold released, the workers told the old count). Touched, some shards
// may hold the new layout already, so the change is dropped and every
// shard of the layout in effect is restored from the boundary's
// checkpoint, the newest (nothing trained since), in a new generation;
// the workers are told the old count again and switch back.
func (c *Core) LayoutSwitchFailed(now time.Time, err error, touched bool) []Action {
	ch := c.psChange
	if ch == nil || !ch.switching {
		return nil
	}
	c.keepLayout()
	c.psAcks, c.lastSent, c.st.PSSwitch = nil, nil, nil
	if !touched {
		c.log.Error("PS count change dropped: the switch failed before it initialised any shard", "from", ch.from,
			"to", ch.newLayout().String(), "step", ch.at, "err", err)
		c.st.Generation-- // (no Init carried it)
		c.rep, c.st.Replicas = ch.before.rep, ch.before.replicas
		return append(c.membership(now), c.save())
	}
	c.log.Error("PS count change failed at the switch: the layout in effect is restored from the boundary's checkpoint",
		"from", ch.from, "to", ch.newLayout().String(), "step", ch.at, "err", err)
	c.resizeShards(ch.from)
	targets := allShards(ch.from)
	c.initEpochs(targets)
	c.st.Generation++
	c.hold = 0
	c.restoring = &restoreInfo{detected: now, reached: slices.Max(c.versions), shards: targets}
	return []Action{c.save(), Restore{Shards: targets, Generation: c.st.Generation}}
}

// recordBackDuring records the restart of each process that came back
// during ch's switch (backDuring): the switch initialised it at version,
// from the boundary's checkpoint, with no step lost.
func (c *Core) recordBackDuring(now time.Time, ch *psChange, version int64) {
	for _, s := range slices.Sorted(maps.Keys(ch.backDuring)) {
		name := c.primaryTask(s)
		c.m.TaskRestarts.WithLabelValues(name).Inc()
		c.st.Restarts = append(c.st.Restarts, report.Restart{Task: name, KilledAtSeconds: c.seconds(ch.backDuring[s]),
			BackAtSeconds: ptr(c.seconds(now)), RestoredStep: version})
		c.log.Warn("parameter server restarted during the PS count change: initialised by the switch", "task", name,
			"version", version, "steps_lost", 0)
	}
}

// resizeShards sizes the per-shard state for n shards.
func (c *Core) resizeShards(n int) {
	c.psCount = n
	c.versions = resize(c.versions, n)
	c.down = resize(c.down, n)
	c.outliers = resize(c.outliers, n)
	c.refusedGrads = c.refusedGrads.resize(n)
	c.nonFiniteGrads = c.nonFiniteGrads.resize(n)
	if c.replicated() {
		c.rep = resize(c.rep, n)
		for s := len(c.st.Replicas); s < n; s++ {
			c.st.Replicas = append(c.st.Replicas, Replica{Primary: cluster.PS, Epoch: 1})
		}
		c.st.Replicas = c.st.Replicas[:n]
	}
}

// resize is s cut or grown (with zero values) to n elements.
func resize[T any](s []T, n int) []T {
	if len(s) >= n {
		return s[:n]
	}
	return append(s, make([]T, n-len(s))...)
}

// resize is c for n shards: those that stay keep their counts (their
// totals were noted; their next counts, after the Init, are afresh);
// the totals of removed shards stay with shard 0, so each worker's count
// (the most any shard counted) is not lost.
func (c shardCounts) resize(n int) shardCounts {
	workers := 0
	if len(c.total) > 0 {
		workers = len(c.total[0])
	}
	for s := n; s < len(c.total); s++ {
		for w := range c.total[s] {
			c.total[0][w] = max(c.total[0][w], c.total[s][w])
			c.atGen[0][w] = max(c.atGen[0][w], c.atGen[s][w])
		}
	}
	out := shardCounts{seen: resize(c.seen, n), total: resize(c.total, n), atGen: resize(c.atGen, n)}
	for s := range out.total {
		if out.total[s] == nil {
			out.seen[s], out.total[s], out.atGen[s] = make([]int64, workers), make([]int64, workers), make([]int64, workers)
		}
		clear(out.seen[s]) // every shard is initialised afresh
	}
	return out
}

// HeartbeatPS records the layout worker says it uses and returns the
// one it is to use: the new one once a change's snapshot is written,
// else the one in effect.
//
// A worker that said it uses the new layout keeps that acknowledgement
// for the rest of the change: the last heartbeat of its loop on the old
// layout, sent as that loop stopped, may arrive after the first one on
// the new layout, and the switch does not wait for a worker that
// switched already.
func (c *Core) HeartbeatPS(worker int, l partition.Layout) partition.Layout {
	if c.psAcks != nil && l.PS > 0 && !c.psAcks[worker].Equal(c.Layout()) {
		c.psAcks[worker] = l
	}
	return c.Layout()
}

// PSSwitchReady says every live worker uses the new layout of a change
// whose count is published: the next stage is due (the loop need not
// wait for its next poll): sync, the switch; async and ssp, the check
// that the snapshot holds every gradient.
func (c *Core) PSSwitchReady(now time.Time) bool {
	ch := c.psChange
	if ch == nil || !ch.published || ch.switching || ch.async.settled {
		return false
	}
	for _, w := range c.members.Live(now) {
		if !c.psAcks[w].Equal(ch.newLayout()) && !c.retired[w] {
			return false
		}
	}
	return true
}

// Layout is the layout workers are to use (registrations and
// heartbeats say it).
func (c *Core) Layout() partition.Layout {
	if ch := c.psChange; ch != nil && ch.published {
		return ch.newLayout()
	}
	return c.layout()
}

// psHoldAt is the PS change's hold (0: none).
func (c *Core) psHoldAt() int64 {
	if c.psChange == nil {
		return 0
	}
	return c.psChange.at
}

// admitPS checks that ps index may register: one of the run's PS slots
// (--max-ps).
func (c *Core) admitPS(index int, now time.Time) error {
	if index < 0 || index >= c.p.Run.PSSlots() {
		return fmt.Errorf("%w: ps index %d out of range (the run has at most %d: --max-ps)", ErrBadTask, index, c.p.Run.PSSlots())
	}
	for len(c.psSeen) <= index {
		c.psSeen = append(c.psSeen, false)
	}
	if c.psSeen[index] {
		c.noteBackDuringSwitch(task(cluster.PS, index), index, now)
	}
	c.psSeen[index] = true
	return nil
}

// noteBackDuringSwitch notes a process of shard s's that registers again
// at now, restarted, if the switch of the change under way initialises
// it: the primary of a shard of the new layout, while the switch runs
// (its Init retries reach the new process), or, for a slot the change
// adds (which nothing else restores), at any time of the change.
func (c *Core) noteBackDuringSwitch(name string, s int, now time.Time) {
	ch := c.psChange
	if ch == nil || s >= ch.to || !ch.switching && s < c.psCount || c.newShardPrimary(s) != name {
		return
	}
	if ch.backDuring == nil {
		ch.backDuring = map[int]time.Time{}
	}
	ch.backDuring[s] = now
}

// newShardPrimary is the task of shard s's primary as a switch
// initialises it: a slot the change adds starts with ps/N (its replica
// state may not be sized for it yet).
func (c *Core) newShardPrimary(s int) string {
	if !c.replicated() || s >= len(c.rep) {
		return task(cluster.PS, s)
	}
	return c.primaryTask(s)
}

// SlotAnswers notes that the process of PS slot s beyond the layout in
// effect (role ps, or standby with hot standbys) answers: a chief
// restarted during a change that adds the slot finds it so, its
// registration having gone to the chief before. It counts as present
// for the change (addedMissing), not as registered with this chief: its
// first registration here is no restart.
func (c *Core) SlotAnswers(role string, s int) {
	if s < c.psCount || s < 0 || s >= c.p.Run.PSSlots() {
		return
	}
	if c.answered == nil {
		c.answered = map[string]bool{}
	}
	c.answered[task(role, s)] = true
}

// adoptPS takes the layout from a saved state (a restarted chief), and
// the layout asked for if a change to it was under way: the change
// starts again from its beginning (the shards answer the new chief's
// first membership, which holds none of them, and the workers are told
// the layout in effect), asked when it was (now, if the state does not
// say).
func (c *Core) adoptPS(now time.Time) {
	if c.st.PS > 0 && c.st.PS != c.psCount {
		c.resizeShards(c.st.PS)
	}
	c.psWeights = c.st.PSWeights
	c.psTarget, c.psTargetWeights = c.psCount, c.psWeights
	if a := c.st.PSAsked; a != nil && a.PS >= 1 && a.PS <= c.p.Run.PSSlots() {
		c.log.Info("taking up the PS count change the chief before was making", "ps", c.psCount, "asked", partition.LayoutOf(a.PS, a.Weights).String())
		asked := now
		if a.AskedUnix > 0 {
			asked = time.Unix(0, int64(a.AskedUnix*1e9))
		}
		c.setPSTarget(a.PS, a.Weights, a.Imbalance, asked)
	}
}
