// Package chief coordinates a run. Its decisions live in Core, a pure
// state machine (core*.go): registration against the authoritative run
// configuration, worker liveness from heartbeats, initialising and
// restoring the PS shards, when to evaluate and checkpoint, the stop rule
// and the report. Chief (this file) is the thin loop around it: it serves
// the Chief gRPC API, polls the shards, and carries out the core's
// actions with RPCs, files and background jobs (evaluations and
// checkpoints), feeding their results back. docs/architecture.md shows
// the whole; docs/semantics.md says what a stop guarantees.
package chief

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
	pb "github.com/pstrain/pstrain/proto"
)

// PS is one shard connection.
type PS struct {
	Addr   string
	Client pb.ParameterServerClient
}

// Config holds the chief's dependencies.
type Config struct {
	Run   config.Run
	Spec  model.Spec
	RunID string
	PS    []PS
	// Standbys are the shards' second processes (standby/N), one per PS,
	// or none: no hot standbys (docs/replication.md).
	Standbys  []PS
	TrainN    int        // training samples (after --data-fraction)
	Evaluator *Evaluator // nil: no evaluation
	Log       *slog.Logger
	Metrics   *metrics.Chief
	Now       func() time.Time
	// OnProgress is called about every PollEvery.
	OnProgress func(Progress)
	PollEvery  time.Duration
	// SilentAfter is how long a poll waits for a process's answer with
	// hot standbys before the process counts as gone and its standby is
	// promoted (default 1 s; docs/replication.md, "A frozen primary").
	// Without standbys a poll waits 5 s: there a wrong guess costs a
	// restore, here only a re-attach.
	SilentAfter time.Duration
	// StartupTimeout bounds the wait for every task to register.
	StartupTimeout time.Duration
	// Store is where checkpoints go (nil: none).
	Store *checkpoint.Store
	// StatePath is where the chief keeps what a restarted chief needs to
	// finish the report ("" = nowhere).
	StatePath string
	// EvalSubset is the fraction of the test set a routine evaluation
	// scores (default DefaultEvalSubset; see CoreParams).
	EvalSubset float64
	// ScaleFile is where `pstrain scale` asks for another worker count
	// ("" = nowhere; docs/elastic.md): read at every poll it changed.
	ScaleFile string
}

// Chief is the coordinator; it also serves the Chief gRPC API.
type Chief struct {
	pb.UnimplementedChiefServer
	cfg  Config
	plan partition.Plan
	// layout names plan (the PS count and a rebalance's weights).
	layout partition.Layout

	mu sync.Mutex // guards core: the RPC handlers and the loop share it
	// stateMu orders the writes of the state file, and saved is the
	// sequence number of the last state written: the loop's SaveState
	// actions and the heartbeats that hand out data (core_queue.go)
	// both write it, and an older state never replaces a newer one.
	stateMu sync.Mutex
	saved   int64
	core    *Core

	scale scaleWatch // the loop's only
	// psSlots are every PS slot's connection (--max-ps); cfg.PS are the
	// first of them, the shards of the layout in effect.
	psSlots []PS
	// standbySlots are every standby slot's (one per PS slot, or none);
	// cfg.Standbys are the first of them, the layout's.
	standbySlots []PS
	moved        chan loadedMove // the boundary's checkpoint being read for the new layout (psscale.go)
	// nudge asks the loop for a tick before the next poll (psscale.go).
	nudge chan struct{}
}

// DefaultEvalSubset is the part of the test set a routine evaluation
// scores: a tenth (1,000 MNIST images). The chief's budget pays per
// image scored, so a smaller subset is scored more often; a hold's
// subset passes then come sooner, each weaker evidence than a larger
// subset's, and the hold's last evaluation is the whole set whatever the
// subset (docs/semantics.md, "Evaluation, and what it costs").
const DefaultEvalSubset = 0.1

