package chief

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/report"
)

// ShardStatus is one PS process's answer to a poll.
type ShardStatus struct {
	Err          error // the shard did not answer (the rest is unset)
	Serving      bool  // initialised, for this run
	Version      int64
	Generation   int64
	Done         bool
	StaleDropped int64
	Loss         float32
	// Refused and NonFinite are, by worker, the gradients the shard's
	// norm guard refused and those holding NaN or Inf since its last
	// Init; Outlier the worker of the first finite out-of-line gradient
	// since then (-1: none).
	Refused, NonFinite []int64
	Outlier            int
	// Gaps are the runs of batches the shard skipped since its Init,
	// as triples worker, from, to (the data ledger, core_ledger.go).
	Gaps []int64
	// Hot standbys (docs/replication.md): the process's role ("primary",
	// "standby", "deposed" or "": no state), its replication epoch, and
	// for a primary whether its standby is attached, where it is, and
	// how far it lags (updates, and the oldest's age in seconds).
	Role                  string
	Epoch                 int64
	StandbyAttached       bool
	StandbyAddr           string
	ReplicationLag        int64
	ReplicationLagSeconds float64
	otherRun              bool // initialised for another run (adoption refuses it)
	// Asked is when the question was asked (zero: at the tick). A process
	// that did not answer was last known alive then, not when the answer
	// timed out: a frozen one is lost for the whole timeout.
	Asked time.Time
}

// lostAt is when a shard that did not answer was lost: when it was
// asked, or now when that is unknown.
func (x ShardStatus) lostAt(now time.Time) time.Time {
	if x.Asked.IsZero() || x.Asked.After(now) {
		return now
	}
	return x.Asked
}

// Tick is a poll: the time, and the status of each shard's processes:
// ps[s] is ps/s's, standby[s] standby/s's (nil without hot standbys).
// Both are nil before training, when the shards are not polled. Which
// of the two is the shard's primary is the core's to say (Replica).
func (c *Core) Tick(now time.Time, ps, standby []ShardStatus) []Action {
	switch c.phase {
	case registering:
		return c.tickRegistering(now)
	case training:
		return c.tickTraining(now, ps, standby)
	}
	return nil
}

func (c *Core) tickRegistering(now time.Time) []Action {
	missing := c.Missing()
	switch {
	case len(missing) == 0:
		c.phase = starting
		c.st.Generation++
		return []Action{InitCluster{Generation: c.st.Generation, Resume: c.p.Run.Resume}}
	case now.Sub(c.created) >= c.p.StartupTimeout:
		c.phase = finished
		return []Action{Finish{Err: fmt.Errorf("chief: tasks did not register within %v: %s", c.p.StartupTimeout, strings.Join(missing, ", "))}}
	case now.Sub(c.lastNag) >= 5*time.Second:
		c.lastNag = now
		c.log.Info("still waiting for tasks", "missing", strings.Join(missing, ", "))
	}
	return nil
}

// Started says InitCluster is done: training starts at step, and the
// newest committed checkpoint is latest (-1: none).
func (c *Core) Started(now time.Time, step, latest int64) []Action {
	c.phase = training
	c.start, c.lastEval, c.lastCkpt = now, now, now
	c.st.TrainStartedUnix = float64(now.UnixNano()) / 1e9
	c.step = step
	for s := range c.versions {
		c.versions[s] = step
	}
	c.st.LatestCheckpoint = latest
	c.beginGeneration(step, false)
	c.log.Info("training started", "max_steps", c.MaxSteps(), "step", step, "generation", c.st.Generation)
	return []Action{c.save()}
}

// Adoption is what a restarted chief finds: shards serving its run.
type Adoption struct {
	Generation int64 // the newest among the serving shards
	Step       int64 // the lowest version among them
	Split      bool  // their generations differ: a rollback was cut short
	Saved      *State
	// Committed are the steps of the store's committed checkpoints.
	Committed []int64
	// Replicas are each shard's primary and epoch as the processes
	// said (hot standbys; nil: the saved ones, or the start's).
	Replicas []Replica
}

