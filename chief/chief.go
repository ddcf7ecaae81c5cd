// Package chief coordinates a run. It holds the authoritative run
// configuration and model spec, refuses tasks whose copies differ, waits
// for the whole cluster to register, initialises the PS shards, tracks
// worker liveness from heartbeats (telling the shards, so a sync step never
// waits for a dead worker), evaluates the model on the test set at an
// interval, decides when training stops, and produces the run's report.
package chief

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/retry"
	"github.com/pstrain/pstrain/metrics"
	"github.com/pstrain/pstrain/model"
	"github.com/pstrain/pstrain/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/report"
	"github.com/pstrain/pstrain/shardckpt"
	"github.com/pstrain/pstrain/wire"
)

// PS is one shard connection.
type PS struct {
	Addr   string
	Client pb.ParameterServerClient
}

// Progress is a snapshot for the progress line.
type Progress struct {
	Step, MaxStep int64
	Epoch         float64
	SamplesPerSec float64
	Loss          float32
	LastAccuracy  float64 // -1 before the first evaluation
	Elapsed, ETA  time.Duration
	LiveWorkers   int
	StaleDropped  int64
}

// Config holds the chief's dependencies.
type Config struct {
	Run       config.Run
	Spec      model.Spec
	RunID     string
	PS        []PS
	TrainN    int        // training samples (after --data-fraction)
	Evaluator *Evaluator // nil: no evaluation
	Log       *slog.Logger
	Metrics   *metrics.Chief
	Now       func() time.Time
	// OnProgress is called about every PollEvery.
	OnProgress func(Progress)
	PollEvery  time.Duration
	// StartupTimeout bounds the wait for every task to register.
	StartupTimeout time.Duration
	// Store is where checkpoints go (nil: none).
	Store *checkpoint.Store
	// StatePath is where the chief keeps what a restarted chief needs to
	// finish the report ("" = nowhere).
	StatePath string
}

// Chief is the coordinator; it also serves the Chief gRPC API.
type Chief struct {
	pb.UnimplementedChiefServer
	cfg  Config
	plan partition.Plan

	mu         sync.Mutex
	members    *Membership
	psSeen     map[int]bool
	workerSeen map[int]bool
	stopping   bool
	registered chan struct{} // closed when every task has registered
	closed     bool
	step       int64
	// started is when training started (zero before); restarts are the
	// recoveries seen so far, for the report.
	started    time.Time
	restarts   []report.Restart
	latestCkpt int64 // newest committed checkpoint step (-1: none)
	maxSteps   int64 // the version at which training ends
}

// New checks the configuration and computes the partition plan.
func New(cfg Config) (*Chief, error) {
	if err := cfg.Run.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.PS) != cfg.Run.PS {
		return nil, fmt.Errorf("chief: %d PS addresses for --ps %d", len(cfg.PS), cfg.Run.PS)
	}
	plan, err := partition.New(cfg.Spec, cfg.Run.PS)
	if err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewChief(nil)
	}
	if cfg.PollEvery <= 0 {
		cfg.PollEvery = 100 * time.Millisecond
	}
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = 2 * time.Minute
	}
	c := &Chief{cfg: cfg, plan: plan, members: NewMembership(cfg.Run.HeartbeatTimeout),
		psSeen: map[int]bool{}, workerSeen: map[int]bool{}, registered: make(chan struct{}), latestCkpt: -1}
	// Every task's restart counter exists from the start, so dashboards
	// show 0 rather than nothing.
	for _, t := range c.taskNames() {
		cfg.Metrics.TaskRestarts.WithLabelValues(t)
	}
	return c, nil
}

func (c *Chief) taskNames() []string {
	out := []string{"chief"}
	for i := 0; i < c.cfg.Run.PS; i++ {
		out = append(out, fmt.Sprintf("ps/%d", i))
	}
	for i := 0; i < c.cfg.Run.Workers; i++ {
		out = append(out, fmt.Sprintf("worker/%d", i))
	}
	return out
}