// withDefaults is cfg with its unset fields set to their defaults.
func withDefaults(cfg Config) Config {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewChief(nil)
	}
	if cfg.PollEvery <= 0 {
		cfg.PollEvery = 100 * time.Millisecond
	}
	if cfg.SilentAfter <= 0 {
		cfg.SilentAfter = time.Second
	}
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = 2 * time.Minute
	}
	if cfg.EvalSubset <= 0 {
		cfg.EvalSubset = DefaultEvalSubset
	}
	return cfg
}

// New checks the configuration and computes the partition plan.
func New(cfg Config) (*Chief, error) {
	if err := cfg.Run.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.PS) != cfg.Run.PS && len(cfg.PS) != cfg.Run.PSSlots() {
		return nil, fmt.Errorf("chief: %d PS addresses for --ps %d (--max-ps %d)", len(cfg.PS), cfg.Run.PS, cfg.Run.PSSlots())
	}
	// The first --ps slots hold the model at the start; the others are
	// where a change of the PS count adds shards (core_psscale.go). With
	// hot standbys every PS slot has its standby slot.
	slots, standbySlots := cfg.PS, cfg.Standbys
	cfg.PS = cfg.PS[:cfg.Run.PS]
	if len(cfg.Standbys) > 0 && len(cfg.Standbys) != len(slots) {
		return nil, fmt.Errorf("chief: %d standby addresses for %d PS slots: a hot standby needs one per PS slot, or none", len(cfg.Standbys), len(slots))
	}
	if len(cfg.Standbys) > 0 {
		cfg.Standbys = cfg.Standbys[:cfg.Run.PS]
	}
	plan, err := partition.New(cfg.Spec, cfg.Run.PS)
	if err != nil {
		return nil, err
	}
	cfg = withDefaults(cfg)
	params := CoreParams{Run: cfg.Run, TrainN: cfg.TrainN, Model: cfg.Spec.String(), Spec: cfg.Spec, Evaluate: cfg.Evaluator != nil,
		Checkpoints: cfg.Store != nil, StartupTimeout: cfg.StartupTimeout, EvalSubset: cfg.EvalSubset,
		InitialLoss: initialLoss(cfg, plan)}
	for _, p := range slots {
		params.PSAddrs = append(params.PSAddrs, p.Addr)
	}
	for _, p := range standbySlots {
		params.StandbyAddrs = append(params.StandbyAddrs, p.Addr)
	}
	core := NewCore(params, cfg.RunID, cfg.Log, cfg.Metrics, cfg.Now())
	c := &Chief{cfg: cfg, plan: plan, layout: partition.Even(cfg.Run.PS), core: core, scale: scaleWatch{since: time.Now()}, psSlots: slots,
		standbySlots: standbySlots, nudge: make(chan struct{}, 1)}
	// Every task's restart counter exists from the start, so dashboards
	// show 0 rather than nothing.
	for _, t := range c.taskNames() {
		cfg.Metrics.TaskRestarts.WithLabelValues(t)
	}
	if err := c.useRows(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Chief) taskNames() []string {
	out := []string{"chief"}
	for i := 0; i < c.cfg.Run.PS; i++ {
		out = append(out, fmt.Sprintf("ps/%d", i))
	}
	for i := range c.cfg.Standbys {
		out = append(out, fmt.Sprintf("standby/%d", i))
	}
	for i := 0; i < c.cfg.Run.Workers; i++ {
		out = append(out, fmt.Sprintf("worker/%d", i))
	}
	return out
}

// Scale asks for workers workers (docs/elastic.md); --scale-file is the
// task's way to call it.
func (c *Chief) Scale(workers int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.Scale(workers, c.cfg.Now())
}

// DataPlan is the run's data plan in effect.
func (c *Chief) DataPlan() dataset.DataPlan {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.st.Plan
}

// maxSteps is the run's last step (a change of the worker count moves
// it).
func (c *Chief) maxSteps() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.MaxSteps()
}