// Adopt takes over a running cluster after a chief restart: it skips
// registration and initialisation and goes on from the shards' state and
// the saved state. A rollback the previous chief did not finish is
// finished (sync mode).
func (c *Core) Adopt(now time.Time, a Adoption) []Action {
	if a.Saved != nil {
		c.st = *a.Saved
	}
	c.st.Generation = max(c.st.Generation, a.Generation)
	c.adoptPlan()
	c.adoptPS(now)
	c.start = now
	if c.st.TrainStartedUnix > 0 {
		c.start = time.Unix(0, int64(c.st.TrainStartedUnix*1e9))
	}
	for i := range c.psSeen {
		c.psSeen[i] = true
	}
	for i := range min(len(c.standbySeen), c.psCount) {
		c.standbySeen[i] = true
	}
	if c.replicated() {
		c.adoptReplicas(a.Replicas)
	}
	for i := range c.workers() {
		c.workerSeen[i] = true
		c.members.Beat(i, now) // live until their heartbeats say otherwise
	}
	c.phase = training
	c.step, c.lastEval, c.lastCkpt = a.Step, now, now
	for s := range c.versions {
		c.versions[s] = a.Step
	}
	c.adoptGeneration(a)
	c.adoptBestPending(a.Committed)
	c.st.Restarts = append(c.st.Restarts, report.Restart{Task: "chief", BackAtSeconds: ptr(c.seconds(now)), RestoredStep: a.Step})
	c.m.TaskRestarts.WithLabelValues("chief").Inc()
	c.log.Warn("chief restarted: adopting the running cluster", "step", a.Step, "generation", c.st.Generation)
	if c.st.StoppedBy != "" {
		return c.resumeStop(now)
	}
	if c.st.PSSwitch != nil {
		return c.resumeSwitch(now)
	}
	if a.Split && c.p.Run.Mode == config.Sync {
		c.log.Warn("the previous chief died during a rollback; restoring every shard")
		return []Action{c.orderRestore(now, -1, nil), c.save()}
	}
	return []Action{c.save()}
}

func (c *Core) tickTraining(now time.Time, ps, standby []ShardStatus) []Action {
	shards := ps
	var acts []Action
	if c.replicated() && len(ps) > 0 {
		shards, acts = c.tickReplicas(now, ps, standby)
	}
	// A Promote or SetStandby hands out a shard's next replication
	// epoch; a PS count change's switch (which hands out the next ones
	// too) waits for a poll that saw it done.
	replicasActed := len(acts) > 0
	acts = append(acts, c.membership(now)...)
	c.noteGaps(shards)
	anyDown, restore := c.noteShards(now, shards)
	if restore != nil {
		return append(acts, restore)
	}
	if anyDown || c.restoring != nil || c.rollback != nil {
		return acts
	}
	if c.readShards(shards) {
		return append(acts, c.tickDone(now)...)
	}
	if more := c.tickElastic(now); len(more) > 0 {
		acts = append(slices.DeleteFunc(acts, func(a Action) bool { _, ok := a.(SetMembership); return ok }), more...)
	}
	if more := c.tickPSUnless(now, replicasActed); len(more) > 0 {
		acts = append(slices.DeleteFunc(acts, func(a Action) bool { _, ok := a.(SetMembership); return ok }), more...)
	}
	if c.psChange != nil && c.psChange.at > 0 {
		return acts // (evaluations and checkpoints read the layout that is changing)
	}
	if a, ok := c.evalDue(now); ok {
		acts = append(acts, a)
	}
	if c.checkpointDue(now) {
		c.ckptBusy, c.lastCkpt = true, now
		acts = append(acts, Checkpoint{Versions: slices.Clone(c.versions), Latest: c.st.LatestCheckpoint, KeepGood: c.keepGood()})
	}
	return acts
}

// noteShards notes which shards are down since when, and checks the
// guard's counts of those that serve. anyDown says a shard is
// unreachable; restore, when not nil, restores a shard that came back
// without state (one at a time; the next poll sees the rest).
func (c *Core) noteShards(now time.Time, shards []ShardStatus) (anyDown bool, restore Action) {
	for s, x := range shards {
		switch {
		case x.Err != nil:
			if c.down[s].IsZero() {
				c.down[s] = x.lostAt(now)
				c.log.Warn("parameter server unreachable", "ps", s, "err", x.Err)
			}
			anyDown = true
		case !x.Serving:
			if c.down[s].IsZero() {
				c.down[s] = now
			}
			return anyDown, c.orderRestore(now, s, shards)
		default:
			c.down[s] = time.Time{}
			c.noteGuard(s, x)
		}
	}
	return anyDown, nil
}

