package chief

import (
	"context"
	"errors"
	"fmt"
	"github.com/pstrain/pstrain/ml/partition"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/internal/retry"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
)

// Register checks a task against the chief's configuration.
func (c *Chief) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	reg := Registration{Role: req.Role, Index: int(req.Index), Settings: convert.RunSettings(req.Settings)}
	if req.ModelSpec != nil {
		spec := convert.Spec(req.ModelSpec)
		reg.Spec = &spec
	}
	task := fmt.Sprintf("%s/%d", req.Role, req.Index)
	c.mu.Lock()
	step, err := c.core.Register(reg, c.cfg.Now())
	c.mu.Unlock()
	switch {
	case errors.Is(err, ErrMismatch):
		c.cfg.Metrics.RejectedRequests.WithLabelValues("config").Inc()
		c.cfg.Log.Error("refused task with a different configuration", "task", task, "err", err)
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, ErrNotYet):
		return nil, status.Error(codes.Unavailable, err.Error()) // the task retries
	case errors.Is(err, ErrQuarantined):
		c.cfg.Metrics.RejectedRequests.WithLabelValues("quarantined").Inc()
		return nil, status.Error(codes.PermissionDenied, err.Error())
	case err != nil:
		c.cfg.Metrics.RejectedRequests.WithLabelValues("task").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	c.cfg.Log.Info("task registered", "task", task, "addr", req.Address, "pid", req.Pid)
	c.mu.Lock()
	plan, layout := c.core.Plan(), c.core.Layout()
	var save *SaveState // chunks of the data queue handed out: saved before the answer
	var need int64      // the state that records the chunks the answer carries
	if req.Role == cluster.Worker {
		if st, leased := c.core.LeaseData(int(req.Index)); leased {
			save = &st
		}
		plan, need = c.core.planFor(int(req.Index)), c.core.LeasedSeq(int(req.Index))
	}
	c.mu.Unlock()
	if save != nil {
		c.saveState(save.State)
	}
	if !c.savedAtLeast(need) {
		return nil, status.Error(codes.Unavailable, "the chief cannot save the data it hands out (its state file); the task retries")
	}
	return &pb.RegisterResponse{RunId: c.cfg.RunID, DataShard: req.Index, NumDataShards: int32(c.cfg.Run.Workers), StartStep: step,
		DataPlan: convert.DataPlan(plan), NumPs: int32(layout.PS), PsWeights: layout.Weights32()}, nil
}

// Heartbeat keeps a worker alive and tells it whether to stop.
func (c *Chief) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	if req.RunId != c.cfg.RunID {
		c.cfg.Metrics.RejectedRequests.WithLabelValues("run_id").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "heartbeat for run %q, chief runs %q", req.RunId, c.cfg.RunID)
	}
	var save *SaveState // chunks of the data queue handed out: saved before the answer
	var need int64      // the state that records the chunks the answer carries
	c.mu.Lock()
	stop, err := c.core.Heartbeat(int(req.Worker), c.cfg.Now())
	if err == nil {
		c.core.WireCounts(int(req.Worker), req.StepsDone, req.PushBytes, req.PullBytes)
	}
	why := c.core.QuarantineReason(int(req.Worker))
	var plan *pb.DataPlan
	if err == nil && req.PlanEras > 0 { // (0: a worker that does not follow a data plan)
		c.core.DataRead(int(req.Worker), req.DataPosition, req.PlanHold, req.DataWaiting, c.cfg.Now())
		if st, leased := c.core.LeaseData(int(req.Worker)); leased {
			save = &st
		}
		if p, changed := c.core.HeartbeatPlan(int(req.Worker), int(req.PlanEras), int(req.PlanLeases)); changed {
			plan, need = convert.DataPlan(p), c.core.LeasedSeq(int(req.Worker))
		}
	}
	var layout partition.Layout
	nudge := false
	if err == nil {
		layout = c.core.HeartbeatPS(int(req.Worker), partition.LayoutOf(int(req.NumPs), req.PsWeights))
		nudge = c.core.PSSwitchReady(c.cfg.Now())
	}
	c.mu.Unlock()
	if save != nil {
		c.saveState(save.State)
	}
	if !c.savedAtLeast(need) {
		plan = nil // its chunks are in no state written yet: a later answer brings them
	}
	if nudge {
		c.nudgeLoop()
	}
	if err != nil {
		c.cfg.Metrics.RejectedRequests.WithLabelValues("task").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &pb.HeartbeatResponse{Stop: stop || why != "", DataPlan: plan, Quarantined: why, NumPs: int32(layout.PS), PsWeights: layout.Weights32()}, nil
}