// Plan is the partition of the model across shards.
func (c *Chief) Plan() partition.Plan { return c.plan }

// step runs f on the core under the lock with the current time.
func (c *Chief) step(f func(now time.Time) []Action) []Action {
	c.mu.Lock()
	defer c.mu.Unlock()
	acts := f(c.cfg.Now())
	if c.core.PSPollSoon() {
		c.nudgeLoop() // (a PS count change waits for a poll: psscale.go)
	}
	return acts
}

// Run waits for the cluster, trains and returns the report. The caller
// fills in what only the launcher knows (tasks, startup time).
//
// When ctx ends (SIGINT or SIGTERM) the run stops cleanly: the shards
// stop, the model is evaluated and checkpointed, and the report says
// interrupted. The RPCs of that wind-down are not cut short by ctx.
//
// A chief restarted in the middle of a run (same run id) finds every
// shard serving the run and adopts it (Core.Adopt).
func (c *Chief) Run(ctx context.Context) (*report.Report, error) {
	work := context.WithoutCancel(ctx)
	results := make(chan func(time.Time) []Action, 2) // at most one evaluation and one checkpoint run
	var jobs sync.WaitGroup
	defer jobs.Wait()
	// A run that fails does not wait minutes for a checkpoint under way
	// (a normal finish has none: the core waits for them).
	jobCtx, cancelJobs := context.WithCancel(work)
	defer cancelJobs()
	acts := c.adopt(work)
	poll := time.NewTicker(c.cfg.PollEvery)
	defer poll.Stop()
	interrupt := ctx.Done()
	for {
		for len(acts) > 0 {
			a := acts[0]
			acts = acts[1:]
			if f, ok := a.(Finish); ok {
				if f.Report != nil {
					f.Report.Restarts = nonNil(f.Report.Restarts)
				}
				if f.Err != nil {
					return f.Report, gaveUp{f.Err}
				}
				return f.Report, nil
			}
			more, err := c.perform(work, jobCtx, a, results, &jobs)
			if err != nil {
				return nil, err
			}
			acts = append(acts, more...)
		}
		var soon <-chan time.Time // a poll before the next tick (holdAwaited)
		if c.holdAwaited() {
			soon = time.After(HoldPollEvery)
		}
		select {
		case <-interrupt:
			interrupt = nil
			c.cfg.Log.Warn("interrupted: stopping the run cleanly (Ctrl-C again, a second or more later, to stop at once)")
			acts = c.step(c.core.Interrupt)
		case <-poll.C:
			acts = c.tick(work)
		case <-c.nudge:
			acts = c.tick(work)
		case <-soon:
			acts = c.tick(work)
		case f := <-results:
			acts = c.step(f)
		}
	}
}

// HoldPollEvery is how often the chief polls the shards while a PS
// count change's hold is awaited (Core.PSHoldAwaited): each poll of that
// wait the workers are held for longer.
const HoldPollEvery = 10 * time.Millisecond

// holdAwaited is Core.PSHoldAwaited under the lock.
func (c *Chief) holdAwaited() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.PSHoldAwaited()
}

func nonNil[T any](x []T) []T {
	if x == nil {
		return []T{}
	}
	return x
}

// tick polls the shards once training runs, feeds the core, and shows
// progress.
func (c *Chief) tick(ctx context.Context) []Action {
	c.mu.Lock()
	polling := c.core.phase == training
	c.mu.Unlock()
	var ps, standby []ShardStatus
	if polling {
		ps, standby = c.pollAll(ctx)
	}
	if req, ok := c.scale.poll(c.cfg.ScaleFile, c.cfg.Log); ok {
		c.step(func(now time.Time) []Action {
			c.applyScale(req, now)
			return nil
		})
	}
	var p Progress
	acts := c.step(func(now time.Time) []Action {
		p = c.core.Progress(now)
		return c.core.Tick(now, ps, standby)
	})
	if polling && c.cfg.OnProgress != nil {
		c.cfg.OnProgress(p)
	}
	return acts
}

