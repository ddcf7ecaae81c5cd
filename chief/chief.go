// Package chief coordinates a run. It holds the authoritative run
// configuration and model spec, refuses tasks whose copies differ, waits
// for the whole cluster to register, initialises the PS shards, tracks
// worker liveness from heartbeats (telling the shards, so a sync step never
// waits for a dead worker), evaluates the model on the test set at an
// interval, decides when training stops, and produces the run's report.
package chief

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/metrics"
	"github.com/pstrain/pstrain/model"
	"github.com/pstrain/pstrain/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/report"
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
		cfg.PollEvery = 250 * time.Millisecond
	}
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = 2 * time.Minute
	}
	return &Chief{cfg: cfg, plan: plan, members: NewMembership(cfg.Run.HeartbeatTimeout),
		psSeen: map[int]bool{}, workerSeen: map[int]bool{}, registered: make(chan struct{})}, nil
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
		c.cfg.Log.Error("refused task with a different configuration", "task", task, "differences", strings.Join(problems, "; "))
		return nil, status.Errorf(codes.FailedPrecondition, "%s does not match the chief's run: %s", task, strings.Join(problems, "; "))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch req.Role {
	case "ps":
		if req.Index < 0 || int(req.Index) >= c.cfg.Run.PS {
			return nil, status.Errorf(codes.InvalidArgument, "ps index %d out of range (the run has %d)", req.Index, c.cfg.Run.PS)
		}
		c.psSeen[int(req.Index)] = true
	case "worker":
		if req.Index < 0 || int(req.Index) >= c.cfg.Run.Workers {
			return nil, status.Errorf(codes.InvalidArgument, "worker index %d out of range (the run has %d)", req.Index, c.cfg.Run.Workers)
		}
		c.workerSeen[int(req.Index)] = true
		c.members.Beat(int(req.Index), c.cfg.Now())
	default:
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
		return nil, status.Errorf(codes.FailedPrecondition, "heartbeat for run %q, chief runs %q", req.RunId, c.cfg.RunID)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
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

// Run waits for the cluster, trains and returns the report. The caller
// fills in what only the launcher knows (tasks, startup time).
func (c *Chief) Run(ctx context.Context) (*report.Report, error) {
	cfg := c.cfg
	r := cfg.Run
	rep := &report.Report{Mode: string(r.Mode), PS: r.PS, Workers: r.Workers, ReplicasToAggregate: r.Replicas(),
		Staleness: r.Staleness, Hidden: r.Hidden, Model: cfg.Spec.String(), Optimizer: r.Optimizer, Batch: r.Batch,
		LR: r.LR, Momentum: r.Momentum, Epochs: r.Epochs, DataFraction: r.DataFraction, Dataset: r.Dataset,
		Seed: r.Seed, TargetAccuracy: r.TargetAccuracy, Evals: []report.Eval{}, Restarts: []report.Restart{}}

	// 1. Wait for every task.
	cfg.Log.Info("waiting for tasks to register", "ps", r.PS, "workers", r.Workers)
	deadline := time.After(cfg.StartupTimeout)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
wait:
	for {
		select {
		case <-c.registered:
			break wait
		case <-tick.C:
			cfg.Log.Info("still waiting for tasks", "missing", strings.Join(c.missing(), ", "))
		case <-deadline:
			return nil, fmt.Errorf("chief: tasks did not register within %v: %s", cfg.StartupTimeout, strings.Join(c.missing(), ", "))
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}

	// 2. Initialise the shards.
	maxSteps := MaxSteps(r, cfg.TrainN)
	init := cfg.Spec.Init(uint64(r.Seed))
	live := c.liveWorkers()
	for s, p := range cfg.PS {
		flat := make([]float32, c.plan.Shards[s].Size)
		c.plan.Gather(s, init, flat)
		req := &pb.InitRequest{RunId: cfg.RunID, Shard: int32(s), NumShards: int32(r.PS), RunConfig: r.JSON(),
			Params: wire.Bytes(flat), MaxVersion: maxSteps, LiveWorkers: live}
		if err := c.callPS(ctx, s, "init", func(ctx context.Context) error { _, err := p.Client.Init(ctx, req); return err }); err != nil {
			return nil, err
		}
	}
	start := cfg.Now()
	rep.TrainStartedUnix = float64(start.UnixNano()) / 1e9
	cfg.Log.Info("training started", "max_steps", maxSteps, "model", cfg.Spec.String(), "params", cfg.Spec.NumParams())

	// 3. Poll, evaluate, stop.
	var (
		lastEval   time.Time
		lastLive   = live
		lastAcc    = -1.0
		reason     string
		step       int64
		staleTotal int64
		loss       float32
		testTime   time.Duration
	)
	poll := time.NewTicker(cfg.PollEvery)
	defer poll.Stop()
	evaluate := func() error {
		ev, d, err := c.evaluate(ctx, start)
		if err != nil {
			return err
		}
		testTime += d
		rep.Evals = append(rep.Evals, ev)
		lastAcc = ev.TestAccuracy
		lastEval = cfg.Now()
		cfg.Metrics.EvalAccuracy.Set(ev.TestAccuracy)
		cfg.Metrics.EvalLoss.Set(ev.TestLoss)
		cfg.Log.Info("evaluation", "step", ev.Step, "seconds", fmt.Sprintf("%.2f", ev.Seconds),
			"test_accuracy", fmt.Sprintf("%.4f", ev.TestAccuracy), "test_loss", fmt.Sprintf("%.4f", ev.TestLoss))
		if r.TargetAccuracy > 0 && ev.TestAccuracy >= r.TargetAccuracy && rep.TimeToTargetSeconds == nil {
			t := ev.Seconds
			rep.TimeToTargetSeconds = &t
		}
		return nil
	}
	for reason == "" {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-poll.C:
		}
		// Membership.
		live = c.liveWorkers()
		if !slices.Equal(live, lastLive) {
			cfg.Log.Warn("live workers changed", "live", live, "was", lastLive)
			for s, p := range cfg.PS {
				req := &pb.MembershipRequest{LiveWorkers: live}
				if err := c.callPS(ctx, s, "membership", func(ctx context.Context) error { _, err := p.Client.SetMembership(ctx, req); return err }); err != nil {
					return nil, err
				}
			}
			lastLive = live
		}
		cfg.Metrics.LiveWorkers.Set(float64(len(live)))
		// Progress. Training is over when any shard is done: with backup
		// workers the shards aggregate independently, and one may stay a
		// step short once the workers have seen another finish.
		done := false
		step, staleTotal = math.MaxInt64, 0
		for s, p := range cfg.PS {
			var st *pb.StatusResponse
			if err := c.callPS(ctx, s, "status", func(ctx context.Context) error {
				var err error
				st, err = p.Client.Status(ctx, &pb.StatusRequest{})
				return err
			}); err != nil {
				return nil, err
			}
			step = min(step, st.Version)
			staleTotal += st.StaleDropped
			done = done || st.Done
			if s == 0 {
				loss = st.LastLoss
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
			reason = "epochs"
			break
		}
		if cfg.Evaluator != nil && r.EvalEvery > 0 && cfg.Now().Sub(lastEval) >= r.EvalEvery && step > 0 {
			if err := evaluate(); err != nil {
				return nil, err
			}
			if rep.TimeToTargetSeconds != nil {
				reason = "target"
			}
		}
	}
	trainEnd := cfg.Now()

	// 4. Stop the shards (workers see done on their next pull), evaluate
	// the final weights, then let the PS processes exit.
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	for s, p := range cfg.PS {
		if err := c.callPS(ctx, s, "stop", func(ctx context.Context) error { _, err := p.Client.Stop(ctx, &pb.StopRequest{}); return err }); err != nil {
			return nil, err
		}
	}
	if cfg.Evaluator != nil {
		if err := evaluate(); err != nil {
			return nil, err
		}
	}
	rep.StopReason = reason
	rep.GlobalSteps = step
	rep.TrainSeconds = trainEnd.Sub(start).Seconds()
	rep.TestSeconds = testTime.Seconds()
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
		var resp *pb.PullResponse
		if err := c.callPS(ctx, s, "pull", func(ctx context.Context) error {
			var err error
			resp, err = p.Client.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: c.cfg.RunID})
			return err
		}); err != nil {
			return report.Eval{}, 0, err
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

// callPS retries an RPC to shard s while it is unavailable, up to a
// minute, and names the shard's address when it gives up.
func (c *Chief) callPS(ctx context.Context, s int, op string, f func(context.Context) error) error {
	backoff := 50 * time.Millisecond
	deadline := c.cfg.Now().Add(c.cfg.StartupTimeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
			return fmt.Errorf("chief: %s on ps/%d at %s: %w", op, s, c.cfg.PS[s].Addr, err)
		}
		if c.cfg.Now().After(deadline) {
			return fmt.Errorf("chief: ps/%d at %s unreachable for %v (%s): %w", s, c.cfg.PS[s].Addr, c.cfg.StartupTimeout, op, err)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, time.Second)
	}
}