// Plan is the partition of the model across shards.
func (c *Chief) Plan() partition.Plan { return c.plan }

// MaxSteps is the version at which training ends: sync steps consume
// R*batch samples, async/ssp updates consume batch samples each.
func MaxSteps(r config.Run, trainN int) int64 {
	per := r.Batch
	if r.Mode == config.Sync {
		per *= r.Replicas()
	}
	return max(1, int64(math.Ceil(r.Epochs*float64(trainN)/float64(per))))
}

// Register checks a task against the chief's configuration.
func (c *Chief) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	var problems []string
	spec := string(c.cfg.Spec.JSON())
	if len(req.ModelSpec) > 0 && string(req.ModelSpec) != spec {
		problems = append(problems, fmt.Sprintf("model spec: %s (chief) vs %s (this task)", spec, req.ModelSpec))
	}
	theirs, err := config.Parse(req.RunConfig)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	problems = append(problems, c.cfg.Run.Diff(theirs)...)
	task := fmt.Sprintf("%s/%d", req.Role, req.Index)
	if len(problems) > 0 {
		c.cfg.Metrics.RejectedRequests.WithLabelValues("config").Inc()
		c.cfg.Log.Error("refused task with a different configuration", "task", task, "differences", strings.Join(problems, "; "))
		return nil, status.Errorf(codes.FailedPrecondition, "%s does not match the chief's run: %s", task, strings.Join(problems, "; "))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch req.Role {
	case "ps":
		if req.Index < 0 || int(req.Index) >= c.cfg.Run.PS {
			c.cfg.Metrics.RejectedRequests.WithLabelValues("task").Inc()
			return nil, status.Errorf(codes.InvalidArgument, "ps index %d out of range (the run has %d)", req.Index, c.cfg.Run.PS)
		}
		c.psSeen[int(req.Index)] = true
	case "worker":
		if req.Index < 0 || int(req.Index) >= c.cfg.Run.Workers {
			c.cfg.Metrics.RejectedRequests.WithLabelValues("task").Inc()
			return nil, status.Errorf(codes.InvalidArgument, "worker index %d out of range (the run has %d)", req.Index, c.cfg.Run.Workers)
		}
		if c.workerSeen[int(req.Index)] && !c.started.IsZero() {
			// A worker that registers again was restarted: it gets its data
			// shard again and joins at the current step.
			now := c.cfg.Now()
			c.restarts = append(c.restarts, report.Restart{Task: task, BackAtSeconds: ptr(now.Sub(c.started).Seconds()), RestoredStep: c.step})
			c.cfg.Metrics.TaskRestarts.WithLabelValues(task).Inc()
			c.cfg.Log.Warn("worker restarted; it rejoins training", "task", task, "step", c.step)
		}
		c.workerSeen[int(req.Index)] = true
		c.members.Beat(int(req.Index), c.cfg.Now())
	default:
		c.cfg.Metrics.RejectedRequests.WithLabelValues("task").Inc()
		return nil, status.Errorf(codes.InvalidArgument, "unknown role %q", req.Role)
	}
	c.cfg.Log.Info("task registered", "task", task, "addr", req.Address, "pid", req.Pid)
	if !c.closed && len(c.psSeen) == c.cfg.Run.PS && len(c.workerSeen) == c.cfg.Run.Workers {
		c.closed = true
		close(c.registered)
	}
	return &pb.RegisterResponse{RunId: c.cfg.RunID, DataShard: req.Index, NumDataShards: int32(c.cfg.Run.Workers), StartStep: c.step}, nil
}

