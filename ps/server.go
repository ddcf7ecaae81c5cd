package ps

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/metrics"
	"github.com/pstrain/pstrain/optim"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/wire"
)

// Server serves one shard over gRPC.
type Server struct {
	pb.UnimplementedParameterServerServer

	log      *slog.Logger
	m        *metrics.PS
	shutdown func() // called after a Stop with shutdown set

	mu      sync.Mutex
	shard   *Shard // nil until Init
	runID   string
	index   int
	changed chan struct{} // closed and replaced whenever a pull may become ready
	// snap is the byte encoding of the parameters at snapVersion, shared
	// read-only by every pull of that version.
	snap        []byte
	snapVersion int64
	lastLoss    float32
}

// NewServer returns an uninitialised shard server. m may be nil (no
// metrics); shutdown is called when the chief orders the process to exit.
func NewServer(log *slog.Logger, m *metrics.PS, shutdown func()) *Server {
	if m == nil {
		m = metrics.NewPS(nil)
	}
	if shutdown == nil {
		shutdown = func() {}
	}
	return &Server{log: log, m: m, shutdown: shutdown, changed: make(chan struct{}), index: -1}
}

// notify wakes every blocked pull so it re-checks readiness. Call with mu.
func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) observe(op string, start time.Time) {
	s.m.Requests.WithLabelValues(op).Inc()
	s.m.RequestDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

// Init replaces the shard's state.
func (s *Server) Init(ctx context.Context, req *pb.InitRequest) (*pb.InitResponse, error) {
	defer s.observe("init", time.Now())
	cfg, err := config.Parse(req.RunConfig)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	params, err := wire.Floats(req.Params)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	params = append([]float32(nil), params...) // own it; the request buffer may be reused
	opt, err := optim.New(optim.Config{Name: cfg.Optimizer, LR: cfg.LR, Momentum: cfg.Momentum}, len(params))
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if len(req.OptimizerState) > 0 || req.OptimizerStep > 0 {
		st, err := wire.Floats(req.OptimizerState)
		if err == nil {
			err = opt.SetState(st, req.OptimizerStep)
		}
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	sc := ShardConfig{Mode: cfg.Mode, Replicas: cfg.Replicas(), Staleness: cfg.Staleness,
		Workers: cfg.Workers, MaxVersion: req.MaxVersion}
	sh, err := NewShard(sc, params, opt, req.Version)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.LiveWorkers != nil {
		sh.SetLive(toInts(req.LiveWorkers))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shard, s.runID, s.index = sh, req.RunId, int(req.Shard)
	s.snap = nil
	s.m.GlobalStep.Set(float64(sh.Version()))
	s.m.ShardParameters.Set(float64(len(params)))
	s.m.RPCReceivedBytes.WithLabelValues("init").Add(float64(len(req.Params)))
	s.notify()
	s.log.Info("shard initialised", "shard", req.Shard, "of", req.NumShards, "params", len(params),
		"version", req.Version, "mode", cfg.Mode, "run", req.RunId)
	return &pb.InitResponse{}, nil
}

func toInts(x []int32) []int {
	out := make([]int, len(x))
	for i, v := range x {
		out[i] = int(v)
	}
	return out
}

// checkRun verifies the request belongs to this run. Call with mu.
func (s *Server) checkRun(runID string) error {
	if s.shard == nil {
		return status.Error(codes.Unavailable, "shard not initialised yet (waiting for the chief)")
	}
	if runID != "" && runID != s.runID {
		s.m.RejectedRequests.WithLabelValues("run_id").Inc()
		return status.Errorf(codes.FailedPrecondition, "request for run %q, this shard serves run %q", runID, s.runID)
	}
	return nil
}

// Pull answers once the shard is ready for this worker.
func (s *Server) Pull(ctx context.Context, req *pb.PullRequest) (*pb.PullResponse, error) {
	start := time.Now()
	defer s.observe("pull", start)
	s.mu.Lock()
	for {
		if err := s.checkRun(req.RunId); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if s.shard.PullReady(int(req.Worker), req.MinVersion) {
			break
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		s.mu.Lock()
	}
	sh := s.shard
	if s.snap == nil || s.snapVersion != sh.Version() {
		s.snap = append([]byte(nil), wire.Bytes(sh.Params())...)
		s.snapVersion = sh.Version()
	}
	resp := &pb.PullResponse{Version: sh.Version(), Params: s.snap, Done: sh.Done()}
	s.mu.Unlock()
	if req.Worker >= 0 {
		s.m.BarrierWait.Observe(time.Since(start).Seconds())
	}
	s.m.RPCSentBytes.WithLabelValues("pull").Add(float64(len(resp.Params)))
	return resp, nil
}

// Push applies or aggregates one gradient.
func (s *Server) Push(ctx context.Context, req *pb.PushRequest) (*pb.PushResponse, error) {
	defer s.observe("push", time.Now())
	s.m.RPCReceivedBytes.WithLabelValues("push").Add(float64(len(req.Grad)))
	g, err := wire.Floats(req.Grad)
	if err != nil {
		s.m.RejectedRequests.WithLabelValues("bad_length").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkRun(req.RunId); err != nil {
		return nil, err
	}
	res, err := s.shard.Push(int(req.Worker), req.Version, g)
	if err != nil {
		s.m.RejectedRequests.WithLabelValues(rejectReason(err)).Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	s.m.GradientStaleness.Observe(float64(res.Staleness))
	if res.Outcome == Stale {
		s.m.StaleGradientsDropped.Inc()
	}
	s.lastLoss = req.Loss
	if res.Advanced || s.shard.cfg.Mode == config.SSP {
		s.m.GlobalStep.Set(float64(s.shard.Version()))
		s.notify()
	}
	return &pb.PushResponse{Outcome: pb.PushResponse_Outcome(res.Outcome), Version: s.shard.Version(), Done: s.shard.Done()}, nil
}

func rejectReason(err error) string {
	switch {
	case errors.Is(err, ErrFutureVersion):
		return "future_version"
	case errors.Is(err, ErrBadLength):
		return "bad_length"
	case errors.Is(err, ErrBadWorker):
		return "bad_worker"
	case errors.Is(err, ErrNonFinite):
		return "non_finite"
	}
	return "other"
}

// SetMembership updates the live worker set.
func (s *Server) SetMembership(ctx context.Context, req *pb.MembershipRequest) (*pb.MembershipResponse, error) {
	defer s.observe("membership", time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shard == nil {
		return nil, status.Error(codes.Unavailable, "shard not initialised yet")
	}
	if s.shard.SetLive(toInts(req.LiveWorkers)) {
		s.m.GlobalStep.Set(float64(s.shard.Version()))
	}
	s.notify()
	return &pb.MembershipResponse{}, nil
}

// Status reports the shard's progress.
func (s *Server) Status(ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shard == nil {
		return &pb.StatusResponse{}, nil
	}
	st := s.shard.Stats()
	return &pb.StatusResponse{Version: s.shard.Version(), Initialized: true, Done: s.shard.Done(),
		StaleDropped: st.StaleDropped, Applied: st.Applied, NumParams: int64(len(s.shard.Params())),
		RunId: s.runID, LastLoss: s.lastLoss}, nil
}

// Stop ends training and optionally the process.
func (s *Server) Stop(ctx context.Context, req *pb.StopRequest) (*pb.StopResponse, error) {
	s.mu.Lock()
	if s.shard != nil {
		s.shard.Stop()
	}
	s.notify()
	s.mu.Unlock()
	if req.Shutdown {
		s.log.Info("shutdown ordered by the chief")
		// Answer first: the process exits after the handler returns.
		go s.shutdown()
	}
	return &pb.StopResponse{}, nil
}

// Snapshot copies the shard's state (for checkpoints and tests).
func (s *Server) Snapshot() (version int64, params, optState []float32, optSteps int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shard == nil {
		return 0, nil, nil, 0, fmt.Errorf("ps: shard not initialised")
	}
	st, steps := s.shard.Optimizer().State()
	return s.shard.Version(), append([]float32(nil), s.shard.Params()...), append([]float32(nil), st...), steps, nil
}
