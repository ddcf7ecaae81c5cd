package chief

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/retry"
	pb "github.com/pstrain/pstrain/proto"
)

// Register checks a task against the chief's configuration.
func (c *Chief) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	theirs, err := config.Parse(req.RunConfig)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	task := fmt.Sprintf("%s/%d", req.Role, req.Index)
	c.mu.Lock()
	step, err := c.core.Register(Registration{Role: req.Role, Index: int(req.Index), Run: theirs, Spec: req.ModelSpec}, c.cfg.Now())
	c.mu.Unlock()
	switch {
	case errors.Is(err, ErrMismatch):
		c.cfg.Metrics.RejectedRequests.WithLabelValues("config").Inc()
		c.cfg.Log.Error("refused task with a different configuration", "task", task, "err", err)
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, ErrNotYet):
		return nil, status.Error(codes.Unavailable, err.Error()) // the task retries
	case err != nil:
		c.cfg.Metrics.RejectedRequests.WithLabelValues("task").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	c.cfg.Log.Info("task registered", "task", task, "addr", req.Address, "pid", req.Pid)
	c.mu.Lock()
	plan := c.core.Plan()
	c.mu.Unlock()
	return &pb.RegisterResponse{RunId: c.cfg.RunID, DataShard: req.Index, NumDataShards: int32(c.cfg.Run.Workers), StartStep: step,
		DataPlan: plan.JSON()}, nil
}

// Heartbeat keeps a worker alive and tells it whether to stop.
func (c *Chief) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	if req.RunId != c.cfg.RunID {
		c.cfg.Metrics.RejectedRequests.WithLabelValues("run_id").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "heartbeat for run %q, chief runs %q", req.RunId, c.cfg.RunID)
	}
	c.mu.Lock()
	stop, err := c.core.Heartbeat(int(req.Worker), c.cfg.Now())
	var plan []byte
	if err == nil && req.PlanEras > 0 { // (0: a worker that does not follow a data plan)
		if p, changed := c.core.HeartbeatPlan(int(req.Worker), int(req.PlanEras)); changed {
			plan = p.JSON()
		}
	}
	c.mu.Unlock()
	if err != nil {
		c.cfg.Metrics.RejectedRequests.WithLabelValues("task").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &pb.HeartbeatResponse{Stop: stop, DataPlan: plan}, nil
}

// pollShards asks every shard for its status once, in parallel.
func (c *Chief) pollShards(ctx context.Context) []ShardStatus {
	out := make([]ShardStatus, len(c.cfg.PS))
	var wg sync.WaitGroup
	for s, p := range c.cfg.PS {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			st, err := p.Client.Status(cctx, &pb.StatusRequest{})
			if err != nil {
				out[s] = ShardStatus{Err: fmt.Errorf("%s: %s", p.Addr, status.Convert(err).Message())}
				return
			}
			out[s] = ShardStatus{Serving: st.Initialized && st.RunId == c.cfg.RunID, Version: st.Version,
				Generation: st.Generation, Done: st.Done, StaleDropped: st.StaleDropped, Loss: st.LastLoss,
				Refused: st.RefusedGradients, NonFinite: st.NonFiniteGradients, Outlier: -1,
				otherRun: st.Initialized && st.RunId != c.cfg.RunID}
			if st.FirstOutlierWorker != nil {
				out[s].Outlier = int(*st.FirstOutlierWorker)
			}
		}()
	}
	wg.Wait()
	return out
}

// setMembership tells every shard the live workers (and, in an elastic
// run, the whole membership); it reports whether all of them heard it,
// and whether one refused a hold at a step it had reached.
func (c *Chief) setMembership(ctx context.Context, a SetMembership) (sent, refused bool) {
	req := &pb.MembershipRequest{LiveWorkers: a.Live, Members: int32(a.Members), Retired: a.Retired,
		Replicas: int32(a.Replicas), MaxVersion: a.MaxVersion, HoldAt: a.HoldAt}
	sent = true
	for _, p := range c.cfg.PS {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := p.Client.SetMembership(cctx, req)
		cancel()
		sent = sent && err == nil
		refused = refused || (a.HoldAt > 0 && status.Code(err) == codes.FailedPrecondition)
	}
	return sent, refused
}

// stopShards ends training on every shard (workers see done on their
// next pull) and returns the shards' versions after it (nil if one did
// not answer the poll).
func (c *Chief) stopShards(ctx context.Context) ([]int64, error) {
	for s, p := range c.cfg.PS {
		if err := c.callPS(ctx, s, "stop", func(ctx context.Context) error { _, err := p.Client.Stop(ctx, &pb.StopRequest{}); return err }); err != nil {
			return nil, err
		}
	}
	var versions []int64
	for _, x := range c.pollShards(ctx) {
		if x.Err != nil {
			return nil, nil
		}
		versions = append(versions, x.Version)
	}
	return versions, nil
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