// Heartbeat keeps a worker alive.
func (c *Chief) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	if req.RunId != c.cfg.RunID {
		c.cfg.Metrics.RejectedRequests.WithLabelValues("run_id").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "heartbeat for run %q, chief runs %q", req.RunId, c.cfg.RunID)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if req.Worker < 0 || int(req.Worker) >= c.cfg.Run.Workers {
		c.cfg.Metrics.RejectedRequests.WithLabelValues("task").Inc()
		return nil, status.Errorf(codes.InvalidArgument, "worker index %d out of range (the run has %d)", req.Worker, c.cfg.Run.Workers)
	}
	c.members.Beat(int(req.Worker), c.cfg.Now())
	return &pb.HeartbeatResponse{Stop: c.stopping}, nil
}

func (c *Chief) missing() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for i := 0; i < c.cfg.Run.PS; i++ {
		if !c.psSeen[i] {
			out = append(out, fmt.Sprintf("ps/%d (%s)", i, c.cfg.PS[i].Addr))
		}
	}
	for i := 0; i < c.cfg.Run.Workers; i++ {
		if !c.workerSeen[i] {
			out = append(out, fmt.Sprintf("worker/%d", i))
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// shardStatus is one poll of every shard.
type shardStatus struct {
	st   []*pb.StatusResponse // nil where the shard did not answer
	errs []error
}

// pollShards asks every shard for its status once, in parallel.
func (c *Chief) pollShards(ctx context.Context) shardStatus {
	out := shardStatus{st: make([]*pb.StatusResponse, len(c.cfg.PS)), errs: make([]error, len(c.cfg.PS))}
	var wg sync.WaitGroup
	for s, p := range c.cfg.PS {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			out.st[s], out.errs[s] = p.Client.Status(cctx, &pb.StatusRequest{})
		}()
	}
	wg.Wait()
	return out
}

// adoptable reports whether this chief was restarted into a running
// cluster: some shard serves this run and none serves another. Shards
// that are down or came back empty are left to the poll loop, which
// restores them. It returns the newest generation and the lowest version
// among the serving shards, and whether their generations differ (the
// previous chief died in the middle of a rollback).
func (c *Chief) adoptable(ctx context.Context) (gen, step int64, split, ok bool) {
	ss := c.pollShards(ctx)
	step = math.MaxInt64
	lo := int64(math.MaxInt64)
	for s, st := range ss.st {
		if ss.errs[s] != nil || !st.Initialized {
			continue
		}
		if st.RunId != c.cfg.RunID {
			return 0, 0, false, false
		}
		ok = true
		gen, lo = max(gen, st.Generation), min(lo, st.Generation)
		step = min(step, st.Version)
	}
	return gen, step, ok && lo != gen, ok
}

// Run waits for the cluster, trains and returns the report. The caller
// fills in what only the launcher knows (tasks, startup time).
//
// A chief restarted in the middle of a run (same run id) finds every
// shard serving the run and adopts it: it skips registration and
// initialisation and goes on from the shards' state and its saved state
// file. A PS that comes back uninitialised is restored from the newest
// valid checkpoint: in sync mode every shard rolls back to it, so the
// model stays one version; in async/ssp mode only that shard does.
func (c *Chief) Run(ctx context.Context) (*report.Report, error) {
	cfg := c.cfg
	r := cfg.Run
	rep := &report.Report{Mode: string(r.Mode), PS: r.PS, Workers: r.Workers, ReplicasToAggregate: r.Replicas(),
		Staleness: r.Staleness, Hidden: r.Hidden, Model: cfg.Spec.String(), Optimizer: r.Optimizer, Batch: r.Batch,
		LR: r.LR, Momentum: r.Momentum, Epochs: r.Epochs, DataFraction: r.DataFraction, Dataset: r.Dataset,
		Seed: r.Seed, TargetAccuracy: r.TargetAccuracy}
	maxSteps := MaxSteps(r, cfg.TrainN)
	c.maxSteps = maxSteps
	st := chiefState{RunID: cfg.RunID, Evals: []report.Eval{}, Restarts: []report.Restart{}, LatestCheckpoint: -1}
	var start time.Time

	if gen, step, split, ok := c.adoptable(ctx); ok {
		// 0. A restarted chief: the cluster is training without it.
		if saved, ok := c.loadState(); ok {
			st = saved
		}
		st.Generation = max(st.Generation, gen)
		start = cfg.Now()
		if st.TrainStartedUnix > 0 {
			start = time.Unix(0, int64(st.TrainStartedUnix*1e9))
		}
		now := cfg.Now()
		c.mu.Lock()
		for i := 0; i < r.PS; i++ {
			c.psSeen[i] = true
		}
		for i := 0; i < r.Workers; i++ {
			c.workerSeen[i] = true
			c.members.Beat(i, now) // live until their heartbeats say otherwise
		}
		c.closed = true
		close(c.registered)
		c.step, c.started, c.latestCkpt = step, start, st.LatestCheckpoint
		c.restarts = append(st.Restarts, report.Restart{Task: "chief", BackAtSeconds: ptr(now.Sub(start).Seconds()), RestoredStep: step})
		c.mu.Unlock()
		cfg.Metrics.TaskRestarts.WithLabelValues("chief").Inc()
		cfg.Log.Warn("chief restarted: adopting the running cluster", "run", cfg.RunID, "step", step, "generation", st.Generation)
		if split && r.Mode == config.Sync {
			// The shards are in different generations: finish the rollback.
			cfg.Log.Warn("the previous chief died during a rollback; restoring every shard")
			if _, err := c.restore(ctx, &st, c.allShards(), maxSteps); err != nil {
				return nil, err
			}
		}
	} else {
		// 1. Wait for every task.
		cfg.Log.Info("waiting for tasks to register", "ps", r.PS, "workers", r.Workers)
		deadline := time.After(cfg.StartupTimeout)
		tick := time.NewTicker(5 * time.Second)
	wait:
		for {
			select {
			case <-c.registered:
				break wait
			case <-tick.C:
				cfg.Log.Info("still waiting for tasks", "missing", strings.Join(c.missing(), ", "))
			case <-deadline:
				tick.Stop()
				return nil, fmt.Errorf("chief: tasks did not register within %v: %s", cfg.StartupTimeout, strings.Join(c.missing(), ", "))
			case <-ctx.Done():
				tick.Stop()
				return nil, ctx.Err()
			}
		}
		tick.Stop()

		// 2. Initialise the shards: from the newest valid checkpoint, or
		// from the seed.
		inits := c.freshInit()
		if r.Resume {
			rs, err := c.loadLatest()
			switch {
			case errors.Is(err, shardckpt.ErrMismatch):
				cfg.Log.Warn("the checkpoints are of another run; starting a new one", "why", err)
			case err != nil:
				return nil, fmt.Errorf("chief: resuming from %s: %w (pass --resume=false to start afresh)", cfg.Store.Dir(), err)
			case rs == nil:
			case rs.final || rs.shards[0].version >= maxSteps:
				cfg.Log.Warn("the newest checkpoint is of a finished run; starting a new one", "path", rs.path, "step", rs.step)
			default:
				inits = rs.shards
				c.latestCkpt = rs.step
				st.LatestCheckpoint = rs.step
				cfg.Log.Info("resuming from checkpoint", "path", rs.path, "step", rs.step)
			}
		}
		if c.latestCkpt < 0 {
			if err := c.archiveOld(); err != nil {
				return nil, fmt.Errorf("chief: moving old checkpoints aside: %w", err)
			}
		}
		st.Generation++
		for s := range cfg.PS {
			if err := c.initShard(ctx, s, inits[s], st.Generation, maxSteps); err != nil {
				return nil, err
			}
		}
		start = cfg.Now()
		st.TrainStartedUnix = float64(start.UnixNano()) / 1e9
		c.mu.Lock()
		c.started, c.step = start, inits[0].version
		c.mu.Unlock()
		cfg.Log.Info("training started", "max_steps", maxSteps, "model", cfg.Spec.String(), "params", cfg.Spec.NumParams(), "step", inits[0].version)
	}
	rep.TrainStartedUnix = st.TrainStartedUnix
	save := func() {
		c.mu.Lock()
		st.Restarts = slices.Clone(c.restarts)
		st.LatestCheckpoint = c.latestCkpt
		c.mu.Unlock()
		c.saveState(st)
	}
	save()

	// 3. Poll, recover, evaluate, checkpoint, stop.
	var (
		lastEval     time.Time
		lastLive     []int32
		lastAcc      = -1.0
		reason       string
		step         int64
		staleTotal   int64
		loss         float32
		versions     = make([]int64, r.PS)
		downSince    = make([]time.Time, r.PS)
		ckptDone     chan checkpointResult // non-nil while a checkpoint is being written
		lastCkpt     = cfg.Now()
		lastCkptStep = c.latestCkpt
		doneAt       time.Time // when a shard first said training is done
	)
	if n := len(st.Evals); n > 0 {
		lastAcc = st.Evals[n-1].TestAccuracy
	}
	currentVersions := func() []int64 {
		ss := c.pollShards(ctx)
		out := slices.Clone(versions)
		for s, x := range ss.st {
			if ss.errs[s] == nil {
				out[s] = x.Version
			}
		}
		return out
	}
	poll := time.NewTicker(cfg.PollEvery)
	defer poll.Stop()
	// An evaluation that fails (a shard restarting) is skipped, not
	// fatal: only this loop can bring that shard back.
	evaluate := func() error {
		ev, d, err := c.evaluate(ctx, start)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			cfg.Log.Warn("evaluation skipped", "err", err)
			lastEval = cfg.Now()
			return nil
		}
		st.TestSeconds += d.Seconds()
		st.Evals = append(st.Evals, ev)
		lastAcc = ev.TestAccuracy
		lastEval = cfg.Now()
		cfg.Metrics.EvalAccuracy.Set(ev.TestAccuracy)
		cfg.Metrics.EvalLoss.Set(ev.TestLoss)
		cfg.Log.Info("evaluation", "step", ev.Step, "seconds", fmt.Sprintf("%.2f", ev.Seconds),
			"test_accuracy", fmt.Sprintf("%.4f", ev.TestAccuracy), "test_loss", fmt.Sprintf("%.4f", ev.TestLoss))
		if r.TargetAccuracy > 0 && ev.TestAccuracy >= r.TargetAccuracy && st.TimeToTargetSeconds == nil {
			st.TimeToTargetSeconds = ptr(ev.Seconds)
		}
		save()
		return nil
	}
	for reason == "" {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-poll.C:
		case res := <-ckptDone:
			ckptDone = nil
			c.recordCheckpoint(res)
			if res.err == nil && res.skipped == "" {
				lastCkptStep = res.step
				save()
			}
			continue
		}
		// Membership: a shard that is down gets it when it is back.
		live := c.liveWorkers()
		cfg.Metrics.LiveWorkers.Set(float64(len(live)))
		if !slices.Equal(live, lastLive) {
			if lastLive != nil {
				cfg.Log.Warn("live workers changed", "live", live, "was", lastLive)
			}
			sent := true
			for _, p := range cfg.PS {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := p.Client.SetMembership(cctx, &pb.MembershipRequest{LiveWorkers: live})
				cancel()
				sent = sent && err == nil
			}
			if sent {
				lastLive = live
			}
		}
		// Status, and recovery of shards that came back empty.
		ss := c.pollShards(ctx)
		down := false
	shards:
		for s, x := range ss.st {
			switch {
			case ss.errs[s] != nil:
				if downSince[s].IsZero() {
					downSince[s] = cfg.Now()
					cfg.Log.Warn("parameter server unreachable", "ps", s, "addr", cfg.PS[s].Addr, "err", status.Convert(ss.errs[s]).Message())
				}
				down = true
			case !x.Initialized || x.RunId != cfg.RunID:
				if downSince[s].IsZero() {
					downSince[s] = cfg.Now()
				}
				// The steps lost are measured from the newest version any
				// shard reached.
				reached := slices.Max(versions)
				for t, y := range ss.st {
					if ss.errs[t] == nil && y.Initialized && y.RunId == cfg.RunID {
						reached = max(reached, y.Version)
					}
				}
				if err := c.recoverShard(ctx, s, &st, downSince[s], start, maxSteps, reached); err != nil {
					return nil, err
				}
				save()
				down = true // poll again before going on
				if r.Mode == config.Sync {
					clear(downSince)
					break shards // every shard was re-initialised
				}
				downSince[s] = time.Time{}
			default:
				downSince[s] = time.Time{}
			}
		}
		if down {
			continue
		}
		done := false
		step, staleTotal = math.MaxInt64, 0
		for s, x := range ss.st {
			versions[s] = x.Version
			step = min(step, x.Version)
			staleTotal += x.StaleDropped
			done = done || x.Done
			if s == 0 {
				loss = x.LastLoss
			}
		}
		c.mu.Lock()
		c.step = step
		c.mu.Unlock()
		cfg.Metrics.GlobalStep.Set(float64(step))
		elapsed := cfg.Now().Sub(start)
		if cfg.OnProgress != nil {
			c.progress(step, maxSteps, elapsed, loss, lastAcc, len(live), staleTotal)
		}
		if done {
			// The other shards are usually a push away from the last
			// step (every worker pushes it to every shard): give them a
			// moment, so the final model is one version. With backup
			// workers a shard may never get there; the wait is bounded.
			hi := slices.Max(versions)
			if doneAt.IsZero() {
				doneAt = cfg.Now()
			}
			if step == hi || cfg.Now().Sub(doneAt) >= time.Second {
				reason = "epochs"
				break
			}
			continue
		}
		if cfg.Evaluator != nil && r.EvalEvery > 0 && cfg.Now().Sub(lastEval) >= r.EvalEvery && step > 0 {
			if err := evaluate(); err != nil {
				return nil, err
			}
			if st.TimeToTargetSeconds != nil {
				reason = "target"
				break
			}
		}
		// Checkpoints are written in the background: the loop goes on
		// polling, evaluating and recovering meanwhile.
		if cfg.Store != nil && ckptDone == nil && c.checkpointDue(lastCkpt, lastCkptStep, step) {
			lastCkpt = cfg.Now()
			ch := make(chan checkpointResult, 1)
			ckptDone = ch
			go func() { ch <- c.checkpointNow(ctx, currentVersions, false) }()
		}
	}
	trainEnd := cfg.Now()

	// 4. Stop the shards (workers see done on their next pull), evaluate
	// the final weights, write the final checkpoint, then let the PS
	// processes exit.
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	for s, p := range cfg.PS {
		if err := c.callPS(ctx, s, "stop", func(ctx context.Context) error { _, err := p.Client.Stop(ctx, &pb.StopRequest{}); return err }); err != nil {
			return nil, err
		}
	}
	// The steps trained are those at the stop: with a target, training
	// went on while the evaluation that reached it ran.
	if ss := c.pollShards(ctx); !slices.ContainsFunc(ss.errs, func(e error) bool { return e != nil }) {
		step = math.MaxInt64
		for _, x := range ss.st {
			step = min(step, x.Version)
		}
	}
	if ckptDone != nil {
		c.recordCheckpoint(<-ckptDone)
	}
	if cfg.Evaluator != nil {
		if err := evaluate(); err != nil {
			return nil, err
		}
	}
	if cfg.Store != nil {
		c.recordCheckpoint(c.checkpointNow(ctx, currentVersions, true))
		save()
	}
	rep.StopReason = reason
	rep.GlobalSteps = step
	rep.TrainSeconds = trainEnd.Sub(start).Seconds()
	rep.TestSeconds = st.TestSeconds
	rep.Evals = st.Evals
	rep.TimeToTargetSeconds = st.TimeToTargetSeconds
	c.mu.Lock()
	rep.Restarts = slices.Clone(c.restarts)
	c.mu.Unlock()
	if rep.Restarts == nil {
		rep.Restarts = []report.Restart{}
	}
	rep.StaleGradientsDropped = staleTotal / int64(max(1, r.PS)) // every shard drops the same late pushes
	perStep := r.Batch
	if r.Mode == config.Sync {
		perStep *= r.Replicas()
	}
	rep.EpochsDone = float64(step) * float64(perStep) / float64(max(1, cfg.TrainN))
	if rep.TrainSeconds > 0 {
		rep.SamplesPerSecond = float64(step) * float64(perStep) / rep.TrainSeconds
	}
	if n := len(rep.Evals); n > 0 {
		rep.TestAccuracy = rep.Evals[n-1].TestAccuracy
		for _, e := range rep.Evals {
			rep.BestTestAccuracy = max(rep.BestTestAccuracy, e.TestAccuracy)
		}
	}
	return rep, nil
}