// pollTimeout bounds a poll's Status call without hot standbys (with
// them: Config.SilentAfter). A dead process answers at once (its
// connection is refused); only a frozen one takes this long.
const pollTimeout = 5 * time.Second

// primary is the process that is shard s's primary: where everything
// meant for "the shard" goes (Init, Checkpoint, Stop, SetMembership,
// evaluation pulls, SetStandby).
func (c *Chief) primary(s int) PS {
	if len(c.cfg.Standbys) == 0 {
		return c.cfg.PS[s]
	}
	c.mu.Lock()
	r := c.core.Replica(s)
	c.mu.Unlock()
	return c.process(r.Primary, s)
}

// process is shard s's process of type typ (ps or standby).
func (c *Chief) process(typ string, s int) PS {
	if typ == cluster.Standby {
		return c.cfg.Standbys[s]
	}
	return c.cfg.PS[s]
}

// primaries is every shard's primary.
func (c *Chief) primaries() []PS {
	out := make([]PS, len(c.cfg.PS))
	for s := range out {
		out[s] = c.primary(s)
	}
	return out
}

// pollShards asks every shard's primary for its status once, in
// parallel.
func (c *Chief) pollShards(ctx context.Context) []ShardStatus {
	return c.poll(ctx, c.primaries())
}

// pollAll asks every PS process for its status once, in parallel: ps/N
// and (with hot standbys) standby/N.
func (c *Chief) pollAll(ctx context.Context) (ps, standby []ShardStatus) {
	all := c.poll(ctx, append(slices.Clone(c.cfg.PS), c.cfg.Standbys...))
	ps = all[:len(c.cfg.PS)]
	if len(c.cfg.Standbys) > 0 {
		standby = all[len(c.cfg.PS):]
	}
	return ps, standby
}

// poll asks each process for its status once, in parallel.
func (c *Chief) poll(ctx context.Context, procs []PS) []ShardStatus {
	out := make([]ShardStatus, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = c.status(ctx, p)
		}()
	}
	wg.Wait()
	return out
}

// status is one process's answer to Status.
func (c *Chief) status(ctx context.Context, p PS) ShardStatus {
	timeout := pollTimeout
	if len(c.cfg.Standbys) > 0 {
		timeout = c.cfg.SilentAfter
	}
	asked := c.cfg.Now()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := p.Client.Status(cctx, &pb.StatusRequest{})
	if err != nil {
		return ShardStatus{Err: fmt.Errorf("%s: %s", p.Addr, status.Convert(err).Message()), Asked: asked}
	}
	out := ShardStatus{Serving: st.Initialized && st.RunId == c.cfg.RunID, Version: st.Version,
		Generation: st.Generation, Done: st.Done, StaleDropped: st.StaleDropped, Loss: st.LastLoss, Gaps: st.DataGaps,
		Refused: st.RefusedGradients, NonFinite: st.NonFiniteGradients, Outlier: -1,
		Role: st.Role, Epoch: st.Epoch, StandbyAttached: st.StandbyAttached, StandbyAddr: st.StandbyAddr,
		ReplicationLag: st.ReplicationLagUpdates, ReplicationLagSeconds: st.ReplicationLagSeconds,
		otherRun: st.Initialized && st.RunId != c.cfg.RunID, Asked: asked}
	if st.FirstOutlierWorker != nil {
		out.Outlier = int(*st.FirstOutlierWorker)
	}
	return out
}