// perform carries out one action. Evaluations and checkpoints run in the
// background and report on results; the rest are done here.
func (c *Chief) perform(ctx, jobCtx context.Context, a Action, results chan<- func(time.Time) []Action, jobs *sync.WaitGroup) ([]Action, error) {
	switch a := a.(type) {
	case SetMembership:
		switch sent, refused := c.setMembership(ctx, a); {
		case refused:
			return c.step(c.core.MembershipRefused), nil
		case sent:
			c.step(func(time.Time) []Action { c.core.MembershipSent(a.Live); return nil })
		}
	case Evaluate:
		jobs.Add(1)
		go func() {
			defer jobs.Done()
			res := c.evaluate(jobCtx, a)
			results <- func(now time.Time) []Action { return c.core.Evaluated(now, res) }
		}()
	case Checkpoint:
		jobs.Add(1)
		go func() {
			defer jobs.Done()
			res := c.checkpointNow(jobCtx, a)
			results <- func(now time.Time) []Action { return c.core.CheckpointDone(now, res) }
		}()
	case SaveState:
		c.saveState(a.State)
	case SnapshotShards:
		res := c.snapshotShards(ctx, a)
		return c.step(func(now time.Time) []Action { return c.core.Snapshotted(now, res) }), nil
	case SwitchLayout:
		version, touched, err := c.switchLayout(ctx, a)
		if err != nil {
			// The layout in effect comes back (Core.LayoutSwitchFailed).
			// (ctx does not end: perform's is the loop's, uncancelled.)
			acts := c.step(func(now time.Time) []Action { return c.core.LayoutSwitchFailed(now, err, touched) })
			if lerr := c.setLayout(c.core.Layout()); lerr != nil {
				return nil, fmt.Errorf("chief: %w; taking back the layout in effect: %w", err, lerr)
			}
			return acts, nil
		}
		acts := c.step(func(now time.Time) []Action { return c.core.LayoutSwitched(now, version) })
		// The removed slots' processes are told to exit in the
		// background, after the switch: a primary's Stop waits for its
		// standby (up to seconds), and the loop must first tell the new
		// layout's members and save the state that records it.
		jobs.Add(1)
		go func() {
			defer jobs.Done()
			c.retirePS(jobCtx, a.To.PS, a.From)
		}()
		return acts, nil
	default:
		return c.performOnShards(ctx, a)
	}
	return nil, nil
}

// performOnShards carries out an action on the shards and hands the
// core its outcome.
func (c *Chief) performOnShards(ctx context.Context, a Action) ([]Action, error) {
	switch a := a.(type) {
	case InitCluster:
		step, latest, err := c.initCluster(ctx, a)
		if err != nil {
			return nil, err
		}
		return c.step(func(now time.Time) []Action { return c.core.Started(now, step, latest) }), nil
	case Restore, Rollback, HandBack:
		return c.performRestore(ctx, a)
	case Reinit:
		if err := c.reinit(ctx, a); err != nil {
			// The run is over either way: report it, with the final
			// checkpoint counted as failed.
			res := CheckpointResult{Err: err, Final: true}
			return c.step(func(now time.Time) []Action { return c.core.CheckpointDone(now, res) }), nil
		}
		return c.step(c.core.Reinitialised), nil
	case StopShards:
		versions, err := c.stopShards(ctx)
		if err != nil {
			// A shard that cannot be told to stop does not cost the run
			// its report: go on with what the others hold.
			c.cfg.Log.Error("could not stop every shard; finishing the run", "err", err)
		}
		return c.step(func(now time.Time) []Action { return c.core.ShardsStopped(now, versions) }), nil
	case Promote:
		version, err := c.promote(ctx, a)
		if err != nil {
			return c.step(func(now time.Time) []Action { return c.core.PromoteFailed(now, a.Shard, err) }), nil
		}
		return c.step(func(now time.Time) []Action { return c.core.Promoted(now, a.Shard, version) }), nil
	case SetStandby:
		if err := c.setStandby(ctx, a); err != nil {
			return c.step(func(now time.Time) []Action { return c.core.StandbyFailed(now, a.Shard, err) }), nil
		}
		return c.step(func(now time.Time) []Action { return c.core.StandbySet(now, a.Shard, a.Epoch, a.Addr) }), nil
	}
	return nil, fmt.Errorf("chief: unknown action %T", a)
}