// checkpointDue says whether the interval since the last checkpoint has
// passed.
func (c *Chief) checkpointDue(last time.Time, lastStep, step int64) bool {
	e := c.cfg.Run.CheckpointEvery
	switch {
	case e.Steps > 0:
		return step-max(lastStep, 0) >= e.Steps
	case e.Duration > 0:
		return c.cfg.Now().Sub(last) >= e.Duration
	}
	return false
}

// recoverShard restores shard s, which came back without state, from the
// newest valid checkpoint (or the initial weights if there is none). In
// sync mode every shard is rolled back with it, in a new generation, so
// that the model stays one version; in async and ssp mode only shard s
// is.
func (c *Chief) recoverShard(ctx context.Context, s int, st *chiefState, detected, start time.Time, maxSteps, reached int64) error {
	cfg := c.cfg
	targets := []int{s}
	if cfg.Run.Mode == config.Sync {
		targets = c.allShards()
	}
	restoredStep, err := c.restore(ctx, st, targets, maxSteps)
	if err != nil {
		return err
	}
	now := cfg.Now()
	lost := max(0, reached-restoredStep)
	task := fmt.Sprintf("ps/%d", s)
	cfg.Metrics.TaskRestarts.WithLabelValues(task).Inc()
	cfg.Metrics.Recovery.Observe(now.Sub(detected).Seconds())
	cfg.Metrics.StepsLost.Add(float64(lost))
	c.mu.Lock()
	c.restarts = append(c.restarts, report.Restart{Task: task, KilledAtSeconds: detected.Sub(start).Seconds(),
		BackAtSeconds: ptr(now.Sub(start).Seconds()), RestoredStep: restoredStep})
	c.step = restoredStep
	c.mu.Unlock()
	cfg.Log.Warn("parameter server restored", "ps", s, "from_step", restoredStep, "steps_lost", lost,
		"shards_rolled_back", len(targets), "generation", st.Generation, "recovery_seconds", fmt.Sprintf("%.2f", now.Sub(detected).Seconds()))
	return nil
}