// promote carries out a Promote: one attempt (a failure is decided on
// at the next poll), answering the version the new primary serves from.
func (c *Chief) promote(ctx context.Context, a Promote) (int64, error) {
	typ, _, _ := strings.Cut(a.Task, "/")
	p := c.process(typ, a.Shard)
	cctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	resp, err := p.Client.Promote(cctx, &pb.PromoteRequest{RunId: c.cfg.RunID, Shard: int32(a.Shard), Epoch: a.Epoch})
	if err != nil {
		return 0, fmt.Errorf("promote %s at %s: %w", a.Task, p.Addr, err)
	}
	return resp.Version, nil
}

// setStandby carries out a SetStandby on the shard's primary (one
// attempt).
func (c *Chief) setStandby(ctx context.Context, a SetStandby) error {
	p := c.primary(a.Shard)
	cctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	_, err := p.Client.SetStandby(cctx, &pb.SetStandbyRequest{RunId: c.cfg.RunID, Shard: int32(a.Shard), Epoch: a.Epoch, Addr: a.Addr})
	if err != nil {
		return fmt.Errorf("set-standby on shard %d's primary at %s: %w", a.Shard, p.Addr, err)
	}
	return nil
}

// setMembership tells every shard the live workers (and, in an elastic
// run, the whole membership); it reports whether all of them heard it,
// and whether one refused a hold at a step it had reached.
func (c *Chief) setMembership(ctx context.Context, a SetMembership) (sent, refused bool) {
	req := &pb.MembershipRequest{LiveWorkers: a.Live, Members: int32(a.Members), Retired: a.Retired,
		Replicas: int32(a.Replicas), MaxVersion: a.MaxVersion, HoldAt: a.HoldAt, Quarantined: a.Quarantined}
	sent = true
	for _, p := range c.primaries() {
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
	for s, p := range c.primaries() {
		if err := c.callPS(ctx, s, p, "stop", func(ctx context.Context) error { _, err := p.Client.Stop(ctx, &pb.StopRequest{}); return err }); err != nil {
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

// Shutdown tells every PS process to exit (standbys too).
func (c *Chief) Shutdown(ctx context.Context) {
	for _, procs := range []struct {
		typ string
		ps  []PS
	}{{cluster.PS, c.cfg.PS}, {cluster.Standby, c.cfg.Standbys}} {
		for s, p := range procs.ps {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if _, err := p.Client.Stop(ctx, &pb.StopRequest{Shutdown: true}); err != nil {
				c.cfg.Log.Warn("could not shut down a PS process", "task", task(procs.typ, s), "addr", p.Addr, "err", err)
			}
			cancel()
		}
	}
}

// psCallTimeout bounds one attempt of an RPC to a PS process.
const psCallTimeout = 30 * time.Second

// callPS retries an RPC to shard s's process p while it is
// unavailable, for up to StartupTimeout from the first failure, each
// attempt for up to psCallTimeout, and names the process's address when
// it gives up.
func (c *Chief) callPS(ctx context.Context, s int, p PS, op string, f func(context.Context) error) error {
	return c.retryPS(ctx, s, p, op, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, psCallTimeout)
		defer cancel()
		return f(cctx)
	})
}

// retryPS is callPS without a bound on an attempt: f bounds each of its
// RPCs itself (an Init followed by a row load of any length).
func (c *Chief) retryPS(ctx context.Context, s int, p PS, op string, f func(context.Context) error) error {
	addr := p.Addr
	err := retry.Do(ctx, retry.Policy{First: 50 * time.Millisecond, Max: time.Second, Patience: c.cfg.StartupTimeout,
		Retryable: retry.OnCodes(codes.Unavailable, codes.DeadlineExceeded), Now: c.cfg.Now}, f)
	var gaveUp *retry.GaveUpError
	switch {
	case err == nil || err == ctx.Err():
		return err
	case errors.As(err, &gaveUp):
		return fmt.Errorf("chief: ps/%d at %s unreachable for %v (%s): %w", s, addr, gaveUp.After.Round(time.Millisecond), op, gaveUp.Err)
	}
	return fmt.Errorf("chief: %s on ps/%d at %s: %w", op, s, addr, err)
}