// readShards takes the step (the lowest shard version), the versions,
// the stale count and the loss from the serving shards, and says whether
// one says training is done.
func (c *Core) readShards(shards []ShardStatus) (done bool) {
	c.step, c.stale = shards[0].Version, 0
	for s, x := range shards {
		c.versions[s] = x.Version
		c.step = min(c.step, x.Version)
		c.stale += x.StaleDropped
		done = done || x.Done
	}
	c.loss = shards[0].Loss
	c.print = psPrint(shards)
	c.m.GlobalStep.Set(float64(c.step))
	return done
}

// tickDone: a shard says training is done. The other shards are usually
// a push away from the last step (every worker pushes it to every
// shard): give them time, so the final model is one version. With
// backup workers a shard may never get there, so the wait is a second;
// without them every shard gets every worker's last push unless a
// worker is lost, which a heartbeat timeout tells (a push delayed by a
// shard's failover takes longer than a second).
func (c *Core) tickDone(now time.Time) []Action {
	if c.doneAt.IsZero() {
		c.doneAt = now
	}
	if c.step == slices.Max(c.versions) || now.Sub(c.doneAt) >= c.doneWait() {
		return c.beginStop(now, "epochs")
	}
	return nil
}

// doneWait bounds tickDone's wait for the shards behind the first done.
func (c *Core) doneWait() time.Duration {
	r := c.p.Run
	if r.Mode != config.Sync || (r.ReplicasToAggregate > 0 && r.ReplicasToAggregate < r.Workers) {
		return time.Second
	}
	return max(time.Second, r.HeartbeatTimeout)
}

// membership orders the shards told of a change in the live workers
// (or, in an elastic run, in the membership).
func (c *Core) membership(now time.Time) []Action {
	live := c.Live(now)
	c.m.LiveWorkers.Set(float64(len(live)))
	a := c.membershipAction(live)
	if c.lastSent != nil && a.equal(*c.lastSent) {
		return nil
	}
	if c.lastLive != nil && !slices.Equal(live, c.loggedLive) && !slices.Equal(live, c.lastLive) {
		c.log.Warn("live workers changed", "live", live, "was", c.lastLive)
	}
	c.loggedLive = live
	c.pending = &a
	c.noteLive(now, a)
	return []Action{a}
}

// noteLive records a change of the number of workers training that a
// in training tells the shards: live, neither quarantined nor removed.
func (c *Core) noteLive(now time.Time, a SetMembership) {
	if c.phase != training {
		return
	}
	n := 0
	for _, w := range a.Live {
		if !c.retired[int(w)] {
			n++
		}
	}
	last := c.p.Run.Workers
	if k := len(c.st.LiveWorkers); k > 0 {
		last = c.st.LiveWorkers[k-1].Workers
	}
	if n != last {
		c.st.LiveWorkers = append(c.st.LiveWorkers, report.LiveWorkers{Seconds: c.seconds(now), Workers: n})
	}
}

// MembershipSent says every shard was told live (and the rest of the
// SetMembership last ordered).
func (c *Core) MembershipSent(live []int32) {
	c.lastLive = live
	if c.lastLive == nil {
		c.lastLive = []int32{}
	}
	a := SetMembership{}
	if c.pending != nil {
		a = *c.pending
	}
	a.Live = c.lastLive
	c.lastSent = &a
	c.retiredHeard = slices.Clone(a.Retired)
	c.heldSent()
	c.psHeldSent()
}

// restoreInfo is a Restore under way.
type restoreInfo struct {
	task     string // "ps/N", or "" when finishing a cut-short rollback
	detected time.Time
	reached  int64 // the newest version any shard had reached
	shards   []int
}

// orderRestore restores the shards after shard s came back empty: in sync
// mode every shard rolls back with it, in a new generation, so the model
// stays one version; in async and ssp mode only that shard is restored.
// s < 0 restores every shard to finish a rollback a previous chief began.
func (c *Core) orderRestore(now time.Time, s int, shards []ShardStatus) Action {
	reached := slices.Max(c.versions)
	for _, y := range shards {
		if y.Err == nil && y.Serving {
			reached = max(reached, y.Version)
		}
	}
	targets := allShards(len(c.versions))
	detected, task := now, ""
	if s >= 0 {
		detected, task = c.down[s], c.primaryTask(s)
		if c.p.Run.Mode != config.Sync {
			targets = []int{s}
		}
	}
	c.initEpochs(targets)
	c.st.Generation++
	c.hold = 0 // the model is replaced: a hold of the target starts again
	c.restoring = &restoreInfo{task: task, detected: detected, reached: reached, shards: targets}
	return Restore{Shards: targets, Generation: c.st.Generation}
}