func (c *Chief) allShards() []int {
	out := make([]int, len(c.cfg.PS))
	for i := range out {
		out[i] = i
	}
	return out
}

// restore re-initialises the target shards, in a new generation, from
// the newest valid checkpoint (or the initial weights if there is none),
// and returns the checkpoint's step.
func (c *Chief) restore(ctx context.Context, st *chiefState, targets []int, maxSteps int64) (int64, error) {
	rs, err := c.loadLatest()
	if err != nil {
		c.cfg.Log.Error("cannot read the checkpoints; restoring the initial weights", "err", err)
		rs = nil
	}
	inits := c.freshInit()
	var restoredStep int64
	if rs != nil {
		inits, restoredStep = rs.shards, rs.step
	} else {
		c.cfg.Log.Error("no valid checkpoint: restoring the initial weights", "shards", targets)
	}
	st.Generation++
	for _, t := range targets {
		if err := c.initShard(ctx, t, inits[t], st.Generation, maxSteps); err != nil {
			return 0, err
		}
	}
	return restoredStep, nil
}

// Shutdown tells every PS process to exit.
func (c *Chief) Shutdown(ctx context.Context) {
	for s, p := range c.cfg.PS {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := p.Client.Stop(ctx, &pb.StopRequest{Shutdown: true}); err != nil {
			c.cfg.Log.Warn("could not shut down ps", "ps", s, "addr", p.Addr, "err", err)
		}
		cancel()
	}
}