// performRestore carries out an action that replaces the shards' state
// with a checkpoint's (or the initial weights) and hands the core its
// outcome.
func (c *Chief) performRestore(ctx context.Context, a Action) ([]Action, error) {
	switch a := a.(type) {
	case Restore:
		step, err := c.restore(ctx, a.Shards, a.Generation)
		if err != nil {
			return nil, err
		}
		return c.step(func(now time.Time) []Action { return c.core.Restored(now, step) }), nil
	case Rollback:
		step, fromCkpt, err := c.rollback(ctx, a)
		if err != nil {
			return nil, err
		}
		return c.step(func(now time.Time) []Action { return c.core.RolledBack(now, step, fromCkpt) }), nil
	case HandBack:
		res := c.handBack(ctx, a)
		return c.step(func(now time.Time) []Action { return c.core.HandedBack(now, res) }), nil
	}
	return nil, fmt.Errorf("chief: unknown restore action %T", a)
}

// adopt checks whether this chief was restarted into a running cluster
// (some shard's primary serves this run and none serves another) and if
// so hands the core what it found.
func (c *Chief) adopt(ctx context.Context) []Action {
	ps, standby := c.pollAll(ctx)
	var saved *State
	if st, ok := c.loadState(); ok {
		saved = &st
	}
	a, ok := adoptionOf(ps, standby, saved)
	var acts []Action
	if !ok {
		c.cfg.Log.Info("waiting for tasks to register", "ps", c.cfg.Run.PS, "standbys", len(c.cfg.Standbys), "workers", c.cfg.Run.Workers)
		return nil
	}
	a.Committed = c.committedSteps()
	acts = c.step(func(now time.Time) []Action { return c.core.Adopt(now, a) })
	if l := c.core.Layout(); !l.Equal(c.layout) {
		if err := c.setLayout(l); err != nil {
			c.cfg.Log.Error("cannot take the saved layout", "ps", l.String(), "err", err)
		}
	}
	c.adoptSlots(ctx)
	return acts
}

// committedSteps are the steps of the store's checkpoints that pass its
// cheap checks, newest first (none without a store).
func (c *Chief) committedSteps() []int64 {
	if c.cfg.Store == nil {
		return nil
	}
	infos, err := c.cfg.Store.List()
	if err != nil {
		c.cfg.Log.Warn("cannot list the checkpoints", "err", err)
		return nil
	}
	var steps []int64
	for _, in := range infos {
		if in.Err == nil {
			steps = append(steps, in.Step)
		}
	}
	return steps
}

// adoptSlots tells the core which PS slots that the change it took up
// adds have a process answering (their processes registered with the
// chief before).
func (c *Chief) adoptSlots(ctx context.Context) {
	c.mu.Lock()
	target := c.core.PSTarget()
	c.mu.Unlock()
	var procs []PS
	var roles []string
	var slots []int
	for s := c.layout.PS; s < min(target, len(c.psSlots)); s++ {
		procs, roles, slots = append(procs, c.psSlots[s]), append(roles, cluster.PS), append(slots, s)
		if s < len(c.standbySlots) {
			procs, roles, slots = append(procs, c.standbySlots[s]), append(roles, cluster.Standby), append(slots, s)
		}
	}
	for i, st := range c.poll(ctx, procs) {
		if st.Err == nil {
			c.mu.Lock()
			c.core.SlotAnswers(roles[i], slots[i])
			c.mu.Unlock()
		}
	}
}