// Restored says the Restore is done: the shards start again at step
// (the checkpoint's; 0 for the initial weights).
func (c *Core) Restored(now time.Time, step int64) []Action {
	r := c.restoring
	c.restoring = nil
	if r == nil {
		return nil
	}
	c.ledgerRestore(r.shards, step)
	for _, s := range r.shards {
		c.down[s] = time.Time{}
		c.versions[s] = step
		if c.replicated() {
			c.rep[s].lost = ""
		}
	}
	c.step = step
	c.beginGeneration(step, false)
	if c.elastic() || len(c.st.Quarantined) > 0 {
		c.lastSent = nil // the restored shards start from the run's membership: say it again
	}
	if r.task == "" {
		return []Action{c.save()}
	}
	lost := max(0, r.reached-step)
	c.m.TaskRestarts.WithLabelValues(r.task).Inc()
	c.m.Recovery.Observe(now.Sub(r.detected).Seconds())
	c.m.StepsLost.Add(float64(lost))
	c.st.Restarts = append(c.st.Restarts, report.Restart{Task: r.task, KilledAtSeconds: c.seconds(r.detected),
		BackAtSeconds: ptr(c.seconds(now)), RestoredStep: step, StepsLost: lost})
	c.log.Warn("parameter server restored", "task", r.task, "from_step", step, "steps_lost", lost,
		"shards_rolled_back", len(r.shards), "generation", c.st.Generation,
		"recovery_seconds", fmt.Sprintf("%.2f", now.Sub(r.detected).Seconds()))
	return []Action{c.save()}
}

// checkpointDue says whether the interval since the last checkpoint has
// passed and none is being written.
func (c *Core) checkpointDue(now time.Time) bool {
	if !c.p.Checkpoints || c.ckptBusy || c.keepsBest() && c.evalBusy {
		// (With --patience a checkpoint past the evaluation under way
		// would leave no room for that evaluation's, named after its
		// step, should it be the best.)
		return false
	}
	e := c.p.Run.CheckpointEvery
	switch {
	case e.Steps > 0:
		// After a failure (a full disk) the steps are still due: try
		// again at most once a second, not at every poll.
		return c.step-max(c.st.LatestCheckpoint, 0) >= e.Steps && now.Sub(c.ckptFailedAt) >= time.Second
	case e.Duration > 0:
		return now.Sub(c.lastCkpt) >= e.Duration
	}
	return false
}

// adoptGeneration begins the adopted shards' generation at their step,
// or where the saved state says it began if they are of that generation:
// the evaluations of the steps it threw away stay out of the model's
// history.
func (c *Core) adoptGeneration(a Adoption) {
	c.beginGeneration(a.Step, false)
	if s := a.Saved; s != nil && s.Generation == a.Generation && s.GenEvals <= len(c.st.Evals) && s.GenStart <= a.Step {
		c.genStart, c.genEvals = s.GenStart, s.GenEvals
		c.st.GenStart, c.st.GenEvals = s.GenStart, s.GenEvals
	}
}

// Progress is a snapshot for the progress line.
type Progress struct {
	Step, MaxStep int64
	Epoch         float64
	SamplesPerSec float64
	Loss          float32
	LastAccuracy  float64 // -1 before the first evaluation
	LastAUC       float64 // a CTR model's latest AUC (0: none)
	Elapsed, ETA  time.Duration
	LiveWorkers   int
	Workers       int // the workers the run has (elastic: docs/elastic.md)
	StaleDropped  int64
}

// Progress reports where training is.
func (c *Core) Progress(now time.Time) Progress {
	samples := c.samplesAt(c.step)
	elapsed := now.Sub(c.start)
	p := Progress{Step: c.step, MaxStep: c.MaxSteps(), Loss: c.loss, LastAccuracy: -1, Elapsed: elapsed,
		LiveWorkers: len(c.lastLive), Workers: c.workers(), StaleDropped: c.stale}
	if n := len(c.st.Evals); n > 0 {
		p.LastAccuracy, p.LastAUC = c.st.Evals[n-1].TestAccuracy, c.st.Evals[n-1].AUC
	}
	p.Epoch = samples / float64(max(1, c.p.TrainN))
	if s := elapsed.Seconds(); s > 0 {
		p.SamplesPerSec = samples / s
	}
	if c.step > 0 {
		p.ETA = time.Duration(float64(elapsed) * float64(p.MaxStep-c.step) / float64(c.step))
	}
	return p
}