func (c *Chief) progress(step, maxSteps int64, elapsed time.Duration, loss float32, acc float64, live int, stale int64) {
	r := c.cfg.Run
	perStep := r.Batch
	if r.Mode == config.Sync {
		perStep *= r.Replicas()
	}
	p := Progress{Step: step, MaxStep: maxSteps, Loss: loss, LastAccuracy: acc, Elapsed: elapsed, LiveWorkers: live, StaleDropped: stale}
	p.Epoch = float64(step) * float64(perStep) / float64(max(1, c.cfg.TrainN))
	if s := elapsed.Seconds(); s > 0 {
		p.SamplesPerSec = float64(step) * float64(perStep) / s
	}
	if step > 0 {
		p.ETA = time.Duration(float64(elapsed) * float64(maxSteps-step) / float64(step))
	}
	c.cfg.OnProgress(p)
}

func (c *Chief) liveWorkers() []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int32
	for _, w := range c.members.Live(c.cfg.Now()) {
		out = append(out, int32(w))
	}
	return out
}

// evaluate pulls the current weights from every shard and scores them.
func (c *Chief) evaluate(ctx context.Context, start time.Time) (report.Eval, time.Duration, error) {
	t0 := c.cfg.Now()
	params := c.cfg.Evaluator.Params()
	var step int64 = math.MaxInt64
	for s, p := range c.cfg.PS {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := p.Client.Pull(pctx, &pb.PullRequest{Worker: -1, RunId: c.cfg.RunID})
		cancel()
		if err != nil {
			return report.Eval{}, 0, fmt.Errorf("chief: pull from ps/%d at %s: %w", s, c.cfg.PS[s].Addr, err)
		}
		flat, err := wire.Floats(resp.Params)
		if err != nil {
			return report.Eval{}, 0, err
		}
		if len(flat) != c.plan.Shards[s].Size {
			return report.Eval{}, 0, fmt.Errorf("chief: ps/%d sent %d parameters, want %d", s, len(flat), c.plan.Shards[s].Size)
		}
		c.plan.Scatter(s, flat, params)
		step = min(step, resp.Version)
	}
	at := c.cfg.Now().Sub(start).Seconds()
	acc, loss, err := c.cfg.Evaluator.Eval()
	if err != nil {
		return report.Eval{}, 0, err
	}
	return report.Eval{Step: step, Seconds: at, TestAccuracy: acc, TestLoss: loss}, c.cfg.Now().Sub(t0), nil
}

// callPS retries an RPC to shard s while it is unavailable, for up to
// StartupTimeout from the first failure, and names the shard's address
// when it gives up.
func (c *Chief) callPS(ctx context.Context, s int, op string, f func(context.Context) error) error {
	addr := c.cfg.PS[s].Addr
	err := retry.Do(ctx, retry.Policy{First: 50 * time.Millisecond, Max: time.Second, Patience: c.cfg.StartupTimeout,
		Retryable: retry.OnCodes(codes.Unavailable, codes.DeadlineExceeded), Now: c.cfg.Now},
		func(ctx context.Context) error {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			return f(cctx)
		})
	var gaveUp *retry.GaveUpError
	switch {
	case err == nil || err == ctx.Err():
		return err
	case errors.As(err, &gaveUp):
		return fmt.Errorf("chief: ps/%d at %s unreachable for %v (%s): %w", s, addr, gaveUp.After.Round(time.Millisecond), op, gaveUp.Err)
	}
	return fmt.Errorf("chief: %s on ps/%d at %s: %w", op, s, addr, err)
}
